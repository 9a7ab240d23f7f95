"""Host syncs per verify step on the cuda backend, counted with the fake CuPy, and its graph capture.

A GPU that waits on the host runs at the host's pace: every sync (a device-to-host copy: the host waits for
the device to drain, then for the bytes) costs tens of microseconds of idle GPU, and at decode sizes a step
is a few milliseconds of GPU work. So the count of syncs per verify step is a budget, counted here on the
CPU with tests/fake_cupy.py (which records every sync, upload and launch the cuda backend's Python side
makes, with the line that made it) on a tiny model, in steady state (after the first steps: no allocation
left to grow), for each drafter with k = 3 drafts per step, and for plain decoding per token.

Before issue 27 (commit 5597b71), per verify step of k = 3 (syncs / bytes brought to the host):

    plain decode (per token)    4 /  3249   logits [1, N] and hidden [1, D] to the host; the embedding row
                                            brought to the host and sent back; get_rows' id range check
    lookup                      4 / 12993   the same for the [4, N] logits and [4, D] hidden of the verify pass
    MTP (greedy)               16 / 26836   the verify pass's 4, then per draft 4: the head's embedding row
                                            (2: range check, row to the host), its hidden row, its [1, N] scores
    draft model (greedy)       16 / 22740   the verify pass's 4, then per draft 4: the draft model's embedding
                                            (2), its hidden row, its [1, N] scores

The budget the issue sets: at most one blocking transfer of a few ints per verify step. BUDGET below is what
the code meets now (greedy acceptance on the device, Placement.accept_greedy; logits and hidden rows left where
the model computes; embedding rows gathered on the device from host-checked ids; greedy drafts kept on the
device through the drafting loop, each fed to the next pass as a device id, model.embed_rows; and left there
for the verify pass, which the loop feeds [pending] + those ids and whose one transfer brings back the run
and the drafts together, speculate.propose with on_device, Draft.ids):

    plain decode (per token)    1 /  8      the argmax token
    lookup                      1 / 16      the verify step's run: (n_accepted, token)
    MTP (greedy)                1 / 16 + 8k [n_accepted, token, d_1..d_k] in one transfer
    draft model (greedy)        1 / 16 + 8k the same

History: 78b3006 to 5dc31a5, MTP and the draft model 1 + k syncs / 16 + 8k bytes (one draft id per sync);
e6135ff, 2 / 16 + 8k (the k drafts fetched at the end of drafting, then the run). Still one sync per draft
on top of the budget, by design: a drafter asked for each draft's probability (p_min, a floor, the adaptive
policy's keep_going: one float each, counted below), a draft vocabulary (its draw maps ids on the host), and
sampled drafting (the law q is read on the host). A batch step is held to the same budget: one transfer for
every slot's run and device drafts. The module docstring of tinyspec/fast/cuda_accept.py lists what is left and why.
"""

from __future__ import annotations

from dataclasses import dataclass

import fake_cupy
import numpy as np
import pytest
from test_backends import write_quantized
from test_cuda_moe import write_moe

from tinyspec import backends
from tinyspec.backends import load_model
from tinyspec.draft import DraftModelDrafter
from tinyspec.generate import generate
from tinyspec.lookup import LookupDrafter
from tinyspec.mtp import MTPDrafter
from tinyspec.quants import GGMLType
from tinyspec.scheduler import EngineOptions

PROMPT = list(range(1, 300))  # every token seen once: the lookup drafter always finds a 1-gram, so it drafts k
K = 3

# per steady-state step: (syncs at most, bytes brought to the host at most)
BUDGET = {"plain": (1, 8), "lookup": (1, 16), "mtp": (1, 16 + 8 * K), "draft": (1, 16 + 8 * K)}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cuda_syncs")
    write_quantized(d / "target.gguf", seed=1)
    write_quantized(d / "draft.gguf", seed=2, n_trunk=2, interval=2, mtp=False)
    write_moe(d / "moe.gguf", GGMLType.Q4_K)  # qwen35moe: 4 trunk layers and the MTP block routed over 6 experts
    return d


@pytest.fixture
def cuda(monkeypatch):
    """`import cupy` and the cuda kernel modules resolve to the stand-ins while a test runs."""
    fake_cupy.install(monkeypatch)


