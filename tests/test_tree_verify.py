"""Draft trees verified in one pass (tree.py), exact: greedy tree speculation equals plain greedy decoding token for
token, and the state after every step is bitwise a plain prefill of the kept tokens.

    the pass    every row of a tree pass equals the last row of a one-token-at-a-time decode of its path (the GDN
                layers from the parent's state, attention over the prefix and the path), on the oracle and the cpu
                backend; restore_path leaves the state of a plain prefill of the path, contiguous KV and paged
    the loop    hypothesis: random trees (random shapes, tokens from the true continuation or not, so random
                acceptance depths and branches), random draft budgets, prompts and lengths: the output equals plain
                greedy and the final state equals a plain prefill, both rollback placements, random targets
                (dense and MoE) and the shipped model on the cpu backend
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_speculate import targets  # noqa: F401  (a fixture: random hybrid targets, dense and MoE)

from tinyspec.backends import load_model, numba_available
from tinyspec.drafting import Draft, KeepsNoKV, Proposing, no_passes
from tinyspec.generate import generate, speculative_generate
from tinyspec.model import Model
from tinyspec.paged import BlockPool
from tinyspec.state import SnapshotRing
from tinyspec.tree import check_parents, path_to

N_VOCAB = 272
NEEDS_NUMBA = pytest.mark.skipif(not numba_available(), reason="needs numba")

def random_tree(rng, k: int) -> tuple[int, ...]:
    """k nodes, each under a random earlier row (biased to deep rows, so some paths are long)."""
    return check_parents([int(min(i - 1, rng.integers(0, i) + rng.integers(0, 2))) for i in range(1, k + 1)])


class RandomTreeDrafter(Proposing, KeepsNoKV):
    """Proposes random trees over the true greedy continuation: a node's token is the true next token of its path
    with probability `hit` (when its path is still the true one), else a random token; so acceptance stops at
    random depths, on random branches, and a tree may hold the true token twice under one parent."""

    stops_by_confidence = False

    def __init__(self, continuation: list[int], seed: int, hit: float = 0.6):
        self.continuation, self.rng, self.hit, self.i = continuation, np.random.default_rng(seed), hit, 0

    def start(self, prompt, hidden, k_max, resume=None):
        self.i = 0

    def drafting(self, pending, k, params, rng, stop=None, on_device=False):
        assert pending == self.continuation[self.i]
        if not k:
            return no_passes(Draft())
        parents = random_tree(self.rng, k)
        tokens, true = [], [True]  # true[r]: row r's path is the true continuation
        for r, p in enumerate(parents, start=1):
            depth = len(path_to(parents, r)) - 1
            j = self.i + depth
            right = true[p] and j < len(self.continuation) and self.rng.random() < self.hit
            tokens.append(self.continuation[j] if right else int(self.rng.integers(0, N_VOCAB)))
            true.append(right)
        return no_passes(Draft(tokens, [None] * k, parents=parents))

    def draft_pass(self, asks):
        return []

    def another(self, pool=None):
        return RandomTreeDrafter(self.continuation, int(self.rng.integers(1 << 30)), self.hit)

    def commit(self, fed, hidden):
        self.i += len(fed)


def fresh_state(model: Model, tokens: list[int], pool=None):
    state = model.new_state(pool)
    model.forward(np.array(tokens), state)
    return state


def decode_path(model: Model, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """The logits of the last of `tokens` decoded one at a time after the prompt: what a tree row must equal."""
    state = fresh_state(model, prompt)
    for t in tokens:
        logits, _ = model.forward([t], state)
    return logits[-1]


@pytest.mark.parametrize("backend", ["numpy", pytest.param("cpu", marks=NEEDS_NUMBA)])
@pytest.mark.parametrize("paged", [False, True])
def test_every_tree_row_is_a_one_token_decode_of_its_path(backend, paged):
    from tinyspec.assets import TARGET

    model = load_model(TARGET, backend)
    rng = np.random.default_rng(1)
    prompt = [int(t) for t in rng.integers(0, model.cfg.n_vocab, 19)]
    parents = (0, 0, 1, 1, 3, 2, 5, 5)
    tokens = [int(t) for t in rng.integers(0, model.cfg.n_vocab, len(parents) + 1)]
    pool = BlockPool(model.cfg, 16, block_size=4) if paged else None
    state, ring = fresh_state(model, prompt, pool), SnapshotRing(model.cfg, len(tokens), model.xp)
    logits, _, _ = model.forward_batch([tokens], [state], [ring], trees=[parents])
    for r in range(len(tokens)):
        path = [tokens[i] for i in path_to(parents, r)]
        assert np.array_equal(logits[r], decode_path(model, prompt, path)), r
    for leaf in (6, 4, 0):  # a deep path, a short one, the root alone
        kept = path_to(parents, leaf)
        again = fresh_state(model, prompt, pool)
        model.forward_batch([tokens], [again], [ring], trees=[parents])
        ring.restore_path(again, kept)
        assert again.max_abs_diff(fresh_state(model, prompt + [tokens[i] for i in kept])) == 0.0
        again.release()
    state.release()


def test_a_tree_pass_needs_a_snapshot_ring_and_a_parent_per_token(request):
    model = request.getfixturevalue("targets")("gdn-attn-x2")  # (test_speculate's random targets)
    state = fresh_state(model, [1, 2, 3])
    with pytest.raises(ValueError, match="one parent per token"):
        model.forward_batch([[1, 2, 3]], [state], [SnapshotRing(model.cfg, 4)], trees=[(0,)])
    with pytest.raises(ValueError, match="SnapshotRing"):
        model.forward_batch([[1, 2, 3]], [state], [None], trees=[(0, 0)])
    with pytest.raises(ValueError, match="parent must be a row before it"):
        model.forward_batch([[1, 2, 3]], [state], [SnapshotRing(model.cfg, 4)], trees=[(0, 2)])


@pytest.mark.parametrize("name", ["gdn-attn-x2", "moe-e8-k2"])
@pytest.mark.parametrize("rollback", ["snapshot", "replay"])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), draft_n=st.integers(1, 8), n_prompt=st.integers(1, 12),
       max_new=st.integers(1, 24), hit=st.sampled_from([0.3, 0.7, 1.0]))
def test_greedy_tree_speculation_equals_plain(request, name, rollback, seed, draft_n, n_prompt, max_new, hit):
    target = request.getfixturevalue("targets")(name)
    target = target.with_placement(replace(target.placement, rollback=rollback))
    prompt = [int(t) for t in np.random.default_rng(seed).integers(0, N_VOCAB, n_prompt)]
    plain = generate(target, prompt, max_new).tokens
    spec = speculative_generate(target, RandomTreeDrafter(plain, seed, hit), prompt, max_new, draft_n=draft_n)
    assert spec.tokens == plain
    assert spec.state.max_abs_diff(fresh_state(target, prompt + plain[:-1])) == 0.0


class TreesForEveryone(RandomTreeDrafter):
    """RandomTreeDrafter in a batch: each slot's drafter finds its sequence's continuation by the history start()
    is given (a prompt, or a resumed one's prompt + tokens[:-1])."""

    def __init__(self, plains: dict, seed: int, hit: float = 0.7):
        super().__init__([], seed, hit)
        self.plains = plains

    def start(self, prompt, hidden, k_max, resume=None):
        begin = max((p for p in self.plains if tuple(prompt[: len(p)]) == p), key=len)
        self.continuation, self.i = self.plains[begin], len(prompt) - len(begin)

    def another(self, pool=None):
        return TreesForEveryone(self.plains, int(self.rng.integers(1 << 30)), self.hit)


def run_schedule(backend: str, seqs: list[dict], k: int, slots: int, block_size: int, spare: int, chunk, seed: int):
    """Several sequences drafting random trees in one pass, arriving at their steps into `slots` slots, their KV in
    a pool of one longest run and `spare` blocks more (so sequences wait and are preempted, then resumed by
    recompute): after every step each active slot's state is bitwise a plain prefill of its committed tokens, and
    every sequence ends with its solo plain greedy output. Returns the engine."""
    from tinyspec.assets import TARGET
    from tinyspec.drafting import FixedDraftLength
    from tinyspec.scheduler import EngineOptions, blocks_per_run
    from tinyspec.sequence import SeqResult
    from tinyspec.speculate import Engine

    model = load_model(TARGET, backend)
    longest_new = {tuple(s["prompt"]): max(t["max_new"] for t in seqs if t["prompt"] == s["prompt"]) for s in seqs}
    plains = {p: generate(model, list(p), n).tokens for p, n in longest_new.items()}  # a prefix is each one's own
    longest = max(len(s["prompt"]) + s["max_new"] + k + 1 for s in seqs)
    engine = Engine(model, TreesForEveryone(plains, seed), FixedDraftLength(k),
                    EngineOptions(slots=slots, n_blocks=blocks_per_run(model, None, longest, block_size) + spare,
                                  block_size=block_size, chunk=chunk))
    results = [SeqResult(i, list(s["prompt"])) for i, s in enumerate(seqs)]
    step = 0
    while step <= max(s["arrive"] for s in seqs) or not engine.done():
        for r, s in zip(results, seqs):
            if s["arrive"] == step:
                engine.add(r, s["max_new"], seed=r.index)
        engine.step()
        step += 1
        assert step < 300, "no progress"
        for s in engine.active.values():
            committed = s.history[: s.state.pos] if s.prefilling else s.seq.prompt_tokens + s.seq.tokens[:-1]
            if committed:
                assert s.state.max_abs_diff(fresh_state(model, committed)) == 0.0
    for r, s in zip(results, seqs):
        assert r.error is None and r.tokens == plains[tuple(s["prompt"])][: s["max_new"]]
    assert not engine.pool.refs.any()
    return engine


ALPHABET = [220, 11, 1, 4, 3, 5, 2, 9, 15]


@pytest.mark.parametrize("backend", ["numpy", pytest.param("cpu", marks=NEEDS_NUMBA)])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_schedules_of_trees_keep_every_slot_exact_after_every_step(backend, data):
    """run_schedule under random schedules: arrivals, 1-3 slots, random k, pool sizes and chunked joins."""
    seqs = [{"prompt": data.draw(st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=8)),
             "max_new": data.draw(st.integers(1, 14)), "arrive": data.draw(st.integers(0, 4))}
            for _ in range(data.draw(st.integers(1, 4)))]
    run_schedule(backend, seqs, data.draw(st.integers(1, 5)), data.draw(st.integers(1, 3)),
                 data.draw(st.sampled_from([2, 4])), data.draw(st.integers(0, 6)), data.draw(st.sampled_from([None, 2, 3])),
                 data.draw(st.integers(0, 99)))


