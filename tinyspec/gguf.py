"""GGUF container: read (memory-mapped, zero-copy) and write. Never dequantizes (see quants/).

File layout (all little-endian; v2 and v3 share it, v1 used u32 counts and is not read):

    offset  size       field
    0       4          magic b"GGUF"
    4       4          version u32 (2 or 3)
    8       8          n_tensors u64
    16      8          n_kv u64
    24      ...        n_kv x  { key: string, value_type: u32, value }
            ...        n_tensors x { name: string, n_dims: u32, ne: u64[n_dims], ggml_type: u32, offset: u64 }
            pad        zeros up to a multiple of `general.alignment` (default 32)
    data    ...        tensor bytes; each tensor at data + offset, offsets multiples of the alignment

    string  = { len: u64, utf-8 bytes[len] }
    value   = scalar of value_type | array { item_type: u32, count: u64, items[count] } (arrays nest)

ne[0] is the contiguous axis, so NumPy shape = reversed(ne): a [rows, cols] weight has ne = (cols, rows).

A GGUF is untrusted input. Every count, length, offset and dimension is checked against the bytes
that remain before anything is allocated or read, Python ints make every product exact (no
overflow), and every failure is a GGUFError naming the field and the byte offset. Cost: the parse
visits each header byte once, so it is linear in the header size and bounded by the file size.

Reference: ggml `ggml/src/gguf.cpp` (gguf_init_from_file_impl, gguf_write_to_buf) and gguf-py
`gguf_reader.py` / `gguf_writer.py`. Does NOT include: big-endian files (refused with a clear
error), GGUF v1, writing in place.
"""

from __future__ import annotations

import enum
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, NamedTuple

import numpy as np

from .quants.types import GGMLType

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
_U64 = struct.Struct("<Q")
MAX_ARRAY_NESTING = 8  # deeper nesting than this is refused (a hostile file could recurse without end)


class GGUFError(ValueError):
    """The file is not a well-formed GGUF; the message names the field and offset."""


class GGUFValueType(enum.IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# fixed-size value types -> little-endian NumPy dtype
SCALAR_DTYPE = {
    GGUFValueType.UINT8: np.dtype("<u1"), GGUFValueType.INT8: np.dtype("<i1"),
    GGUFValueType.UINT16: np.dtype("<u2"), GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"), GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.UINT64: np.dtype("<u8"), GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT32: np.dtype("<f4"), GGUFValueType.FLOAT64: np.dtype("<f8"),
    GGUFValueType.BOOL: np.dtype("<u1"),
}


@dataclass(frozen=True)
class GGUFValue:
    """A metadata value with its GGUF type, so a file can be written back exactly as it was read.

    type: the value's type. For ARRAY, item_type is the items' type and value is a list of items:
    plain Python values for scalar items, GGUFValue for nested arrays (each keeps its own item_type).
    """

    type: GGUFValueType
    value: Any
    item_type: GGUFValueType | None = None

    def to_python(self) -> Any:
        """Plain value: numbers/bools/str; arrays of numbers as a NumPy array, of strings as a list."""
        if self.type != GGUFValueType.ARRAY:
            return self.value
        if self.item_type == GGUFValueType.ARRAY:
            return [item.to_python() for item in self.value]
        if self.item_type == GGUFValueType.STRING:
            return list(self.value)
        if self.item_type == GGUFValueType.BOOL:
            return np.asarray(self.value, dtype=bool)
        return np.asarray(self.value, dtype=SCALAR_DTYPE[self.item_type].newbyteorder("="))


class TensorInfo(NamedTuple):
    name: str
    ggml_type: GGMLType
    shape: tuple[int, ...]  # NumPy order: ggml ne reversed
    offset: int  # absolute byte offset of the data in the file
    nbytes: int

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=object)) if self.shape else 1


