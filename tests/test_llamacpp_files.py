"""tinyspec reads real llama.cpp files exactly as gguf-py does, and writes them back byte for byte.

The files are *.gguf in $TINYSPEC_LLAMACPP_FILES (default <repo>/.cache/llamacpp), made by
tools/make_llamacpp_fixtures.py with llama.cpp's own tooling: convert_hf_to_gguf.py (F32, F16, BF16,
Q8_0, TQ1_0, TQ2_0, the MTP sidecar), llama-quantize (k-quant, legacy and i-quant mixes) and
llama-imatrix (a GGUF with no model metadata). CI has none of them, so every test here skips.

Oracle: gguf==0.19.0 (PyPI), `gguf.GGUFReader` for the container and `gguf.quants.dequantize` for
the values. Per file, checked exactly (no tolerance anywhere):
    header      version, alignment
    metadata    same keys in the same order; same GGUF value types (item types too) and equal values
    tensors     same names in the same order; ggml type ids; shapes (gguf-py's are ggml order, reversed
                here); absolute data offsets; raw() bytes == gguf-py's tensor.data bytes
    values      tinyspec.quants.dequantize == gguf.quants.dequantize bit for bit (compared as uint32)
    round trip  read + write_gguf (same metadata, tensors, alignment) == the input file, byte for byte
And over all files: at least one mixes more than one quantized type, as real downloads do.

Cost: ~30 s per file, nearly all of it gguf-py's own parse of the 248k-token vocabulary (tinyspec's
takes 0.6 s); 12.5 min for the script's 25 files on 2 cores. Run it alone with `pytest -m llamacpp`.
"""

from __future__ import annotations

import filecmp
import math
import os
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from tinyspec.gguf import RawTensor, read_gguf, write_gguf  # noqa: E402
from tinyspec.quants import GGMLType, dequantize  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FOLDER = Path(os.environ.get("TINYSPEC_LLAMACPP_FILES") or REPO / ".cache" / "llamacpp")
FILES = sorted(FOLDER.glob("*.gguf"))
NO_FILES = (f"no *.gguf in {FOLDER}: make them with `python tools/make_llamacpp_fixtures.py --llama-cpp DIR` "
            "or point $TINYSPEC_LLAMACPP_FILES at a folder of llama.cpp GGUF files")
PLAIN_TYPES = {GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.F64,
               GGMLType.I8, GGMLType.I16, GGMLType.I32, GGMLType.I64}

pytestmark = pytest.mark.llamacpp
PARAMS = [pytest.param(f, id=f.name) for f in FILES] or [pytest.param(None, marks=pytest.mark.skip(reason=NO_FILES))]


@pytest.fixture(scope="module", params=PARAMS)
def pair(request):
    """(tinyspec GGUFFile, gguf.GGUFReader) of one file; module scope so each file is parsed once."""
    path = request.param
    with read_gguf(path) as ours:
        yield ours, gguf.GGUFReader(path)


# ---------------------------------------------------------------------------------------------- helpers


def typed_from_reader(field) -> tuple:
    """A gguf-py ReaderField -> a typed value tree: (type_id, value), or (ARRAY, item_type_id, items)
    where items are plain values, or typed trees when the items are arrays themselves.

    Built from field.parts, not field.contents(): contents() flattens nested arrays and reports no item
    type for an empty array. Parts after the key are the value's own encoding, one part per scalar:
        scalar  [value]           string  [length, bytes]        array  [item_type, count, items...]
    """
    parts = field.parts
    STRING, ARRAY = gguf.GGUFValueType.STRING, gguf.GGUFValueType.ARRAY

    def walk(i: int, vtype: int) -> tuple[tuple, int]:
        """The value whose encoding starts at parts[i] -> (tree, index of the next part)."""
        if vtype == STRING:
            return (vtype, parts[i + 1].tobytes().decode("utf-8", errors="surrogateescape")), i + 2
        if vtype != ARRAY:
            return (vtype, parts[i][0].item()), i + 1
        item_type, count = int(parts[i][0]), int(parts[i + 1][0])
        i += 2
        if item_type == STRING:  # a vocabulary: 250k of these, so no per-item tuples
            items = [p.tobytes().decode("utf-8", errors="surrogateescape") for p in parts[i + 1:i + 2 * count:2]]
            return (vtype, item_type, items), i + 2 * count
        if item_type != ARRAY:
            return (vtype, item_type, [p[0].item() for p in parts[i:i + count]]), i + count
        items = []
        for _ in range(count):
            item, i = walk(i, item_type)
            items.append(item)
        return (vtype, item_type, items), i

    tree, end = walk(3, int(parts[2][0]))  # parts 0..2: key length, key bytes, value type
    assert end == len(parts), f"{field.name}: {len(parts) - end} parts left unread"
    return tree


def typed_from_ours(v) -> tuple:
    """tinyspec GGUFValue -> the same typed tree as typed_from_reader."""
    if v.type != gguf.GGUFValueType.ARRAY:
        return (int(v.type), v.value)
    if v.item_type == gguf.GGUFValueType.ARRAY:
        return (int(v.type), int(v.item_type), [typed_from_ours(x) for x in v.value])
    return (int(v.type), int(v.item_type), list(v.value))


