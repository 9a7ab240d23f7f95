"""Rewrite a GGUF's tensors in another outtype, as tinyspec's converter would have stored them, and (--eval) measure
what that costs on the held-out files.

    python tools/requantize.py IN.gguf OUT.gguf --outtype q4_k_m [--retype Q5_0=Q4_0] [--eval] [--backend cpu]

Every tensor is dequantized to float32 (a Q8_0 file gives its rounded values, so requantizing it rounds twice),
then stored by tinyspec.convert.tensor_types' rules for the outtype (q4_k_m: llama-quantize Q4_K_M's per-tensor
mix, tinyspec/quant_mix.py) and encoded by tinyspec.quants. Metadata is copied but for general.file_type; the
tensors keep their order. This is what `llama-quantize --allow-requantize IN OUT Q4_K_M` does.
--retype A=B: store in B what the rules put in A (an experiment: e.g. the Q5_0 fallbacks in 4-bit Q4_0).
--eval: held-out loss per UTF-8 byte (tools/eval_tiny.py heldout_loss_per_byte) of both files, their sizes, and
the relative change, which is the quantization penalty when IN is the file that ships.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tinyspec.convert import OUTTYPES, encode, tensor_types
from tinyspec.gguf import GGUFValue, GGUFValueType, RawTensor, read_gguf, write_gguf
from tinyspec.quants import GGMLType, dequantize


def requantize(src: Path, dst: Path, outtype: str, retype: dict | None = None) -> dict:
    """Write dst: src's metadata (file_type set to the outtype's) and its tensors re-stored in `outtype`, a type
    the rules choose replaced by retype's {GGMLType: GGMLType} where it names one. Returns {type name: tensor
    count} of what was written."""
    with read_gguf(src) as f:
        arch = f.metadata["general.architecture"]
        shapes = {name: t.shape for name, t in f.tensors.items()}
        kinds = tensor_types(shapes, outtype, f.metadata[f"{arch}.block_count"],
                             f.metadata.get(f"{arch}.expert_count", 0))
        kinds = {name: (retype or {}).get(kind, kind) for name, kind in kinds.items()}
        fields = dict(f.fields)
        fields["general.file_type"] = GGUFValue(GGUFValueType.UINT32, OUTTYPES[outtype][1])

        def produce(name: str):
            t = f.tensors[name]
            return lambda: encode(dequantize(f.raw(name), t.ggml_type, t.shape), kinds[name])

        write_gguf(dst, fields, {name: RawTensor(kinds[name], shapes[name], produce(name)) for name in f.tensors})
    return dict(Counter(kind.name for kind in kinds.values()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--outtype", choices=list(OUTTYPES), default="q4_k_m")
    ap.add_argument("--retype", action="append", default=[], metavar="A=B",
                    help="store in type B what the rules put in type A, e.g. Q5_0=Q4_0 (repeatable)")
    ap.add_argument("--eval", action="store_true", help="held-out loss per byte of both files (minutes each)")
    ap.add_argument("--backend", default="cpu", help="numpy, cpu or cuda, for --eval (default cpu)")
    a = ap.parse_args(argv)
    retype = {GGMLType[k.upper()]: GGMLType[v.upper()] for k, v in (r.split("=") for r in a.retype)}
    counts = requantize(a.src, a.dst, a.outtype, retype)
    print(f"wrote {a.dst}: {', '.join(f'{n} {k}' for k, n in sorted(counts.items()))} tensors")
    if not a.eval:
        return 0
    sys.path.insert(0, str(REPO / "tools"))
    from eval_tiny import heldout_loss_per_byte

    from tinyspec.backends import load_model
    from tinyspec.tokenizer import Tokenizer

    results = []
    for path in (a.src, a.dst):
        t0 = time.time()
        model = load_model(path, a.backend)
        r = heldout_loss_per_byte(model, Tokenizer.from_gguf(model.metadata))
        results.append(r["nats_per_byte"])
        print(f"{path}: {path.stat().st_size / 1e6:.2f} MB, {r['nats_per_byte']:.4f} nats/byte "
              f"({r['nats_per_token']:.4f} nats/token over {r['tokens']:,} tokens, {r['bytes']:,} bytes; "
              f"{time.time() - t0:.0f} s)")
    print(f"penalty: {100 * (results[1] / results[0] - 1):+.2f}% nats/byte")
    return 0


if __name__ == "__main__":
    sys.exit(main())
