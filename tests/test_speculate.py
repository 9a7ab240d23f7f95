"""The speculative engine: greedy output equals plain greedy output for every drafter and draft length,
and after generation every piece of state equals that of a sequence that plainly decoded the same tokens.

Random tiny hybrid models (GDN + attention + MTP) are built here; drafters include an adversarial one
(random proposals, almost all rejected) and an oracle (the true continuation, always accepted).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from law_checks import assert_counts_follow
from tiny_models import write_tiny_qwen35

from tinyspec.draft import DraftModelDrafter
from tinyspec.drafting import (
    Draft,
    FixedDraftLength,
    KeepsNoKV,
    Plan,
    Proposing,
    StopRule,
    no_passes,
)
from tinyspec.fast.adaptive import AdaptiveDraftLength
from tinyspec.fast.draft_vocab import DraftVocab
from tinyspec.generate import generate, speculative_generate
from tinyspec.lookup import LookupDrafter
from tinyspec.model import Model
from tinyspec.mixed import MixedDrafter
from tinyspec.mtp import MTPDrafter, MTPHead, shift_hidden

N_VOCAB = 272


TARGETS = {  # random hybrid targets: different head layouts, layer patterns, tied/untied output, and a qwen35moe
    "gdn-attn-x2": dict(seed=11, n_trunk=4, interval=2),
    "tied-nk1-nv2": dict(seed=21, n_trunk=5, interval=3, n_k=1, n_v=2, H=4, H_kv=2, tied=True),
    "moe-e8-k2": dict(seed=31, n_trunk=4, interval=2, experts=(8, 2, 16, 24)),  # the rollback invariants on MoE too
}


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    """targets(name) -> TARGETS[name] as a Model, written and loaded once per module."""
    built = {}

    def get(name: str) -> Model:
        if name not in built:
            path = tmp_path_factory.mktemp("spec") / f"{name}.gguf"
            write_tiny_qwen35(path, **TARGETS[name])
            built[name] = Model.from_gguf(path)
        return built[name]

    return get


@pytest.fixture(scope="module", params=list(TARGETS))
def target(targets, request) -> Model:
    return targets(request.param)


@pytest.fixture(scope="module")
def draft_model(tmp_path_factory) -> Model:
    path = tmp_path_factory.mktemp("spec") / "draft.gguf"
    write_tiny_qwen35(path, seed=12, n_trunk=2, interval=2, D=16, F=24, mtp=False)
    return Model.from_gguf(path)


class RandomDrafter(Proposing, KeepsNoKV):
    """Adversarial: proposes random tokens, so nearly every draft is rejected."""

    stops_by_confidence = False

    def __init__(self, seed: int):
        self.seed, self.rng = seed, np.random.default_rng(seed)

    def start(self, prompt, hidden, k_max, resume=None):
        pass

    def drafting(self, pending, k, params, rng, stop=None, on_device=False):
        return no_passes(Draft([int(t) for t in self.rng.integers(0, N_VOCAB, k)], [None] * k))

    def draft_pass(self, asks):
        return []

    def another(self, pool=None):
        return RandomDrafter(self.seed + 1)

    def commit(self, fed, hidden):
        pass


class OracleDrafter(Proposing, KeepsNoKV):
    """Proposes the true greedy continuation: every draft is accepted, k+1 tokens per step."""

    stops_by_confidence = False

    def __init__(self, continuation: list[int]):
        self.continuation, self.i = continuation, 0  # i = index of the pending token in the output

    def start(self, prompt, hidden, k_max, resume=None):
        self.i = 0

    def drafting(self, pending, k, params, rng, stop=None, on_device=False):
        assert pending == self.continuation[self.i]
        drafts = self.continuation[self.i + 1 : self.i + 1 + k]
        return no_passes(Draft(drafts, [None] * len(drafts)))

    def draft_pass(self, asks):
        return []

    def another(self, pool=None):
        return OracleDrafter(self.continuation)

    def commit(self, fed, hidden):
        self.i += len(fed)  # the kept tokens, then the new pending token


def make_drafter(kind: str, target: Model, draft_model: Model, plain: list[int]):
    vocab = DraftVocab(np.random.default_rng(5).permutation(N_VOCAB), N_VOCAB // 3, N_VOCAB)  # a third of the ids
    return {"mtp": lambda: MTPDrafter(target), "lookup": lambda: LookupDrafter(n_max=3),
            "draft": lambda: DraftModelDrafter(draft_model, target=target),
            "mtp-vocab": lambda: MTPDrafter(target, vocab),
            "mtp-pmin": lambda: MTPDrafter(target, vocab, p_min=0.3),  # stops after unsure drafts
            "mtp-stop": lambda: MTPDrafter(target),  # with STOPPING: stops where a rule on the probabilities says
            "draft-stop": lambda: DraftModelDrafter(draft_model, target=target),
            "draft-vocab": lambda: DraftModelDrafter(draft_model, target=target, vocab=vocab),
            "random": lambda: RandomDrafter(0), "oracle": lambda: OracleDrafter(plain),
            # draft trees (tree.py): the head's top-3 per depth, lookup's several matches, both in one tree
            "mtp-tree": lambda: MTPDrafter(target, tree=3), "lookup-tree": lambda: LookupDrafter(n_max=3, tree=2),
            "mixed": lambda: MixedDrafter(MTPDrafter(target), LookupDrafter(n_max=3), tree=2)}[kind]()


@dataclass
class StoppingPolicy(FixedDraftLength):
    """k drafts at most, each step cut by a stop rule on the drafts' probabilities (as the adaptive policy's
    keep_drafting cuts it): on after a draft the drafter gives probability >= 0.4 while the product stays >= 0.2."""

    def plan(self, rooms, prefill_rows=0):
        stop = StopRule(lambda probs: probs[-1] >= 0.4 and float(np.prod(probs)) >= 0.2)
        return [Plan(min(self.k_max, room), stop) for room in rooms]


def policy_for(kind: str, draft_n: int):
    return StoppingPolicy(draft_n) if kind.endswith("-stop") else FixedDraftLength(draft_n)


def fresh_state(model: Model, tokens: list[int]):
    state = model.new_state()
    model.forward(np.array(tokens), state)
    return state


def repetitive_prompt(rng, n: int) -> list[int]:
    """Prompts with repeats so lookup finds matches too."""
    base = [int(t) for t in rng.integers(0, N_VOCAB, max(2, n // 2))]
    return (base * 3)[:n]


@pytest.fixture(params=["snapshot", "replay"])
def rollback(request) -> str:
    """Both rollback stores of state.py: SnapshotRing (copies) and ReplayRing (rescans); the same bits."""
    return request.param


def with_ring(model: Model, rollback: str) -> Model:
    """The same weights with the placement's ring set to `rollback` (Model.new_ring makes that one)."""
    return model.with_placement(replace(model.placement, rollback=rollback))


