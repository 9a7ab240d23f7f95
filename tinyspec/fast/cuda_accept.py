"""Greedy acceptance on the device: a verify step brings back two ints, not [k+1, N] logits (issue 27).

The greedy rule (spec_sampling.verify_greedy, the oracle) reads the target's verify rows, logits [k+1, N] for
fed = [pending, d_1..d_k]:

    top[i]  = argmax logits[i]                         the target's own choice after fed token i
    n       = the longest prefix with d_{i+1} == top[i]   drafts kept (0..k)
    token   = top[n]                                   a correction (n < k) or the bonus (n = k)

On the host this needs the whole [k+1, N] block brought down (k+1 rows of a 248k-entry vocabulary at the 0.8B
shape: 4 MB a step at k = 3) before the argmax can start. Here every step of it runs where the logits are:
an argmax per row, one compare with the drafts (uploaded: k ints, an asynchronous copy), a cumulative
product that stays 1 while every draft so far matched (its sum is n), a gather of top[n]. What crosses back
is the run's two ints, in one transfer: the verify step's one sync. The engine knows the drafts, so n and
the token are the whole emitted run (fed[1 : 1 + n] + [token]).

greedy_run is written with NumPy functions that dispatch on their arguments (NEP 18): on CuPy arrays each is
a CuPy launch, on NumPy arrays it is the oracle's rule again (tests/test_cuda_syncs.py checks both against
verify_greedy, ties included: argmax takes the first maximum on both).

What is still not on the device (tests/test_cuda_syncs.py counts each):
    the sampled rule (temperature > 0): the target's laws come to the host (speculate.accept), as do the
        drafters' laws q; a device version needs the residual draw on the device (one uniform per draft,
        drawn on the host and uploaded, would keep the RNG stream the engine's)
    the drafts of MTP and the draft model: they stay on the device while drafting (each argmax fed to the
        next pass as a device id) and come to the host in one transfer when drafting ends
        (speculate.fetch_drafts), because Draft.tokens is a host list the engine feeds the verify pass: a
        second sync per step; fetching them with the run ([n, token, d_1..d_k]) is the next step
    the token id range check: model.embed_rows checks host ids (free) and trusts device ids (a drafter's
        argmax, in range by construction; an id out of range would give a NaN row on the GPU)
"""

from __future__ import annotations

from typing import Callable

import numpy as np


def greedy_run(logits, drafts):  # [k+1, N], [k] ints, where the logits are -> [2] ints: (n_accepted, token)
    """The greedy rule on the logits' device: (n, top[n]) as a 2-entry integer array, no transfer."""
    top = np.argmax(logits, axis=-1)  # [k+1]
    k = drafts.shape[0]
    matched = (top[:k] == drafts).astype(np.int64)  # [k]: 1 where draft i+1 is the target's choice
    n = np.cumprod(matched).sum()  # the kept prefix: the product stays 1 up to the first mismatch
    return np.stack([n.astype(np.int64), np.take(top, n).astype(np.int64)])  # [2]


class DeviceGreedyRule:
    """Kernels.accept_greedy for the array module xp (CuPy): (logits [k+1, N] on the device, drafts k host ints)
    -> (n_accepted, token) host ints, with one transfer of two ints. graphs=True: greedy_run replayed from a
    CUDA graph per (k+1, N, k) (cuda_graphs.GraphedCall: its ~10 launches become one, plus two input copies);
    self.graphs says what was captured and why a shape fell back to plain launches."""

    def __init__(self, xp, to_host: Callable, graphs: bool = False):
        from .cuda_graphs import GraphedCall

        self.xp, self.to_host = xp, to_host
        self.graphs = GraphedCall(greedy_run, xp, enabled=graphs)

    def __call__(self, logits, drafts) -> tuple[int, int]:
        drafts_dev = self.xp.asarray(np.asarray(drafts, dtype=np.int64))  # [k] up: an asynchronous copy
        n, token = (int(v) for v in self.to_host(self.graphs(logits, drafts_dev)))  # the step's one sync
        return n, token
