"""Speculative sampling: accept a drafted token or draw a correction, so the output law is exactly the target's.

Letters (the two papers swap them, so we say it once and name every variable after its model):
    p_target  the target model's law for the next token     (Leviathan et al. 2023: p;  Chen et al. 2023: q)
    q_draft   the drafter's proposal law the token came from (Leviathan et al. 2023: q;  Chen et al. 2023: p)
    None for q_draft means a deterministic draft: q_draft is one-hot on the drafted token.

One draft d ~ q_draft, checked against p_target:

    accept d   with probability a(d) = min(1, p_target(d) / q_draft(d))        (one uniform u: u < a(d))
    otherwise  emit x ~ residual(x) = max(0, p_target(x) - q_draft(x)) / Z,  Z = sum_x max(0, p_target(x) - q_draft(x))

Why the emitted token has law p_target (write p, q for p_target(x), q_draft(x)):
    P(accepted and x) = q * min(1, p / q)                        = min(p, q)
    P(rejected)       = sum_d q(d) (1 - a(d)) = sum max(0, q - p) = sum max(0, p - q) = Z   (both laws sum to 1)
    P(rejected and x) = Z * max(0, p - q) / Z                      = max(0, p - q)
    P(x)              = min(p, q) + max(0, p - q)                  = p                                   QED
With k drafts, position i repeats this with p_i, q_i conditioned on the accepted prefix; if all k are
accepted, the bonus token is drawn from p_k. So every emitted token has the target's conditional law.

Temperature 0 is exact greedy, not just in law: p_target is one-hot on g = argmax, so a(d) is exactly 1
(d == g) or 0 (d != g) and u < 1 / u < 0 decide it whatever u is; the residual max(0, p - q) is nonzero
only at g, so the correction is g. Nothing is rounded: both tests compare against exact 0 and 1
(jaymody/speculative-sampling issue #3 is what happens when greedy p is a full softmax instead).

Deterministic drafts (q_draft one-hot on d): accept with probability p_target(d); the residual is p_target
with d removed. That is exactly "sample x ~ p_target; accept iff x == d; else emit x", which is how
llama.cpp verifies MTP / draft-model / n-gram drafts (common/sampling.cpp, docs/qwen35.md 5.3).

Papers: Leviathan, Kalman, Matias 2023, "Fast Inference from Transformers via Speculative Decoding"
(arXiv:2211.17192), Algorithm 1, proof in Appendix A.1; Chen et al. 2023, "Accelerating Large Language
Model Decoding with Speculative Sampling" (arXiv:2302.01318), Algorithm 2 and Theorem 1.
Official implementation: llama.cpp examples/speculative/speculative.cpp (accept :317, residual :330-352).

Does NOT include: tree / multi-candidate verification (spec_tree.py builds it on this rule), typical
acceptance (Medusa), or lossy relaxations of the rule.
"""

from __future__ import annotations

import numpy as np

from .sampling import sample


def accept_probability(p_target: np.ndarray, q_draft: np.ndarray | None, token: int) -> float:
    """a(d) = min(1, p_target(d) / q_draft(d)); q_draft None = one-hot on token, so a(d) = p_target(d).

    p_target(d) == 0 gives 0 even if q_draft(d) == 0 too: a token the target rules out is never accepted.
    """
    p_tok = float(p_target[token])
    q_tok = 1.0 if q_draft is None else float(q_draft[token])
    if p_tok <= 0.0:
        return 0.0
    if p_tok >= q_tok:  # also covers q_draft(d) == 0 (a draft q could not have made): ratio +inf
        return 1.0
    return p_tok / q_tok  # < 1, no overflow


def accept_draft(p_target: np.ndarray, q_draft: np.ndarray | None, token: int, rng: np.random.Generator) -> bool:
    """Accept `token` with probability min(1, p_target[token] / q_draft[token]).

    Draws exactly one uniform whatever the outcome, so the RNG stream does not depend on the branch.
    Greedy (p_target one-hot): a(d) is exactly 1 or 0 and u in [0, 1), so accept iff p_target[token] == 1.
    """
    u = rng.random()  # in [0, 1)
    return u < accept_probability(p_target, q_draft, token)


def residual(p_target: np.ndarray, q_draft: np.ndarray | None, token: int) -> np.ndarray:  # [N], [N] -> [N]
    """The correction law after a rejection: normalize(max(0, p_target - q_draft)); q_draft None = one-hot on token.

    If p_target - q_draft has no positive mass (p_target == q_draft, or p_target one-hot on the token of a
    one-hot q_draft), a rejection had probability 0 and cannot happen; we return p_target to be safe.
    """
    p_target = np.asarray(p_target, dtype=np.float64)
    if q_draft is None:
        q_draft = np.zeros_like(p_target)
        q_draft[token] = 1.0
    diff = np.maximum(p_target - np.asarray(q_draft, dtype=np.float64), 0.0)
    mass = diff.sum()
    if mass <= 0.0:
        return p_target
    return diff / mass


def verify_greedy(logits: np.ndarray, drafts: list[int]) -> tuple[int, int]:  # [k + 1, N], k ids
    """verify_step at temperature 0, read straight from the target's logits: with one-hot target laws it
    accepts d_i iff d_i == argmax of row i and the correction (or bonus) is that argmax, whatever the draft
    laws (module docstring). The same result without k + 1 laws over the vocabulary or any uniform."""
    top = np.argmax(logits, axis=-1)
    for i, d in enumerate(drafts):
        if int(d) != int(top[i]):
            return i, int(top[i])
    return len(drafts), int(top[len(drafts)])


def verify_step(p_rows: list[np.ndarray], drafts: list[int], q_rows: list[np.ndarray | None],
                rng: np.random.Generator) -> tuple[int, int]:
    """Check drafts left to right; return (n_accepted, next_token).

    p_rows: k+1 target laws [N]; row i is the law of the token after the i-th verified input, i.e. the
            law that drafts[i] is checked against; row k is the bonus law when all k drafts are accepted
    drafts: k drafted token ids; q_rows: k proposal laws [N] or None (one-hot on the draft)

    Emitted tokens are drafts[:n_accepted] + [next_token]. next_token is the correction drawn from the
    residual at the first rejection, or the bonus token drawn from p_rows[k].
    """
    k = len(drafts)
    if len(p_rows) != k + 1 or len(q_rows) != k:
        raise ValueError(f"{k} drafts need {k + 1} target rows and {k} draft rows, got {len(p_rows)} and {len(q_rows)}")
    for i in range(k):
        if not accept_draft(p_rows[i], q_rows[i], drafts[i], rng):
            return i, sample(residual(p_rows[i], q_rows[i], drafts[i]), rng)
    return k, sample(p_rows[k], rng)
