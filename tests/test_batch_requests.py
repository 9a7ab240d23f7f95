"""Requests of their own in one engine (speculate.Engine.add with params / stop_ids, Engine.cancel): what a server
needs when every client brings its own temperature, seed and stops, and may leave at any time.

    mixed     greedy and sampled sequences (different temperatures, top-k, stop ids) in the same verify passes:
              each gets exactly its solo tokens (greedy: generate's; sampled: its solo run with its seed, the
              same drafter and k), for every drafter
    cancel    a waiting sequence and a running one cancelled between steps: the running one's slot, KV blocks and
              reservation are freed and on_finish is called; the others are unaffected (still their solo
              tokens); no block leaks; cancelling a finished sequence is refused
    draft_n   sequences capped at different drafts per step (Engine.add draft_n: 0, 1, 3, and the engine's
              policy) in the same verify passes: each gets the tokens and the counts of its solo run with that
              draft_n; the policies plan within each cap; a cap out of 0..k_max is the sequence's error

Models: the shipped tiny-target.gguf (with an MTP head) and tiny-draft.gguf on the numpy oracle and the cpu
backend; a random quantized file on the cuda backend's Python side (the fake CuPy) for a mixed pass there.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from test_batch import one_numba_thread  # noqa: F401  (autouse: the cpu kernels on one thread, as there)

import tinyspec
from tinyspec.backends import load_model, numba_available
from tinyspec.draft import DraftModelDrafter
from tinyspec.drafting import FixedDraftLength
from tinyspec.generate import generate, speculative_generate
from tinyspec.lookup import LookupDrafter
from tinyspec.mtp import MTPDrafter
from tinyspec.sampling import SamplingParams
from tinyspec.scheduler import EngineOptions
from tinyspec.sequence import SeqResult
from tinyspec.speculate import Engine

ASSETS = Path(tinyspec.__file__).resolve().parent / "assets"
BACKENDS = ["numpy", pytest.param("cpu", marks=pytest.mark.skipif(not numba_available(), reason="needs numba"))]
PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 17], [3], [5, 6, 5, 6, 5, 6, 5]]
MAX_NEW = 10
GREEDY = SamplingParams()
# (params, seed, stop ids) per prompt: greedy and two different sampled laws, and stops of their own
ASKS = [(GREEDY, 0, ()), (SamplingParams(0.9, 20), 17, ()), (GREEDY, 0, (15,)),
        (SamplingParams(1.3, 0, 0.9), 4, (15, 7)), (SamplingParams(0.7), 99, ())]


@functools.cache
def models(backend: str = "numpy"):
    return load_model(ASSETS / "tiny-target.gguf", backend), load_model(ASSETS / "tiny-draft.gguf", backend)


def drafter_for(kind: str, backend: str = "numpy"):
    target, draft = models(backend)
    return {"none": lambda: None, "lookup": lambda: LookupDrafter(n_max=3), "mtp": lambda: MTPDrafter(target),
            "draft": lambda: DraftModelDrafter(draft, target)}[kind]()


def solo(kind: str, prompt, params, seed, stops, k: int, backend: str = "numpy") -> list[int]:
    """The sequence alone: plain generate (greedy, or `none`), else the speculative run with its seed and k."""
    target, _ = models(backend)
    if kind == "none" or params.greedy:  # greedy speculative output is plain greedy output (test_batch checks it)
        return generate(target, prompt, MAX_NEW, params, np.random.default_rng(seed), stop_ids=stops).tokens
    return speculative_generate(target, drafter_for(kind, backend), prompt, MAX_NEW, draft_n=k, params=params,
                                rng=np.random.default_rng(seed), stop_ids=stops).tokens


def engine_for(kind: str, slots: int, k: int, backend: str = "numpy", on_finish=None) -> Engine:
    target, _ = models(backend)
    policy = FixedDraftLength(0 if kind == "none" else k)
    return Engine(target, drafter_for(kind, backend), policy,
                  EngineOptions(slots=slots, n_blocks=64, block_size=4), on_finish=on_finish)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["none", "lookup", "mtp", "draft"])
def test_greedy_and_sampled_sequences_in_one_pass_each_get_their_solo_tokens(backend, kind):
    k = 3
    engine = engine_for(kind, slots=3, k=k, backend=backend)
    seqs = [SeqResult(i, p) for i, p in enumerate(PROMPTS)]
    for seq, (params, seed, stops) in zip(seqs, ASKS):
        engine.add(seq, MAX_NEW, seed, params=params, stop_ids=stops)
    mixed_steps = 0
    while not engine.done():
        engine.step()
        kinds = {s.seq.params.greedy for s in engine.active.values()}
        mixed_steps += len(kinds) == 2
    assert mixed_steps > 0  # greedy and sampled sequences really shared passes
    for seq, (params, seed, stops) in zip(seqs, ASKS):
        assert seq.error is None
        assert seq.tokens == solo(kind, seq.prompt_tokens, params, seed, stops, k, backend), seq.index


def test_the_engine_defaults_apply_when_a_sequence_brings_none():
    target, _ = models()
    engine = Engine(target, options=EngineOptions(slots=2, n_blocks=32, block_size=4,
                                                  params=SamplingParams(0.9, 20), stop_ids=(15,)))
    seq = SeqResult(0, PROMPTS[0])
    engine.add(seq, MAX_NEW, 5)
    assert seq.params == SamplingParams(0.9, 20) and seq.stop_ids == frozenset({15})
    while not engine.done():
        engine.step()
    assert seq.tokens == generate(target, PROMPTS[0], MAX_NEW, SamplingParams(0.9, 20), np.random.default_rng(5),
                                  stop_ids=(15,)).tokens


@pytest.mark.parametrize("kind", ["none", "mtp"])
def test_cancel_frees_the_slot_and_its_blocks_and_leaves_the_others_exact(kind):
    """Sequence 1 is cancelled after its first steps (running), sequence 3 while it waits; the slot sequence 1
    held takes the next waiting one, and at the end every block is free."""
    finished = []
    engine = engine_for(kind, slots=2, k=3, on_finish=lambda seq: finished.append(seq.index))
    seqs = [SeqResult(i, p) for i, p in enumerate(PROMPTS)]
    for seq in seqs:
        engine.add(seq, MAX_NEW, 0)
    engine.step()
    engine.step()
    running = {s.seq.index: b for b, s in engine.active.items()}
    assert set(running) == {0, 1} and 0 < len(seqs[1].tokens) < MAX_NEW
    used_before = engine.pool.used
    assert engine.cancel(seqs[1]) and engine.cancel(seqs[3])
    assert 1 in finished and running[1] not in engine.active  # ended like a stop: on_finish, slot free
    assert engine.pool.used < used_before
    assert [w.seq.index for w in engine.waiting] == [2, 4]
    n_cancelled = len(seqs[1].tokens)
    while not engine.done():
        engine.step()
    assert len(seqs[1].tokens) == n_cancelled and seqs[3].tokens == []  # nothing more for them
    assert not engine.cancel(seqs[1]) and not engine.cancel(seqs[0])  # ended: nothing to cancel
    for i in (0, 2, 4):
        assert seqs[i].tokens == solo(kind, PROMPTS[i], GREEDY, 0, (), 3), i
    assert sorted(finished) == [0, 1, 2, 4]
    assert engine.pool.used == 0 and sorted(engine.pool.free) == list(range(engine.pool.n_blocks))


def test_a_mixed_pass_on_the_cuda_backend_brings_its_logits_to_the_host_and_stays_exact(monkeypatch, tmp_path):
    """On the cuda backend (the fake CuPy: its Python side, on the CPU) an all-greedy pass keeps logits and drafts
    on the device and runs the rule there; a pass with a sampled sequence is brought to the host, where the
    greedy sequences beside it take the same argmax rule. Every sequence equals its solo run on that backend.
    This catches the bug where the mixed pass brought every hidden row to the host and a greedy sequence's MTP
    drafter joined them to the device rows it already held (CuPy refuses a host array in device math)."""
    import fake_cupy
    from test_backends import write_quantized

    fake_cupy.install(monkeypatch)
    write_quantized(tmp_path / "target.gguf", seed=1)
    target = load_model(tmp_path / "target.gguf", "cuda")
    engine = Engine(target, MTPDrafter(target), FixedDraftLength(3),
                    EngineOptions(slots=3, n_blocks=64, block_size=4))
    seqs = [SeqResult(i, p) for i, p in enumerate(PROMPTS)]
    for seq, (params, seed, stops) in zip(seqs, ASKS):
        engine.add(seq, MAX_NEW, seed, params=params, stop_ids=stops)
    while not engine.done():
        engine.step()
    for seq, (params, seed, stops) in zip(seqs, ASKS):
        if params.greedy:
            alone = generate(target, seq.prompt_tokens, MAX_NEW, params, stop_ids=stops).tokens
        else:
            alone = speculative_generate(target, MTPDrafter(target), seq.prompt_tokens, MAX_NEW, draft_n=3,
                                         params=params, rng=np.random.default_rng(seed), stop_ids=stops).tokens
        assert seq.tokens == alone, seq.index


def test_a_trunk_without_attention_layers_still_batches_with_its_mtp_head(tmp_path):
    """The MTP head's KV lives in the pool's slabs, one per attention layer of the trunk; a trunk with none (a
    one-layer test file) still gets one slab a block for it (was: 'rows ... do not tile the pool's slabs')."""
    from tinyspec.batch import batch_generate
    from tinyspec.fast import synth

    path = tmp_path / "moe-1-layer.gguf"
    synth.synth_model(path, "35b-a3b", "q4_k_m", n_layers=1, n_vocab=512, n_expert=8)
    model = load_model(path, "numpy")
    assert all(model.cfg.recurrent) and model.cfg.n_nextn
    prompts = [[1, 2, 3 + i] for i in range(3)]
    out = batch_generate(model, prompts, 4, drafter=MTPDrafter(model), draft_n=2, options=EngineOptions(slots=3))
    assert [s.tokens for s in out.sequences] == [generate(model, p, 4).tokens for p in prompts]


# draft_n per sequence: (prompt, draft_n, params, seed); None is the engine's policy, FixedDraftLength(3)
CAPPED = [([1, 2, 3, 4, 5], 0, SamplingParams(0.9, 20), 11), ([7, 8], 1, SamplingParams(1.1), 12),
          ([9, 10, 11, 12], 3, SamplingParams(0.8, 0, 0.9), 13), ([5, 6, 5, 6, 5], None, SamplingParams(0.9, 20), 14)]
CAPPED_NEW = 24
COUNTS = ("steps", "plain_steps", "drafted", "accepted", "k_max", "accepted_per_position", "accepted_length_histogram")


def capped_solo(prompt, draft_n: int, params: SamplingParams, seed: int, drafter: bool = True):
    target, _ = models()
    return generate(target, prompt, CAPPED_NEW, params, np.random.default_rng(seed),
                    drafter=MTPDrafter(target) if drafter else None, draft_n=draft_n)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_each_sequence_drafts_at_most_its_draft_n_and_gets_its_solo_run_with_that_draft_n(sampled):
    """Four sequences in one engine of FixedDraftLength(3) over the MTP head, capped at 0, 1, 3 drafts a step and
    not at all. Greedy: every one's tokens are plain greedy generate's. Sampled with a seed: draft_n = d gets the
    tokens of generate(..., drafter=MTPDrafter(model), draft_n=d) with that seed, and d = 0 also those of
    generate with no drafter at all (a step that drafts nothing draws one token from the target's row with the
    sequence's stream, drafter or not). Either way its counts (steps, drafted, accepted, per position; k_max is
    its cap) are its solo run's, draft_n = 0 drafts nothing, and no step emits more than draft_n + 1 tokens."""
    target, _ = models()
    runs: dict[int, list[int]] = {}
    engine = Engine(target, MTPDrafter(target), FixedDraftLength(3), EngineOptions(slots=4, n_blocks=64, block_size=4),
                    on_emit=lambda seq, tokens, marks: runs.setdefault(seq.index, []).append(len(tokens)))
    seqs = [SeqResult(i, prompt) for i, (prompt, *_) in enumerate(CAPPED)]
    for seq, (_, draft_n, params, seed) in zip(seqs, CAPPED):
        engine.add(seq, CAPPED_NEW, seed, params=params if sampled else GREEDY, draft_n=draft_n)
    while not engine.done():
        engine.step()
    for seq, (prompt, draft_n, params, seed) in zip(seqs, CAPPED):
        d = engine.k_max if draft_n is None else draft_n
        params = params if sampled else GREEDY
        assert seq.error is None and len(seq.tokens) == CAPPED_NEW
        alone = capped_solo(prompt, d, params, seed)
        assert seq.tokens == alone.tokens, (seq.index, d)
        assert {c: seq.stats[c] for c in COUNTS} == {c: alone.stats[c] for c in COUNTS}, (seq.index, d)
        assert max(runs[seq.index]) <= d + 1
        if d == 0:
            assert seq.stats["drafted"] == 0 and seq.stats["plain_steps"] == seq.stats["steps"]
            assert seq.tokens == capped_solo(prompt, None, params, seed, drafter=False).tokens
        else:
            assert seq.stats["drafted"] > 0
    if not sampled:
        for seq in seqs:
            assert seq.tokens == generate(target, seq.prompt_tokens, CAPPED_NEW).tokens, seq.index


def test_the_policies_plan_within_each_sequences_cap():
    """The engine hands a policy min(room, draft_n) per sequence: the fixed policy plans exactly that, the adaptive
    and batch-aware ones at most that (their own choice below it), whatever they would choose for the others;
    and an adaptive engine's capped sequences still get plain greedy tokens."""
    from tinyspec.fast.adaptive import AdaptiveDraftLength
    from tinyspec.fast.batch_draft_length import BatchDraftLength

    rooms = [0, 1, 3, 2]
    assert [pl.k for pl in FixedDraftLength(3).plan(rooms)] == rooms
    for policy in (AdaptiveDraftLength(3, a0=0.99), BatchDraftLength(3, a0=0.99)):
        for _ in range(6):
            assert all(pl.k <= room for pl, room in zip(policy.plan(rooms), rooms)), type(policy).__name__

    target, _ = models()
    runs: dict[int, list[int]] = {}
    drafter = MTPDrafter(target)
    policy = AdaptiveDraftLength.for_drafter(drafter, 3, a0=0.99)
    engine = Engine(target, drafter, policy, EngineOptions(slots=3, n_blocks=64, block_size=4),
                    on_emit=lambda seq, tokens, marks: runs.setdefault(seq.index, []).append(len(tokens)))
    seqs = [SeqResult(i, prompt) for i, (prompt, *_) in enumerate(CAPPED[:3])]
    for seq, (_, draft_n, _, _) in zip(seqs, CAPPED):
        engine.add(seq, CAPPED_NEW, 0, draft_n=draft_n)
    while not engine.done():
        engine.step()
    assert any(k > 1 for k in policy.chosen)  # it drafted past the caps for the uncapped sequence
    assert seqs[0].stats["drafted"] == 0 and max(runs[0]) == 1 and max(runs[1]) <= 2 and max(runs[2]) > 2
    for seq in seqs:
        assert seq.tokens == generate(target, seq.prompt_tokens, CAPPED_NEW).tokens, seq.index


@pytest.mark.parametrize("draft_n", [-1, 4, 1.5, True, "2"])
def test_a_draft_n_out_of_range_is_that_sequences_error(draft_n):
    target, _ = models()
    engine = Engine(target, MTPDrafter(target), FixedDraftLength(3), EngineOptions(slots=2, n_blocks=64, block_size=4))
    bad, good = SeqResult(0, PROMPTS[0]), SeqResult(1, PROMPTS[1])
    engine.add(bad, MAX_NEW, 0, draft_n=draft_n)
    engine.add(good, MAX_NEW, 0, draft_n=2)
    assert bad.error is not None and "draft_n" in bad.error and "0..3" in bad.error
    while not engine.done():
        engine.step()
    assert bad.tokens == [] and good.error is None
    assert good.tokens == generate(target, PROMPTS[1], MAX_NEW).tokens


def test_an_engine_without_a_drafter_takes_draft_n_0_only():
    target, _ = models()
    engine = Engine(target, options=EngineOptions(slots=2, n_blocks=32, block_size=4))
    plain, asks = SeqResult(0, PROMPTS[0]), SeqResult(1, PROMPTS[1])
    engine.add(plain, MAX_NEW, 0, draft_n=0)
    engine.add(asks, MAX_NEW, 0, draft_n=1)
    assert plain.error is None and "0..0" in asks.error
    while not engine.done():
        engine.step()
    assert plain.tokens == generate(target, PROMPTS[0], MAX_NEW).tokens