@dataclass(frozen=True)
class Step:
    drafted: int  # drafts verified (0: a plain step)
    syncs: int
    sync_bytes: int
    uploads: int
    launches: int
    causes: dict  # "call at file:line" -> syncs


class Recording:
    """A drafter that remembers how many drafts each step proposed (the protocol, passed through)."""

    def __init__(self, inner):
        self.inner, self.stops_by_confidence, self.drafted = inner, inner.stops_by_confidence, []

    def start(self, prompt, hidden, k_max, resume=None):
        self.inner.start(prompt, hidden, k_max, resume)

    def drafting(self, *args):
        draft = yield from self.inner.drafting(*args)
        self.drafted.append(draft.n)  # tokens may still be on the device (Draft.ids): its count is on the host
        return draft

    def draft_pass(self, asks):
        return self.inner.draft_pass(asks)

    def another(self, pool=None):
        return Recording(self.inner.another(pool))

    def commit(self, fed, hidden):
        self.inner.commit(fed, hidden)

    def release(self):
        return self.inner.release()

    @property
    def kv_table(self):
        return self.inner.kv_table


def count_steps(target, drafter=None, max_new: int = 14, **kw) -> tuple[list[Step], list[int]]:
    """Generate with `drafter` (None: plain), counting between consecutive emits (one emit per verify step, or
    per token when plain). -> the steps after the first two (steady state), the tokens."""
    marks = []
    drafter = Recording(drafter) if drafter is not None else None
    with fake_cupy.counting() as ledger:
        out = generate(target, PROMPT, max_new, drafter=drafter, draft_n=K if drafter else None,
                       on_emit=lambda tokens, kinds: marks.append((ledger.snapshot(), len(ledger.transfers))), **kw)
    steps = []
    for i, ((a, ta), (b, tb)) in enumerate(zip(marks, marks[1:])):
        window = fake_cupy.Ledger(ledger.transfers[ta:tb])
        drafted = drafter.drafted[i] if drafter and i < len(drafter.drafted) else 0  # no room left: no propose
        steps.append(Step(drafted, b[0] - a[0], b[1] - a[1], b[2] - a[2], b[3] - a[3],
                          window.causes()))
    return steps[2:], out.tokens


DRAFTERS = {
    "mtp": lambda target, files: MTPDrafter(target),
    "lookup": lambda target, files: LookupDrafter(n_min=1),
    "draft": lambda target, files: DraftModelDrafter(load_model(files / "draft.gguf", "cuda"), target=target),
}


def steps_in_budget(files, name: str, kind: str) -> list:
    """The steady-state steps of `kind` on files/name (cuda through the fake), each checked against BUDGET, the
    tokens against the NumPy oracle's plain run."""
    target = load_model(files / name, "cuda")
    drafter = DRAFTERS[kind](target, files) if kind != "plain" else None
    steps, tokens = count_steps(target, drafter)
    assert tokens == generate(load_model(files / name, "numpy"), PROMPT, 14).tokens
    full = [s for s in steps if s.drafted == K] if drafter else steps
    assert full, "no steady-state step drafted k tokens"
    most_syncs, most_bytes = BUDGET[kind]
    for s in full:
        assert s.syncs <= most_syncs and s.sync_bytes <= most_bytes, (kind, s)
    return full


@pytest.mark.parametrize("kind", ["plain", "mtp", "lookup", "draft"])
def test_syncs_per_verify_step_stay_in_budget(files, cuda, kind):
    steps_in_budget(files, "target.gguf", kind)


@pytest.mark.parametrize("kind", ["plain", "mtp", "lookup", "draft"])
def test_moe_routing_costs_no_sync(files, cuda, kind):
    """Issue 35 item 7: on a qwen35moe target, a verify step stays in the dense budget. Before, every MoE layer
    brought its router's choices to the host (moe_ffn's kern.to_host: 4 trunk layers, 5 syncs a verify step,
    plus one per MTP draft) and launched one matmul per chosen expert; now routing and grouping run on the
    device (Kernels.route_experts: fast/cuda_moe.py) and each projection is one grouped launch
    (cuda_ops.bind_experts) reading the device offsets. The tokens are the NumPy oracle's, plain and
    speculative."""
    for s in steps_in_budget(files, "moe.gguf", kind):
        assert not any("moe.py" in cause for cause in s.causes), s.causes


