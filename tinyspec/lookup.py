"""Prompt-lookup n-gram drafter: guess the next tokens by finding the current suffix earlier in the history.

Output often repeats the input: code editing re-emits most of the file it was given, summaries quote
the source, chat answers repeat names and identifiers. When the last few tokens appeared before, the
tokens that followed them then are a free guess for what follows now. No model, no probabilities:
the draft is deterministic, so its proposal law q_draft is one-hot on each draft token (None in the
drafter protocol), and the rejection rule accepts draft d with probability p_target(d).

    history  h_0 .. h_{L-1}   (committed tokens + the pending token)
    for n = n_max down to n_min:                    longest suffix first: more context, better guess
        suffix = h_{L-n} .. h_{L-1}
        i* = max{ i < L-n : h_i .. h_{i+n-1} == suffix }     most recent EARLIER occurrence
        if i* exists: draft = h_{i*+n} .. h_{i*+n+k-1}, cut at the end of the history
    no n matches -> draft = [] (the engine does a plain one-token step)

i < L-n excludes the suffix itself but allows an occurrence that overlaps it, so the continuation may
run into the suffix: it is still just history tokens. Because i* <= L-n-1, a match always yields at
least one token. The most recent occurrence is the freshest context, but in a periodic history it is
also the closest to the end, so the draft can be shorter than k (llama.cpp's ngram-simple does the same).

Example: h = [5 6 7 9 5 6 7 8 5 6], k = 3, n_max = 3
    n=3 suffix [8 5 6]: not seen before
    n=2 suffix [5 6]:   at i=4 (most recent) and i=0 -> draft = h[6:9] = [7 8 5]

A tree of guesses (tree=W > 1): find_matches keeps looking after the first match and returns up to W different
continuations (the most recent occurrences of the longest suffix, then of shorter ones; those with a next token
not seen yet first), each with the suffix length it matched, merged into one draft tree (tree.TreeBuilder) of at
most k nodes. Lookup has no probabilities, so a node's score is counted (tree.Calibration: the share of such
guesses the target kept once their parent was, per best match or not, suffix length and first token or not),
starting from a prior: the r-th continuation (r = 0, 1, ...) at CONFIDENCE a token (its first token CONFIDENCE *
0.5 ** r), SAMPLED_CONFIDENCE when the sequence samples. The scores only rank the nodes when the budget is cut,
here and against the MTP head's guesses (mixed.py).

Cost: O(L * n) per step for the linear scan, fine for a reference that runs a NumPy model per token.

Official implementation: llama.cpp common/ngram-map.cpp `ngram-simple` (one fixed n, backwards scan),
see docs/qwen35.md section 5.6. The idea: "prompt lookup decoding", Saxena 2023
(github.com/apoorvumang/prompt-lookup-decoding; HF transformers `prompt_lookup_num_tokens`).

Does NOT include:
    - an index: real engines hash n-grams into a table (llama.cpp ngram-map / ngram-mod, a 4M-entry hash
      of 24-grams) or keep a suffix automaton over the history, so a lookup is O(n) instead of O(L * n)
    - continuation statistics (ngram-map-k4v's vote over 4 continuations, ngram-cache counts, min_hits)
    - a static n-gram corpus (how many to draft is the loop's policy, not the drafter's: speculate.py)
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .sampling import SamplingParams
from .drafting import Draft, Drafting, KeepsNoKV, Proposing, StopRule, no_passes
from .tree import Calibration, Guess, TreeBuilder

CONFIDENCE = 0.8  # a lookup branch's score per token (the best match's; the r-th match's branch is 0.5 ** r of it)
SAMPLED_CONFIDENCE = 0.4  # the same for a sampled sequence (temperature 1: lookup alone kept 0.2-0.4 of its drafts)


def find_draft(history: Sequence[int], k: int, n_max: int = 4, n_min: int = 1) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the longest matching suffix.

    [5, 6, 7, 9, 5, 6, 7, 8, 5, 6], k=3 -> [7, 8, 5]  (suffix [5, 6] last seen at index 4)
    [1, 2, 3], k=3                      -> []         (no token repeats: a plain step)
    """
    if k < 0 or not 1 <= n_min <= n_max:
        raise ValueError(f"need k >= 0 and 1 <= n_min <= n_max, got k={k}, n_min={n_min}, n_max={n_max}")
    history = [int(t) for t in history]
    L = len(history)
    if k == 0:
        return []
    for n in range(min(n_max, L - 1), n_min - 1, -1):  # an earlier occurrence needs L >= n + 1
        suffix = history[L - n:]
        for i in range(L - n - 1, -1, -1):  # most recent first, never the suffix itself (i = L - n)
            if history[i:i + n] == suffix:
                return history[i + n:i + n + k]
    return []