def plain(tree: tuple):
    """Typed tree -> the plain Python value the `.metadata` contract promises (bool, int, float, str, list)."""
    if tree[0] != gguf.GGUFValueType.ARRAY:
        return tree[1]
    if tree[1] == gguf.GGUFValueType.ARRAY:
        return [plain(x) for x in tree[2]]
    return tree[2]


def strict(x):
    """Make == strict about kinds: True != 1, 1 != 1.0, and floats compare by bits (NaN == NaN)."""
    if isinstance(x, np.ndarray):
        x = x.tolist()
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, (list, tuple)):
        kinds = {type(y) for y in x}
        if kinds <= {str} or kinds <= {int}:  # the big arrays (tokens, token types): compared as they are
            return ("list", sorted(k.__name__ for k in kinds), list(x))
        return ("list", [strict(y) for y in x])
    if isinstance(x, float):
        return ("float", x.hex() if not math.isnan(x) else "nan")
    return (type(x).__name__, x)


def first_difference(a: Path, b: Path) -> str:
    """Where two files first differ, in words (for a failing round trip)."""
    x, y = np.memmap(a, np.uint8, "r"), np.memmap(b, np.uint8, "r")
    n = min(x.size, y.size)
    diff = np.flatnonzero(x[:n] != y[:n])
    at = int(diff[0]) if diff.size else n
    return (f"sizes {x.size} vs {y.size}; first difference at byte {at}: "
            f"{bytes(x[at:at + 16]).hex()} vs {bytes(y[at:at + 16]).hex()}")


# ---------------------------------------------------------------------------------------------- per file


def test_header_and_metadata(pair):
    ours, reader = pair
    assert ours.version == int(reader.fields["GGUF.version"].parts[0][0])
    assert ours.alignment == reader.alignment
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}  # gguf-py's pseudo-fields
    assert list(ours.metadata) == list(fields), "metadata keys or their order differ"
    for key, field in fields.items():
        expected = typed_from_reader(field)
        assert strict(typed_from_ours(ours.fields[key])) == strict(expected), f"{key}: typed value differs"
        assert strict(ours.metadata[key]) == strict(plain(expected)), f"{key}: .metadata value differs"


def test_tensor_infos_and_bytes(pair):
    ours, reader = pair
    assert list(ours.tensors) == [t.name for t in reader.tensors], "tensor names or their order differ"
    for t in reader.tensors:
        info = ours.tensors[t.name]
        assert info.name == t.name
        assert isinstance(info.ggml_type, GGMLType) and int(info.ggml_type) == int(t.tensor_type), t.name
        assert info.shape == tuple(int(n) for n in reversed(t.shape.tolist())), t.name
        assert info.offset == t.data_offset, t.name
        assert info.nbytes == t.n_bytes, t.name
        raw = ours.raw(t.name)
        assert raw.dtype == np.uint8 and raw.size == t.n_bytes, t.name
        assert np.array_equal(raw, np.asarray(t.data).reshape(-1).view(np.uint8)), f"{t.name}: bytes differ"


def test_dequantize_bit_exact(pair):
    ours, reader = pair
    for t in reader.tensors:
        info = ours.tensors[t.name]
        expected = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(info.shape)
        got = dequantize(ours.raw(t.name), info.ggml_type, info.shape)
        assert got.dtype == np.float32 and got.shape == info.shape, t.name
        bad = np.flatnonzero(got.reshape(-1).view(np.uint32) != expected.reshape(-1).view(np.uint32))
        assert bad.size == 0, (
            f"{t.name} ({info.ggml_type.name} {info.shape}): {bad.size} of {got.size} values differ, "
            f"first at flat index {bad[0]}: {got.reshape(-1)[bad[0]]!r} vs {expected.reshape(-1)[bad[0]]!r}"
        )


def test_round_trip_is_byte_identical(pair, tmp_path):
    """Writing back what was read gives the input file: header encoding, metadata order and types,
    tensor info order, padding between tensors and after the last one all match llama.cpp's writers."""
    ours, _ = pair
    out = tmp_path / "copy.gguf"
    tensors = {name: RawTensor(t.ggml_type, t.shape, ours.raw(name)) for name, t in ours.tensors.items()}
    write_gguf(out, ours.fields, tensors, version=ours.version)
    with read_gguf(out) as back:
        assert back.alignment == ours.alignment
    src = Path(ours.path)
    assert filecmp.cmp(src, out, shallow=False), first_difference(src, out)


# ---------------------------------------------------------------------------------------------- all files


@pytest.mark.skipif(not FILES, reason=NO_FILES)
def test_some_file_mixes_quantized_types():
    """Real files mix types per tensor (more bits for output/attn_v/ffn_down, fallbacks for short rows);
    a fixture set without a mix would not exercise that."""
    mixes = {}
    for path in FILES:
        with read_gguf(path) as f:
            mixes[path.name] = {t.ggml_type for t in f.tensors.values()} - PLAIN_TYPES
    assert any(len(m) > 1 for m in mixes.values()), {k: sorted(t.name for t in m) for k, m in mixes.items()}
