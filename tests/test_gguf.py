"""GGUF container: a hand-packed file, writer->reader round trips, and interop with gguf-py both ways.

gguf-py (llama.cpp's own Python library) is the oracle: files its GGUFWriter writes must read here
exactly as its GGUFReader reads them, files written here must read there the same, and re-writing a
gguf-py file with our writer must reproduce it byte for byte.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinyspec.gguf import GGUFError, GGUFValue, GGUFValueType, RawTensor, read_gguf, write_gguf
from tinyspec.quants import LAYOUT, GGMLType

gguf = pytest.importorskip("gguf")

VT = GGUFValueType


def pack_str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def test_hand_packed_file(tmp_path):
    """A v3 file built byte by byte: two KVs, one F32 [2, 3] tensor. Every field is checked by hand."""
    header = b"GGUF" + struct.pack("<IQQ", 3, 1, 2)
    kv = pack_str("general.architecture") + struct.pack("<I", VT.STRING) + pack_str("qwen35")
    kv += pack_str("qwen35.block_count") + struct.pack("<II", VT.UINT32, 7)
    info = pack_str("w") + struct.pack("<I2QIQ", 2, 3, 2, GGMLType.F32, 0)  # ne = (3, 2) -> shape (2, 3)
    head = header + kv + info
    pad = bytes(-len(head) % 32)
    data = np.arange(6, dtype="<f4").tobytes()
    path = tmp_path / "hand.gguf"
    path.write_bytes(head + pad + data)

    with read_gguf(path) as g:
        assert g.version == 3 and g.alignment == 32
        assert g.metadata == {"general.architecture": "qwen35", "qwen35.block_count": 7}
        assert g.fields["qwen35.block_count"].type == VT.UINT32
        t = g.tensors["w"]
        assert (t.ggml_type, t.shape, t.offset, t.nbytes) == (GGMLType.F32, (2, 3), len(head) + len(pad), 24)
        np.testing.assert_array_equal(g.raw("w").view("<f4").reshape(t.shape), np.arange(6).reshape(2, 3))


def test_v2_reads_like_v3(tmp_path):
    write_gguf(tmp_path / "v2.gguf", {"a": 1}, {"w": np.ones(4, np.float32)}, version=2)
    with read_gguf(tmp_path / "v2.gguf") as g:
        assert g.version == 2 and g.metadata == {"a": 1}


# --------------------------------------------------------------------------------- round trips (hypothesis)

SCALARS = {
    VT.UINT8: st.integers(0, 2**8 - 1), VT.INT8: st.integers(-2**7, 2**7 - 1),
    VT.UINT16: st.integers(0, 2**16 - 1), VT.INT16: st.integers(-2**15, 2**15 - 1),
    VT.UINT32: st.integers(0, 2**32 - 1), VT.INT32: st.integers(-2**31, 2**31 - 1),
    VT.UINT64: st.integers(0, 2**64 - 1), VT.INT64: st.integers(-2**63, 2**63 - 1),
    VT.FLOAT32: st.floats(width=32, allow_nan=False), VT.FLOAT64: st.floats(allow_nan=False),
    VT.BOOL: st.booleans(), VT.STRING: st.text(max_size=12),
}


def typed_values(depth: int = 2):
    scalar = st.sampled_from(sorted(SCALARS)).flatmap(lambda t: SCALARS[t].map(lambda v: GGUFValue(t, v)))
    flat_array = st.sampled_from(sorted(SCALARS)).flatmap(
        lambda t: st.lists(SCALARS[t], max_size=6).map(lambda vs: GGUFValue(VT.ARRAY, vs, t)))
    if depth == 0:
        return st.one_of(scalar, flat_array)
    nested = st.lists(typed_values(depth - 1).filter(lambda v: v.type == VT.ARRAY), max_size=3).map(
        lambda vs: GGUFValue(VT.ARRAY, vs, VT.ARRAY))
    return st.one_of(scalar, flat_array, nested)


@st.composite
def raw_tensors(draw):
    qtype = draw(st.sampled_from(sorted(LAYOUT)))
    rows = draw(st.integers(1, 3))
    blocks = draw(st.integers(1, 2))
    shape = (rows, blocks * qtype.block_size)
    nbytes = rows * blocks * qtype.type_size
    data = np.frombuffer(draw(st.binary(min_size=nbytes, max_size=nbytes)), np.uint8)
    return RawTensor(qtype, shape, data)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    fields=st.dictionaries(st.text(min_size=1, max_size=10), typed_values(), max_size=6),
    tensors=st.dictionaries(st.text(min_size=1, max_size=10), raw_tensors(), max_size=4),
    alignment=st.sampled_from([None, 1, 8, 32, 64]),
)
def test_write_read_round_trip(tmp_path, fields, tensors, alignment):
    """Whatever the writer writes, the reader reads back: same typed fields, same tensors, same bytes;
    and writing what was read reproduces the file byte for byte."""
    if alignment is not None:
        fields = {**fields, "general.alignment": GGUFValue(VT.UINT32, alignment)}
    path, again = tmp_path / "a.gguf", tmp_path / "b.gguf"
    write_gguf(path, fields, tensors)
    with read_gguf(path) as g:
        assert g.fields == fields
        assert list(g.tensors) == list(tensors)
        for name, t in tensors.items():
            info = g.tensors[name]
            assert (info.ggml_type, info.shape, info.nbytes) == (t.ggml_type, t.shape, t.data.size)
            assert info.offset % (alignment or 32) == 0
            np.testing.assert_array_equal(g.raw(name), t.data)
        write_gguf(again, g.fields, {n: RawTensor(i.ggml_type, i.shape, g.raw(n)) for n, i in g.tensors.items()})
    assert again.read_bytes() == path.read_bytes()


def test_plain_values_are_typed_like_llama_cpp_expects(tmp_path):
    meta = {"b": True, "i": -5, "u": 3_000_000_000, "big": 2**40, "f": 0.5, "s": "héllo",
            "ints": [1, -2, 3], "wide": [1, 2**33], "strs": ["a", "b"], "arr": np.arange(3, dtype=np.uint64)}
    write_gguf(tmp_path / "t.gguf", meta)
    with read_gguf(tmp_path / "t.gguf") as g:
        types = {k: (v.type.name, v.item_type.name if v.item_type is not None else None) for k, v in g.fields.items()}
        assert types == {"b": ("BOOL", None), "i": ("INT32", None), "u": ("UINT32", None), "big": ("INT64", None),
                         "f": ("FLOAT32", None), "s": ("STRING", None), "ints": ("ARRAY", "INT32"),
                         "wide": ("ARRAY", "INT64"), "strs": ("ARRAY", "STRING"), "arr": ("ARRAY", "UINT64")}
        assert g.metadata["s"] == "héllo" and g.metadata["strs"] == ["a", "b"]
        np.testing.assert_array_equal(g.metadata["wide"], [1, 2**33])


def test_writer_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="multiple of the Q8_0 block size"):
        write_gguf(tmp_path / "x.gguf", {}, {"q": RawTensor(GGMLType.Q8_0, (2, 30), np.zeros(60, np.uint8))})
    with pytest.raises(ValueError, match="needs 68 bytes"):
        write_gguf(tmp_path / "x.gguf", {}, {"q": RawTensor(GGMLType.Q8_0, (2, 32), np.zeros(60, np.uint8))})
    with pytest.raises(ValueError, match="out of range for UINT8"):
        write_gguf(tmp_path / "x.gguf", {"k": GGUFValue(VT.UINT8, 300)})
    with pytest.raises(ValueError, match="share one type"):
        write_gguf(tmp_path / "x.gguf", {"k": [1, "a"]})


def test_closed_file_refuses_raw(tmp_path):
    write_gguf(tmp_path / "t.gguf", {}, {"w": np.ones(4, np.float32)})
    g = read_gguf(tmp_path / "t.gguf")
    g.close()
    with pytest.raises(ValueError, match="closed"):
        g.raw("w")


def test_views_outlive_close(tmp_path):
    """close() with a live raw() view must not invalidate the view (the map lives until it goes)."""
    write_gguf(tmp_path / "t.gguf", {}, {"w": np.arange(4, dtype=np.float32)})
    with read_gguf(tmp_path / "t.gguf") as g:
        view = g.raw("w")
    np.testing.assert_array_equal(view.view(np.float32), np.arange(4))


# --------------------------------------------------------------------------------- interop with gguf-py


def reader_value(field):
    """gguf-py ReaderField -> plain Python value (flat arrays only; gguf-py cannot read nested ones)."""
    types = [VT(int(t)) for t in field.types]
    if types[0] == VT.ARRAY:
        return list(field.contents())
    return field.contents()


def ours_plain(v: GGUFValue):
    return list(v.value) if v.type == VT.ARRAY else v.value


def write_with_gguf_py(path, rng):
    """A file as llama.cpp's converter would write it: typed KVs of every kind, mixed tensor types."""
    w = gguf.GGUFWriter(str(path), arch="qwen35")
    w.add_uint32("qwen35.block_count", 4)
    w.add_uint64("u64", 2**40 + 3)
    w.add_int8("i8", -3)
    w.add_uint8("u8", 200)
    w.add_int16("i16", -300)
    w.add_uint16("u16", 60000)
    w.add_int32("i32", -70000)
    w.add_int64("i64", -(2**40))
    w.add_float32("f32", 1e-6)
    w.add_float64("f64", 1 / 3)
    w.add_bool("yes", True)
    w.add_string("s", "Qwen3.5 — tiny ✓")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "ĠHello", "<|im_end|>"])
    w.add_array("tokenizer.ggml.scores", [0.0, -1.5, 2.25, 3.0])
    w.add_array("tokenizer.ggml.token_type", [1, 1, 1, 3])
    f32 = rng.standard_normal((4, 64)).astype(np.float32)
    w.add_tensor("token_embd.weight", f32)
    w.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(64).astype(np.float16))
    for name, qt in (("blk.0.attn_q.weight", gguf.GGMLQuantizationType.Q8_0),
                     ("blk.0.ffn_up.weight", gguf.GGMLQuantizationType.Q4_0),
                     ("blk.0.ffn_gate.weight", gguf.GGMLQuantizationType.BF16)):
        q = gguf.quants.quantize(rng.standard_normal((3, 256)).astype(np.float32), qt)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def assert_same_as_gguf_py(path):
    ref = gguf.GGUFReader(str(path))
    with read_gguf(path) as g:
        ref_fields = {k: f for k, f in ref.fields.items() if not k.startswith("GGUF.")}
        assert list(g.fields) == list(ref_fields)
        for key, field in ref_fields.items():
            assert int(field.types[0]) == g.fields[key].type, key
            assert ours_plain(g.fields[key]) == reader_value(field), key
        assert [t.name for t in ref.tensors] == list(g.tensors)
        for t in ref.tensors:
            ours = g.tensors[t.name]
            assert int(t.tensor_type) == ours.ggml_type
            assert tuple(int(n) for n in reversed(t.shape)) == ours.shape
            assert t.data_offset == ours.offset and t.n_bytes == ours.nbytes
            assert g.raw(t.name).tobytes() == np.asarray(t.data).tobytes()


