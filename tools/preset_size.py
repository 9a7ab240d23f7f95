"""What a train_tiny target shape costs to ship: its parameter count and the exact size of the GGUF the converter
writes for it, with random weights (no training: the size does not depend on the values).

    python tools/preset_size.py --preset gpu-q4k                       # the preset's target, in its outtype
    python tools/preset_size.py --preset gpu --arch hidden=512,heads=4 --outtype q4_k_m   # a candidate shape

The model is built by train_tiny.build, saved by train_tiny.export_hf with the shipped target's tokenizer (8192
tokens; --tokenizer-from another GGUF for another vocabulary) and converted by tinyspec.convert; the shipped
target's training.* record is added as metadata, so the size is the one a shipped file of that shape would have
(the record is ~45 KB, most of it the 8192-entry token ranking). Prints one line per shape.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from train_tiny import EOT, PRESETS, build, export_hf, save_tokenizer, tokenizer_from_gguf

from tinyspec.convert import OUTTYPES, convert
from tinyspec.gguf import read_gguf

SHIPPED = REPO / "tinyspec" / "assets" / "tiny-target.gguf"


def shipped_size(arch, outtype: str, tokenizer_from: Path = SHIPPED) -> tuple[int, int, dict]:
    """(parameters, file bytes, {type name: tensor count}) of the GGUF of a random-weight target of `arch`."""
    import torch

    tok = tokenizer_from_gguf(tokenizer_from)
    with read_gguf(tokenizer_from) as g:
        training = {k: g.fields[k] for k in g.fields if k.startswith("training.")}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        save_tokenizer(tok, tmp / "tokenizer")
        torch.manual_seed(0)
        model, mtp = build(torch, arch, tok.get_vocab_size(), tok.token_to_id(EOT))
        export_hf(torch, model, mtp, tmp / "hf", tmp / "tokenizer")
        convert(tmp / "hf", tmp / "t.gguf", outtype, metadata=training)
        with read_gguf(tmp / "t.gguf") as g:
            params = sum(t.n_elements for t in g.tensors.values())
            return params, g.file_size, dict(Counter(t.ggml_type.name for t in g.tensors.values()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="gpu-q4k")
    ap.add_argument("--arch", action="append", default=[],
                    help="comma-separated Arch overrides, e.g. hidden=512,heads=4 (repeat for several shapes)")
    ap.add_argument("--outtype", choices=list(OUTTYPES), help="default: the preset's (q8_0 if it names none)")
    ap.add_argument("--tokenizer-from", type=Path, default=SHIPPED)
    a = ap.parse_args(argv)
    preset = PRESETS[a.preset]
    outtype = a.outtype or preset.get("outtype", "q8_0")
    base = preset["target"].arch
    for spec in a.arch or [""]:
        changes = {k: type(getattr(base, k))(v) if not isinstance(getattr(base, k), bool) else v == "True"
                   for k, v in (kv.split("=") for kv in spec.split(",") if kv)}
        arch = replace(base, **changes)
        params, size, types = shipped_size(arch, outtype, a.tokenizer_from)
        print(f"{outtype} {params / 1e6:.2f} M params, {size:,} bytes ({size / 1e6:.2f} MB): {arch}; "
              f"{', '.join(f'{n} {k}' for k, n in sorted(types.items()))} tensors", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
