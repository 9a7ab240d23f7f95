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
