"""The batch engine (tinyspec/batch.py) is exact per sequence, whatever else shares the batch.

    greedy    every sequence's tokens == its solo plain greedy output (generate), for every drafter, batch
              size, prompt length, stop ids (a stop inside a slot's accepted window included) and any mix of
              draft lengths per slot and step
    sampled   with its seed, every sequence's tokens == its solo speculative run (same k, same seed); a plain
              batch == generate with the same seed; and a Monte-Carlo chi-square of one slot's first two
              tokens against the target's exact law
    schedules a hypothesis property over random arrival schedules (continuous batching): after EVERY step each
              active slot's state is bitwise a fresh prefill of its committed tokens, no KV block is leaked or
              owned twice, tables hold exactly ceil(pos / block_size) blocks, the rollback rings are never
              reallocated, the drafters' KV (MTP head, draft model) takes pool blocks counted with the rest, and a
              drafter giving its blocks back (its sequence preempted or finished) holds exactly its committed
              tokens (lookup history, MTP window and queue, draft-model state); sampled, each sequence equals its
              solo run, an MTP head restarted from a window before the preemption included
    bad input slots=0, no prompts, too long / empty / out-of-vocabulary prompts, a run the pool cannot hold

Models: the shipped tiny-target.gguf (with an MTP head) and tiny-draft.gguf on the numpy oracle and the cpu
backend (numba; its ring is a ReplayRing, the oracle's a SnapshotRing), and a random tiny model from
tiny_models.py for the law test.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from law_checks import assert_counts_follow
from tiny_models import write_tiny_qwen35

import tinyspec
from tinyspec.backends import load_model, numba_available
from tinyspec.batch import batch_generate
from tinyspec.draft import DraftModelDrafter
from tinyspec.drafting import FixedDraftLength, Plan, policy_for
from tinyspec.generate import generate, speculative_generate
from tinyspec.lookup import LookupDrafter
from tinyspec.model import Model
from tinyspec.mixed import MixedDrafter
from tinyspec.mtp import MTPDrafter, MTPHead, shift_hidden
from tinyspec.sampling import SamplingParams, probs_from_logits
from tinyspec.scheduler import EngineOptions, blocks_per_run
from tinyspec.sequence import SeqResult
from tinyspec.speculate import Engine
from tinyspec.state import GDNState, ReplayRing, SnapshotRing

ASSETS = Path(tinyspec.__file__).resolve().parent / "assets"
NEEDS_NUMBA = pytest.mark.skipif(not numba_available(), reason="needs numba")
BACKENDS = ["numpy", pytest.param("cpu", marks=NEEDS_NUMBA)]
DRAFTERS = ("none", "lookup", "mtp", "draft", "mixed")  # mixed: the MTP head's tree and lookup's branches

# prompts of different lengths, some repetitive (so lookup finds matches); 5 of them: more than any slot count here
PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 17], [3], [5, 6, 5, 6, 5, 6, 5]]
MAX_NEW = 10


@pytest.fixture(scope="module", autouse=True)
def one_numba_thread():
    """The cpu backend's kernels on the calling thread only, for this module (restored after). On a 2-core VM a
    parallel call waits for both threads (LESSONS 18), and with Numba's OpenMP workers spinning between the many
    small calls of these tiny models this file ran 3-6x slower than on one thread. Bits do not depend on the
    thread count (test_numba_ops.py::test_thread_count_does_not_change_bits), so nothing checked here changes."""
    if not numba_available():
        yield
        return
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(before)


@functools.cache
def models(backend: str) -> tuple[Model, Model]:
    """(target, draft model) on `backend`: loaded once per test run. "numpy+pad": the oracle with Placement.pad_rows,
    so every verify pass's sequence feeds k_max + 1 rows and the MTP head pads its first pass of a drafting to k + 2
    rows, as the cuda backend does with graphs."""
    if backend == "numpy+pad":
        target, draft = models("numpy")
        return target.with_placement(dataclasses.replace(target.placement, pad_rows=True)), draft
    return load_model(ASSETS / "tiny-target.gguf", backend), load_model(ASSETS / "tiny-draft.gguf", backend)


# the random schedules' (backend, drafter) pairs: every drafter on each backend and on the padded oracle (verify rows
# padded to k_max + 1, the MTP head's first pass to k + 2: Placement.pad_rows)
SCHEDULE_CASES = ([pytest.param("numpy", k, id=f"{k}-numpy") for k in DRAFTERS]
                  + [pytest.param("cpu", k, marks=NEEDS_NUMBA, id=f"{k}-cpu") for k in DRAFTERS]
                  + [pytest.param("numpy+pad", k, id=f"{k}-numpy-padded") for k in DRAFTERS if k != "none"])


_SOLO: dict = {}


def solo_greedy(backend: str, prompt, max_new: int, stops=()) -> list[int]:
    """The sequence's plain greedy output alone (generate), memoised: what every batch run must reproduce."""
    key = (backend, tuple(prompt), max_new, tuple(sorted(stops)))
    if key not in _SOLO:
        _SOLO[key] = generate(models(backend)[0], list(prompt), max_new, stop_ids=tuple(sorted(stops))).tokens
    return _SOLO[key]


def batch_drafter(kind: str, target: Model, draft: Model, slots: int, max_queue: int = 32):
    return {"none": lambda: None,
            "lookup": lambda: LookupDrafter(n_max=3),
            "mtp": lambda: MTPDrafter(target, max_queue=max_queue),
            "draft": lambda: DraftModelDrafter(draft, target),
            "mixed": lambda: MixedDrafter(MTPDrafter(target, max_queue=max_queue), LookupDrafter(n_max=3), tree=2)}[kind]()


def solo_drafter(kind: str, target: Model, draft: Model, max_queue: int = 32):
    return {"lookup": lambda: LookupDrafter(n_max=3), "mtp": lambda: MTPDrafter(target, max_queue=max_queue),
            "draft": lambda: DraftModelDrafter(draft, target),
            "mixed": lambda: MixedDrafter(MTPDrafter(target, max_queue=max_queue), LookupDrafter(n_max=3), tree=2)}[kind]()


