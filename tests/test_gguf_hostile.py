"""A GGUF file is untrusted input: every malformed file must raise GGUFError naming the problem,
quickly, without allocating more than the file's size. Nothing else may escape the reader.

The cases follow the loader bugs and CVEs peers shipped (docs/peers.md section 5):
overflowing counts, sizes and padding, strings longer than the file, unknown types, out-of-bounds
tensor data, and llama.cpp's own tests/test-gguf.cpp handcrafted-file categories.
"""

from __future__ import annotations

import struct
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tinyspec.gguf import GGUFError, GGUFValue, GGUFValueType, RawTensor, read_gguf, write_gguf
from tinyspec.quants import GGMLType, dequantize

VT = GGUFValueType
U64_MAX = 2**64 - 1


def s(text: str | bytes) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def info(name: str, ne: tuple[int, ...], ggml_type: int = GGMLType.F32, offset: int = 0, n_dims: int | None = None) -> bytes:
    n_dims = len(ne) if n_dims is None else n_dims
    return s(name) + struct.pack(f"<I{len(ne)}QIQ", n_dims, *ne, ggml_type, offset)


def craft(kvs: list[bytes] = (), infos: list[bytes] = (), data: bytes = b"", *, n_kv=None, n_tensors=None,
          version=3, magic=b"GGUF", alignment=32) -> bytes:
    head = magic + struct.pack("<IQQ", version, len(infos) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv)
    head += b"".join(kvs) + b"".join(infos)
    return head + bytes(-len(head) % alignment) + data


def parse(tmp_path, blob: bytes):
    """Read `blob` as a file, returning the GGUFFile or raising; checks peak allocation and time."""
    path = tmp_path / "hostile.gguf"
    path.write_bytes(blob)
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        g = read_gguf(path)
        g.close()
        return g
    finally:
        elapsed = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        # a hostile count must never turn into a big allocation or a long loop
        assert peak < 256 * 1024 + 16 * len(blob), f"peak allocation {peak} bytes for a {len(blob)}-byte file"
        assert elapsed < 30.0, f"parse took {elapsed:.2f} s"  # a hang guard, not a speed claim (a loaded machine)


def rejects(tmp_path, blob: bytes, match: str):
    with pytest.raises(GGUFError, match=match):
        parse(tmp_path, blob)


F32_4 = info("w", (4,))
DATA_4 = np.ones(4, np.float32).tobytes()