def test_reads_gguf_py_files_identically(tmp_path, rng):
    path = tmp_path / "ref.gguf"
    write_with_gguf_py(path, rng)
    assert_same_as_gguf_py(path)


def test_rewrite_of_gguf_py_file_is_byte_identical(tmp_path, rng):
    path, again = tmp_path / "ref.gguf", tmp_path / "again.gguf"
    write_with_gguf_py(path, rng)
    with read_gguf(path) as g:
        write_gguf(again, g.fields, {n: RawTensor(t.ggml_type, t.shape, g.raw(n)) for n, t in g.tensors.items()})
    assert again.read_bytes() == path.read_bytes()


def test_gguf_py_reads_our_files(tmp_path, rng):
    meta = {"general.architecture": "qwen35", "qwen35.block_count": GGUFValue(VT.UINT32, 2),
            "general.alignment": GGUFValue(VT.UINT32, 64), "toks": ["x", "y"], "f": np.float32([1, 2])}
    q = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    write_gguf(tmp_path / "ours.gguf", meta, {"a": rng.standard_normal((3, 5)).astype(np.float32),
                                              "q": RawTensor(GGMLType.Q8_0, (2, 64), q)})
    assert_same_as_gguf_py(tmp_path / "ours.gguf")


def test_missing_file_is_a_gguf_error(tmp_path):
    with pytest.raises(GGUFError, match="cannot open"):
        read_gguf(tmp_path / "nope.gguf")


def test_lazy_tensor_data_is_produced_at_write_time(tmp_path):
    """RawTensor.data may be a callable (a converter streams tensors one at a time); same bytes as eager."""
    calls = []
    data = np.arange(8, dtype=np.float32)
    lazy = RawTensor(GGMLType.F32, (2, 4), lambda: calls.append(1) or data)
    write_gguf(tmp_path / "lazy.gguf", {"a": 1}, {"w": lazy})
    write_gguf(tmp_path / "eager.gguf", {"a": 1}, {"w": data.reshape(2, 4)})
    assert calls == [1] and (tmp_path / "lazy.gguf").read_bytes() == (tmp_path / "eager.gguf").read_bytes()
    with pytest.raises(ValueError, match="needs 32 bytes, got 16"):
        write_gguf(tmp_path / "bad.gguf", {}, {"w": RawTensor(GGMLType.F32, (2, 4), lambda: data[:4])})