def find_drafts(history: Sequence[int], k: int, n_max: int = 4, n_min: int = 1, m: int = 1) -> list[list[int]]:
    """find_matches' continuations alone."""
    return [cont for cont, _ in find_matches(history, k, n_max, n_min, m)]


def find_matches(history: Sequence[int], k: int, n_max: int = 4, n_min: int = 1,
                 m: int = 1) -> list[tuple[list[int], int]]:
    """Up to m different continuations of up to k tokens each, best first: every earlier occurrence of the
    longest matching suffix, most recent first, then of shorter suffixes; a continuation whose first token is
    new comes before those that repeat one (different next tokens are different guesses); one that is already
    there (or a prefix of one there) is dropped. The first is find_draft's. Each with the length n of the
    suffix it matched (a longer match is a surer guess: lookup_branches' calibration key).

    [5, 6, 7, 9, 5, 6, 7, 8, 5, 6], k=3, m=3 -> [[7, 8, 5], [7, 9, 5]]
        ([5 6] at 4 and 0; [6] at 5 and 1 finds the same two again)
    [5, 6, 7, 1, 5, 6, 7, 2, 6, 9, 5, 6], k=2, m=2 -> [[7, 2], [9, 5]]
        ([5 6] at 4 and 0 -> [7, 2], [7, 1]; [6] at 8 -> [9, 5], a new next token, so it goes before [7, 1])
    """
    if k < 0 or m < 1 or not 1 <= n_min <= n_max:
        raise ValueError(f"need k >= 0, m >= 1 and 1 <= n_min <= n_max, got k={k}, m={m}, n_min={n_min}, n_max={n_max}")
    history = [int(t) for t in history]
    L = len(history)
    found: list[tuple[list[int], int]] = []
    if k == 0:
        return found
    for n in range(min(n_max, L - 1), n_min - 1, -1):
        suffix = history[L - n:]
        for i in range(L - n - 1, -1, -1):
            if history[i:i + n] == suffix:
                cont = history[i + n:i + n + k]
                if not any(old[:len(cont)] == cont for old, _ in found):
                    found.append((cont, n))
    firsts, new, repeats = set(), [], []
    for cont, n in found:  # a new next token first, in the order found; then the rest
        (repeats if cont[0] in firsts else new).append((cont, n))
        firsts.add(cont[0])
    return (new + repeats)[:m]