@pytest.mark.parametrize("kind", ["plain", "mtp", "lookup"])
def test_a_moe_batch_is_each_sequence_alone_on_cuda(files, cuda, kind):
    """Many sequences at once on the MoE target (their rows routed together, grouped by expert in one launch per
    projection): each sequence's greedy tokens are its plain greedy ones on the NumPy oracle."""
    from tinyspec.batch import batch_generate

    target = load_model(files / "moe.gguf", "cuda")
    oracle = load_model(files / "moe.gguf", "numpy")
    prompts = [PROMPT[:40], PROMPT[5:30], PROMPT[100:160]]
    drafter = DRAFTERS[kind](target, files) if kind != "plain" else None
    out = batch_generate(target, prompts, 10, drafter=drafter, draft_n=K if drafter else None,
                         options=EngineOptions(slots=2))
    assert [r.tokens for r in out.sequences] == [generate(oracle, p, 10).tokens for p in prompts]


@pytest.mark.parametrize("kind", ["plain", "mtp", "lookup", "draft"])
def test_a_batch_step_brings_back_one_transfer_whatever_the_slots(files, cuda, kind):
    """Many sequences at once (speculate.Engine over a paged pool): 5 prompts in 3 slots, greedy. A step
    where no sequence joins or ends (a join pays its prefill's first token, an end its last: 2 per sequence)
    makes ONE blocking transfer: every slot's run, with the drafts that stayed on the device, so its bytes grow
    with slots x drafts (8 bytes each: 2 per slot, plus each device draft), not with rows x vocabulary. Each
    sequence's tokens are its plain greedy ones."""
    from tinyspec.scheduler import EngineOptions
    from tinyspec.sequence import SeqResult
    from tinyspec.speculate import Engine

    target = load_model(files / "target.gguf", "cuda")
    oracle = load_model(files / "target.gguf", "numpy")
    prompts = [PROMPT, PROMPT[5:], PROMPT[10:40], PROMPT[3:60], PROMPT[20:]]
    drafter = DRAFTERS[kind](target, files) if kind != "plain" else None
    engine = Engine(target, drafter, options=EngineOptions(slots=3, n_blocks=200, block_size=16))
    results = [SeqResult(i, p) for i, p in enumerate(prompts)]
    for r in results:
        engine.add(r, 12, seed=r.index)
    steady = 0
    while not engine.done():
        before = dict(engine.active)
        with fake_cupy.counting() as ledger:
            engine.step()
        if set(before) != set(engine.active) or any(engine.active[b] is not s for b, s in before.items()):
            continue  # a sequence joined or ended in this step
        syncs, nbytes = ledger.snapshot()[:2]
        assert syncs == 1, (kind, ledger.causes())
        most = 8 * (2 * len(before) + (K * len(before) if kind in ("mtp", "draft") else 0))
        assert nbytes <= most, (kind, nbytes, most)
        steady += 1
    assert steady >= 3
    for r, p in zip(results, prompts):
        assert r.error is None and r.tokens == generate(oracle, p, 12).tokens


def test_a_draft_costs_a_sync_of_its_own_only_when_its_probability_is_asked_for(files, cuda):
    """p_min (like a floor or the adaptive policy's keep_going) reads each draft's probability on the host: one
    float per draft on top of the budget, and the same tokens (a p_min this small never stops drafting)."""
    target = load_model(files / "target.gguf", "cuda")
    steps, tokens = count_steps(target, MTPDrafter(target, p_min=1e-9))
    assert tokens == generate(load_model(files / "target.gguf", "numpy"), PROMPT, 14).tokens
    full = [s for s in steps if s.drafted == K]
    assert full and all(s.syncs == BUDGET["mtp"][0] + K for s in full), full