CASES = {
    "bad magic": (b"GGML" + bytes(40), "not a GGUF file"),
    "empty file": (b"", "not a GGUF file"),
    "header cut short": (b"GGUF\x03\x00\x00\x00", "truncated file"),
    "version 1": (craft(version=1), "unsupported GGUF version 1"),
    "version 4": (craft(version=4), "unsupported GGUF version 4"),
    "big-endian": (craft(version=0x03000000), "big-endian"),
    "absurd n_kv": (craft(n_kv=U64_MAX), "n_kv = 18446744073709551615 cannot fit"),
    "absurd n_tensors": (craft(n_tensors=2**62), "n_tensors = 4611686018427387904 cannot fit"),
    "n_kv larger than present": (craft([kv("a", VT.UINT8, b"\x01")], data=b"\xff" * 12, n_kv=2, alignment=1), "metadata key 1: string length"),
    "key longer than file": (craft([struct.pack("<Q", U64_MAX)], data=bytes(32)), "metadata key 0: string length"),
    "string value longer than file": (craft([kv("a", VT.STRING, struct.pack("<Q", 2**40))]), "value of 'a': string length"),
    "unknown value type": (craft([kv("a", 13, b"\x00" * 8)]), "type of 'a': unknown value type 13"),
    "negative value type": (craft([kv("a", 0xFFFFFFFF, b"\x00" * 8)]), "unknown value type 4294967295"),
    "array count overflows": (craft([kv("a", VT.ARRAY, struct.pack("<IQ", VT.UINT64, U64_MAX))]), "array of 18446744073709551615"),
    "string array count too big": (craft([kv("a", VT.ARRAY, struct.pack("<IQ", VT.STRING, 2**40))]), "STRING items"),
    "unknown array item type": (craft([kv("a", VT.ARRAY, struct.pack("<IQ", 99, 1))]), "item type: unknown value type 99"),
    "arrays nested without end": (
        craft([kv("a", VT.ARRAY, struct.pack("<IQ", VT.ARRAY, 1) * 100 + struct.pack("<IQ", VT.UINT8, 0))]),
        "nested deeper"),
    "bool that is not 0/1": (craft([kv("a", VT.BOOL, b"\x07")]), "bool value 7"),
    "duplicate key": (craft([kv("a", VT.UINT8, b"\x01"), kv("a", VT.UINT8, b"\x02")]), "duplicate metadata key 'a'"),
    "alignment zero": (craft([kv("general.alignment", VT.UINT32, struct.pack("<I", 0))]), "power of two"),
    "alignment not a power of two": (craft([kv("general.alignment", VT.UINT32, struct.pack("<I", 48))]), "power of two"),
    "alignment of the wrong type": (craft([kv("general.alignment", VT.UINT64, struct.pack("<Q", 32))]), "UINT32"),
    "n_dims zero": (craft(infos=[info("w", (), n_dims=0)]), "n_dims = 0"),
    "n_dims five": (craft(infos=[info("w", (1, 1, 1, 1, 1))]), "n_dims = 5"),
    "negative dimension": (craft(infos=[info("w", (2**63,))]), "does not fit in int64"),
    "unknown ggml type": (craft(infos=[info("w", (4,), ggml_type=31)], data=DATA_4), "unknown ggml type 31"),
    "row not a multiple of the block": (craft(infos=[info("w", (30,), ggml_type=GGMLType.Q8_0)]), "not a multiple of the Q8_0 block size 32"),
    "element count overflows int64": (craft(infos=[info("w", (2**62, 2**62))], data=DATA_4), "outside the 16-byte data section"),
    "exabyte tensor in a tiny file": (craft(infos=[info("w", (2**40, 2**20), ggml_type=GGMLType.Q4_0)], data=DATA_4), "outside"),
    "offset past the end": (craft(infos=[info("w", (4,), offset=2**63)], data=DATA_4), "outside"),
    "offset + size wraps": (craft(infos=[info("w", (4,), offset=2**64 - 32)], data=DATA_4), "outside"),
    "data truncated": (craft(infos=[info("w", (8,))], data=DATA_4), "outside the 16-byte data section"),
    "misaligned offset": (craft(infos=[info("w", (4,), offset=4)], data=DATA_4 * 2), "not a multiple of the alignment 32"),
    "duplicate tensor name": (craft(infos=[info("w", (4,)), info("w", (4,), offset=32)], data=DATA_4 + bytes(16) + DATA_4),
                              "duplicate tensor name 'w'"),
    "overlapping tensors": (craft(infos=[info("a", (16,)), info("b", (16,), offset=32)], data=bytes(96)), "overlap"),
    "tensor name longer than file": (craft(infos=[struct.pack("<Q", 2**50)], data=bytes(32)), "tensor 0 name: string length"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_malformed_file_raises_named_error(tmp_path, case):
    blob, match = CASES[case]
    rejects(tmp_path, blob, match)


def test_well_formed_craft_is_accepted(tmp_path):
    """The crafting helper itself makes valid files, so each case above fails for its own reason."""
    g = parse(tmp_path, craft([kv("a", VT.UINT8, b"\x01")], [F32_4], DATA_4))
    assert g.metadata == {"a": 1} and g.tensors["w"].shape == (4,)


def sample_file(tmp_path) -> tuple[bytes, int]:
    """A valid file with every value kind and several tensor types; returns (bytes, end of the last tensor)."""
    rng = np.random.default_rng(1)
    meta = {"general.architecture": "qwen35", "n": GGUFValue(VT.UINT32, 24), "f": 1.5, "b": True,
            "toks": ["<|endoftext|>", "Ġthe", "é"], "scores": np.float32([0, -1, 2]),
            "nested": GGUFValue(VT.ARRAY, [GGUFValue(VT.ARRAY, [1, 2], VT.INT16)], VT.ARRAY)}
    tensors = {"a": rng.standard_normal((2, 8)).astype(np.float32),
               "q": RawTensor(GGMLType.Q4_K, (1, 256), rng.integers(0, 256, 144, dtype=np.uint8)),
               "h": rng.standard_normal(5).astype(np.float16)}
    path = tmp_path / "valid.gguf"
    write_gguf(path, meta, tensors)
    with read_gguf(path) as g:
        end = max(t.offset + t.nbytes for t in g.tensors.values())
    return path.read_bytes(), end


def test_every_truncation_is_rejected(tmp_path):
    """Cut the file at every byte before the end of the last tensor's data: always a GGUFError."""
    blob, end = sample_file(tmp_path)
    for cut in range(end):
        with pytest.raises(GGUFError):
            parse(tmp_path, blob[:cut])
    parse(tmp_path, blob[:end])  # trailing padding after the last tensor is optional


def read_everything(tmp_path, blob: bytes) -> None:
    """Parse, then touch every tensor's bytes and dequantize it: only GGUFError may come out of parsing."""
    path = tmp_path / "fuzz.gguf"
    path.write_bytes(blob)
    try:
        g = read_gguf(path)
    except GGUFError:
        return
    with g:
        for t in g.tensors.values():
            if t.n_elements <= 1 << 16 and t.ggml_type.name not in ("Q8_1", "Q8_K", "Q1_0", "Q2_0"):
                dequantize(g.raw(t.name), t.ggml_type, t.shape)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_bit_flips_and_truncations(tmp_path, data):
    blob, _ = sample_file(tmp_path)
    blob = bytearray(blob)
    for _ in range(data.draw(st.integers(1, 8), label="n_flips")):
        pos = data.draw(st.integers(0, len(blob) - 1), label="pos")
        blob[pos] ^= 1 << data.draw(st.integers(0, 7), label="bit")
    cut = data.draw(st.integers(0, len(blob)), label="cut")
    read_everything(tmp_path, bytes(blob[:cut]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=st.binary(max_size=200), version=st.sampled_from([2, 3]))
@example(header=struct.pack("<QQ", 0, 1) + s("k") + struct.pack("<I", VT.ARRAY), version=3)
def test_fuzz_random_headers(tmp_path, header, version):
    read_everything(tmp_path, b"GGUF" + struct.pack("<I", version) + header)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(st.sampled_from([0, 1, 2, 3, 4, 8, 9, 12, 31, 32, 2**31, 2**32 - 1, 2**63, U64_MAX]), max_size=30))
@example(words=[1, 0, 0, 3, 0, 1, 1, 0, 0, 0, 0])  # a tensor [2^32, 2^32, 0]: no bytes, but no array has that shape
def test_fuzz_structured_headers(tmp_path, words):
    """Headers made of boundary integers hit the count/length/type checks far more often than random bytes."""
    body = b"".join(struct.pack("<Q", w & U64_MAX) for w in words)
    read_everything(tmp_path, b"GGUF" + struct.pack("<I", 3) + body)