@pytest.mark.parametrize("kind", ["mtp", "mtp-pmin", "mtp-stop", "lookup", "draft", "draft-stop", "random", "oracle",
                                  "mtp-tree", "lookup-tree", "mixed"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), draft_n=st.integers(1, 8), n_prompt=st.integers(1, 12), max_new=st.integers(1, 24))
def test_greedy_speculative_equals_plain(target, draft_model, rollback, kind, seed, draft_n, n_prompt, max_new):
    target = with_ring(target, rollback)
    prompt = repetitive_prompt(np.random.default_rng(seed), n_prompt)
    plain = generate(target, prompt, max_new).tokens
    drafter = make_drafter(kind, target, draft_model, plain)
    spec = speculative_generate(target, drafter, prompt, max_new, policy=policy_for(kind, draft_n))
    assert spec.tokens == plain
    # the target state holds exactly prompt + emitted[:-1], bit for bit
    assert spec.state.max_abs_diff(fresh_state(target, prompt + plain[:-1])) == 0.0
    if kind == "oracle":
        assert spec.stats.accepted == spec.stats.drafted  # every draft accepted
    if kind in ("mtp", "mtp-pmin", "mtp-stop", "mtp-tree", "mixed"):  # the MTP cache ends exactly at the accepted prefix, with the target's hidden rows
        tokens = prompt + plain[:-1]
        _, hidden = target.forward(np.array(tokens), target.new_state())
        head = MTPHead(target)
        cache = head.new_cache()
        head.forward(tokens, shift_hidden(hidden), cache)
        assert (drafter.mtp if kind == "mixed" else drafter).cache.max_abs_diff(cache) == 0.0
    if kind in ("draft", "draft-stop"):  # the draft model holds exactly the accepted prefix
        assert drafter.state.max_abs_diff(fresh_state(draft_model, prompt + plain[:-1])) == 0.0