@pytest.mark.parametrize("kind", ["mtp", "draft"])
def test_propose_returns_host_tokens_unless_the_loop_asks_for_device_ids(files, cuda, kind):
    """The Drafter protocol's two answers (speculate.Draft): by default propose returns host ints, which notebooks,
    batch.py and the tests read (one transfer at the end of drafting); asked on_device=True (the loop does, when
    greedy) it returns the same drafts as Draft.ids on the device with no transfer at all, and tokens None until
    the verify step's fetch fills them (with_tokens)."""
    from tinyspec.sampling import SamplingParams

    target = load_model(files / "target.gguf", "cuda")
    drafts = {}
    for on_device in (False, True):
        drafter = DRAFTERS[kind](target, files)
        state = target.new_state()
        logits, hidden = target.forward(np.array(PROMPT), state, to_host=False)
        drafter.start(PROMPT, hidden, K)
        pending = int(fake_cupy.asnumpy(np.argmax(logits[-1])))
        with fake_cupy.counting() as ledger:
            drafts[on_device] = drafter.propose(pending, K, SamplingParams(), None, on_device=on_device)
        assert ledger.snapshot()[0] == (0 if on_device else 1), ledger.causes()  # the fetch at the end, or none
    host, device = drafts[False], drafts[True]
    assert host.ids is None and len(host.tokens) == K and all(type(t) is int for t in host.tokens)
    assert device.tokens is None and isinstance(device.ids, fake_cupy.ndarray) and device.n == K
    filled = device.with_tokens(fake_cupy.asnumpy(device.ids))
    assert filled.tokens == host.tokens and filled.ids is None and filled.n == K


@pytest.mark.parametrize("on", ["numpy", "fake cupy"])
def test_device_acceptance_equals_the_oracle(cuda, on):
    """cuda_accept.DeviceGreedyRule (greedy_run: NumPy functions that dispatch) against the oracle's accept_greedy
    (placement.py: spec_sampling.verify_greedy, with the drafts as host ints) on every prefix length, ties in the
    rows (argmax takes the first maximum on both) and k = 0; the drafts given as host ints (lookup's) and as
    device ids (a greedy drafter's, left on the device), which come back with the run in the same one transfer."""
    from tinyspec.fast.cuda_accept import DeviceGreedyRule
    from tinyspec.placement import accept_greedy
    from tinyspec.spec_sampling import verify_greedy

    xp = np if on == "numpy" else fake_cupy
    accept = DeviceGreedyRule(xp, lambda a: a if xp is np else fake_cupy.asnumpy(a))
    rng = np.random.default_rng(0)
    for k in range(0, 6):
        for _ in range(20):
            logits = rng.integers(0, 4, (k + 1, 7)).astype(np.float32)  # small integers: many ties
            top = np.argmax(logits, axis=-1)
            n_right = rng.integers(0, k + 1)
            drafts = [int(t) for t in top[:n_right]] + [int(rng.integers(0, 7)) for _ in range(k - n_right)]
            bounds = np.array([0, k + 1])
            [expected] = accept_greedy(logits, bounds, [drafts])
            assert expected == (*verify_greedy(logits, drafts), drafts)
            assert accept(xp.asarray(logits), bounds, [drafts]) == [expected]
            with fake_cupy.counting() as ledger:
                ids = xp.asarray(np.array(drafts, dtype=np.int64))
                assert accept(xp.asarray(logits), bounds, [ids]) == [expected]
            if xp is fake_cupy:  # the run and the drafts: one transfer of 2 + k ints
                assert ledger.snapshot()[:2] == (1, 8 * (2 + k)), ledger.causes()


@pytest.mark.parametrize("on", ["numpy", "fake cupy"])
def test_device_acceptance_of_a_batch_is_each_sequence_alone_in_one_transfer(cuda, on):
    """Several sequences' verify rows in one [R, N] (ragged, k_b drafts each, some as device ids, some as host
    ints, some none): every sequence's run is the oracle's on its own rows, and all of them, with the drafts
    that were on the device, come back in ONE transfer of 8 * (2 B + device drafts) bytes."""
    from tinyspec.fast.cuda_accept import DeviceGreedyRule
    from tinyspec.placement import accept_greedy
    from tinyspec.spec_sampling import verify_greedy

    xp = np if on == "numpy" else fake_cupy
    accept = DeviceGreedyRule(xp, lambda a: a if xp is np else fake_cupy.asnumpy(a))
    rng = np.random.default_rng(1)
    for _ in range(20):
        ks = [int(k) for k in rng.integers(0, 5, 4)]
        bounds = np.cumsum([0] + [k + 1 for k in ks])
        logits = rng.integers(0, 4, (int(bounds[-1]), 7)).astype(np.float32)
        drafts = [[int(t) for t in rng.integers(0, 7, k)] for k in ks]
        expected = [(*verify_greedy(logits[lo:hi], d), d) for lo, hi, d in zip(bounds[:-1], bounds[1:], drafts)]
        assert accept_greedy(logits, bounds, drafts) == expected
        on_device = [b % 2 == 0 for b in range(len(ks))]
        given = [xp.asarray(np.array(d, dtype=np.int64)) if dev else d for d, dev in zip(drafts, on_device)]
        with fake_cupy.counting() as ledger:
            assert accept(xp.asarray(logits), bounds, given) == expected
        if xp is fake_cupy:
            fetched = 2 * len(ks) + sum(k for k, dev in zip(ks, on_device) if dev)
            assert ledger.snapshot()[:2] == (1, 8 * fetched), ledger.causes()


