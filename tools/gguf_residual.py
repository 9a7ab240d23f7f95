"""The rounding residual of a quantized GGUF: what a Q8_0 file lost, kept beside it so training can go on.

    write_residual(main, exact, out)      # main: the Q8_0 file; exact: the same checkpoint converted to F32
    correction = read_residual(main, out) # name -> float32 array; dequant(main) + correction = the F32 values

A Q8_0 file stores each weight tensor w as blocks of 32 values along a row, x = d q with d = fp16(max|x| / 127)
and q an int8; a reader gets dequant(Q(w)) = w - r. `tiny-NAME.residual.gguf` holds r for every tensor the main
file stores quantized, in GGUF space (after tinyspec.convert's transforms, so it adds to what the file holds),
itself stored in that tensor's type and scaled by SCALE = 2^16:

    Q8_0   one block's error is at most c d, c = 1/2 + 127 * 2^-11 ~ 0.562 (half a step, plus fp16's rounding of d
           times the largest code), so |r| <= c amax / 127 with amax the block's largest |w|; r's own Q8_0 blocks
           are the same 32 values, so what is left, e = w - (dequant(main) + r's dequant), is
               |e| <= c max|r| / 127 <= c^2 amax / 127^2 ~ 2.0e-5 amax      (the main file alone: ~ 4e-3 amax)
    F16    (Q8_0's fallback for a row that is not a multiple of 32): r in F16, |e| <= 2^-11 |r| ~ 2^-22 |w|
    F32    exact in the main file: not repeated.

Why the scale: r's own block scale would be about max|r| / 127 ~ amax / 254 / 127, subnormal in fp16 (below 2^-14)
for any block with amax < ~2, where fp16 rounds a scale to 2^-24 absolute and a code of 127 then carries up to
127 * 2^-25 ~ 3.8e-6 of error, far more than the bound above for weights of ~0.05; 2^16 r keeps the scales normal
for blocks with amax above ~3e-5, and multiplying by a power of two is exact.

Pairing: `residual.main_sha256` is the SHA-256 of the main file's tensors (names, types, shapes and bytes, in file
order); read_residual refuses a residual whose digest is not the main file's, since it corrects those exact bytes.
The metadata (the training record) may change without breaking the pair. The file is not a model: no
`general.architecture`, so tinyspec and llama.cpp refuse to run it.
Measured figures (sizes, errors with and without it): docs/performance-log.md, 2026-11-28 "what a next training run
needs"; tests/test_train_tiny.py checks the bound on a trained model.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from tinyspec.convert import encode
from tinyspec.gguf import GGUFFile, RawTensor, read_gguf, write_gguf
from tinyspec.quants import GGMLType, dequantize

SCALE = 2.0**16  # the residual is stored times SCALE (a power of two: exact); its file records the factor
C = 0.5 + 127 * 2.0**-11  # a Q8_0 block's worst error in units of its scale d (rounding, plus fp16's rounding of d)


def residual_path(main: Path) -> Path:
    """tiny-target.gguf -> tiny-target.residual.gguf, beside it."""
    return main.with_name(main.name.removesuffix(".gguf") + ".residual.gguf")


def digest(g: GGUFFile) -> str:
    """SHA-256 of a file's tensors: each name, type, shape and bytes, in file order (not its metadata)."""
    h = hashlib.sha256()
    for name, t in g.tensors.items():
        h.update(f"{name}:{t.ggml_type.name}:{t.shape};".encode())
        h.update(g.raw(name))
    return h.hexdigest()


def write_residual(main: Path, exact: Path, out: Path, scale: float = SCALE) -> int:
    """Write `out`, the residual of `main` against `exact` (an F32 conversion of the same checkpoint: same tensor
    names and shapes); returns how many tensors it holds (every one `main` does not store as F32)."""
    with read_gguf(main) as g, read_gguf(exact) as f:
        tensors = {}
        for name, t in g.tensors.items():
            if t.ggml_type == GGMLType.F32:
                continue
            if f.tensors[name].ggml_type != GGMLType.F32 or f.tensors[name].shape != t.shape:
                raise ValueError(f"{exact}: {name} is not the F32 form of {main}'s tensor {t.shape}")
            w = dequantize(f.raw(name), GGMLType.F32, t.shape).astype(np.float64)
            r = w - dequantize(g.raw(name), t.ggml_type, t.shape)  # exact in float64
            tensors[name] = RawTensor(t.ggml_type, t.shape, encode((r * scale).astype(np.float32), t.ggml_type))
        meta = {"general.type": "residual", "residual.main_file": main.name, "residual.main_sha256": digest(g),
                "residual.scale": float(scale)}
        write_gguf(out, meta, tensors)
    return len(tensors)


def read_residual(main: Path, residual: Path) -> dict[str, np.ndarray]:
    """name -> r (float32, the scale undone) for each tensor the residual holds; ValueError when the residual was
    not written for `main`'s tensors."""
    with read_gguf(main) as g, read_gguf(residual) as res:
        meta, main_sha = res.metadata, digest(g)
        if meta.get("general.type") != "residual":
            raise ValueError(f"{residual}: not a residual file (general.type {meta.get('general.type')!r})")
        if meta["residual.main_sha256"] != main_sha:
            raise ValueError(f"{residual} was written for other weights ({meta['residual.main_file']}, sha256 "
                             f"{meta['residual.main_sha256'][:12]}...) than {main}'s (sha256 {main_sha[:12]}...)")
        want = {name for name, t in g.tensors.items() if t.ggml_type != GGMLType.F32}
        if set(res.tensors) != want:
            raise ValueError(f"{residual}: its tensors are not the quantized tensors of {main}")
        return {name: dequantize(res.raw(name), t.ggml_type, t.shape) / np.float32(meta["residual.scale"])
                for name, t in res.tensors.items()}
