"""Acceptance over a draft tree: keep a path from the root, so the output law is exactly the target's.

The tree (tree.py): row 0 is the pending token, draft i is row i, the token after row parents[i-1]. The
verify pass gives, per row r, the target's law p_rows[r] of the token after r's path. A node's children
c_1..c_m (row order) are its candidates x_1..x_m for that token, each with its proposal law q_j
(None: one-hot on x_j, a deterministic candidate). Starting at the root, with r the law still to match:

    r_0 = p_rows[row]
    for j = 1..m:   accept c_j with probability min(1, r_{j-1}(x_j) / q_j(x_j))      (one uniform)
                    accepted: emit x_j, move to c_j, start again there with r_0 = p_rows[c_j]
                    rejected: r_j = residual(r_{j-1}, q_j, x_j) = max(0, r_{j-1} - q_j) / Z_j
    all rejected:   emit x ~ r_m (the correction) and stop; a row with no children: x ~ p_rows[row] (the bonus)

This is recursive rejection sampling: SpecInfer's "multi-step speculative sampling" (Miao et al. 2024,
"SpecInfer: Accelerating Large Language Model Serving with Tree-based Speculative Inference and
Verification", arXiv:2305.09781), there with i.i.d. candidates from one q. SpecTr (Sun et al. 2023,
arXiv:2310.15141) studies the same multi-draft setting and replaces this rule by an optimal-transport one.
A chain (one child per row) is exactly spec_sampling.verify_step: the same uniforms in the same order.

Why the emitted token at one node has the law r_0 = p_rows[row] (write r for r_{j-1}, q for q_j):
    Condition: every candidate is drafted before verification (so independently of the coins), x_j drawn
    from q_j given the path to it and the earlier candidates at its node (q_j may depend on them): i.i.d.
    draws from one q, as SpecInfer; or a deterministic token, q_j one-hot on it, e.g. an n-gram
    continuation or the top-n of a greedy head.
    Claim, by induction on the candidates left: with candidates j..m left and law r, the node emits x ~ r.
    No candidate left: x ~ r_m is sampled directly.                                                   (base)
    Stage j is one ordinary speculative step (spec_sampling.py) of the draft x_j ~ q against r:
        P(accept and x) = q(x) min(1, r(x) / q(x))               = min(r(x), q(x))
        P(reject)       = sum_x max(0, q - r) = sum_x max(0, r - q) = Z_j            (both laws sum to 1)
        P(reject and x) = Z_j * r_j(x) = max(0, r(x) - q(x))   (by induction: the stages left emit r_j)
        P(x)            = min(r, q) + max(0, r - q)              = r(x)                               QED
    An accepted x_j moves the walk to c_j, whose own subtree was drafted for the path ending in x_j (drawn
    before verification, conditioned on that path only), so the claim holds again there with p_rows[c_j],
    the target's law after that path. So every emitted token has the target's conditional law given the
    tokens before it, exactly as for a chain; the run stops at the first node that emits a non-draft token.

Two consequences the tree builders rely on:
    (a) Two one-hot candidates with the same token x at one node: if the first is rejected, r'(x) = 0
        (the one-hot residual is r with x removed), so the second is accepted with probability r'(x) = 0,
        and its residual max(0, r' - onehot(x)) / Z = r' leaves the law unchanged. The second row is never
        kept and changes nothing: builders may merge the two into one row (children joined under it).
    (b) A candidate with a non-one-hot q must not be merged or dropped, even when its token repeats an
        earlier sibling's: its stage still changes the residual (r_j = max(0, r - q_j) / Z_j subtracts all
        of q_j, not just x_j), and dropping it after seeing its token conditions the draws that are left.

Temperature 0 (every p_rows[r] one-hot on g_r = argmax) is exactly verify_tree_greedy whatever the uniforms:
a candidate x != g has r(x) = 0, so it is rejected and the residual stays one-hot on g (max(0, onehot(g) - q)
is nonzero only at g); the first candidate equal to g is accepted with probability min(1, 1 / q(g)) = 1 > u;
with none equal, the correction is g. Nothing is rounded (spec_sampling.py says why that matters).

Official implementation: SpecInfer's token-tree verifier (FlexFlow Serve); not compared against it here.

Does NOT include: the drafters that build trees (EAGLE-2's reranking, Medusa heads), optimal-transport
multi-draft acceptance (SpecTr's k-sequential selection), or typical acceptance (Medusa).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .sampling import sample
from .spec_sampling import accept_draft, residual
from .tree import check_parents, children


def verify_tree_greedy(logits: np.ndarray, tokens: Sequence[int], parents: Sequence[int]) -> tuple[list[int], int]:
    """verify_tree at temperature 0, read straight from the target's logits [n + 1, N] (row r: the logits for the
    token after row r's path). From the root, move to the first child (row order) whose token is the argmax of the
    current row; stop when none is. Returns (path, next_token): the kept rows [0, r1, r2, ...] (len(path) - 1
    drafts accepted) and the argmax of the path's last row (the correction, or the bonus when it has no children).
    np.argmax takes the first maximum on ties, as spec_sampling.verify_greedy and the one-hot greedy law do."""
    n = len(tokens)
    if len(parents) != n or len(logits) != n + 1:
        raise ValueError(f"{n} drafts need {n} parents and {n + 1} logit rows, got {len(parents)} and {len(logits)}")
    kids = children(check_parents(parents))  # per row its children, in row order
    top = np.argmax(logits, axis=-1)  # [n + 1]
    path = [0]
    while True:
        best = int(top[path[-1]])
        match = next((child for child in kids[path[-1]] if int(tokens[child - 1]) == best), None)
        if match is None:
            return path, best
        path.append(match)


def verify_tree(p_rows: Sequence[np.ndarray], tokens: Sequence[int], parents: Sequence[int],
                q_rows: Sequence[np.ndarray | None], rng: np.random.Generator) -> tuple[list[int], int]:
    """Walk the tree from the root by recursive rejection sampling (module docstring); return (path, next_token).

    p_rows: n + 1 target laws [N]; p_rows[r] is the law of the token after row r's path
    tokens: the n draft ids (draft i = row i); parents: their n parent rows (parents[i - 1] < i)
    q_rows: per draft its proposal law [N], or None (a deterministic draft: one-hot on its token)

    path: the kept rows from the root, [0, r1, r2, ...]; the emitted tokens are tokens[r - 1] for r in path[1:],
    then next_token: the correction drawn from the last residual, or the bonus drawn from p_rows[path[-1]] when
    that row has no children. One uniform per candidate tried, one for next_token.
    """
    n = len(tokens)
    if len(parents) != n or len(p_rows) != n + 1 or len(q_rows) != n:
        raise ValueError(f"{n} drafts need {n} parents, {n + 1} target rows and {n} draft rows, "
                         f"got {len(parents)}, {len(p_rows)} and {len(q_rows)}")
    kids = children(check_parents(parents))  # per row its children, in row order
    path = [0]
    while True:
        law = p_rows[path[-1]]  # [N], the law the current node's token must have
        for child in kids[path[-1]]:
            q_draft, token = q_rows[child - 1], int(tokens[child - 1])
            if accept_draft(law, q_draft, token, rng):
                path.append(child)
                break
            law = residual(law, q_draft, token)
        else:  # every child rejected (or none): the correction, or the bonus
            return path, sample(law, rng)