@pytest.mark.parametrize("kind", ["plain", "mtp", "lookup", "draft"])
def test_graphs_on_and_off_give_the_same_tokens_with_fewer_launches(files, cuda, kind):
    """The greedy rule replayed from a CUDA graph per verify length (fast/cuda_graphs.py) under the fake's capture
    emulation: the same tokens as plain launches (and as the oracle), every shape captured (no sync, no host
    copy inside a capture: those raise, and the key would be listed in .failed), fewer launches a step."""
    loaded = load_model(files / "target.gguf", "cuda")
    runs = {}
    for graphs in (False, True):
        # every replay checked: the greedy rule passes no host scalar that a replay would keep stale
        target = loaded.with_placement(backends.cuda_placement(graphs=graphs, check_graphs=fake_cupy.check_replay))
        drafter = DRAFTERS[kind](target, files) if kind != "plain" else None
        steps, tokens = count_steps(target, drafter)
        runs[graphs] = steps, tokens, target.placement.graph_counts()
    (off, tokens_off, counts_off), (on, tokens_on, counts) = runs[False], runs[True]
    assert tokens_on == tokens_off
    assert counts_off["captured"] == counts_off["replays"] == 0  # graphs off: nothing captured, nothing counted
    if kind != "plain":  # plain decoding picks its token with one argmax, not the rule
        N = loaded.cfg.n_vocab  # the verify shape of k = 3 drafts: logits [4, N], drafts [3]
        assert str((((K + 1, N), "float32"), ((K,), "int64"))) in counts["shapes"], counts
        assert counts["captured"] >= 1 and counts["failed"] == 0 and not counts["reasons"] and counts["replays"] > 0
        assert sum(s.launches for s in on) < sum(s.launches for s in off)
    assert [s.syncs for s in on] == [s.syncs for s in off]


def test_a_capture_that_fails_is_reported_not_silent(cuda):
    """Issue 35, item 2: a function that syncs inside its capture still gives the right answer (plain launches),
    but the fallback is said: one GraphCaptureWarning for the shape, with the reason, and stats() counts it."""
    from tinyspec.fast.cuda_graphs import GraphCaptureWarning, GraphedCall

    cp = fake_cupy

    def syncs(x):  # int(): a device-to-host copy, which a capture refuses
        return x * int(x[0])

    call = GraphedCall(syncs, cp)
    x = cp.asarray(np.arange(1, 4, dtype=np.float32))
    assert cp.asnumpy(call(x)).tolist() == [1, 2, 3]  # first call of the shape: eager (warm-up)
    with pytest.warns(GraphCaptureWarning, match="inside a CUDA graph capture"):
        assert cp.asnumpy(call(x)).tolist() == [1, 2, 3]  # the capture fails: the fallback's answer
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per shape: later calls run plainly without a second warning
        assert cp.asnumpy(call(x)).tolist() == [1, 2, 3]
    counts = call.stats()
    assert counts["captured"] == 0 and counts["failed"] == 1 and counts["replays"] == 0 and counts["plain"] == 3
    assert "RuntimeError" in next(iter(counts["reasons"].values()))


# --- the fake's graph capture: CuPy's API, a GPU's rules