class RawTensor(NamedTuple):
    """A tensor to write: its type, NumPy-order shape and exactly its bytes (uint8 or any array).

    data may also be a zero-argument callable returning those bytes: write_gguf then calls it only
    when it reaches the tensor, so a converter can stream a model larger than memory.
    """

    ggml_type: GGMLType
    shape: tuple[int, ...]
    data: Any


# ---------------------------------------------------------------------------------------------- reading


class _Cursor:
    """Bounds-checked little-endian reads from a buffer. Every read names what it reads."""

    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def take(self, n: int, what: str) -> int:
        """Reserve n bytes at the cursor; return their start offset."""
        if n < 0 or n > self.size - self.pos:
            raise GGUFError(f"truncated file: {what} at offset {self.pos} needs {n} bytes, {self.size - self.pos} remain")
        start, self.pos = self.pos, self.pos + n
        return start

    def scalar(self, fmt: str, what: str):
        start = self.take(struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self.buf, start)[0]

    def u32(self, what: str) -> int:
        return self.scalar("<I", what)

    def u64(self, what: str) -> int:
        return self.scalar("<Q", what)

    def string(self, what: str) -> str:
        n = self.u64(f"{what} length")
        if n > self.size - self.pos:
            raise GGUFError(f"{what}: string length {n} at offset {self.pos - 8} is longer than the {self.size - self.pos} bytes left")
        start = self.take(n, what)
        # surrogateescape keeps any byte sequence, so a file round-trips even with invalid UTF-8.
        return bytes(self.buf[start:start + n]).decode("utf-8", errors="surrogateescape")

    def strings(self, count: int, what: str) -> list[str]:
        """`count` strings back to back: string() unrolled, since a vocabulary has ~250k of them."""
        buf, size, pos, out = self.buf, self.size, self.pos, []
        unpack_len = _U64.unpack_from
        for i in range(count):
            if size - pos < 8:
                raise GGUFError(f"truncated file: {what}[{i}] length at offset {pos} needs 8 bytes, {size - pos} remain")
            (n,) = unpack_len(buf, pos)
            pos += 8
            if n > size - pos:
                raise GGUFError(f"{what}[{i}]: string length {n} at offset {pos - 8} is longer than the {size - pos} bytes left")
            out.append(buf[pos:pos + n].decode("utf-8", errors="surrogateescape"))
            pos += n
        self.pos = pos
        return out

    def value_type(self, what: str) -> GGUFValueType:
        at = self.pos
        raw = self.u32(what)
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise GGUFError(f"{what}: unknown value type {raw} at offset {at}") from None

    def value(self, vtype: GGUFValueType, what: str, depth: int = 0) -> GGUFValue:
        if vtype == GGUFValueType.STRING:
            return GGUFValue(vtype, self.string(what))
        if vtype == GGUFValueType.ARRAY:
            return self.array(what, depth)
        at = self.pos
        dtype = SCALAR_DTYPE[vtype]
        start = self.take(dtype.itemsize, what)
        v = np.frombuffer(self.buf, dtype, 1, start)[0].item()
        if vtype == GGUFValueType.BOOL:
            if v not in (0, 1):
                raise GGUFError(f"{what}: bool value {v} at offset {at} is neither 0 nor 1")
            v = bool(v)
        return GGUFValue(vtype, v)

    def array(self, what: str, depth: int) -> GGUFValue:
        if depth >= MAX_ARRAY_NESTING:
            raise GGUFError(f"{what}: arrays nested deeper than {MAX_ARRAY_NESTING} at offset {self.pos}")
        item_type = self.value_type(f"{what} item type")
        count = self.u64(f"{what} count")
        left = self.size - self.pos
        # the smallest encoding of one item bounds the count before any list is built
        min_item = {GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 12}.get(item_type) or SCALAR_DTYPE[item_type].itemsize
        if count * min_item > left:
            raise GGUFError(f"{what}: array of {count} {item_type.name} items needs at least {count * min_item} bytes, {left} remain")
        if item_type in SCALAR_DTYPE:
            dtype = SCALAR_DTYPE[item_type]
            start = self.take(count * dtype.itemsize, what)
            items = np.frombuffer(self.buf, dtype, count, start)
            if item_type == GGUFValueType.BOOL:
                if np.any(items > 1):
                    raise GGUFError(f"{what}: bool array item is neither 0 nor 1 (array at offset {start})")
                return GGUFValue(GGUFValueType.ARRAY, items.astype(bool).tolist(), item_type)
            return GGUFValue(GGUFValueType.ARRAY, items.tolist(), item_type)
        if item_type == GGUFValueType.STRING:
            return GGUFValue(GGUFValueType.ARRAY, self.strings(count, what), item_type)
        items = [self.array(f"{what}[{i}]", depth + 1) for i in range(count)]
        return GGUFValue(GGUFValueType.ARRAY, items, item_type)


