"""The cuda backend's device pass (tinyspec/fast/cuda_pass.py): one map upload a pass, the layer loop replayed from
a CUDA graph, run through the fake CuPy (tests/fake_cupy.py) with every replay checked for a baked host scalar.

1. A pass uploads its row map once, and nothing else: host ids, positions, rope angles and attention's map all
   ride in it (before: the embedding ids, then per attention layer its rope angles and its map).
2. Graphs on and off, for every drafter, one sequence: the same tokens as the oracle; the verify shape's forward
   graph captured, none failed, replays; fewer launches a step. A cache that grows is a new key.
3. A batch in a pool: graphed, and every sequence gets its solo tokens.
4. What is not graphed still runs the device pass (a replay ring), and what is not a device pass (a chunked
   prefill, several sequences with caches of their own) runs the host path, both exact; a graph store of one
   evicts and stays right.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import fake_cupy
import tinyspec
from test_cuda_syncs import DRAFTERS, K, PROMPT, count_steps
from tinyspec import backends
from tinyspec.backends import load_model
from tinyspec.batch import batch_generate
from tinyspec.scheduler import EngineOptions
from tinyspec.fast import cuda_pass
from tinyspec.generate import generate, speculative_generate
from tinyspec.mtp import MTPDrafter

ASSETS = Path(tinyspec.__file__).resolve().parent / "assets"


@pytest.fixture
def cuda(monkeypatch):
    fake_cupy.install(monkeypatch)


def cuda_model(graphs: bool = True, **kw):
    """The shipped tiny target on the fake's cuda backend, every replay checked (fake_cupy.check_replay)."""
    loaded = load_model(ASSETS / "tiny-target.gguf", "cuda")
    return loaded.with_placement(dataclasses.replace(
        backends.cuda_placement(graphs=graphs, check_graphs=fake_cupy.check_replay), **kw))


def oracle_tokens(prompt, max_new, **kw) -> list[int]:
    return generate(load_model(ASSETS / "tiny-target.gguf", "numpy"), prompt, max_new, **kw).tokens


# ------------------------------------------------------------------------------------------ 1. one upload a pass
@pytest.mark.parametrize("T", [1, 4])
def test_a_pass_uploads_its_row_map_once(cuda, T):
    model = cuda_model(graphs=False)
    state, ring = model.new_state(), model.new_ring(4)
    model.forward(np.arange(1, 30), state)
    with fake_cupy.counting() as ledger:
        model.forward(np.arange(40, 40 + T), state, ring=ring if T > 1 else None, to_host=False)
    uploads = [t for t in ledger.transfers if t.kind == "upload"]
    assert len(uploads) == 1 and "cuda_pass" in uploads[0].where, ledger.causes()
    assert not [t for t in ledger.transfers if t.kind == "sync"]


# ------------------------------------------------------------------------------------------ 2. graphs, one sequence
@pytest.mark.parametrize("kind", ["plain", "lookup", "mtp"])
def test_graphs_replay_the_forward_pass_with_the_same_tokens(cuda, kind, tmp_path):
    runs = {}
    for graphs in (False, True):
        model = cuda_model(graphs)
        drafter = None if kind == "plain" else DRAFTERS[kind](model, tmp_path)
        steps, tokens = count_steps(model, drafter)
        runs[graphs] = steps, tokens, model.placement.graph_counts()["by_use"]["forward"]
    (off, tokens_off, counts_off), (on, tokens_on, counts) = runs[False], runs[True]
    assert tokens_on == tokens_off == oracle_tokens(PROMPT, 14)
    assert counts_off["captured"] == counts_off["replays"] == 0
    T = 1 if kind == "plain" else K + 1
    assert any(s.startswith(f"(PassMap(R={T}, B=1,") for s in counts["shapes"]), counts["shapes"]
    assert counts["failed"] == 0 and not counts["reasons"] and counts["replays"] > 0, counts
    assert sum(s.launches for s in on) < sum(s.launches for s in off) / 2  # the pass's launches became one
    assert [s.syncs for s in on] == [s.syncs for s in off]


def test_a_cache_that_grows_is_captured_again(cuda):
    """A contiguous cache doubles at 64 positions: new arrays, so a new key; the tokens stay the oracle's."""
    model = cuda_model()
    prompt = list(range(1, 50))
    tokens = generate(model, prompt, 30).tokens
    counts = model.placement.graph_counts()["by_use"]["forward"]
    assert tokens == oracle_tokens(prompt, 30)
    assert counts["captured"] >= 2 and counts["failed"] == 0, counts  # one per capacity, 64 and 128