class RandomK:
    """A BatchPolicy that picks every slot's k at random each step (0 .. min(k_max, room), seeded), and checks
    what the engine tells it: one room per active slot, one draft and one accepted count per slot, rows = R (padded:
    every decoding slot feeds k_max + 1 rows, its drafts' and filler, Placement.pad_rows)."""

    def __init__(self, k_max: int, seed: int, padded: bool = False):
        self.k_max, self.rng, self.padded = k_max, np.random.default_rng(seed), padded
        self.chosen: list[list[int]] = []  # per step, the k of each slot
        self.n_slots = 0

    def plan(self, rooms: list[int], prefill_rows: int = 0) -> list[Plan]:
        assert rooms and all(0 <= r <= self.k_max for r in rooms), rooms
        ks = [int(self.rng.integers(0, min(self.k_max, r) + 1)) for r in rooms]
        self.chosen.append(ks)
        self.n_slots, self.prefill_rows = len(rooms), prefill_rows
        return [Plan(k) for k in ks]

    def observe(self, drafts, accepted, draft_s, verify_s, rows) -> None:
        ks = self.chosen[-1]
        assert len(drafts) == len(accepted) == self.n_slots
        assert all(len(d.tokens) <= k and 0 <= a <= len(d.tokens) for d, a, k in zip(drafts, accepted, ks))
        own = [self.k_max + 1] * len(drafts) if self.padded else [len(d.tokens) + 1 for d in drafts]
        assert rows == sum(own) + self.prefill_rows  # joining chunks share the pass
        assert draft_s >= 0 and verify_s >= 0

    def summary(self):
        return None


# ------------------------------------------------------------------------------------------ 1. greedy exactness
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", DRAFTERS)
@pytest.mark.parametrize("slots", [1, 2, 3])
def test_greedy_batch_equals_solo_plain_greedy(backend, kind, slots):
    """A full batch (as many prompts as slots) and an over-full one (5 prompts: the rest wait and join as slots
    free up): every sequence's tokens are its solo plain greedy tokens, in input order."""
    target, draft = models(backend)
    for prompts in (PROMPTS[:slots], PROMPTS):
        result = batch_generate(target, prompts, MAX_NEW, drafter=batch_drafter(kind, target, draft, slots),
                                draft_n=None if kind == "none" else 3,
                                options=EngineOptions(slots=slots, block_size=4))
        assert [s.index for s in result.sequences] == list(range(len(prompts)))
        for seq, prompt in zip(result.sequences, prompts):
            assert seq.error is None
            assert seq.prompt_tokens == prompt
            assert seq.tokens == solo_greedy(backend, prompt, MAX_NEW), (seq.index, seq.marks)
            assert len(seq.marks) == len(seq.tokens) and seq.marks[0] == "target"
            assert seq.stats["emitted"] == len(seq.tokens)
        stats = result.stats
        assert stats["sequences"] == len(prompts) and stats["failed"] == 0
        assert stats["generated"] == len(prompts) * MAX_NEW
        assert 0 < stats["kv_blocks_peak"] <= stats["kv_blocks"]
        if kind in ("mtp", "draft"):  # the drafters did draft, and drafts were kept
            assert sum(s.stats["accepted"] for s in result.sequences) > 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", DRAFTERS)
def test_stop_ids_end_sequences_early_even_inside_an_accepted_window(backend, kind):
    """Stop ids taken from the runs themselves: for each sequence, its first accepted draft (else its 3rd
    token). A stop inside a slot's accepted window cuts the run there; the sequence equals solo greedy with the
    same stops (generate: the stop is emitted, then nothing), and the sequences that do not stop are untouched."""
    target, draft = models(backend)
    slots, max_new = 2, 12
    free = batch_generate(target, PROMPTS, max_new, drafter=batch_drafter(kind, target, draft, slots),
                          draft_n=None if kind == "none" else 3, options=EngineOptions(slots=slots, block_size=4))
    stops = set()
    for seq in free.sequences:
        js = [j for j, m in enumerate(seq.marks) if m == "accepted" and seq.tokens[j] not in seq.tokens[:j]] or [2]
        stops.add(seq.tokens[js[0]])
    result = batch_generate(target, PROMPTS, max_new, drafter=batch_drafter(kind, target, draft, slots),
                            draft_n=None if kind == "none" else 3,
                            options=EngineOptions(slots=slots, stop_ids=sorted(stops), block_size=4))
    early = 0
    for seq, prompt in zip(result.sequences, PROMPTS):
        expected = solo_greedy(backend, prompt, max_new, stops)
        assert seq.tokens == expected, seq.index
        early += len(seq.tokens) < max_new
        if len(seq.tokens) < max_new:
            assert seq.tokens[-1] in stops
    assert early >= 3
    if kind in ("mtp", "draft"):  # some sequence's stop was an accepted draft: the window was cut after it
        assert any(seq.marks[-1] == "accepted" and seq.tokens[-1] in stops for seq in result.sequences)


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_new_zero_and_one_and_a_stop_as_first_token(backend):
    target, _ = models(backend)
    first = solo_greedy(backend, PROMPTS[0], 1)[0]
    for max_new in (0, 1):
        result = batch_generate(target, PROMPTS, max_new, drafter=MTPDrafter(target), options=EngineOptions(slots=2))
        assert [s.tokens for s in result.sequences] == [solo_greedy(backend, p, max_new) for p in PROMPTS]
    result = batch_generate(target, PROMPTS, 6, drafter=MTPDrafter(target),
                            options=EngineOptions(slots=2, stop_ids=[first]))
    assert result.sequences[0].tokens == [first]
    assert [s.tokens for s in result.sequences] == [solo_greedy(backend, p, 6, {first}) for p in PROMPTS]


# ------------------------------------------------------------------------------------- 2. any mix of k per slot
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", DRAFTERS)
def test_random_k_per_slot_per_step_is_still_exact(backend, kind):
    target, draft = models(backend)
    slots = 3
    for seed in (0, 1):
        policy = RandomK(4, seed)
        result = batch_generate(target, PROMPTS, MAX_NEW, drafter=batch_drafter(kind, target, draft, slots),
                                policy=policy, options=EngineOptions(slots=slots, block_size=4))
        assert [s.tokens for s in result.sequences] == [solo_greedy(backend, p, MAX_NEW) for p in PROMPTS]
        ks = [k for step in policy.chosen for k in step]
        assert 0 in ks and max(ks) > 0  # plain steps and drafting steps both happened
        assert any(len(set(step)) > 1 for step in policy.chosen)  # slots with different k in the same pass
        if kind in ("mtp", "draft"):
            assert sum(s.stats["accepted"] for s in result.sequences) > 0