def _parse_tensor_info(cur: _Cursor, index: int) -> tuple[str, GGMLType, tuple[int, ...], int]:
    name = cur.string(f"tensor {index} name")
    what = f"tensor {index} ({name!r})"
    n_dims = cur.u32(f"{what} n_dims")
    if not 1 <= n_dims <= MAX_DIMS:
        raise GGUFError(f"{what}: n_dims = {n_dims}, must be 1..{MAX_DIMS}")
    ne = [cur.u64(f"{what} ne[{d}]") for d in range(n_dims)]
    if any(n >= 2**63 for n in ne):
        raise GGUFError(f"{what}: dimension {ne} does not fit in int64 (negative as ggml reads it)")
    if 0 in ne and int(np.prod([n for n in ne if n], dtype=object)) >= 2**63:  # no bytes (a zero dimension), but
        raise GGUFError(f"{what}: dimensions {ne} multiply past int64")  # no array has that shape (otherwise the
        # bytes it needs do not fit the data section: checked with the offsets below)
    type_at = cur.pos
    raw_type = cur.u32(f"{what} ggml type")
    try:
        ggml_type = GGMLType(raw_type)
    except ValueError:
        raise GGUFError(f"{what}: unknown ggml type {raw_type} at offset {type_at}") from None
    rel_offset = cur.u64(f"{what} data offset")
    if ne[0] % ggml_type.block_size:
        raise GGUFError(f"{what}: row length ne[0] = {ne[0]} is not a multiple of the {ggml_type.name} block size {ggml_type.block_size}")
    return name, ggml_type, tuple(reversed(ne)), rel_offset