# ------------------------------------------------------------------------------------------ 3. a batch in a pool
def test_a_batch_in_a_pool_is_graphed_and_exact(cuda):
    model = cuda_model()
    prompts = [list(range(1, 20)), list(range(30, 37)), list(range(50, 75))]
    result = batch_generate(model, prompts, 12, drafter=MTPDrafter(model), draft_n=2,
                            options=EngineOptions(slots=3, block_size=8))
    assert [s.tokens for s in result.sequences] == [oracle_tokens(p, 12) for p in prompts]
    counts = model.placement.graph_counts()["by_use"]["forward"]
    assert counts["replays"] > 0 and counts["failed"] == 0, counts
    assert any("B=3" in s for s in counts["shapes"]), counts["shapes"]


def test_a_batch_of_more_than_eight_sequences_is_graphed(cuda):
    """The bug (issue 45, fault 2): the ragged GDN layers join B sequences' rows with one concatenate, and CuPy joins
    more than 8 small arrays with a kernel that reads their pointers from a table it uploads first; a capture
    refuses the upload, so every forward pass of 9 or more sequences failed to capture (and retried at every new
    state). ops.join_rows now joins at most 8 arrays a call."""
    model = cuda_model()
    prompts = [list(range(1 + 3 * i, 9 + 3 * i)) for i in range(9)]
    result = batch_generate(model, prompts, 6, options=EngineOptions(slots=9, block_size=8))
    assert [s.tokens for s in result.sequences] == [oracle_tokens(p, 6) for p in prompts]
    counts = model.placement.graph_counts()["by_use"]["forward"]
    assert counts["failed"] == 0 and counts["replays"] > 0, counts
    assert any("B=9" in s for s in counts["shapes"]), counts["shapes"]


def test_scratch_a_graph_was_captured_with_outlives_a_larger_call(monkeypatch):
    """The bug (issue 45, fault 1): the tensor-core linear keeps one pair of scratch buffers and replaced them with
    larger ones when a call needed more; the old pair went back to CuPy's pool while graphs captured with it still
    wrote its addresses at every replay, into memory the pool could have handed to a live array. The real
    cuda_ops module, run on the fake CuPy: the replaced pair stays alive, and the sizes double."""
    import gc
    import importlib.util
    import sys

    monkeypatch.setitem(sys.modules, "cupy", fake_cupy.module())
    path = Path(tinyspec.__file__).parent / "fast" / "cuda_ops.py"
    spec = importlib.util.spec_from_file_location("tinyspec.fast._cuda_ops_under_the_fake", path)
    real = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(real)  # its own module-level scratch, apart from any other test's
    old_u32, old_f32 = real._scratch(64, 8)  # what a graph captured at this size writes at every replay
    held = sys.getrefcount(old_u32), sys.getrefcount(old_f32)  # ours, and the module's
    large = real._scratch(1000, 100)
    assert large[0].size >= 1000 and large[1].size >= 100 and large[0] is not old_u32
    gc.collect()
    assert (sys.getrefcount(old_u32), sys.getrefcount(old_f32)) == held, \
        "the module let go of the scratch a graph was captured with when a larger call replaced it"
    assert real._scratch(1001, 10)[0].size >= 2000  # at least doubled: few pairs are ever retired


# ------------------------------------------------------------------------------------------ 4. what is not graphed
def test_a_replay_ring_runs_the_device_pass_without_a_graph(cuda, tmp_path):
    model = cuda_model(rollback="replay")
    tokens = generate(model, PROMPT, 14, drafter=DRAFTERS["lookup"](model, tmp_path), draft_n=K).tokens
    assert tokens == oracle_tokens(PROMPT, 14)
    counts = model.placement.graph_counts()["by_use"]["forward"]
    assert counts["failed"] == 0 and not any(s.startswith(f"(PassMap(R={K + 1}, B=1,") for s in counts["shapes"])
    # the verify passes (a ring) never became a key; passes without one (the prefill, a step with no drafts) may


def test_what_is_not_a_device_pass_runs_the_host_path(cuda):
    model = cuda_model()
    passes = model.placement.device_pass
    a, b = model.new_state(), model.new_state()
    assert passes(model.cfg, [np.array([1]), np.array([2])], [a.layers, b.layers], np.array([0, 1, 2]), [None, None],
                  True) is None
    assert all(layer.n == 0 for s in (a, b) for layer in s.layers if hasattr(layer, "n"))  # nothing claimed
    prompt = list(range(1, 40))
    assert generate(model, prompt, 6, chunked_prefill=True).tokens == oracle_tokens(prompt, 6, chunked_prefill=True)


