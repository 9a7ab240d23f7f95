"""The MTP head's tree and prompt-lookup branches, proposed as one draft tree.

The two drafters guess differently: the MTP head is good at the next few tokens of fresh text, lookup at long
runs the text repeats (code being edited, quoted sources). A tree can hold both guesses at once, and the verify
pass keeps whichever path the target agrees with (tree.py):

    candidates  up to W lookup continuations after the pending token (lookup.find_matches, no pass), then the
                MTP head's chain and its top-W siblings per depth (mtp.MTPDrafter.growing, its passes): the chain
                stops once k candidates score at least its last guess (no deeper guess could be kept), and the head
                is not run when lookup's nodes fill the k rows better than any head guess could
    merge       one trie (tree.TreeBuilder): a greedy MTP guess equal to a lookup token under the same parent is
                that node; sampled MTP nodes are draws from q and are never merged (lookup's are one-hot)
    keep        the k nodes of largest score (the product along the path of each guess's counted chance to be
                kept once its parent was: tree.Calibration, one for both drafters), prefix-closed, depth-first rows

When lookup finds nothing, the tree is the MTP tree. Everything else a drafter does goes to both: both see the
prompt and every kept token; only the MTP head keeps KV (its table, its release), and only it runs passes.

The idea: SpecInfer's merge-based token trees (Miao et al. 2024) merge several small models' guesses into one
tree the same way; here one of the two "models" is the history.
"""

from __future__ import annotations

import numpy as np

from .drafting import Draft, Drafting, Proposing, StopRule
from .lookup import LookupDrafter
from .mtp import FIRST_GUESS, MTPDrafter
from .tree import Calibration, TreeBuilder
from .sampling import SamplingParams


class MixedDrafter(Proposing):
    """The drafter protocol (drafting.Drafter) over an MTP drafter and a lookup drafter, drafting one tree of at
    most k nodes with up to `tree` guesses per MTP depth and `tree` lookup continuations (the two drafters' own
    `tree` settings are not read)."""

    def __init__(self, mtp: MTPDrafter, lookup: LookupDrafter, tree: int = 2):
        if tree < 1:
            raise ValueError(f"tree must be at least 1, got {tree}")
        self.mtp, self.lookup, self.tree = mtp, lookup, tree
        self.calibration = Calibration()  # both sources' scores, learned (and the last tree proposed)

    @property
    def stops_by_confidence(self) -> bool:  # the stop rule shortens the MTP chain
        return self.mtp.stops_by_confidence

    @property
    def kv_table(self):
        return self.mtp.kv_table

    def start(self, prompt: list[int], hidden: np.ndarray, k_max: int = 0, resume=None) -> None:
        """resume: what release() returned (the head's window and the scores' counts), or None."""
        head, calibration = resume if resume is not None else (None, None)
        self.mtp.start(prompt, hidden, k_max, head)
        self.lookup.start(prompt, hidden, k_max)
        self.calibration = calibration or Calibration()

    def commit(self, fed: list[int], hidden: np.ndarray) -> None:
        self.calibration.learn(fed)
        self.mtp.commit(fed, hidden)
        self.lookup.commit(fed, hidden)

    def release(self) -> tuple:
        """The head's blocks back; (its HeadWindow, the scores' counts) for a resume (lookup restarts from the
        history alone)."""
        self.lookup.release()
        return self.mtp.release(), self.calibration

    def another(self, pool=None) -> "MixedDrafter":
        return MixedDrafter(self.mtp.another(pool), self.lookup.another(pool), self.tree)

    def draft_pass(self, asks: list) -> list:
        return self.mtp.draft_pass(asks)

    def drafting(self, pending: int, k: int, params: SamplingParams, rng: np.random.Generator,
                 stop: StopRule | None = None, on_device: bool = False) -> Drafting:
        """Lookup's branches, then the MTP head's candidates (its passes go through), cut to k nodes. Host ints,
        whatever on_device asks."""
        if not k:
            return Draft()
        branches = self.lookup.branches(pending, k, self.tree, self.calibration, sampled=not params.greedy)
        builder, withdrawn = TreeBuilder(), False
        for path in branches:  # lookup's first: the head's chain stops where its guesses could no longer be kept
            builder.add_path(path, "lookup")
        if not self._head_cannot_win(branches, k):  # (lookup's copy fills every row better than a head guess could)
            _, withdrawn = yield from self.mtp.growing(pending, k, params, rng, stop, self.tree, self.calibration, builder)
        return self.calibration.propose(builder.grow(k), withdrawn)

    def _head_cannot_win(self, branches: list, k: int) -> bool:
        """Whether lookup's branches hold k nodes that each score above the best any head guess could (its first
        guess at the highest calibrated rate of any decile): then no head node would be kept, so its passes (the
        drafting's cost) are skipped; its kept tokens wait in its queue, fed with its next drafting."""
        best_head = max(self.calibration.rate(("mtp", first, b), max((b + 1) / 10, FIRST_GUESS if first else 0))
                        for b in range(10) for first in (True, False))
        scores = sorted((g.score for path in branches for g in path), reverse=True)
        return len(scores) >= k and scores[k - 1] > best_head