class GGUFFile:
    """A parsed GGUF file; tensor data stays in the memory map until `raw(name)` views it.

    .version, .alignment, .data_offset (absolute start of the data section), .file_size
    .fields    key -> GGUFValue (typed, for writing back)
    .metadata  key -> plain Python value (GGUFValue.to_python)
    .tensors   name -> TensorInfo, in file order
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        try:
            with open(self.path, "rb") as f:
                self.file_size = os.fstat(f.fileno()).st_size
                if self.file_size < 24:
                    head = f.read(4)
                    if head != GGUF_MAGIC:
                        raise GGUFError(f"not a GGUF file: magic {head!r}, expected {GGUF_MAGIC!r}")
                    raise GGUFError(f"truncated file: header needs 24 bytes, file has {self.file_size}")
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise GGUFError(f"cannot open {self.path}: {e.strerror or e}") from None
        try:
            self._parse(_Cursor(self._mmap, self.file_size))
        except GGUFError:
            self.close()
            raise

    def _parse(self, cur: _Cursor) -> None:
        magic = bytes(self._mmap[0:4])
        cur.take(4, "magic")
        if magic != GGUF_MAGIC:
            raise GGUFError(f"not a GGUF file: magic {magic!r}, expected {GGUF_MAGIC!r}")
        self.version = cur.u32("version")
        if self.version not in (2, 3):
            swapped = int.from_bytes(self.version.to_bytes(4, "little"), "big")
            if swapped in (2, 3):
                raise GGUFError(f"big-endian GGUF (version {swapped}) is not supported; convert it to little-endian")
            raise GGUFError(f"unsupported GGUF version {self.version} (supported: 2, 3)")
        n_tensors = cur.u64("n_tensors")
        n_kv = cur.u64("n_kv")
        left = self.file_size - cur.pos
        if n_kv > left // 13:  # smallest KV: 8-byte key length + 4-byte type + 1-byte value
            raise GGUFError(f"n_kv = {n_kv} cannot fit in the {left} bytes after the header")
        if n_tensors > left // 24:  # smallest info: 8-byte name length + n_dims + type + offset
            raise GGUFError(f"n_tensors = {n_tensors} cannot fit in the {left} bytes after the header")

        self.fields: dict[str, GGUFValue] = {}
        for i in range(n_kv):
            key = cur.string(f"metadata key {i}")
            if key in self.fields:
                raise GGUFError(f"duplicate metadata key {key!r} (entry {i})")
            self.fields[key] = cur.value(cur.value_type(f"type of {key!r}"), f"value of {key!r}")

        self.alignment = DEFAULT_ALIGNMENT
        if "general.alignment" in self.fields:
            align = self.fields["general.alignment"]
            if align.type != GGUFValueType.UINT32 or align.value == 0 or align.value & (align.value - 1):
                raise GGUFError(f"general.alignment must be a non-zero power of two UINT32, got {align.type.name} {align.value!r}")
            self.alignment = align.value

        infos = []
        for i in range(n_tensors):
            infos.append(_parse_tensor_info(cur, i))
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        data_size = self.file_size - self.data_offset
        if infos and data_size < 0:
            raise GGUFError(f"truncated file: data section starts at {self.data_offset}, file has {self.file_size} bytes")

        self.tensors: dict[str, TensorInfo] = {}
        for name, ggml_type, shape, rel_offset in infos:
            if name in self.tensors:
                raise GGUFError(f"duplicate tensor name {name!r}")
            n_elements = int(np.prod(shape, dtype=object))
            nbytes = n_elements // ggml_type.block_size * ggml_type.type_size
            if rel_offset % self.alignment:
                raise GGUFError(f"tensor {name!r}: data offset {rel_offset} is not a multiple of the alignment {self.alignment}")
            if rel_offset > data_size or nbytes > data_size - rel_offset:
                raise GGUFError(
                    f"tensor {name!r}: data [{rel_offset}, {rel_offset + nbytes}) lies outside the {data_size}-byte data section"
                )
            self.tensors[name] = TensorInfo(name, ggml_type, shape, self.data_offset + rel_offset, nbytes)
        spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in self.tensors.values() if t.nbytes)
        for (_, end_a, name_a), (start_b, _, name_b) in zip(spans, spans[1:]):
            if start_b < end_a:
                raise GGUFError(f"tensors {name_a!r} and {name_b!r} overlap in the data section")
        self.metadata: dict[str, Any] = {k: v.to_python() for k, v in self.fields.items()}

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view of the memory map (no copy)."""
        if name not in self.tensors:
            raise KeyError(f"no tensor named {name!r} in {self.path}")
        if self._mmap is None:
            raise ValueError(f"{self.path} is closed")
        t = self.tensors[name]
        return np.frombuffer(self._mmap, np.uint8, t.nbytes, t.offset)

    def close(self) -> None:
        mm, self._mmap = getattr(self, "_mmap", None), None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # views from raw() are still alive; the map is freed when the last one goes

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFFile({self.path!r}, v{self.version}, {len(self.fields)} keys, {len(self.tensors)} tensors)"


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Parse a GGUF file's header and memory-map its tensor data. Raises GGUFError on any malformed input."""
    return GGUFFile(path)


# ---------------------------------------------------------------------------------------------- writing


