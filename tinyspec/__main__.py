"""Command line: `python -m tinyspec <command>`.

    inspect FILE.gguf [--json]   metadata and tensor table of a GGUF file

Errors are one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

import numpy as np

from .gguf import GGUFError, GGUFFile, read_gguf

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


def _jsonable(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list):
        return [_jsonable(x) for x in value]
    return value


def inspect_json(g: GGUFFile) -> dict:
    return {
        "metadata": {k: _jsonable(v) for k, v in g.metadata.items()},
        "tensors": [
            {"name": t.name, "type": t.ggml_type.name, "shape": list(t.shape), "offset": t.offset, "nbytes": t.nbytes}
            for t in g.tensors.values()
        ],
    }


def inspect_text(g: GGUFFile) -> str:
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


def cmd_inspect(args) -> int:
    with read_gguf(args.file) as g:
        if args.json:
            json.dump(inspect_json(g), sys.stdout)
            sys.stdout.write("\n")
        else:
            print(inspect_text(g))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tinyspec",
        description="tinyspec: speculative decoding on hybrid Gated-DeltaNet (qwen35) models, every piece readable.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("inspect", help="show a GGUF file's metadata and tensor table",
                       description="Show a GGUF file's metadata (long arrays summarised) and its tensors "
                                   "(name, ggml type, NumPy-order shape, absolute offset, bytes).")
    p.add_argument("file", help="path to a .gguf file")
    p.add_argument("--json", action="store_true",
                   help='print {"metadata": {...}, "tensors": [{"name", "type", "shape", "offset", "nbytes"}]} '
                        "with every array in full")
    p.set_defaults(func=cmd_inspect)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. piped into `head`
        return 0
    except (GGUFError, ValueError, OSError) as e:
        print(f"tinyspec {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
