"""Greedy acceptance on the device: a verify step brings back a few ints per sequence, not its logits.

The greedy rule (spec_sampling.verify_greedy, the oracle) reads a sequence's verify rows, logits [k+1, N] for
fed = [pending, d_1..d_k]:

    top[i]  = argmax logits[i]                         the target's own choice after fed token i
    n       = the longest prefix with d_{i+1} == top[i]   drafts kept (0..k)
    token   = top[n]                                   a correction (n < k) or the bonus (n = k)

On the host this needs the whole [k+1, N] block brought down (k+1 rows of a 248k-entry vocabulary at the 0.8B
shape: 4 MB a step at k = 3) before the argmax can start. Here every step of it runs where the logits are:
an argmax per row, one compare with the drafts (host drafts uploaded: k ints, an asynchronous copy), a cumulative
product that stays 1 while every draft so far matched (its sum is n), a gather of top[n]. What crosses back
is the run's two ints. When the drafts are host ints (lookup) the engine knows them, so n and the token are the
whole emitted run (fed[1 : 1 + n] + [token]). When they are device ids (greedy MTP and draft-model drafts, left
where they were made: drafting with on_device) they ride along: greedy_run returns [n, token, d_1..d_k].
A batch's sequences each get their greedy_run on their own rows, and all the runs come back concatenated, in
ONE transfer for the whole step: 8 bytes per int, 2 per sequence plus its device drafts.

greedy_run is written with NumPy functions that dispatch on their arguments (NEP 18): on CuPy arrays each is
a CuPy launch, on NumPy arrays it is the oracle's rule again (tests/test_cuda_syncs.py checks both against
verify_greedy, ties included: argmax takes the first maximum on both).

What is still read on the host (tests/test_cuda_syncs.py counts each):
    the sampled rule (temperature > 0): the target's laws come to the host (speculate.accept), as do the
        drafters' laws q; a device version needs the residual draw on the device (one uniform per draft,
        drawn on the host and uploaded, would keep the RNG stream the engine's)
    drafts whose probability is read (p_min, a floor, the adaptive policy's keep_going: one float per draft),
        drafts over a draft vocabulary (DraftVocabulary.draw maps subset ids on the host) and sampled drafts:
        one transfer per draft
    the token id range check: model.embed_rows checks host ids (free) and trusts device ids (a drafter's
        argmax, in range by construction; an id out of range would give a NaN row on the GPU)
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..ops import join_rows


def greedy_run(logits, drafts):  # [k+1, N], [k] int64, where the logits are -> [2 + k]: (n, token, d_1..d_k)
    """The greedy rule on the logits' device: (n, top[n]) followed by the drafts, one integer array, no transfer."""
    top = np.argmax(logits, axis=-1)  # [k+1]
    k = drafts.shape[0]
    matched = (top[:k] == drafts).astype(np.int64)  # [k]: 1 where draft i+1 is the target's choice
    n = np.cumprod(matched).sum()  # the kept prefix: the product stays 1 up to the first mismatch
    run = np.stack([n.astype(np.int64), np.take(top, n).astype(np.int64)])  # [2]
    return np.concatenate([run, drafts])  # [2 + k]: what the verify step brings back, all of it or the run alone


class DeviceGreedyRule:
    """Placement.accept_greedy for the array module xp (CuPy): (logits [R, N] on the device for B sequences' rows,
    bounds [B+1] host ints, drafts: per sequence k_b host ints or a [k_b] int64 device array) -> per sequence
    (n_accepted, token, drafts as host ints), with ONE transfer for all of them: each sequence's run
    (greedy_run on its rows), with its drafts when they came as device ids (host drafts are known: returned as
    given, not fetched), concatenated on the device and brought back together.
    graphs=True: a one-sequence step's greedy_run replayed from a CUDA graph per (k+1, N, k)
    (cuda_graphs.GraphedCall: its ~10 launches become one, plus two input copies); graph_counts() says how many
    shapes were captured, failed (each also warned) and replayed. Several sequences' runs launch plainly.
    check_graphs: GraphedCall's check (tests: fake_cupy.check_replay; None on a GPU)."""

    def __init__(self, xp, to_host: Callable, graphs: bool = False, check_graphs: Callable | None = None):
        from .cuda_graphs import GraphedCall

        self.xp, self.to_host = xp, to_host
        self.graphs = GraphedCall(greedy_run, xp, enabled=graphs, check=check_graphs)

    def graph_counts(self) -> dict:
        """The greedy rule's CUDA graphs: {captured, failed, replays, plain, shapes, reasons} (GraphedCall.stats)."""
        return self.graphs.stats()

    def __call__(self, logits, bounds, drafts: list) -> list[tuple[int, int, list[int]]]:
        on_device = [isinstance(d, self.xp.ndarray) for d in drafts]
        if not any(on_device) and not any(len(d) for d in drafts):  # a plain step: one row a sequence, its argmax
            tops = self.to_host(np.argmax(logits[: len(drafts)], axis=-1))  # the step's one sync, 8 bytes a sequence
            return [(0, int(token), []) for token in tops]
        ids = [d if dev else self.xp.asarray(np.asarray(d, dtype=np.int64)) for d, dev in zip(drafts, on_device)]
        spans = list(zip(bounds[:-1], bounds[1:]))
        if len(drafts) == 1:  # one sequence: the whole verify pass's rows, the graphed rule
            runs = [self.graphs(logits, ids[0])]  # [2 + k]
        else:
            runs = [greedy_run(logits[lo:hi], d) for (lo, hi), d in zip(spans, ids)]  # [2 + k_b] each
        wanted = [run if dev else run[:2] for run, dev in zip(runs, on_device)]  # host drafts: not fetched
        together = join_rows(wanted)  # dispatches (NEP 18); at most 8 at a time (ops.join_rows)
        fetched = [int(v) for v in self.to_host(together)]  # the step's one sync
        out, at = [], 0
        for d, dev in zip(drafts, on_device):
            k = len(d) if not dev else int(d.shape[0])
            n, token = fetched[at], fetched[at + 1]
            out.append((n, token, fetched[at + 2 : at + 2 + k] if dev else [int(t) for t in d]))
            at += 2 + (k if dev else 0)
        return out