def test_a_graph_store_of_one_evicts_and_stays_exact(cuda, tmp_path, monkeypatch):
    monkeypatch.setattr(cuda_pass, "MAX_GRAPHS", 1)
    model = cuda_model(pad_rows=False)  # (unpadded, lookup's verify passes take several shapes: evictions)
    assert model.placement.device_pass.graphs.max_graphs == 1
    tokens = generate(model, PROMPT, 14, drafter=DRAFTERS["lookup"](model, tmp_path), draft_n=K).tokens
    assert tokens == oracle_tokens(PROMPT, 14)
    counts = model.placement.graph_counts()["by_use"]["forward"]
    assert len(counts["shapes"]) <= 1 and counts["evicted"] >= 1 and counts["failed"] == 0, counts
    assert len(model.placement.device_pass.graphs.eager) <= 4  # the keys seen once are bounded too
    assert counts["pools"] <= counts["captured"], counts


def test_an_evicted_graphs_pool_serves_the_next_capture_on_one_stream(cuda):
    """Issue 45, fault 4 (in part): each capture made a new memory pool and a new stream, and an eviction dropped
    the evicted graph's pool, whose cudaFree waits for the whole device. Now one side stream serves every capture
    and an evicted graph's pool the next one: three shapes through a store of one make two pools, not three."""
    from tinyspec.fast.cuda_graphs import GraphedCall

    cp = fake_cupy
    call = GraphedCall(lambda x: x * 2 + 1, cp, max_graphs=1, check=fake_cupy.check_replay)
    streams = []
    for n in (3, 4, 5):
        x = cp.asarray(np.arange(n, dtype=np.float32))
        for _ in range(3):  # a plain warm-up, the capture, a replay
            assert np.array_equal(cp.asnumpy(call(x)), np.arange(n) * 2 + 1)
        streams.append(call.stream)
    stats = call.stats()
    assert stats["captured"] == 3 and stats["evicted"] == 2 and stats["pools"] == 2, stats
    assert streams[0] is streams[1] is streams[2] is not None


def test_a_moe_pass_is_graphed_and_exact(cuda, tmp_path):
    """qwen35moe: routing and grouping on the device with no sync (fast/cuda_moe.py), so its pass captures too."""
    from test_cuda_moe import write_moe
    from tinyspec.quants import GGMLType

    write_moe(tmp_path / "moe.gguf", GGMLType.Q4_K)
    model = load_model(tmp_path / "moe.gguf", "cuda").with_placement(
        backends.cuda_placement(check_graphs=fake_cupy.check_replay))
    prompt = list(range(1, 30))
    tokens = generate(model, prompt, 10, drafter=MTPDrafter(model), draft_n=2).tokens
    assert tokens == generate(load_model(tmp_path / "moe.gguf", "numpy"), prompt, 10).tokens
    counts = model.placement.graph_counts()["by_use"]["forward"]
    assert counts["replays"] > 0 and counts["failed"] == 0, counts


def test_the_counting_tool_reports_the_graphs_saving(load_tool):
    """tools/count_cuda_steps.py, the figures LESSONS 26 quotes: one sync a step, one upload a plain step, and the
    graphed pass's launches a small fraction of the plain ones."""
    counts = load_tool("count_cuda_steps").count(("plain",))
    off, on = counts["plain, graphs off"], counts["plain, graphs on"]
    assert off["syncs"] == on["syncs"] == 1 and off["uploads"] == on["uploads"] == 1
    assert on["launches"] < off["launches"] / 10, counts


def test_bench_times_verify_passes_replayed_from_their_graphs(cuda):
    """bench's verify timings reuse one scratch state per size (fast/bench.py reset_to), so on cuda every timed
    pass is a graph replay, not a first call of fresh arrays."""
    from tinyspec.fast import bench

    model = cuda_model()
    times = bench.verify_times(model, PROMPT[:20], sizes=(1, 4), repeats=3)
    assert {T: len(t) for T, t in times.items()} == {1: 3, 4: 3}
    counts = model.placement.graph_counts()["by_use"]["forward"]
    assert counts["replays"] >= 2 * 3 and counts["failed"] == 0, counts