# --------------------------------------------------------------------------------------------------- 3. sampled
SAMPLED = SamplingParams(temperature=0.9, top_k=20)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["mtp", "draft", "lookup"])
@pytest.mark.parametrize("k", [1, 3])
def test_sampled_batch_equals_solo_speculative_with_the_same_seed(backend, kind, k):
    target, draft = models(backend)
    seeds = [17, 4, 99, 1234, 5]
    stops = [15]
    result = batch_generate(target, PROMPTS, MAX_NEW, drafter=batch_drafter(kind, target, draft, 2), draft_n=k,
                            seeds=seeds, options=EngineOptions(slots=2, params=SAMPLED, stop_ids=stops, block_size=4))
    drafted = 0
    for seq, prompt, seed in zip(result.sequences, PROMPTS, seeds):
        solo = speculative_generate(target, solo_drafter(kind, target, draft), prompt, MAX_NEW, draft_n=k,
                                    params=SAMPLED, rng=np.random.default_rng(seed), stop_ids=stops)
        assert seq.tokens == solo.tokens, seq.index
        assert seq.marks == solo.marks
        assert (seq.stats["drafted"], seq.stats["accepted"]) == (solo.stats.drafted, solo.stats.accepted)
        drafted += seq.stats["drafted"]
    if kind != "lookup":
        assert drafted > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_sampled_plain_batch_equals_generate_with_the_same_seed(backend):
    target, _ = models(backend)
    seeds = [3, 1, 4, 1, 5]  # two sequences share a seed: each still has its own stream
    result = batch_generate(target, PROMPTS, MAX_NEW, seeds=seeds, options=EngineOptions(slots=3, params=SAMPLED))
    outs = [generate(target, p, MAX_NEW, SAMPLED, rng=np.random.default_rng(s)).tokens for p, s in zip(PROMPTS, seeds)]
    assert [s.tokens for s in result.sequences] == outs
    # and the outputs are really sampled: another seed gives another output somewhere
    other = batch_generate(target, PROMPTS, MAX_NEW, seeds=[s + 100 for s in seeds],
                           options=EngineOptions(slots=3, params=SAMPLED))
    assert [s.tokens for s in other.sequences] != outs



@pytest.fixture(scope="module")
def law_models(tmp_path_factory):
    """A random tiny target (N = 272) and a draft model built from the same seed with one trunk layer fewer: the
    same first three layers, so its law is close to the target's but not equal (drafts are accepted about half
    the time: both the accept and the residual path are taken)."""
    d = tmp_path_factory.mktemp("law")
    write_tiny_qwen35(d / "target.gguf", seed=11, n_trunk=4, interval=2)
    write_tiny_qwen35(d / "draft.gguf", seed=11, n_trunk=3, interval=2, mtp=False)
    return Model.from_gguf(d / "target.gguf"), Model.from_gguf(d / "draft.gguf")


def test_one_slot_of_a_batch_keeps_the_target_law(law_models):
    """Monte-Carlo chi-square, as test_speculate.test_sampled_speculation_keeps_the_target_law for one sequence:
    the joint law of the first two tokens of sequence 1 in a batch of 3 (its neighbours with seeds of their own
    that change per run too, the second token through the accept / residual rule against the draft model's q)
    equals the exact p(t1) p(t2 | t1) of the target, enumerated here. Seeded, so deterministic; the tolerance
    is the chi-square critical value at p = 0.001 after pooling cells with expected count < 5."""
    target, draft = law_models
    params = SamplingParams(temperature=1.0, top_k=4)
    prompts = [[5, 6, 7], [40, 41, 40, 41, 40], [9]]
    state = target.new_state()
    logits, _ = target.forward(np.array(prompts[1]), state)
    p1 = probs_from_logits(logits[-1], params)
    exact = {}
    for t1 in np.flatnonzero(p1):
        s = state.copy()
        p2 = probs_from_logits(target.forward(np.array([t1]), s)[0][-1], params)
        exact.update({(int(t1), int(t2)): p1[t1] * p2[t2] for t2 in np.flatnonzero(p2)})
    assert abs(sum(exact.values()) - 1) < 1e-9

    n_runs, counts, drafted, accepted = 700, {}, 0, 0
    for seed in range(n_runs):
        result = batch_generate(target, prompts, 3, drafter=DraftModelDrafter(draft, target), draft_n=2,
                                seeds=[seed + 10_000, seed, seed + 20_000],
                                options=EngineOptions(slots=3, params=params))
        seq = result.sequences[1]
        counts[tuple(seq.tokens[:2])] = counts.get(tuple(seq.tokens[:2]), 0) + 1
        drafted, accepted = drafted + seq.stats["drafted"], accepted + seq.stats["accepted"]
    assert 0 < accepted < drafted, (drafted, accepted)  # both the accept and the residual path were taken
    assert_counts_follow(counts, exact, n_runs, min_cells=4)  # a test with some power


# ------------------------------------------------------------------------------- 4. random schedules, every step
ALPHABET = [1, 2, 3, 4, 5, 9, 11, 15, 220, 353]  # few distinct ids: repeats, so lookup drafts
COMMON_OUT = [15, 7, 2, 11, 91, 30, 8, 6, 12, 220, 508]  # tokens the tiny target often emits after such prompts


def drafter_positions(drafter) -> int:
    """The positions a drafter's KV holds or has queued (0: one that keeps no KV)."""
    drafter = drafter.mtp if isinstance(drafter, MixedDrafter) else drafter  # (its KV is its MTP head's)
    if isinstance(drafter, MTPDrafter):
        return drafter.fed_cache.n + sum(len(fed) for fed, _ in drafter.queue)
    if isinstance(drafter, DraftModelDrafter):
        return drafter.fed_state.pos + len(drafter.queue)
    return 0


def watch_drafting(engine: Engine) -> None:
    """After every drafting pass, each decoding sequence's drafter holds at most its positions + room + 2, the most
    the scheduler budgets its blocks for (drafting.Drafter's rule: + k + 2 during a drafting of k <= room). Checked
    as the pass returns: for the MTP head inside draft_pass, before a padded pass's filler is dropped (the peak)."""
    drafters = engine.drafters
    if drafters is None:
        return

    def check():
        for b, s in engine.active.items():
            if not s.prefilling:
                assert drafter_positions(drafters[b]) <= s.state.pos + s.room(engine.k_max) + 2, b

    def checked(real):
        def call(*args, **kwargs):
            out = real(*args, **kwargs)
            check()
            return out
        return call

    if isinstance(drafters[0], MTPDrafter):  # the drafters share one head, this engine's own
        head = drafters[0].head
        head.forward_batch = checked(head.forward_batch)
    drafters[0].draft_pass = checked(drafters[0].draft_pass)  # (only the first drafter's makes passes: run_together)


