"""Placement: where a model's numbers live, handed to a model beside its Kernels.

A model is handed two immutable objects by the backend that loads it (backends.py): its Kernels (kernels.py: the
math a layer calls) and its Placement (here): the array module its state lives in, the copies between there and
the engine (which samples on the host), the device pass that lets a whole forward pass run from one upload, the
greedy acceptance rule (it runs where the logits are), which ring keeps what a rollback needs, and what the
backend's CUDA graphs did. None of it is math a layer calls; all of it changes with where the numbers are. HOST,
the default, is the oracle's: the host is the device, so every copy is the identity and there is no device pass.

    field         oracle (HOST)          contract (shapes: R rows, B sequences, N vocab)
    xp            numpy                  the array module that allocates state, KV caches and rings (cupy: on a GPU)
    to_device     identity               host arrays (token embeddings, token ids) -> where the model computes
    to_host       identity               logits and hidden rows -> NumPy, for the engine
    device_pass   no_device_pass         (cfg, tokens, layers, bounds, rings, logits, ahead) -> None: the layers run the
                                         host path (lengths and positions read from the caches), as the oracle and
                                         cpu do; or a pass whose run(fn, *inputs) returns fn(rows, *inputs), rows
                                         the pass's row map (one map made and uploaded once, the KV rows claimed
                                         on the host first; layers[b]: sequence b's layer states; inputs: device
                                         arrays the pass reads), computed or replayed. Model.forward_batch and
                                         MTPHead.forward_batch hand it their layers. The cuda backend's is
                                         fast/cuda_pass.py (its map: fast/rowmap.py; a CUDA graph per shape).
                                         ahead: None, or per sequence (own rows, then): the pass's last rows past
                                         `own` are filler, and `then` one-row passes will follow over the same
                                         caches (an MTP drafting's depths 2..k): their maps may ride this pass's
                                         upload
    accept_greedy accept_greedy          (logits [R, N] where the model computes: B sequences' verify rows,
                                         bounds [B+1] where each sequence's rows start, drafts: per sequence k_b
                                         host ints or a [k_b] int64 array where the logits are) -> per sequence
                                         (n_accepted, token, drafts as host ints): the greedy rule (the argmax
                                         of each row against the drafts, the kept prefix, the target's own
                                         token); the cuda backend's runs on the device and brings back every
                                         sequence's run, and its drafts when they were there, in one transfer
                                         (fast/cuda_accept.py)
    rollback      "snapshot"             which ring Model.new_ring makes (state.py): "snapshot" copies each token's
                                         GDN state during the pass (on a GPU a device-to-device copy); "replay"
                                         keeps the pass's inputs and reruns the kept tokens on a rejection (the
                                         cpu backend's: no 72 MB of copies per 0.8B verify pass, LESSONS 15)
    graph_counts  no_graphs              () -> None, or what the backend's CUDA graphs did so far: {captured, failed,
                                         replays, plain, shapes, reasons} (fast/cuda_graphs.py); `bench --json`
                                         reports it as "graphs"
    pad_rows      False                  True: a drafter pads a pass whose row count varies step to step to a fixed
                                         one (the MTP head's first pass of a drafting of k: k + 2 rows, mtp.py), so
                                         a CUDA graph per shape is captured for few shapes; False where padded
                                         rows would only cost time (no graphs: the oracle, cpu, cuda graphs off)

A variant is `dataclasses.replace(placement, rollback="replay")` handed to `model.with_placement`. This module
imports NumPy and spec_sampling only: the core reads and runs without the wing (tests/test_kernels.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Callable

import numpy as np

from .spec_sampling import verify_greedy

ROLLBACKS = ("snapshot", "replay")


def accept_greedy(logits: np.ndarray, bounds, drafts: list) -> list[tuple[int, int, list[int]]]:
    """The oracle's Placement.accept_greedy: per sequence b (its rows bounds[b] .. bounds[b+1]-1 of logits [R, N],
    its k_b drafts), spec_sampling.verify_greedy and the drafts as host ints. The oracle's device is the host,
    so drafts given as an id array (a drafter's argmaxes, left where they were made) are read, not fetched; the
    cuda backend's version (fast/cuda_accept.py) brings every sequence's run back in one transfer."""
    out = []
    for lo, hi, ds in zip(bounds[:-1], bounds[1:], drafts):
        ds = [int(d) for d in ds]
        out.append((*verify_greedy(logits[lo:hi], ds), ds))
    return out


def no_device_pass(cfg, tokens, layers, bounds, rings, logits, ahead=None) -> None:
    """The oracle's Placement.device_pass: none. Its layers read positions and lengths from the caches on the host."""
    return None


def no_graphs() -> None:
    """The oracle's Placement.graph_counts: it captures no CUDA graphs, so there is nothing to count."""
    return None


def same(a):
    """The identity: the oracle's host and device are the same memory."""
    return a


@dataclass(frozen=True)
class Placement:
    """Where a model's numbers live (see the module docstring for each field's contract). Frozen: a backend
    builds one and hands it over with its Kernels."""

    xp: ModuleType = np
    to_device: Callable = same
    to_host: Callable = same
    device_pass: Callable = no_device_pass
    accept_greedy: Callable = accept_greedy
    rollback: str = "snapshot"
    graph_counts: Callable[[], dict | None] = no_graphs
    pad_rows: bool = False

    def __post_init__(self):
        if self.rollback not in ROLLBACKS:
            raise ValueError(f"rollback must be one of {', '.join(ROLLBACKS)}, got {self.rollback!r}")


HOST = Placement()  # the oracle's
