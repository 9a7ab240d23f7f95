"""The batch-aware draft length (tinyspec/fast/batch_draft_length.py): one k for every slot, priced by the cost
of a pass of R rows; plain where drafting would lose; greedy output unchanged."""

from pathlib import Path

import numpy as np
import pytest

from tinyspec.backends import load_model
from tinyspec.batch import batch_generate
from tinyspec.scheduler import EngineOptions
from tinyspec.fast.batch_draft_length import BatchDraftLength
from tinyspec.generate import generate
from tinyspec.mtp import MTPDrafter
from tinyspec.drafting import Draft

ASSETS = Path(__file__).resolve().parents[1] / "tinyspec" / "assets"


def simulate(policy: BatchDraftLength, n_slots: int, v0: float, v1: float, a: float, d: float, steps: int = 200,
             seed: int = 0) -> dict[int, int]:
    """Drive the policy with a simulated batch: a pass of R rows takes v0 + v1 R seconds, each draft depth d,
    each draft kept with probability a until the first rejection. Returns k -> steps it was chosen for every slot."""
    rng = np.random.default_rng(seed)
    counts: dict[int, int] = {}
    for _ in range(steps):
        plans = policy.plan([8] * n_slots)
        ks = [p.k for p in plans]
        drafts, accepted = [], []
        for k in ks:
            m = 0
            while m < k and rng.random() < a:
                m += 1
            drafts.append(Draft(list(range(k))))
            accepted.append(m)
        rows = sum(k + 1 for k in ks)
        policy.observe(drafts, accepted, d * max(ks), v0 + v1 * rows, rows)
        if len(set(ks)) == 1:
            counts[ks[0]] = counts.get(ks[0], 0) + 1
    return counts


def test_memory_bound_passes_draft_the_most():
    """Rows nearly free (v1 << v0), good drafts: k_max almost every step."""
    counts = simulate(BatchDraftLength(3), n_slots=4, v0=0.030, v1=0.0005, a=0.8, d=0.002)
    assert counts.get(3, 0) > 0.8 * sum(counts.values())


def test_compute_bound_passes_decode_plainly():
    """A row costs as much as the weight read and drafts are kept half the time: drafting loses, so almost every
    step is plain, and a drafting probe is one slot's one draft, never a whole batch's."""
    policy = BatchDraftLength(3)
    counts = simulate(policy, n_slots=8, v0=0.020, v1=0.008, a=0.5, d=0.008)
    assert counts.get(0, 0) > 0.8 * sum(counts.values())
    probes = 0
    for _ in range(2 * policy.probe_max):  # decoding plainly, a probe drafts one token in one slot
        ks = [p.k for p in policy.plan([8] * 8)]
        policy.observe([Draft(list(range(k))) for k in ks], [0] * 8, 0.0, 0.020 + 0.008 * (8 + sum(ks)), 8 + sum(ks))
        assert sum(ks) <= 1, ks
        probes += sum(ks)
    assert 1 <= probes <= 4  # the gap between probes doubled while they kept finding plain best


def test_the_choice_follows_the_batch_size():
    """The same costs per row: one slot drafts (its pass is memory-bound), sixteen do not (theirs is not)."""
    one = simulate(BatchDraftLength(3), n_slots=1, v0=0.030, v1=0.004, a=0.8, d=0.002)
    many = simulate(BatchDraftLength(3), n_slots=16, v0=0.030, v1=0.004, a=0.8, d=0.002)
    assert max(one, key=one.get) >= 2
    assert max(many, key=many.get) == 0


def test_rooms_cap_each_slot():
    policy = BatchDraftLength(3)
    simulate(policy, 2, 0.030, 0.0005, 0.9, 0.001, steps=20)
    plans = policy.plan([3, 0, 1])
    assert [p.k for p in plans][1] == 0 and plans[2].k <= 1


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_greedy_output_is_unchanged(backend):
    if backend == "cpu":
        pytest.importorskip("numba")
    model = load_model(ASSETS / "tiny-target.gguf", backend)
    rng = np.random.default_rng(3)
    prompts = [[int(t) for t in rng.integers(0, model.cfg.n_vocab, n)] for n in (4, 9, 2, 6)]
    out = batch_generate(model, prompts, 24, drafter=MTPDrafter(model), policy=BatchDraftLength(3),
                         options=EngineOptions(slots=3))
    for seq, prompt in zip(out.sequences, prompts):
        assert seq.tokens == generate(model, prompt, 24).tokens
    assert out.stats["policy"]["chosen_k"]


def test_prefill_rows_in_the_pass_are_priced():
    """Chunked prefill puts C prompt rows into the verify pass whatever k is (speculate.Engine): the policy prices
    verify(B (k + 1) + C). Where drafting loses alone (compute-bound rows, drafts kept half the time), a pass that
    carries a 256-row chunk anyway makes the drafts' few extra rows cheap by comparison: drafting wins there."""
    policy = BatchDraftLength(3)
    simulate(policy, n_slots=8, v0=0.020, v1=0.008, a=0.5, d=0.008)
    alone, with_chunk = policy.rates(8), policy.rates(8, prefill_rows=256)
    assert max(range(4), key=lambda k: alone[k]) == 0
    assert max(range(4), key=lambda k: with_chunk[k]) > 0
    assert with_chunk[0] < alone[0]  # the chunk's rows slow the decoding slots' pass