class Watch:
    """Everything the invariants compare against, recorded at setup: the rings (ReplayRing: every buffer that
    may legitimately be a spare), the pool's arrays; new_ring / new_state calls counted from then on."""

    def __init__(self, engine: Engine, model: Model):
        self.engine, self.model = engine, model
        self.pool_k, self.pool_v = list(engine.pool.k), list(engine.pool.v)
        self.rings = list(engine.rings)
        self.gdn = [i for i, r in enumerate(model.cfg.recurrent) if r]
        # SnapshotRing: its per-token buffers, which must stay the same arrays for the whole run
        self.snap = [[(r.conv[i], r.ssm[i]) for i in self.gdn] if isinstance(r, SnapshotRing) else None
                     for r in engine.rings]
        # ReplayRing: a pass scans into the ring's spare and swaps it with the state's memory, so buffers move
        # between rings and states. No allocation means every spare is a buffer that existed at setup or was a
        # joining state's own memory (recorded by the new_state wrapper below); kept alive here, so `is` is sound.
        self.known_ssm = {i: [r.log[i].spare for r in engine.rings if isinstance(r, ReplayRing)] for i in self.gdn}
        self.new_rings, self.tree_rings = 0, {}
        real_new_ring, real_new_state = model.new_ring, model.new_state

        def new_ring(slots, tree=False):  # a slot's tree ring (a SnapshotRing) is made when its first tree comes
            self.new_rings += not tree
            return real_new_ring(slots, tree)

        def new_state(pool=None):
            state = real_new_state(pool)
            for i in self.gdn:
                self.known_ssm[i].append(state.layers[i].ssm)
            return state

        model.new_ring, model.new_state = new_ring, new_state  # model: this test's own Model object

    def check_rings(self) -> None:
        engine = self.engine
        assert self.new_rings == 0, "a ring was allocated after setup"
        for b, ring in enumerate(engine.tree_rings):  # made once per slot, then kept
            if ring is not None:
                assert self.tree_rings.setdefault(b, ring) is ring, "a slot's tree ring was made twice"
        assert len(engine.rings) == len(self.rings) and all(a is b for a, b in zip(engine.rings, self.rings))
        states = [s.state for s in engine.active.values()]
        for ring, snap in zip(engine.rings, self.snap):
            if snap is not None:
                for i, (conv, ssm) in zip(self.gdn, snap):
                    assert ring.conv[i] is conv and ring.ssm[i] is ssm
                    for state in states:  # a state never holds a ring buffer (restore copies out of it)
                        assert not np.may_share_memory(state.layers[i].ssm, ssm)
                        assert not np.may_share_memory(state.layers[i].conv, conv)
        for i in self.gdn:
            buffers = [r.log[i].spare for r in engine.rings if isinstance(r, ReplayRing)]
            assert all(any(b is k for k in self.known_ssm[i]) for b in buffers), "a ring buffer nobody allocated"
            buffers += [s.layers[i].ssm for s in states]
            assert len({id(b) for b in buffers}) == len(buffers), "a memory buffer owned twice"
            for a in range(len(buffers)):
                for b in range(a + 1, len(buffers)):
                    assert not np.may_share_memory(buffers[a], buffers[b])

    def check_pool(self) -> None:
        """Every block is in use (refs = the tables listing it, the drafters' included), idle (cached, nobody's) or
        free, exactly one of them; a shared or cached block lies before every position its users may still write; a
        drafter holds blocks only while its slot's sequence decodes, exactly those its KV's positions need, and its
        KV (fed and queued) never holds more positions than its sequence's state: the rule the scheduler budgets by."""
        engine, pool = self.engine, self.engine.pool
        assert all(a is b for a, b in zip(pool.k, self.pool_k)) and all(a is b for a, b in zip(pool.v, self.pool_v))
        tables = [s.state.table.blocks for s in engine.active.values()]
        for b, drafter in enumerate(engine.drafters or []):
            held = list(drafter.kv_table.blocks) if drafter.kv_table is not None else []
            s, positions = engine.active.get(b), drafter_positions(drafter)
            drafter = drafter.mtp if isinstance(drafter, MixedDrafter) else drafter
            if s is None or s.prefilling:
                assert not held, f"slot {b}'s drafter holds blocks while no sequence of its has started it"
            if isinstance(drafter, MTPDrafter):
                assert len(held) == drafter.fed_cache.table.blocks_for(drafter.fed_cache.n)
            elif isinstance(drafter, DraftModelDrafter):
                assert len(held) == drafter.fed_state.table.blocks_for(drafter.fed_state.pos)
            if held and s is not None:  # the budget's rule (drafting.Drafter): never more than its sequence holds
                assert positions <= s.state.pos, (positions, s.state.pos)
            tables.append(held)
        users = np.zeros(pool.n_blocks, np.int64)
        for table in tables:
            assert len(table) == len(set(table)), "a block twice in one table"
            users[table] += 1
        assert (users == pool.refs).all(), "a reference count differs from the tables using the block"
        in_use, idle, free = set(np.flatnonzero(users)), set(pool.idle), set(pool.free)
        assert len(pool.free) == len(free), "a block twice on the free list"
        assert not in_use & idle and not in_use & free and not idle & free, "a block in two places"
        assert in_use | idle | free == set(range(pool.n_blocks)), "a block leaked"
        assert idle == {b for b in pool.cached if pool.refs[b] == 0} and not free & set(pool.cached)
        assert pool.used == len(in_use) and pool.peak_used <= pool.n_blocks
        for s in engine.active.values():
            table = s.state.table
            assert len(table.blocks) == -(-s.state.pos // pool.block_size)
            assert list(table.ids()) == table.blocks
            assert all(layer.n == s.state.pos for layer in s.state.layers if not isinstance(layer, GDNState))
            shared = [j for j, b in enumerate(table.blocks) if not pool.writable(b)]
            assert all((j + 1) * pool.block_size <= s.state.pos for j in shared), "a shared block it may still write"
            if not s.prefilling:  # decoding: everything before its committed tokens' last block is final
                assert len(s.seq.prompt_tokens) + len(s.seq.tokens) - 1 == s.state.pos


def committed_tokens(s) -> list[int]:
    """What a slot's state must equal a one-pass prefill of: the history fed so far while it prefills (its
    prompt; a resumed one's prompt + tokens[:-1]), else prompt + every emitted token but the pending last one."""
    if s.prefilling:
        return s.history[: s.state.pos]
    return s.seq.prompt_tokens + s.seq.tokens[:-1]


@st.composite
def schedules(draw):
    n = draw(st.integers(1, 5))
    shared = draw(st.lists(st.sampled_from(ALPHABET), max_size=10))  # a prefix some prompts start with
    seqs = [{"prompt": (shared if draw(st.booleans()) else []) +
             draw(st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=8)),
             "max_new": draw(st.integers(0, 14)), "arrive": draw(st.integers(0, 5))} for _ in range(n)]
    k_max = draw(st.sampled_from([0, 1, 2, 3, 4, 4, 5]))
    block_size = draw(st.sampled_from([1, 2, 3, 4, 16]))
    need = max(-(-(len(s["prompt"]) + s["max_new"] + k_max + 1) // block_size) for s in seqs)
    return {"seqs": seqs, "slots": draw(st.integers(1, 3)), "k_max": k_max, "block_size": block_size,
            # the pool: one longest run (its drafter's KV included, pool_size) and `spare` blocks more, often too
            # few for all: waits and preemptions
            "spare": draw(st.integers(0, 2 * need)),
            "stops": draw(st.sets(st.sampled_from(COMMON_OUT), max_size=2)),
            "policy_seed": draw(st.integers(0, 2**16)),
            "chunk": draw(st.sampled_from([None, 1, 2, 3, 5])),
            "prefix_cache": draw(st.booleans()), "max_states": draw(st.integers(0, 3)),
            "state_every": draw(st.integers(0, 2)),
            "max_queue": draw(st.sampled_from([1, 2, 3, 32]))}  # the MTP head's window: small ones restart often


HEAVY = {  # always run: late arrivals, a pool too small for all at once (sequences wait for blocks), stops
    "seqs": [{"prompt": [1], "max_new": 14, "arrive": 0},
             {"prompt": [9, 15, 9, 15, 9], "max_new": 9, "arrive": 0},
             {"prompt": [220, 11, 1, 4, 220, 11, 1, 4, 3, 5, 2, 9], "max_new": 12, "arrive": 2},
             {"prompt": [353, 4, 11], "max_new": 1, "arrive": 3},
             {"prompt": [5, 5, 5, 1, 2, 3, 4], "max_new": 14, "arrive": 5}],
    "slots": 3, "k_max": 4, "block_size": 2, "spare": 2, "stops": {7}, "policy_seed": 3,
    "chunk": None, "prefix_cache": False, "max_states": 0, "state_every": 0, "max_queue": 32}

SHARED = [220, 11, 1, 4, 220, 11, 1, 4, 3]
PREFIXED = {  # always run: prompts sharing a 9-token prefix arrive one by one in 3 slots with a tight pool, chunked
    # prefill of 3 rows, the prefix cache on (a branch point at block 4, the prompts' ends): hits, preemptions
    "seqs": [{"prompt": SHARED + [5, 2], "max_new": 12, "arrive": 0},
             {"prompt": SHARED + [9, 9, 1], "max_new": 10, "arrive": 1},
             {"prompt": SHARED + [5, 2], "max_new": 12, "arrive": 2},
             {"prompt": SHARED + [15], "max_new": 8, "arrive": 3},
             {"prompt": [1, 2], "max_new": 14, "arrive": 3}],
    "slots": 3, "k_max": 3, "block_size": 2, "spare": 2, "stops": set(), "policy_seed": 5,
    "chunk": 3, "prefix_cache": True, "max_states": 3, "state_every": 0, "max_queue": 2,
    "expect_hits_and_preemptions": True}


def pool_size(model: Model, drafter, sch: dict, k_max: int) -> int:
    """The schedule's pool: the blocks of its longest run, the drafter's KV included, and `spare` more."""
    longest = max(len(s["prompt"]) + s["max_new"] + k_max + 1 for s in sch["seqs"])
    return blocks_per_run(model, drafter, longest, sch["block_size"]) + sch["spare"]


def engine_for(model: Model, draft: Model, kind: str, sch: dict, policy, params=SamplingParams(), on_finish=None):
    drafter = batch_drafter(kind, model, draft, sch["slots"], sch["max_queue"])
    options = EngineOptions(slots=sch["slots"], n_blocks=pool_size(model, drafter, sch, policy.k_max),
                            block_size=sch["block_size"], chunk=sch["chunk"], prefix_cache=sch["prefix_cache"],
                            max_states=sch["max_states"], state_every=sch["state_every"], params=params,
                            stop_ids=sch["stops"])
    return Engine(model, drafter, policy, options, on_finish=on_finish)


@pytest.mark.parametrize("backend, kind", SCHEDULE_CASES)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sch=schedules())
@example(sch=HEAVY)
@example(sch=PREFIXED)
def test_random_schedules_keep_every_slot_exact_after_every_step(backend, kind, sch):
    """Continuous batching under a random schedule: sequences arrive between steps, slots free up and are
    refilled, k varies per slot and step, prompts share prefixes, join a chunk at a time (random chunk sizes),
    start from the prefix cache and are preempted when the (often tiny) pool runs out, the drafters' KV (the MTP
    head's, a draft model's) counted in it. After every step each active slot holds exactly the state of a fresh
    prefill of its committed tokens (committed_tokens), bitwise: GDN conv windows and memories, KV contents (read
    through shared blocks too) and positions; its tokens so far are a prefix of its solo greedy output; the block
    pool and the rings obey the invariants of Watch (reference counts with the drafters' blocks, no leak, nothing
    in two places, no shared block still writable; every write into a shared or cached block raises,
    BlockTable.check_writable). Each time a drafter gives its blocks back (preempted or finished) it holds exactly
    what a solo run's would (check_drafter), and a resumed one is handed back what it gave. At the end every
    sequence equals its solo greedy output and every block is idle or free."""
    base, draft = models(backend)
    model = base.with_kernels(base.kernels)  # the same weights, a Model object of this example's own (Watch wraps it)
    slots, seqs, stops = sch["slots"], sch["seqs"], sch["stops"]
    finished, occupant, released = [], {}, {}  # slot -> its Running, seq index -> its drafter's release() record

    def on_finish(seq: SeqResult):
        finished.append(seq.index)
        assert seq.tokens == solo_greedy(backend, seq.prompt_tokens, seqs[seq.index]["max_new"], stops)

    def check_drafter(alone, committed: list[int]) -> None:
        """A drafter about to give its blocks back holds what a solo run's holds after `committed`."""
        if kind == "mixed":  # both halves: lookup's history, then the MTP head's window as below
            assert alone.lookup.history == committed
            alone = alone.mtp
        if kind == "lookup":
            assert alone.history == committed
        elif kind in ("mtp", "mixed"):  # the head's window: its fed tokens' KV, with the target's hidden rows, and the rest queued
            _, hidden = base.forward(np.array(committed), base.new_state())
            rows, (begin, fed) = shift_hidden(hidden), (alone.window.start, alone.window.fed)
            head = MTPHead(base)
            ref = head.new_cache()
            if fed:
                head.forward(committed[begin : begin + fed], rows[begin : begin + fed], ref)
            assert alone.fed_cache.max_abs_diff(ref) == 0.0
            assert [t for f, _ in alone.queue for t in f] == committed[begin + fed :]
            if alone.queue:
                assert np.array_equal(np.concatenate([h for _, h in alone.queue]), rows[begin + fed :])
            if sch["max_queue"] >= 32:  # (<= 26 tokens: under the window, so never a restart)
                assert begin == 0
        else:  # the draft model's state: a prefill of the committed tokens it fed, bitwise; the rest queued
            ref = draft.new_state()
            n = alone.fed_state.pos
            if n:
                draft.forward(np.array(committed[:n]), ref)
            assert alone.fed_state.max_abs_diff(ref) == 0.0 and alone.queue == committed[n:]

    policy = RandomK(sch["k_max"], sch["policy_seed"], padded=backend == "numpy+pad")
    engine = engine_for(model, draft, kind, sch, policy, on_finish=on_finish)
    assert engine.k_max == sch["k_max"] and len(engine.rings) == slots
    for slot, drafter in enumerate(engine.drafters or []):  # which sequence each slot's drafter serves
        def start(prompt, hidden, k_max, resume=None, slot=slot, real_start=drafter.start):  # (after the slot is filled)
            s = occupant[slot] = engine.active[slot]
            assert prompt == s.history == s.seq.prompt_tokens + s.seq.tokens[:-1] and k_max == engine.k_max
            assert len(hidden) == len(prompt)
            assert resume == released.pop(s.seq.index, None)  # what it gave back when preempted, or nothing
            real_start(prompt, hidden, k_max, resume)

        def release(slot=slot, alone=drafter, real_release=drafter.release):  # (after the slot was emptied)
            s = occupant.pop(slot, None)
            if s is None:  # a sequence that never started its drafter (cancelled while prefilling): nothing held
                assert not (alone.kv_table is not None and alone.kv_table.blocks)
                return real_release()
            check_drafter(alone, s.seq.prompt_tokens + s.seq.tokens[:-1])
            released[s.seq.index] = record = real_release()
            assert not (alone.kv_table is not None and alone.kv_table.blocks)
            return record

        drafter.start, drafter.release = start, release
    watch_drafting(engine)
    watch = Watch(engine, model)
    results = [SeqResult(i, list(s["prompt"])) for i, s in enumerate(seqs)]
    last_arrival, step = max(s["arrive"] for s in seqs), 0
    while step <= last_arrival or not engine.done():
        for r, s in zip(results, seqs):
            if s["arrive"] == step:
                engine.add(r, s["max_new"], seed=r.index)
        engine.step()
        step += 1
        assert step < 400, "no progress"
        assert len(engine.active) <= slots and set(engine.active) <= set(range(slots))
        for b, s in engine.active.items():
            seq = s.seq
            if seq.tokens:
                assert s.pending == seq.tokens[-1] and len(seq.tokens) < seqs[seq.index]["max_new"]
            assert seq.tokens == solo_greedy(backend, seq.prompt_tokens, seqs[seq.index]["max_new"], stops)[
                : len(seq.tokens)]
            committed = committed_tokens(s)
            ref = base.new_state()  # a solo sequence's own state (contiguous KV), prefilled in one pass
            if committed:
                base.forward(np.array(committed), ref, logits=False)
            assert ref.max_abs_diff(s.state) == 0.0, (b, seq.index, len(committed))
        watch.check_pool()
        watch.check_rings()
    assert sorted(finished) == [r.index for r in results]  # every sequence finished exactly once
    for r, s in zip(results, seqs):
        assert r.error is None
        assert r.tokens == solo_greedy(backend, r.prompt_tokens, s["max_new"], stops)
        assert r.stats["emitted"] == len(r.tokens)
    pool = engine.pool
    assert sorted(pool.free + list(pool.idle)) == list(range(pool.n_blocks)) and not pool.refs.any()
    assert pool.peak_used <= pool.n_blocks
    assert sum(r.stats["preemptions"] for r in results) == engine.preemptions
    if sch.get("expect_hits_and_preemptions"):  # the example does what it is there for
        assert engine.preemptions > 0 and engine.prefix_cache.hits > 0


_SOLO_SAMPLED: dict = {}


def solo_sampled(backend: str, kind: str, prompt, max_new: int, k: int, seed: int, stops=(), max_queue: int = 32,
                 policy=None) -> list[int]:
    """The sequence's sampled output alone with its seed (plain: generate; else speculative_generate with the
    same drafter kind, MTP window and k, or `policy`), memoised."""
    key = (backend, kind, tuple(prompt), max_new, k, seed, tuple(sorted(stops)), max_queue, repr(policy))
    if key not in _SOLO_SAMPLED:
        target, draft = models(backend)
        rng, stop_ids = np.random.default_rng(seed), tuple(sorted(stops))
        _SOLO_SAMPLED[key] = (generate(target, list(prompt), max_new, SAMPLED, rng=rng, stop_ids=stop_ids) if kind == "none"
                              else speculative_generate(target, solo_drafter(kind, target, draft, max_queue), list(prompt),
                                                        max_new, draft_n=None if policy else k, params=SAMPLED, rng=rng,
                                                        stop_ids=stop_ids, policy=policy)).tokens
    return _SOLO_SAMPLED[key]


@pytest.mark.parametrize("backend, kind", SCHEDULE_CASES)
@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sch=schedules())
@example(sch=PREFIXED)
def test_random_schedules_keep_every_sampled_sequence_equal_to_its_solo_run(backend, kind, sch):
    """Sampled, under the same random schedules (arrivals, shared prefixes, chunk sizes, prefix cache, tiny pools
    forcing preemption, the drafters' KV in them; MTP windows of 1-3 tokens, so heads restart from a window before
    they are preempted): every sequence's tokens equal its solo run with its seed and the same k. A preempted
    sequence keeps its random stream and resumes with its drafter restarted on its history from the record its
    release() gave (an MTP head: the same window and queue), so it draws what it would have drawn; its first
    token comes from its final chunk's last row as from a one-pass prefill."""
    target, draft = models(backend)
    k = max(1, sch["k_max"]) if kind != "none" else 0
    engine = engine_for(target, draft, kind, sch, FixedDraftLength(k), SAMPLED)
    results = [SeqResult(i, list(s["prompt"])) for i, s in enumerate(sch["seqs"])]
    last_arrival, step = max(s["arrive"] for s in sch["seqs"]), 0
    while step <= last_arrival or not engine.done():
        for r, s in zip(results, sch["seqs"]):
            if s["arrive"] == step:
                engine.add(r, s["max_new"], seed=100 + r.index)
        engine.step()
        step += 1
        assert step < 400, "no progress"
    for r, s in zip(results, sch["seqs"]):
        assert r.tokens == solo_sampled(backend, kind, r.prompt_tokens, s["max_new"], k, 100 + r.index, sch["stops"],
                                        sch["max_queue"])
    pool = engine.pool
    assert sorted(pool.free + list(pool.idle)) == list(range(pool.n_blocks)) and not pool.refs.any()
    if sch.get("expect_hits_and_preemptions"):
        assert engine.preemptions > 0


