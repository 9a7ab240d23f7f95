"""A GGUF file told to a reader: what `python -m tinyspec inspect FILE [--json]` prints.

    text   a header line (version, size, alignment, counts); every metadata key with its GGUF type and value
           (arrays longer than LONG_ARRAY: their length, item type and first items); the tensor table (name,
           ggml type, NumPy-order shape, absolute offset, bytes); the count of tensors per type
    json   {"metadata": {...}, "tensors": [{"name", "type", "shape", "offset", "nbytes"}]}, arrays in full

gguf.py reads the container; this module only formats what it read (it never touches tensor data).
"""

from __future__ import annotations

import json
import sys
from collections import Counter

import numpy as np

from .gguf import GGUFFile, read_gguf

LONG_ARRAY = 8  # arrays longer than this are summarised in the text view


def _short(value) -> str:
    """One-line text for a metadata value; long arrays show their length, type and first items."""
    if isinstance(value, np.ndarray):
        items = value.tolist()
        kind = str(value.dtype)
    elif isinstance(value, list):
        items, kind = value, "items"
    else:
        return repr(value)
    if len(items) <= LONG_ARRAY:
        return repr(items)
    head = ", ".join(repr(x) if not isinstance(x, (list, np.ndarray)) else "[...]" for x in items[:4])
    return f"[{head}, ...] ({len(items)} {kind})"


def _jsonable(value):  # a metadata value -> JSON-ready (arrays in full)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list):
        return [_jsonable(x) for x in value]
    return value


def inspect_json(g: GGUFFile) -> dict:
    """The file as plain JSON values (NumPy arrays as lists)."""
    return {
        "metadata": {k: _jsonable(v) for k, v in g.metadata.items()},
        "tensors": [
            {"name": t.name, "type": t.ggml_type.name, "shape": list(t.shape), "offset": t.offset, "nbytes": t.nbytes}
            for t in g.tensors.values()
        ],
    }


def inspect_text(g: GGUFFile) -> str:
    """The file as lines of text, long arrays summarised."""
    lines = [
        f"{g.path}: GGUF v{g.version}, {g.file_size:,} bytes, alignment {g.alignment}, "
        f"{len(g.fields)} metadata keys, {len(g.tensors)} tensors",
        "",
        "metadata:",
    ]
    width = max((len(k) for k in g.metadata), default=0)
    for key, value in g.metadata.items():
        field = g.fields[key]
        kind = f"{field.item_type.name}[]" if field.item_type is not None else field.type.name
        lines.append(f"  {key:<{width}}  {kind:<9} {_short(value)}")
    lines += ["", "tensors:"]
    rows = [("name", "type", "shape", "offset", "bytes")]
    rows += [(t.name, t.ggml_type.name, "x".join(map(str, t.shape)), f"{t.offset:,}", f"{t.nbytes:,}") for t in g.tensors.values()]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        lines.append(f"  {r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]:>{widths[3]}}  {r[4]:>{widths[4]}}")
    counts = Counter(t.ggml_type.name for t in g.tensors.values())
    total = sum(t.nbytes for t in g.tensors.values())
    lines += ["", "types: " + ", ".join(f"{n} x{c}" for n, c in counts.most_common()) + f"; tensor data {total:,} bytes"]
    return "\n".join(lines)


def print_inspect(path: str, as_json: bool = False) -> int:
    """`inspect`: the file at `path` on standard output, as text or (as_json) one JSON object."""
    with read_gguf(path) as g:
        if as_json:
            json.dump(inspect_json(g), sys.stdout)
            sys.stdout.write("\n")
        else:
            print(inspect_text(g))
    return 0