def test_a_captured_graph_replays_its_work_on_the_same_arrays(cuda):
    cp = fake_cupy
    x, y = cp.asarray(np.arange(4, dtype=np.float32)), cp.zeros(4, np.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        t = x * 2  # a new array: recorded, computed again on each launch
        np.copyto(y, t + 1)  # a write into an array that exists: recorded, not run
        assert stream.is_capturing()
        graph = stream.end_capture()
    assert fake_cupy.asnumpy(y).tolist() == [0, 0, 0, 0]  # capture runs nothing into y
    x[...] = np.float32(10)
    with fake_cupy.counting() as ledger:
        graph.launch(stream)
    assert fake_cupy.asnumpy(y).tolist() == [21] * 4 and ledger.launches == 1 and graph.n_allocs == 2


def test_a_capture_refuses_syncs_and_host_copies(cuda):
    cp = fake_cupy
    x = cp.asarray(np.ones(3, np.float32))
    for leak in (lambda: int(x[0]), lambda: cp.asnumpy(x), lambda: float(np.sum(x)), lambda: cp.asarray(np.ones(2)),
                 lambda: x.set(np.zeros(3, np.float32))):
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            with pytest.raises(RuntimeError, match="inside a CUDA graph capture"):
                leak()
            stream.end_capture()
    with pytest.raises(RuntimeError, match="default"):
        cp.cuda.Stream.null.begin_capture()


def test_a_python_int_read_during_capture_is_baked_in(cuda):
    """What must be static for a replay to be right: a length the host passed at capture is the graph's."""
    cp = fake_cupy
    cache, out = cp.asarray(np.arange(8, dtype=np.float32)), cp.zeros((), np.float32)
    n = 3
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        np.copyto(out, cache[:n].sum())
        graph = stream.end_capture()
    n = 5  # the host moved on; the graph did not
    graph.launch()
    assert float(out) == 0 + 1 + 2 and n == 5


def test_a_host_scalar_that_changes_between_replays_raises(cuda):
    """Issue 35, item 4: a length closed over by the captured function (here an eps handed to a row kernel and a
    slice bound) is baked into the graph; when the host's value moves on, the fake's check_replay re-runs the
    function before the replay and raises, where a GPU would replay the old value. Unchanged, replays pass."""
    from tinyspec.fast.cuda_graphs import GraphedCall

    cp = fake_cupy
    setting = {"eps": 1e-6, "n": 3}

    import sys

    rows = sys.modules["tinyspec.fast.cuda_rows"]  # the real module, on the fake (the `cuda` fixture)

    def normed(x, w):  # a kernel argument from a Python variable: what a graph cannot see change
        return rows.rms_norm(x, w, setting["eps"])

    def head(x):  # a slice bound from a Python variable: an offset baked into the launch that reads it
        return x[: setting["n"]].sum()

    x, w = cp.asarray(np.ones((2, 4), np.float32)), cp.asarray(np.ones(4, np.float32))
    for fn, args, key in ((normed, (x, w), "eps"), (head, (x[0],), "n")):
        call = GraphedCall(fn, cp, check=fake_cupy.check_replay)
        for _ in range(4):  # warm-up, then a capture and three launches: the host's value unchanged, checks pass
            call(*args)
        assert call.stats()["captured"] == 1 and call.stats()["replays"] == 3
        setting[key] = setting[key] * 2  # the host moves on
        with pytest.raises(fake_cupy.BakedScalarChanged, match="captured with the host scalars"):
            call(*args)


def test_the_serving_engine_on_the_cuda_backend_keeps_every_sequence_solo(cuda, files):
    """Issue 36's engine on the cuda backend (through the fake): prompts sharing a prefix, the prefix cache,
    chunked prefill inside the verify pass and a pool small enough to preempt, with MTP drafts whose KV takes
    the same pool. Every sequence's tokens equal its solo run on the same backend."""
    from tinyspec.batch import batch_generate
    from tinyspec.scheduler import blocks_per_run

    model = load_model(files / "target.gguf", "cuda")
    shared = list(range(1, 40))
    prompts = [shared + [60 + i, 70 + i] for i in range(5)]
    solo = [generate(model, p, 10, drafter=MTPDrafter(model), draft_n=2).tokens for p in prompts]
    per_run = blocks_per_run(model, MTPDrafter(model), len(prompts[0]) + 10 + 3, 8)
    out = batch_generate(model, prompts, 10, drafter=MTPDrafter(model), draft_n=2,
                         options=EngineOptions(slots=3, chunk=8, prefix_cache=True, block_size=8,
                                               n_blocks=per_run * 3 // 2))
    assert [s.tokens for s in out.sequences] == solo
    assert out.stats["preemptions"] > 0 and out.stats["prefix_hits"] > 0, out.stats