def _int_type(lo: int, hi: int) -> GGUFValueType:
    """The first of INT32, UINT32, INT64, UINT64 that holds every integer in [lo, hi]."""
    for t in (GGUFValueType.INT32, GGUFValueType.UINT32, GGUFValueType.INT64, GGUFValueType.UINT64):
        info = np.iinfo(SCALAR_DTYPE[t])
        if info.min <= lo and hi <= info.max:
            return t
    raise ValueError(f"integers in [{lo}, {hi}] do not fit in 64 bits")


def _infer_value(v: Any) -> GGUFValue:
    """Plain Python/NumPy value -> GGUFValue. bool->BOOL, int->INT32 (or UINT32/INT64/UINT64 by range),
    float->FLOAT32, str->STRING, list/ndarray->ARRAY. Pass a GGUFValue to choose the type yourself."""
    if isinstance(v, GGUFValue):
        return v
    if isinstance(v, (bool, np.bool_)):
        return GGUFValue(GGUFValueType.BOOL, bool(v))
    if isinstance(v, (int, np.integer)):
        return GGUFValue(_int_type(int(v), int(v)), int(v))
    if isinstance(v, (float, np.floating)):
        return GGUFValue(GGUFValueType.FLOAT32, float(v))
    if isinstance(v, str):
        return GGUFValue(GGUFValueType.STRING, v)
    if isinstance(v, np.ndarray):
        by_dtype = {dt.newbyteorder("="): t for t, dt in SCALAR_DTYPE.items() if t != GGUFValueType.BOOL}
        item_type = GGUFValueType.BOOL if v.dtype == bool else by_dtype.get(v.dtype.newbyteorder("="))
        if item_type is None or v.ndim != 1:
            raise ValueError(f"cannot store a {v.ndim}-D {v.dtype} array as GGUF metadata")
        return GGUFValue(GGUFValueType.ARRAY, v.tolist(), item_type)
    if isinstance(v, (list, tuple)):
        items = [_infer_value(x) for x in v]
        ints = (GGUFValueType.INT32, GGUFValueType.UINT32, GGUFValueType.INT64, GGUFValueType.UINT64)
        types = {GGUFValueType.INT64 if x.type in ints else x.type for x in items}
        if len(types) > 1:
            raise ValueError(f"array items must share one type, got {sorted(t.name for t in types)}")
        item_type = types.pop() if types else GGUFValueType.UINT8
        if item_type == GGUFValueType.ARRAY:
            return GGUFValue(GGUFValueType.ARRAY, items, item_type)
        if item_type in ints:  # the narrowest integer type that holds every item
            item_type = _int_type(min(x.value for x in items), max(x.value for x in items))
        return GGUFValue(GGUFValueType.ARRAY, [x.value for x in items], item_type)
    raise ValueError(f"cannot store a {type(v).__name__} as GGUF metadata")


def _encode_string(s: str) -> bytes:
    b = s.encode("utf-8", errors="surrogateescape")
    return struct.pack("<Q", len(b)) + b


def _encode_value(v: GGUFValue) -> bytes:
    """The bytes of a value (without its leading type tag)."""
    if v.type == GGUFValueType.STRING:
        return _encode_string(v.value)
    if v.type == GGUFValueType.ARRAY:
        head = struct.pack("<IQ", v.item_type, len(v.value))
        if v.item_type == GGUFValueType.STRING:
            return head + b"".join(_encode_string(s) for s in v.value)
        if v.item_type == GGUFValueType.ARRAY:
            return head + b"".join(_encode_value(x) for x in v.value)
        return head + _pack_numbers(v.value, v.item_type)
    return _pack_numbers([v.value], v.type)


def _pack_numbers(values, vtype: GGUFValueType) -> bytes:
    dtype = SCALAR_DTYPE[vtype]
    if vtype not in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64, GGUFValueType.BOOL):
        info = np.iinfo(dtype)
        if any(not info.min <= int(x) <= info.max for x in values):
            raise ValueError(f"value out of range for {vtype.name}")
    return np.asarray(values, dtype=dtype).tobytes()