class PlainThenDraft:
    """k = 0 while max_new leaves room for k_max drafts, then as many as it leaves: a long run of plain steps (an
    MTP head's queue passes its 32-token window, so the head restarts from it), drafting only at the end. It reads
    only the rooms, so a sequence gets the same k alone and in a batch."""

    def __init__(self, k_max: int):
        self.k_max = k_max

    def plan(self, rooms: list[int], prefill_rows: int = 0) -> list[Plan]:
        return [Plan(0 if room == self.k_max else room) for room in rooms]

    def observe(self, drafts, accepted, draft_s, verify_s, rows) -> None:
        pass

    def summary(self):
        return None

    def __repr__(self):  # the memo key of solo_sampled
        return f"PlainThenDraft({self.k_max})"


def recording_laws(drafter, laws: list, owner=lambda: 0) -> None:
    """Wrap drafter.drafting so that each Draft's tokens and proposal laws q (bitwise copies) are appended to
    laws[owner()] (owner: the index of the sequence the drafter serves now)."""
    real = drafter.drafting

    def drafting(pending, k, params, rng, stop=None, on_device=False):
        draft = yield from real(pending, k, params, rng, stop, on_device)
        laws[owner()].append((list(draft.tokens), [q.copy() for q in draft.q_rows]))
        return draft

    drafter.drafting = drafting


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("max_queue, max_new, n_blocks", [(32, 48, 35), (2, 20, 14)], ids=["window32", "window2"])
def test_a_sampled_mtp_sequence_preempted_after_its_head_restarted_from_a_window_draws_its_solo_tokens(
        backend, max_queue, max_new, n_blocks):
    """The bug this guards: an MTP head whose queue passed max_queue restarts from a window of the recent past, so
    its cache holds only that window, and its next restart comes when its queue passes max_queue again. A sequence
    preempted after such a restart used to resume with its head rebuilt from the whole history and an empty queue:
    other proposal laws q, so a sampled sequence could draw other tokens than its solo run (greedy ones never
    noticed: acceptance compares argmaxes). release() now hands back the HeadWindow (where the cache starts, how
    many tokens it fed) and start() rebuilds that cache and queue. Two sequences, plain steps until max_new leaves
    room for 8 drafts then drafting (PlainThenDraft: the queue passes the window, then the head drafts from it), in
    a pool of blocks of 4 (the heads' KV counted) that runs out after the newer one's head restarted: the default
    32-token window, and a 2-token one. The newer sequence's tokens AND every draft's law q equal its solo run's,
    bitwise (rebuilt from the whole history instead, its laws after the resume differ in both cases)."""
    target, _ = models(backend)
    policy = PlainThenDraft(8)
    engine = Engine(target, MTPDrafter(target, max_queue=max_queue), policy,
                    EngineOptions(slots=2, n_blocks=n_blocks, block_size=4, params=SAMPLED))
    windows, laws = [], [[], []]  # what each resumed head was handed back; per sequence its drafts and laws
    for slot, drafter in enumerate(engine.drafters):
        def start(prompt, hidden, k_max, resume=None, real_start=drafter.start):
            windows.append(resume)
            real_start(prompt, hidden, k_max, resume)

        drafter.start = start
        recording_laws(drafter, laws, lambda slot=slot: engine.active[slot].seq.index)
    newer = SeqResult(1, [9, 15, 9])
    engine.add(SeqResult(0, [1, 2, 3]), max_new, seed=100)
    engine.add(newer, max_new, seed=101)
    while not engine.done():
        engine.step()
    assert newer.stats["preemptions"] > 0 and any(w is not None and w.start > 0 for w in windows)
    alone, solo_laws = MTPDrafter(target, max_queue=max_queue), [[]]
    recording_laws(alone, solo_laws)
    solo = speculative_generate(target, alone, newer.prompt_tokens, max_new, params=SAMPLED, policy=policy,
                                rng=np.random.default_rng(101))
    assert newer.tokens == solo.tokens
    assert len(laws[1]) == len(solo_laws[0]) > 0
    for (tokens, q_rows), (solo_tokens, solo_q_rows) in zip(laws[1], solo_laws[0]):
        assert tokens == solo_tokens and all(np.array_equal(a, b) for a, b in zip(q_rows, solo_q_rows))