@pytest.mark.parametrize("backend", ["numpy", pytest.param("cpu", marks=NEEDS_NUMBA)])
def test_trees_in_a_pool_too_small_for_all_are_preempted_and_stay_exact(backend):
    seqs = [{"prompt": [1, 2, 3, 1, 2], "max_new": 14, "arrive": 0}, {"prompt": [9, 15, 9], "max_new": 12, "arrive": 0},
            {"prompt": [220, 11, 4], "max_new": 12, "arrive": 1}, {"prompt": [5], "max_new": 10, "arrive": 2}]
    engine = run_schedule(backend, seqs, k=4, slots=3, block_size=2, spare=1, chunk=None, seed=7)
    assert engine.preemptions > 0


@pytest.mark.parametrize("graphs", [False, True])
def test_trees_on_the_cuda_backend_through_the_stand_in(monkeypatch, graphs):
    """The cuda backend's modules run on the fake CuPy (tests/fake_cupy.py): a tree pass takes the host path of its
    placement (no device pass, no graph: its rows' attention and scan follow parents), the chains around it keep
    theirs, and greedy tree speculation equals the oracle's plain greedy output."""
    import dataclasses

    import fake_cupy
    from tinyspec import backends
    from tinyspec.assets import TARGET

    fake_cupy.install(monkeypatch)
    model = load_model(TARGET, "cuda")
    model = model.with_placement(dataclasses.replace(backends.cuda_placement(graphs=graphs,
                                                                             check_graphs=fake_cupy.check_replay)))
    prompt = [5, 6, 7, 8, 9, 10, 5, 6]
    plain = generate(load_model(TARGET, "numpy"), prompt, 24).tokens
    spec = speculative_generate(model, RandomTreeDrafter(plain, 5, 0.7), prompt, 24, draft_n=5)
    assert spec.tokens == plain and spec.stats.accepted > 0