@pytest.mark.parametrize("kind", ["mtp", "lookup", "draft", "oracle"])
def test_stop_at_every_position_of_a_window(target, draft_model, rollback, kind):
    """A stop token at output position j (inside an accepted run or not): output ends at j, state exact."""
    target = with_ring(target, rollback)
    prompt = repetitive_prompt(np.random.default_rng(5), 9)
    plain = generate(target, prompt, 16).tokens
    for j in range(len(plain)):
        if plain[j] in plain[:j]:
            continue  # an earlier copy of the token would stop first
        drafter = make_drafter(kind, target, draft_model, plain)
        spec = speculative_generate(target, drafter, prompt, 16, draft_n=4, stop_ids=(plain[j],))
        assert spec.tokens == plain[: j + 1]
        assert spec.state.max_abs_diff(fresh_state(target, prompt + plain[:j])) == 0.0


def test_oracle_drafter_emits_k_plus_one_per_step(target, draft_model):
    prompt = [1, 2, 3]
    plain = generate(target, prompt, 1 + 4 * 5).tokens
    spec = speculative_generate(target, OracleDrafter(plain), prompt, len(plain), draft_n=4)
    assert spec.tokens == plain
    assert spec.stats.steps == 4 and spec.stats.as_dict()["mean_accepted_length"] == 5.0  # 1 + 4 steps x 5 = 21
    assert spec.stats.as_dict()["acceptance_rate"] == 1.0 and spec.stats.rollbacks == 0


def test_rollback_reruns_no_pass_and_allocates_no_ring(target, rollback, monkeypatch):
    """The target sees each verify pass once: tokens forwarded = prompt + k+1 per step (no re-run of the
    kept prefix through the model; a ReplayRing rescans only the GDN memory), and the ring is allocated
    once for the whole generation."""
    target = with_ring(target, rollback)
    created = []
    real_new_ring = target.new_ring
    monkeypatch.setattr(target, "new_ring", lambda slots: created.append(1) or real_new_ring(slots))
    prompt = [7, 8, 9, 10]
    before = target.n_forward_tokens
    spec = speculative_generate(target, RandomDrafter(1), prompt, 20, draft_n=3)
    forwarded = target.n_forward_tokens - before
    assert spec.stats.rollbacks > 0 and len(created) == 1
    assert forwarded == len(prompt) + spec.stats.steps + spec.stats.drafted


def test_stats_fields(target):
    spec = speculative_generate(target, MTPDrafter(target), [3, 4, 5], 12, draft_n=3)
    d = spec.stats.as_dict()
    assert set(d) >= {"steps", "drafted", "accepted", "acceptance_rate", "mean_accepted_length",
                      "accepted_per_position", "accepted_length_histogram", "phase_ms", "tokens_per_s"}
    assert sum(d["accepted_length_histogram"].values()) == d["steps"]
    assert d["emitted"] == len(spec.tokens) == 12
    assert len(spec.marks) == 12 and spec.marks[0] == "target"


def test_bad_arguments(target):
    with pytest.raises(ValueError, match="prompt is empty"):
        speculative_generate(target, LookupDrafter(), [], 4)
    with pytest.raises(ValueError, match="draft length must be in 0..64"):
        speculative_generate(target, LookupDrafter(), [1], 4, draft_n=-1)


def test_limits_are_checked_before_anything_is_allocated(target):
    """A draft length past MAX_DRAFT (the ring holds a state per draft) and a generation past the model's context
    are refused up front, in speculative and plain generation alike, with the numbers in the message."""
    from tinyspec.drafting import MAX_DRAFT
    from tinyspec.generate import generate

    n_ctx = target.cfg.n_ctx
    with pytest.raises(ValueError, match=f"0..{MAX_DRAFT}"):
        speculative_generate(target, LookupDrafter(), [1], 4, draft_n=10**9)
    with pytest.raises(ValueError, match=f"0..{MAX_DRAFT}"):
        generate(target, [1], 4, drafter=LookupDrafter(), policy=AdaptiveDraftLength(MAX_DRAFT + 1))
    with pytest.raises(ValueError, match=f"context length {n_ctx}.*at most {n_ctx - 3} new tokens"):
        generate(target, [1, 2, 3], n_ctx)
    with pytest.raises(ValueError, match="context length"):
        speculative_generate(target, LookupDrafter(), [1, 2, 3], 10**12)
    with pytest.raises(ValueError, match="shorter prompt"):
        generate(target, [1] * (n_ctx + 1), 0)
    with pytest.raises(ValueError, match="max_new"):
        generate(target, [1], -1)
    assert len(generate(target, [1, 2, 3], 2).tokens) == 2  # within the limits nothing changes