# ------------------------------------------------------------------------------------------------ 5. bad input
def test_bad_arguments_raise():
    target, _ = models("numpy")
    with pytest.raises(ValueError, match="slots"):
        batch_generate(target, [[1, 2]], 4, options=EngineOptions(slots=0))
    with pytest.raises(ValueError, match="slots"):
        EngineOptions(slots=0)
    with pytest.raises(ValueError, match="no prompts"):
        batch_generate(target, [], 4)
    with pytest.raises(ValueError, match="max_new"):
        batch_generate(target, [[1]], -1)
    with pytest.raises(ValueError, match="seeds"):
        batch_generate(target, [[1], [2]], 4, seeds=[1])
    with pytest.raises(ValueError, match="disagree"):
        batch_generate(target, [[1]], 4, drafter=MTPDrafter(target), draft_n=2, policy=RandomK(3, 0))
    with pytest.raises(ValueError, match="block_size"):
        batch_generate(target, [[1, 2, 3]], 4, options=EngineOptions(block_size=0))


class TooMany:
    """A policy that plans past its own k_max: refused before anything is drafted."""
    k_max = 2

    def plan(self, rooms, prefill_rows=0):
        return [Plan(3) for _ in rooms]

    def observe(self, *args):
        pass

    def summary(self):
        return None


