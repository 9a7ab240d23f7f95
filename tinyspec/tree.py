"""A draft tree: several guesses for the next tokens, verified in one pass.

A chain proposes d_1..d_k, each the guess for the token after the one before it. A tree proposes several
guesses at a point: a node is one draft token, and its parent is the token it follows. The verify pass feeds
the pending token and every node, one row each, in topological order (a parent before its children):

    row 0            the pending token (the root: chosen, not yet fed)
    row i (1..n)     draft i, the token after row parents[i-1]      parents[i-1] < i

    parents (0, 1, 2)          the chain d_1 d_2 d_3             0 - 1 - 2 - 3
    parents (0, 0, 1, 1, 3)    two guesses after the pending     0 - 1 - 3 - 5
                               token, two after the first        |    `- 4
                                                                 `- 2

Row i sits at position pos + depth(i) (pos: the tokens its sequence holds before the pass) and must compute
exactly what a one-token decode of its path (the root, its ancestors, itself) computes there: its attention
sees the prefix and its ancestors only, and the Gated DeltaNet state it starts from is its parent's state
after the parent's token (gdn.gdn_recurrent_tree). After acceptance a path from the root is kept (spec_tree.py),
and the sequence is rolled back to it: the GDN state of the path's last row from the ring, the path's KV rows
moved to the positions a plain decode would have written (state.ModelState.keep_path).

Official implementation of the idea: SpecInfer (Miao et al. 2024, token-tree verification), Medusa and
EAGLE-2 (draft trees over a transformer: a mask); SGLang's GDN kernels take parent indices (docs/peers.md).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def chain_parents(k: int) -> tuple[int, ...]:
    """The chain of k drafts as a tree: draft i follows row i - 1."""
    return tuple(range(k))


def check_parents(parents: Sequence[int]) -> tuple[int, ...]:
    """parents as a tuple of ints, each draft's parent an earlier row (0 .. i-1 for draft i); else a ValueError."""
    out = tuple(int(p) for p in parents)
    for i, p in enumerate(out, start=1):
        if not 0 <= p < i:
            raise ValueError(f"draft {i}'s parent must be a row before it (0 .. {i - 1}), got {p}")
    return out


def is_chain(parents: Sequence[int]) -> bool:
    return all(int(p) == i for i, p in enumerate(parents))


def depths(parents: Sequence[int]) -> np.ndarray:  # n parents -> [n + 1] depths, row 0 (the root) at 0
    """Each row's depth: how many drafts its path holds (its position is pos + depth)."""
    out = np.zeros(len(parents) + 1, np.int64)
    for i, p in enumerate(parents, start=1):
        out[i] = out[p] + 1
    return out


def path_to(parents: Sequence[int], row: int) -> list[int]:
    """The rows from the root to `row`, root first: [0, ..., row]."""
    path = [int(row)]
    while path[-1]:
        path.append(int(parents[path[-1] - 1]))
    return path[::-1]


def children(parents: Sequence[int]) -> list[list[int]]:
    """Per row (0 .. n) its children's rows, in row order (the order acceptance tries them)."""
    out: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents, start=1):
        out[p].append(i)
    return out


def levels(parents: Sequence[int]) -> list[np.ndarray]:
    """The rows grouped by depth, shallowest first: every row's parent is in the level before its own, so a level's
    rows can be computed together once the previous level is done."""
    d = depths(parents)
    return [np.flatnonzero(d == level) for level in range(int(d.max()) + 1)]


def draw(parents: Sequence[int], tokens: Sequence[int], pending: int | None = None) -> str:
    """The tree as text, one row a line, indented by depth: how notebooks and error messages show it."""
    d, lines = depths(parents), []
    order = []

    def visit(row: int, kids: list[list[int]]) -> None:
        order.append(row)
        for child in kids[row]:
            visit(child, kids)

    visit(0, children(parents))
    for row in order:
        token = ("pending" if pending is None else str(pending)) if row == 0 else str(tokens[row - 1])
        lines.append(f"{'  ' * int(d[row])}{'' if row == 0 else '`- '}[{row}] {token}")
    return "\n".join(lines)
