"""The README's two set-up commands are the ones users and CI run: keep them true."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    lines = (ROOT / "README.md").read_text().splitlines()
    return [line.strip() for line in lines if line.strip().startswith("python3 -m venv .venv")]


def test_readme_has_exactly_two_setup_commands():
    demo, tests = readme_commands()
    assert demo.endswith("pip install -q -e . && python -m tinyspec")  # the no-argument demo
    assert tests.endswith("python -m pytest")


def test_ci_runs_the_readme_test_command():
    _, tests = readme_commands()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in [line.strip() for line in ci], ".ci/run must run exactly the README's test command"


def test_every_cited_test_exists():
    """README.md, LESSONS.md and the docs pages they point to name the tests behind their claims (`test_x.py::test_name`, or `::test_name`
    after a file already named): each must exist, so a renamed test cannot leave a claim pointing at nothing."""
    import re

    for doc in ("README.md", "LESSONS.md", "docs/claims.md", "docs/measurements.md"):
        text = (ROOT / doc).read_text()
        current = None
        missing = []
        for file, name in re.findall(r"(?:(?:tests/)?(test_\w+\.py))?::(test_\w+)", text):
            current = file or current
            if current is None:
                continue
            source = (ROOT / "tests" / current).read_text()
            if f"def {name}(" not in source:
                missing.append(f"{current}::{name}")
        assert not missing, f"{doc} cites tests that do not exist: {missing}"


def test_the_pages_the_readme_links_exist():
    """The README is for a newcomer; the GPU, llama.cpp, measurement and claims pages it links must be there."""
    import re

    for target in re.findall(r"\]\((docs/[\w./-]+\.md)\)", (ROOT / "README.md").read_text()):
        assert (ROOT / target).exists(), target


def test_the_notebooks_extra_installs_the_jupyter_the_readme_names():
    """issue 49 item 4: the README says `pip install -e ".[nb]"`, then `jupyter lab notebooks/`; the nb extra must
    bring JupyterLab (before, `jupyter lab` was "not found")."""
    import re

    readme = (ROOT / "README.md").read_text()
    assert 'pip install -e ".[nb]"`, then `jupyter lab notebooks/`' in readme
    nb = re.search(r"^nb = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)  # (tomllib: Python 3.11+)
    assert nb and re.search(r'"jupyterlab\b', nb[1]), "the nb extra lists no jupyterlab"


def readme_example_prompts() -> list[str]:
    """The prompts of the README's examples on the shipped model: `generate --prompt` lines with no --model (bash's
    $'...' quoting read as bash reads it) and the curl bodies' "prompt"."""
    text = (ROOT / "README.md").read_text()
    prompts = []
    for line in text.splitlines():
        if "tinyspec generate" in line and "--model" not in line and (m := re.search(r"--prompt \$'([^']*)'", line)):
            prompts.append(m.group(1).encode().decode("unicode_escape"))
        elif "tinyspec generate" in line and "--model" not in line and (m := re.search(r'--prompt "([^"]*)"', line)):
            prompts.append(m.group(1))
    prompts += [json.loads(body)["prompt"] for body in re.findall(r"-d '(\{\"prompt\".*?\})'", text)]
    return prompts


def test_the_readme_examples_repeat_no_line_more_than_twice():
    """issue 58's bar for what a newcomer is shown first: the shipped model's greedy answer to each README example
    prompt (48 tokens, the default backend, as the README's commands run) repeats no non-blank line more than twice
    and loops inside no line (no word 3-gram more than twice in one line: "the underlying underlying underlying
    underlying ..." is one line)."""
    from tinyspec.assets import TARGET
    from tinyspec.backends import load_model
    from tinyspec.generate import generate
    from tinyspec.textstream import text_ids
    from tinyspec.tokenizer import Tokenizer

    prompts = readme_example_prompts()
    assert len(prompts) >= 3 and all(p.endswith("\n") for p in prompts)
    model = load_model(TARGET)
    tok = Tokenizer.from_gguf(model.metadata)
    for prompt in sorted(set(prompts)):
        answer = tok.decode(text_ids(generate(model, tok.encode(prompt), 48, stop_ids=tok.eog_ids).tokens,
                                     tok.eog_ids))
        lines = [line for line in answer.splitlines() if line.strip()]
        assert max(map(lines.count, lines), default=0) <= 2, (prompt, answer)
        for line in lines:
            words = re.findall(r"\S+", line)
            grams = list(zip(words, words[1:], words[2:]))
            assert max(map(grams.count, grams), default=0) <= 2, (prompt, line)