def test_a_server_drafting_mixed_trees_answers_what_plain_decoding_does():
    """serve with --spec mtp+lookup (the MTP head's tree and lookup's branches): concurrent greedy completions, each
    the text plain decoding gives, and the drafts were trees that the target kept."""
    import threading

    from serve_helpers import get, shown, target

    from tinyspec.lookup import LookupDrafter
    from tinyspec.mixed import MixedDrafter
    from tinyspec.mtp import MTPDrafter
    from tinyspec.scheduler import EngineOptions
    from tinyspec.serve import Server
    from test_serve import client

    model, tok = target()
    srv = Server(model, tok, "tiny-target", EngineOptions(slots=2), port=0,
                 drafter=MixedDrafter(MTPDrafter(model), LookupDrafter(), tree=2), spec="mtp+lookup").start()
    try:
        prompts = ["def read_config(path):\n    with open(path) as f:\n", "class Stack:\n", "import os\n"]
        out = {}

        def ask(p):
            out[p] = client(srv).completions.create(model="tiny-target", prompt=p, max_tokens=16, temperature=0)

        threads = [threading.Thread(target=ask, args=(p,)) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for p in prompts:
            assert out[p].choices[0].text == shown(generate(model, tok.encode(p), 16).tokens)
        assert sum(o.model_extra["tinyspec"]["accepted"] for o in out.values()) > 0
        assert get(srv, "/health")["status"] == "ok"
    finally:
        srv.close()
