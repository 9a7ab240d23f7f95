"""The oracle stands alone: every tinyspec module imports with numba, cupy, torch, transformers and
llama.cpp's gguf package made unimportable (fast paths are leaves; test oracles stay in tests)."""

import pkgutil
import subprocess
import sys

import tinyspec

BLOCKED = ("numba", "cupy", "torch", "transformers", "gguf", "tokenizers", "tiktoken")


def test_every_module_imports_without_optional_packages():
    modules = ["tinyspec"] + [m.name for m in pkgutil.walk_packages(tinyspec.__path__, prefix="tinyspec.")
                               if not m.name.startswith("tinyspec.fast")]
    code = "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in BLOCKED) + "".join(
        f"import {m}\n" for m in modules)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "tinyspec.quants.kquants" in modules and len(modules) > 20


def test_the_core_modules_import_one_way():
    """No import circle among the core's modules, counting every `from .x import` wherever it stands (in a function,
    under TYPE_CHECKING): a reader who follows the imports never comes back where they started. The circles this
    found once: generate <-> speculate (plain decoding lived on both sides), kernels <-> gdn/attention/moe (the
    layers named the Kernels type under TYPE_CHECKING). The wing (tinyspec.fast) is a leaf the core never imports
    (tests/test_kernels.py), so only the core is walked."""
    import ast
    from pathlib import Path

    root = Path(tinyspec.__file__).parent
    core = {p.stem: p for p in root.glob("*.py") if p.stem not in ("__init__", "__main__")}
    graph = {}
    for name, path in core.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                targets = [node.module] if node.module else [a.name for a in node.names]
                deps |= {t.split(".")[0] for t in targets if t and t.split(".")[0] in core}
        graph[name] = deps - {name}
    assert {"speculate", "scheduler", "generate", "kernels", "gdn"} <= set(graph)

    def cycle_from(start):
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for dep in graph[node]:
                if dep == start:
                    return path + [start]
                if dep not in seen:
                    seen.add(dep)
                    stack.append((dep, path + [dep]))
        return None

    cycles = [c for c in map(cycle_from, graph) if c]
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c) for c in cycles)
