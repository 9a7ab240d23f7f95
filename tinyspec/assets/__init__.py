"""The models tinyspec ships (tools/train_tiny.py trains them; tools/eval_tiny.py measures them): a small qwen35
target with an MTP head, and a draft model with its vocabulary. The demo, the CLI's defaults and the notebooks run
on them, offline."""

from pathlib import Path

ASSETS = Path(__file__).resolve().parent
TARGET, DRAFT = ASSETS / "tiny-target.gguf", ASSETS / "tiny-draft.gguf"