def test_a_plan_past_the_room_is_refused_before_drafting():
    class Counting(LookupDrafter):
        asked = 0

        def drafting(self, *args, **kwargs):
            Counting.asked += 1
            return super().drafting(*args, **kwargs)

    target, _ = models("numpy")
    engine = Engine(target, Counting(), TooMany(), EngineOptions(n_blocks=16, block_size=4))
    engine.add(SeqResult(0, [1, 2, 3]), 8, 0)
    engine.step()  # the prefill pass: nothing is planned yet
    with pytest.raises(ValueError, match="planned"):
        engine.step()
    assert Counting.asked == 0  # refused before the drafter was asked


@pytest.mark.parametrize("backend", BACKENDS)
def test_prompts_that_cannot_run_are_reported_and_the_others_are_exact(backend):
    target, draft = models(backend)
    max_new, n_ctx = 8, target.cfg.n_ctx
    too_long = [1] * (n_ctx - max_new + 1)
    prompts = [PROMPTS[0], too_long, [], PROMPTS[2], [1, target.cfg.n_vocab], PROMPTS[4], [-1]]
    finished = []
    result = batch_generate(target, prompts, max_new, drafter=DraftModelDrafter(draft, target), draft_n=3,
                            on_finish=lambda s: finished.append(s.index), options=EngineOptions(slots=2))
    seqs = result.sequences
    assert [s.index for s in seqs] == list(range(len(prompts)))
    assert "context length" in seqs[1].error
    assert "empty" in seqs[2].error
    assert "outside the vocabulary" in seqs[4].error and "outside the vocabulary" in seqs[6].error
    for i in (1, 2, 4, 6):
        assert seqs[i].tokens == []
    for i in (0, 3, 5):
        assert seqs[i].error is None and seqs[i].tokens == solo_greedy(backend, prompts[i], max_new)
    assert sorted(finished) == [0, 3, 5]  # only the sequences that ran are streamed
    assert result.stats["failed"] == 4 and result.stats["sequences"] == 7
    # all prompts bad: every one reported, nothing runs, no exception
    bad = batch_generate(target, [[], too_long], max_new, options=EngineOptions(slots=2))
    assert all(s.error for s in bad.sequences) and bad.stats["generated"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_run_the_pool_can_never_hold_is_reported_and_the_others_run(backend):
    """n_blocks given too small for one sequence's longest run: that sequence is reported (never admitted, so
    the pool cannot run out mid-step), the others run exactly, one at a time where the pool is tight."""
    target, _ = models(backend)
    long_prompt = [5, 6, 5, 6, 5, 6, 5, 6, 5, 6, 5, 6, 7, 8]
    prompts = [PROMPTS[1], long_prompt, PROMPTS[3], PROMPTS[0]]
    # block_size 4, k_max 3, max_new 6: [7, 8] needs ceil(12 / 4) = 3 blocks, the long prompt ceil(24 / 4) = 6
    result = batch_generate(target, prompts, 6, drafter=LookupDrafter(), draft_n=3,
                            options=EngineOptions(slots=3, block_size=4, n_blocks=5))
    seqs = result.sequences
    assert "KV pool" in seqs[1].error and seqs[1].tokens == []
    for i in (0, 2, 3):
        assert seqs[i].error is None and seqs[i].tokens == solo_greedy(backend, prompts[i], 6)
    assert result.stats["kv_blocks_peak"] <= 5


def test_padded_head_passes_draft_what_unpadded_ones_do():
    """Placement.pad_rows: the MTP head's first pass of a drafting runs k + 2 rows, filler after its own, whose KV is
    dropped after the pass. The drafts are the unpadded head's, bit for bit: the same accepted and rejected drafts at
    every step (marks), so the same tokens and the same head cache, for k = 1 and 3."""
    plain, padded = models("numpy")[0], models("numpy+pad")[0]
    prompt = [5, 6, 5, 6, 5, 6, 7, 8, 9, 10, 11]
    for k in (1, 3):
        runs = [speculative_generate(m, MTPDrafter(m), prompt, 24, draft_n=k) for m in (plain, padded)]
        assert runs[0].tokens == runs[1].tokens == solo_greedy("numpy", prompt, 24)
        assert runs[0].marks == runs[1].marks and runs[0].stats.accepted_per_position == runs[1].stats.accepted_per_position, k


def test_padded_head_passes_stay_within_the_drafter_budget_rule(monkeypatch):
    """drafting.Drafter's rule, which the scheduler budgets a drafter's pool blocks by: during a drafting of k its KV
    holds at most its sequence's positions + k + 2. The padded first pass reaches exactly that after a start (1 own
    row: pos + 1 - 1 held before, k + 2 rows) and stays under it after a verify (2 .. k + 2 own rows)."""
    model = models("numpy+pad")[0]
    engine = Engine(model, MTPDrafter(model), policy_for(3, None), EngineOptions())
    over = []
    real = MTPHead.forward_batch

    def watched(self, tokens, hidden_prev, caches, *args, **kwargs):
        out = real(self, tokens, hidden_prev, caches, *args, **kwargs)
        over.append(caches[0].n - engine.active[0].state.pos - 3)
        return out

    monkeypatch.setattr(MTPHead, "forward_batch", watched)
    seq = SeqResult(0, [5, 6, 5, 6, 5, 6, 7, 8, 9])
    engine.add(seq, 20, np.random.default_rng(0))
    while not engine.done():
        engine.step()
    assert seq.tokens == solo_greedy("numpy", seq.prompt_tokens, 20)
    assert max(over) == 2, over