def _as_raw_tensor(name: str, t: Any) -> RawTensor:
    if isinstance(t, RawTensor):
        return t
    if isinstance(t, np.ndarray):
        by_dtype = {np.dtype(np.float32): GGMLType.F32, np.dtype(np.float16): GGMLType.F16,
                    np.dtype(np.float64): GGMLType.F64, np.dtype(np.int8): GGMLType.I8,
                    np.dtype(np.int16): GGMLType.I16, np.dtype(np.int32): GGMLType.I32,
                    np.dtype(np.int64): GGMLType.I64}
        if t.dtype.newbyteorder("=") not in by_dtype:
            raise ValueError(f"tensor {name!r}: no GGML type for dtype {t.dtype}; pass a RawTensor")
        return RawTensor(by_dtype[t.dtype.newbyteorder("=")], t.shape, t.astype(t.dtype.newbyteorder("<")))
    raise ValueError(f"tensor {name!r}: expected a NumPy array or RawTensor, got {type(t).__name__}")


def write_gguf(path: str | os.PathLike, metadata: Mapping[str, Any], tensors: Mapping[str, Any] | Iterable = (),
               *, version: int = 3) -> None:
    """Write a GGUF file: metadata in the given order, then tensor infos, then aligned tensor data.

    metadata: key -> GGUFValue, or a plain value whose type is inferred (see _infer_value).
              `general.alignment` (UINT32 power of two), if present, sets the alignment.
    tensors:  name -> NumPy array (F32/F16/F64/I8..I64 by dtype) or RawTensor(ggml_type, shape, bytes).
    The layout matches llama.cpp's and gguf-py's writers: every tensor's data is padded to the alignment.
    """
    fields = {k: _infer_value(v) for k, v in metadata.items()}
    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in fields:
        a = fields["general.alignment"]
        if a.type != GGUFValueType.UINT32 or a.value <= 0 or a.value & (a.value - 1):
            raise ValueError("general.alignment must be a UINT32 power of two")
        alignment = a.value
    items = list(tensors.items()) if isinstance(tensors, Mapping) else list(tensors)
    raws = [(name, _as_raw_tensor(name, t)) for name, t in items]

    header = bytearray(GGUF_MAGIC + struct.pack("<IQQ", version, len(raws), len(fields)))
    for key, v in fields.items():
        header += _encode_string(key) + struct.pack("<I", v.type) + _encode_value(v)
    offset, sizes = 0, []
    for name, t in raws:
        shape = tuple(int(s) for s in t.shape)
        qtype = GGMLType(t.ggml_type)
        n = int(np.prod(shape, dtype=object)) if shape else 1
        if n % qtype.block_size or (shape and shape[-1] % qtype.block_size):
            raise ValueError(f"tensor {name!r}: row length {shape[-1]} is not a multiple of the {qtype.name} block size")
        nbytes = n // qtype.block_size * qtype.type_size
        if not callable(t.data):  # check eagerly what can be checked before writing anything
            _tensor_bytes(name, qtype, shape, t.data, nbytes)
        ne = tuple(reversed(shape)) or (1,)
        header += _encode_string(name) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, qtype, offset)
        sizes.append(nbytes)
        offset += -(-nbytes // alignment) * alignment
    header += bytes(-len(header) % alignment)
    with open(path, "wb") as f:
        f.write(header)
        for (name, t), nbytes in zip(raws, sizes):
            data = _tensor_bytes(name, GGMLType(t.ggml_type), t.shape, t.data() if callable(t.data) else t.data, nbytes)
            f.write(data.tobytes())
            f.write(bytes(-nbytes % alignment))


def _tensor_bytes(name: str, qtype: GGMLType, shape, data, nbytes: int) -> np.ndarray:
    data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if data.size != nbytes:
        raise ValueError(f"tensor {name!r}: {qtype.name} {tuple(shape)} needs {nbytes} bytes, got {data.size}")
    return data