def test_a_reset_scratch_state_computes_what_a_fresh_copy_does():
    from tinyspec.fast.bench import reset_to

    model = load_model(ASSETS / "tiny-target.gguf", "numpy")
    state = model.new_state()
    model.forward(np.arange(1, 30), state)
    scratch, ring = state.copy(), model.new_ring(4)
    model.forward(np.array([7, 8, 9, 10]), scratch, ring=ring)
    reset_to(scratch, state)
    assert scratch.max_abs_diff(state) == 0.0
    again, _ = model.forward(np.array([7, 8, 9, 10]), scratch, ring=ring)
    fresh, _ = model.forward(np.array([7, 8, 9, 10]), state.copy())
    assert again.tobytes() == fresh.tobytes()


def test_a_new_sequence_replays_from_its_first_pass_and_a_prefill_is_never_captured(cuda, tmp_path):
    """A shape run once warms every state's key (the kernels are compiled): a second sequence's passes are captured
    at their first call, none runs plainly. A prefill of more than MAX_GRAPH_ROWS rows is never a graph."""
    model = cuda_model()
    drafter = DRAFTERS["lookup"](model, tmp_path)
    first = generate(model, PROMPT, 14, drafter=drafter, draft_n=K).tokens
    before = model.placement.graph_counts()["by_use"]["forward"]
    again = generate(model, PROMPT, 14, drafter=DRAFTERS["lookup"](model, tmp_path), draft_n=K).tokens
    after = model.placement.graph_counts()["by_use"]["forward"]
    assert again == first == oracle_tokens(PROMPT, 14)
    assert after["plain"] == before["plain"] and after["replays"] > before["replays"], (before, after)
    assert len(PROMPT) > cuda_pass.MAX_GRAPH_ROWS
    assert not any(s.startswith(f"(PassMap(R={len(PROMPT)},") for s in after["shapes"])


def test_a_slots_graphs_outlive_its_sequence(cuda):
    """Issue 45 item 4: a slot's state is made once and reset for each sequence it holds (ModelState.reset, in the
    same arrays), so the graphs captured for the first sequences replay for every later one: as many requests
    again capture no graph more (before: each new sequence's states used to be new arrays, so a new key and a capture)."""
    def serve(n_requests: int) -> dict:
        model = cuda_model()
        prompts = [list(range(1 + 7 * i, 9 + 7 * i)) for i in range(n_requests)]  # equal lengths: equal shapes
        result = batch_generate(model, prompts, 6, options=EngineOptions(slots=2, block_size=8))
        assert [s.tokens for s in result.sequences] == [oracle_tokens(p, 6) for p in prompts]
        return model.placement.graph_counts()["by_use"]["forward"]

    four, eight = serve(4), serve(8)  # (the second pair's prefill is the first capture of the prefill shape)
    assert four["failed"] == eight["failed"] == 0 and eight["evicted"] == 0, (four, eight)
    assert eight["captured"] == four["captured"] == 2, (four["shapes"], eight["shapes"])
    assert eight["replays"] > four["replays"], (four, eight)


def test_a_reset_state_is_a_fresh_state_in_the_same_arrays():
    """ModelState.reset: the GDN windows and memories zeroed in place, every KV block back to the pool, position 0;
    a pass from it computes what a pass from a new state does."""
    from tinyspec.paged import BlockPool

    model = load_model(ASSETS / "tiny-target.gguf", "numpy")
    pool = BlockPool(model.cfg, 16, 8)
    state = model.new_state(pool)
    arrays = [a for layer in state.layers if hasattr(layer, "ssm") for a in (layer.conv, layer.ssm)]
    model.forward(np.arange(1, 20), state)
    assert pool.available < 16
    state.reset()
    assert state.pos == 0 and pool.available == 16
    assert [a for layer in state.layers if hasattr(layer, "ssm") for a in (layer.conv, layer.ssm)] == arrays
    assert all(id(a) == id(b) for a, b in zip(arrays, [a for layer in state.layers if hasattr(layer, "ssm")
                                                       for a in (layer.conv, layer.ssm)]))
    again, _ = model.forward(np.arange(30, 40), state)
    fresh, _ = model.forward(np.arange(30, 40), model.new_state(pool))
    assert again.tobytes() == fresh.tobytes()