def test_draft_model_with_other_vocabulary_is_refused(target, tmp_path):
    write_tiny_qwen35(tmp_path / "other.gguf", N=300, mtp=False)
    with pytest.raises(ValueError, match="vocabulary"):
        DraftModelDrafter(Model.from_gguf(tmp_path / "other.gguf"), target=target)


# Every drafter once, the targets taken in turn: the rule under test (spec_sampling) does not look at the target,
# and the greedy tests above run every drafter on every target; 400 seeded runs a case (the rule itself is checked
# exactly, by enumeration, in test_spec_sampling.py).
LAW_CASES = [("gdn-attn-x2", "mtp"), ("tied-nk1-nv2", "lookup"), ("moe-e8-k2", "draft"),
             ("gdn-attn-x2", "mtp-vocab"), ("tied-nk1-nv2", "draft-vocab"), ("moe-e8-k2", "mtp-pmin"),
             ("tied-nk1-nv2", "mtp-stop"), ("gdn-attn-x2", "draft-stop"), ("moe-e8-k2", "mtp"),
             ("gdn-attn-x2", "mtp-tree"), ("tied-nk1-nv2", "mixed")]  # trees: the rule is spec_tree's


@pytest.mark.parametrize("name, kind", LAW_CASES, ids=["-".join(c) for c in LAW_CASES])
def test_sampled_speculation_keeps_the_target_law(targets, draft_model, name, kind):
    """Monte-Carlo chi-square: the joint law of the first two emitted tokens under speculative sampling
    (the second one went through the accept/residual rule against the drafter's q) equals the target's
    exact law p(t1) p(t2 | t1), computed here by enumeration. Seeded, so deterministic."""
    from tinyspec.sampling import SamplingParams, probs_from_logits

    target = targets(name)
    params = SamplingParams(temperature=1.0, top_k=4)
    prompt = [40, 41, 40, 41, 40]
    for _ in range(16):  # prepend the possible first tokens until the prompt holds them all, so lookup drafts too
        state = target.new_state()
        logits, _ = target.forward(np.array(prompt), state)
        p1 = probs_from_logits(logits[-1], params)
        missing = [int(t) for t in np.flatnonzero(p1) if t not in prompt[:-1]]
        if not missing:
            break
        prompt = missing + prompt
    assert not missing
    exact = {}
    for t1 in np.flatnonzero(p1):
        s = state.copy()
        p2 = probs_from_logits(target.forward(np.array([t1]), s)[0][-1], params)
        exact.update({(int(t1), int(t2)): p1[t1] * p2[t2] for t2 in np.flatnonzero(p2)})

    n_runs, counts, drafted, accepted = 400, {}, 0, 0
    drafter = make_drafter(kind, target, draft_model, [])
    for seed in range(n_runs):
        spec = speculative_generate(target, drafter, prompt, 3, draft_n=2, params=params, rng=np.random.default_rng(seed))
        counts[tuple(spec.tokens[:2])] = counts.get(tuple(spec.tokens[:2]), 0) + 1
        drafted, accepted = drafted + spec.stats.drafted, accepted + spec.stats.accepted
    # drafts were made and the residual path was taken; random tiny drafters rarely propose a token in
    # the target's top 4, so the accept path is exercised by the exact enumeration in test_spec_sampling.py
    assert 0 < drafted and accepted < drafted, (drafted, accepted)
    assert_counts_follow(counts, exact, n_runs)


def test_snapshot_ring_save_restore_is_identity_and_ranges_are_checked(target):
    from tinyspec.state import SnapshotRing

    state = fresh_state(target, [1, 2, 3, 4])
    ring = SnapshotRing(target.cfg, 3)
    ring.save(state, 0)
    before = state.copy()
    ring.restore(state, 0)
    assert state.max_abs_diff(before) == 0.0
    for bad in (-1, 1, 3):  # slot 1 was never written; 3 is outside the ring
        with pytest.raises(ValueError, match="entry"):
            ring.restore(state, bad)
    with pytest.raises(ValueError, match="entry"):
        ring.save(state, 3)
    target.forward(np.array([5, 6]), state, ring=ring)  # a pass of 2 fills slots 0, 1
    short = fresh_state(target, [1, 2])
    with pytest.raises(ValueError, match="rollback to 5 tokens: the state holds 2"):
        ring.restore(short, 0)