def lookup_branches(matches: list[tuple[list[int], int]], calibration: Calibration | None = None,
                    sampled: bool = False) -> list[list[Guess]]:
    """find_matches' continuations as tree branches: one-hot guesses scored by the product along the branch of
    each token's chance to be kept once the token before it was: CONFIDENCE (the r-th match's first token:
    CONFIDENCE * 0.5 ** r) as the prior, counted by `calibration` if given per (the best match or another, the
    suffix length it matched, first token or not): inside a span the text copies, a 4-token match is right
    nearly every time, a 1-token match far less often. sampled: the sequence samples, and a one-hot guess is then kept
    only with the target's probability of it (spec_sampling.py), not whenever it is the target's best: the prior is
    SAMPLED_CONFIDENCE, and the counts are kept apart from a greedy sequence's."""
    out = []
    for r, (cont, n) in enumerate(matches):
        branch, score = [], 1.0
        for d, t in enumerate(cont, start=1):
            key = ("lookup", sampled, min(r, 1), n, d == 1)
            prior = (SAMPLED_CONFIDENCE if sampled else CONFIDENCE) * (0.5 ** r if d == 1 else 1.0)
            score *= prior if calibration is None else calibration.rate(key, prior)
            branch.append(Guess(t, None, score, key=key))
        out.append(branch)
    return out


class LookupDrafter(Proposing, KeepsNoKV):
    """The drafter protocol (drafting.Drafter) around find_draft; its state is the token history.

    history = prompt + every token the target has fed since; drafting looks up history + [pending].
    The target's hidden rows are ignored: this drafter runs no model (its drafting asks for no pass), and has no
    confidence to report; its drafts are host ints from the start. It keeps no KV (KeepsNoKV): in a batch it takes
    no pool block, and a preempted sequence's history restarts it exactly.

    tree: up to this many continuations (find_drafts), proposed as one tree of at most k nodes; 1: the chain of
    find_draft (parents None).
    """

    stops_by_confidence = False

    def __init__(self, n_max: int = 4, n_min: int = 1, tree: int = 1):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
        if tree < 1:
            raise ValueError(f"tree must be at least 1 (1: a chain), got {tree}")
        self.n_max, self.n_min, self.tree = n_max, n_min, tree
        self.history: list[int] = []
        self.calibration = Calibration()  # a tree's scores, learned (and the last tree proposed)

    def start(self, prompt: list[int], hidden: np.ndarray, k_max: int = 0, resume: Calibration | None = None) -> None:
        """The history is the prompt (a resumed sequence's: prompt + its tokens but the pending one); resume: what
        release() returned, the tree scores' counts so far."""
        self.history = [int(t) for t in prompt]
        self.calibration = resume or Calibration()

    def release(self) -> Calibration | None:
        """No KV to give back; the history restarts it exactly. A tree drafter hands back its scores' counts
        (tree.Calibration), which a resumed sequence drafts by as it would have (None: a chain drafter's nothing)."""
        return self.calibration if self.tree > 1 else None

    def another(self, pool=None) -> "LookupDrafter":  # no KV: nothing in a pool

        return LookupDrafter(self.n_max, self.n_min, self.tree)

    def drafting(self, pending: int, k: int, params: SamplingParams, rng: np.random.Generator,
                 stop: StopRule | None = None, on_device: bool = False) -> Drafting:
        # pending is chosen but not yet fed: it is the last token of the suffix we look up
        if self.tree > 1:
            builder = TreeBuilder()
            for path in self.branches(pending, k, self.tree, self.calibration, not params.greedy):
                builder.add_path(path, "lookup")
            return no_passes(self.calibration.propose(builder.grow(k)))
        drafts = find_draft(self.history + [int(pending)], k, self.n_max, self.n_min)
        return no_passes(Draft(drafts, [None] * len(drafts)))  # deterministic drafts: q_draft is one-hot (None)

    def branches(self, pending: int, k: int, m: int, calibration: Calibration | None = None,
                 sampled: bool = False) -> list[list[Guess]]:
        """Up to m continuations of up to k tokens after the pending token, as scored tree branches."""
        return lookup_branches(find_matches(self.history + [int(pending)], k, self.n_max, self.n_min, m), calibration,
                               sampled)

    def draft_pass(self, asks: list) -> list:  # never asked: drafting makes no pass
        return []

    def commit(self, fed: list[int], hidden: np.ndarray) -> None:
        self.history.extend(int(t) for t in fed)
        self.calibration.learn(fed)  # what the target kept of the last tree: how good each kind of guess is