@pytest.mark.parametrize("kind", ["mtp", "lookup"])
def test_padded_passes_make_few_shapes(cuda, kind, tmp_path):
    """Issue 45 item 4: the MTP head's first pass of a drafting feeds the last verify's kept tokens and the pending one
    (1 .. k + 2 rows per sequence), so a batch's passes had as many shapes as combinations of acceptances, each a
    first call that runs plainly. Padded to k + 2 rows (Placement.pad_rows, on with graphs) they are one shape per
    batch size; and so are the verify passes, every sequence's rows padded to k_max + 1 (lookup drafts 0 .. k
    tokens a step, as its matches allow): fewer plain passes, more replays, the same tokens.
    (tools/count_cuda_steps.py --serving counts a longer run, where the captures fall too.)"""
    prompts = [list(range(1 + 5 * i, 12 + 5 * i)) for i in range(5)]

    def serve(pad: bool) -> dict:
        model = cuda_model(pad_rows=pad)
        result = batch_generate(model, prompts, 16, drafter=DRAFTERS[kind](model, tmp_path), draft_n=3,
                                options=EngineOptions(slots=3, block_size=8))
        assert [s.tokens for s in result.sequences] == [oracle_tokens(p, 16) for p in prompts]
        return model.placement.graph_counts()["by_use"]["forward"]

    unpadded, padded = serve(False), serve(True)
    assert padded["failed"] == unpadded["failed"] == 0
    assert padded["plain"] < unpadded["plain"], (unpadded, padded)
    assert padded["replays"] > unpadded["replays"], (unpadded, padded)


def map_uploads(ledger) -> int:
    return sum(1 for t in ledger.transfers if t.kind == "upload" and "cuda_pass.py" in t.where)


def test_a_greedy_mtp_steps_head_maps_ride_one_upload(cuda, monkeypatch):
    """Issue 45 item 4: the MTP head's k passes of a greedy drafting are one pass of its kept tokens (padded), then
    k - 1 passes of one device id each, at positions known before the first: their maps are packed with the first
    one's and uploaded with it (rowmap.plan_ahead), so a step uploads two maps, the verify pass's and the head's, not
    k + 1. Every draft's probability under the head is the oracle's, bit for bit (a tiny p_min makes the drafter
    read each one and stops nothing), graphs on and off, one sequence and a batch in a pool whose maps ahead cross
    blocks."""
    from tinyspec import mtp

    seen = []
    real = mtp.draft_probability
    monkeypatch.setattr(mtp, "draft_probability", lambda *a: seen.append(real(*a)) or seen[-1])

    def run(model, prompts, max_new, **options):
        seen.clear()
        if options:
            result = batch_generate(model, prompts, max_new, drafter=MTPDrafter(model, p_min=1e-30), draft_n=3,
                                    options=EngineOptions(**options))
            return [s.tokens for s in result.sequences], list(seen)
        return speculative_generate(model, MTPDrafter(model, p_min=1e-30), prompts[0], max_new, draft_n=3).tokens, \
            list(seen)

    numpy_model = load_model(ASSETS / "tiny-target.gguf", "numpy")
    prompt = list(range(3, 40))
    want = run(numpy_model, [prompt], 20)
    for graphs in (False, True):
        model = cuda_model(graphs=graphs)
        marks = []
        with fake_cupy.counting() as ledger:
            seen.clear()
            got = speculative_generate(model, MTPDrafter(model, p_min=1e-30), prompt, 20, draft_n=3,
                                       on_emit=lambda tokens, kinds: marks.append(map_uploads(ledger))).tokens
        assert (got, seen) == want, graphs
        steps = [b - a for a, b in zip(marks, marks[1:])]
        assert steps and set(steps) == {2}, steps
    prompts = [list(range(1 + 5 * i, 14 + 5 * i)) for i in range(3)]
    options = {"slots": 3, "block_size": 4}  # (blocks of 4: the maps ahead cross them)
    assert run(cuda_model(), prompts, 12, **options) == run(numpy_model, prompts, 12, **options)


def test_a_drafting_that_stops_early_leaves_its_announced_maps_unused(cuda):
    """A drafting that stops before k (p_min: an unsure draft ends it) does not ask for the passes whose maps rode the
    first upload: the next pass, the verify, finds no match and uploads its own map; the tokens are the oracle's."""
    prompt = list(range(3, 30))
    model = cuda_model()
    drafter = MTPDrafter(model, p_min=0.6)
    got = speculative_generate(model, drafter, prompt, 16, draft_n=3)
    numpy_model = load_model(ASSETS / "tiny-target.gguf", "numpy")
    want = speculative_generate(numpy_model, MTPDrafter(numpy_model, p_min=0.6), prompt, 16, draft_n=3)
    assert got.tokens == want.tokens == oracle_tokens(prompt, 16) and got.marks == want.marks
    assert sum(got.stats.drafted_per_position) < 3 * got.stats.steps  # some draftings did stop early