def test_replay_ring_restores_every_prefix_bitwise_and_checks_ranges(target):
    """ReplayRing.restore(j) equals a fresh run of the kept tokens for every j, in any order and repeatedly
    (each restore rescans from the pre-pass memory, which the pass never overwrote), also into a copy."""
    from tinyspec.state import ReplayRing

    prompt, batch = [1, 2, 3, 4], [5, 6, 7, 8]
    ring = ReplayRing(target.cfg, 4, target.kernels.causal_conv, target.kernels.gdn_scan)
    with pytest.raises(ValueError, match="entry 0: the ring holds entries 0 .. -1"):
        ring.restore(fresh_state(target, prompt), 0)
    state = fresh_state(target, prompt)
    target.forward(np.array(batch), state, ring=ring)
    assert state.max_abs_diff(fresh_state(target, prompt + batch)) == 0.0  # the pass itself: as without a ring
    after = state.copy()
    for slot in (2, 0, 3, 1, 1):
        s = after.copy()
        ring.restore(s, slot)
        assert s.max_abs_diff(fresh_state(target, prompt + batch[: slot + 1])) == 0.0
    ring.restore(state, 1)
    assert state.max_abs_diff(fresh_state(target, prompt + batch[:2])) == 0.0
    target.forward(np.array([9, 10]), state, ring=ring)  # the next pass writes into the old base
    ring.restore(state, 0)
    assert state.max_abs_diff(fresh_state(target, prompt + batch[:2] + [9])) == 0.0
    for bad in (-1, 2):
        with pytest.raises(ValueError, match="entry"):
            ring.restore(state, bad)
    with pytest.raises(ValueError, match="rollback to 8 tokens: the state holds 4"):
        ring.restore(fresh_state(target, prompt), 1)


def test_gdn_windows_keep_their_address_across_passes(target, rollback):
    """A CUDA graph bakes in every array address, so the conv writes each GDN layer's window in place
    (gdn.gdn_conv's outs): with no ring and with a SnapshotRing, state.conv stays the same object through
    every pass and rollback. A ReplayRing keeps the pre-pass window as its replay base (ReplayLog.conv), so its
    pass gives the state a fresh window, which its rollback then writes in place. The bits: the ring tests above."""
    from tinyspec.state import GDNState

    target = with_ring(target, rollback)
    state = target.new_state()
    gdn = [i for i, layer in enumerate(state.layers) if isinstance(layer, GDNState)]
    windows = lambda: [state.layers[i].conv for i in gdn]  # noqa: E731
    first = windows()
    target.forward(np.array([1, 2, 3]), state)  # no ring: prefill
    target.forward(np.array([4]), state)  # no ring: a decode step
    assert all(a is b for a, b in zip(windows(), first))
    ring = target.new_ring(4)
    target.forward(np.array([5, 6, 7]), state, ring=ring)
    if rollback == "snapshot":
        assert all(a is b for a, b in zip(windows(), first))
    else:  # the old window is the log's base; the state took a new one
        assert all(ring.log[i].conv is b and state.layers[i].conv is not b for i, b in zip(gdn, first))
    after = windows()
    ring.restore(state, 1)
    assert all(a is b for a, b in zip(windows(), after))
    assert state.max_abs_diff(fresh_state(target, [1, 2, 3, 4, 5, 6])) == 0.0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_self_speculation_accepts_everything(target, temperature):
    """A drafter identical to the target (the target as its own draft model) is accepted at rate 1.0:
    greedy drafts equal the argmax; sampled drafts have q == p, so min(1, p/q) = 1."""
    from tinyspec.sampling import SamplingParams

    spec = speculative_generate(target, DraftModelDrafter(target, target), [3, 1, 4, 1, 5], 16, draft_n=3,
                                params=SamplingParams(temperature), rng=np.random.default_rng(0))
    assert spec.stats.drafted > 0 and spec.stats.accepted == spec.stats.drafted


def test_measure_step_overheads_times_both_rings(tmp_path, capsys):
    """tools/measure_step_overheads.py (LESSONS 14-15; costs in docs/performance-log.md old 25) runs on a
    file's header and reports a ReplayRing rollback per kept count next to the SnapshotRing figures."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    import measure_step_overheads

    path = tmp_path / "t.gguf"
    write_tiny_qwen35(path, seed=11, n_trunk=4, interval=2)
    assert measure_step_overheads.main(["--model", str(path), "--k", "3", "--repeat", "2", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["restore_ms"] > 0 and len(r["replay_restore_ms"]) == 3 and min(r["replay_restore_ms"]) > 0
