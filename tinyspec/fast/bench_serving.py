"""bench --serving: requests that share a prefix arrive over time; what the prefix cache and chunked prefill buy.

The scenario (issue 36). N requests, request i = a shared prefix of P tokens + `own` tokens of its own, each
generating max_new greedy tokens. Request i arrives just before engine step i * gap: the schedule is counted in
steps, not seconds, so the passes, the rows and the tokens are the same on every machine and only the seconds
vary. One speculate.Engine over a paged KV pool of `slots` slots serves them, in four configurations:

    baseline      no prefix cache, each prompt whole in the pass after its admission (chunk None)
    cache         the prefix cache (prefix_cache.py), whole prompts
    chunk         no cache, every prompt fed `chunk` rows a pass
    cache+chunk   both: what a server runs

Every configuration must emit the baseline's tokens (raised otherwise). Per request:

    ttft_ms      arrival (Engine.add) to its first token (on_emit), wall clock
    ttft_steps   the engine's passes from its arrival through the one that picked its first token (exact)
    ttft_rows    the rows of those passes, every sequence's (exact: the work the request waited through)

Per configuration: tok_s (tokens generated / seconds from the first arrival to the last token); prefill_rows
(prompt rows computed, exact) and full_prefills (requests that found no saved state and fed their whole
prompt); wait_rows_max, the most prefill rows in a pass that also carried running slots' rows (what a running
slot waited through while prompts joined) and the step times in ms beside it; and memory at its peak pass: KV
blocks held (in use, or idle but cached), saved GDN states, the running sequences' own GDN states and the
pass's logits ([R, N] float32: a whole prompt in one pass is R rows of logits, every one computed); graphs (the
cuda backend; null elsewhere): what its CUDA graphs did in the configuration's last round, captured, evicted and
failed graphs, passes replayed and run plainly. Each run is an Engine of its own, whose slot states and pool are
new arrays, so it captures its graphs anew: within one engine (a server) the captures are bounded by the pass
shapes it meets (a slot's state outlives its sequences, the MTP head's passes are padded: fast/cuda_pass.py).

The goals (cache+chunk against baseline): prefill rows <= 1/8; median time to first token >= 4x lower; no
running slot's step delayed by more than one chunk (wait_rows_max <= chunk: exact; in ms a timing). Timings are
medians over `rounds` interleaved rounds with their spread, and `checks` flags figures that contradict the exact
ones or spread too wide (bench.checks' rule).

Does NOT include: arrivals in wall-clock time (a server's load generator), sampling, stop tokens (every request
runs max_new tokens), a draft model's GDN states (outside the pool; docs/serving.md section 6).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from ..drafters import build_drafter
from ..drafting import policy_for
from ..model import Model
from ..paged import BlockPool
from ..prefix_cache import PrefixCache
from ..scheduler import EngineOptions
from ..sequence import SeqResult
from ..speculate import Engine
from ..state import GDNState
from .bench import WIDE

CONFIGS = {"baseline": (False, False), "cache": (True, False), "chunk": (False, True), "cache+chunk": (True, True)}


@dataclass
class Scenario:
    """What bench --serving runs (the module docstring); the defaults are issue 36's scenario."""
    requests: int = 16
    prefix: int = 512  # shared tokens at the start of every prompt
    own: int = 16  # tokens of its own after the prefix
    max_new: int = 16  # tokens each request generates
    gap: int = 8  # request i arrives before engine step i * gap
    slots: int = 4
    chunk: int = 64  # prefill rows a pass in the chunked configurations
    block_size: int = 16
    kv_blocks: int | None = None  # default: `slots` of the longest runs, never shared (no preemption needed)
    drafter: str | None = None  # None: plain decoding; else a drafters.py name (mtp, lookup) at k = draft_n
    draft_n: int = 3
    seed: int = 0  # of the random token ids

    def prompts(self, n_vocab: int) -> list[list[int]]:
        rng = np.random.default_rng(self.seed)
        shared = [int(t) for t in rng.integers(0, n_vocab, self.prefix)]
        return [shared + [int(t) for t in rng.integers(0, n_vocab, self.own)] for _ in range(self.requests)]

    def check(self, n_ctx: int) -> None:
        """Refuse a scenario that cannot run, naming the flag (bench --serving's)."""
        for flag, value, low in (("--requests", self.requests, 1), ("--prefix", self.prefix, 0), ("--own", self.own, 1),
                                 ("--max-new", self.max_new, 1), ("--gap", self.gap, 0), ("--slots", self.slots, 1),
                                 ("--chunk", self.chunk, 1), ("--block-size", self.block_size, 1),
                                 ("--draft-n", self.draft_n, 1)):
            if value < low:
                raise ValueError(f"{flag} must be >= {low}, got {value}")
        longest = self.prefix + self.own + self.max_new + (self.draft_n if self.drafter else 0)
        if longest > n_ctx:
            raise ValueError(f"a request of {self.prefix} + {self.own} prompt tokens and {self.max_new} new ones exceeds "
                             f"the model's context length {n_ctx}")
        if self.n_blocks() < -(-(longest + 1) // self.block_size):
            raise ValueError(f"--kv-blocks {self.kv_blocks} cannot hold one request ({longest + 1} positions)")

    def n_blocks(self) -> int:
        k = self.draft_n if self.drafter else 0
        return self.kv_blocks or self.slots * -(-(self.prefix + self.own + self.max_new + k + 1) // self.block_size)


@dataclass
class Run:
    """One configuration's run: per request its arrival and first token; per pass its seconds and rows."""
    tokens: list[list[int]]
    ttft_s: list[float]
    ttft_steps: list[int]
    ttft_rows: list[int]
    wall_s: float
    pass_s: list[float] = field(default_factory=list)
    pass_decode_rows: list[int] = field(default_factory=list)  # the running slots' verify rows
    pass_prefill_rows: list[int] = field(default_factory=list)  # the joining prompts' chunk rows
    memory: dict = field(default_factory=dict)  # the peak pass's memory, by part
    counts: dict = field(default_factory=dict)  # exact: prefill rows, full prefills, hits, preemptions, blocks
    graphs: dict | None = None  # what the CUDA graphs did during this run (graph_delta); None: a backend without
    # graphs


GRAPH_COUNTS = ("captured", "evicted", "failed", "replays", "plain")


def graph_delta(before: dict | None, after: dict | None) -> dict | None:
    """What the CUDA graphs did between two Placement.graph_counts() (None where the backend captures none): graphs
    captured and evicted, captures failed, passes replayed and passes run plainly, over the interval."""
    if before is None or after is None:
        return None
    return {k: after[k] - before[k] for k in GRAPH_COUNTS}


def gdn_state_bytes(model: Model) -> int:
    """One sequence's GDN layers (conv windows and memories): what a slot holds, and what a saved state costs."""
    return sum(layer.conv.nbytes + layer.ssm.nbytes for layer in model.new_state().layers if isinstance(layer, GDNState))


def run(model: Model, sc: Scenario, prompts: list[list[int]], prefix_cache: bool, chunked: bool) -> Run:
    """Drive one Engine step by step through the scenario's arrivals, timing each request and each pass."""
    drafter = build_drafter(sc.drafter, model) if sc.drafter else None
    policy = policy_for(sc.draft_n if sc.drafter else 0, None)
    seqs = [SeqResult(i, p) for i, p in enumerate(prompts)]
    arrived_s, arrived_pass, first_s, first_pass = {}, {}, {}, {}
    out = Run([], [], [], [], 0.0)

    def on_emit(seq: SeqResult, tokens: list[int], marks: list[str]) -> None:
        if seq.index not in first_s:  # its first token, picked in the pass now in progress
            first_s[seq.index], first_pass[seq.index] = time.perf_counter(), len(out.pass_s)

    options = EngineOptions(slots=sc.slots, n_blocks=sc.n_blocks(), block_size=sc.block_size,
                            chunk=sc.chunk if chunked else None, prefix_cache=prefix_cache)
    engine = Engine(model, drafter, policy, options, on_emit=on_emit)
    pool, cache = engine.pool, engine.prefix_cache
    per_state, per_block, row_bytes = gdn_state_bytes(model), pool.bytes_per_block(), 4 * model.cfg.n_vocab
    step, arrived, peak, saved_peak = 0, 0, -1, 0
    graphs_before = model.placement.graph_counts()
    t_first = time.perf_counter()
    while arrived < len(seqs) or not engine.done():
        while arrived < len(seqs) and arrived * sc.gap <= step:
            arrived_s[arrived], arrived_pass[arrived] = time.perf_counter(), len(out.pass_s)
            engine.add(seqs[arrived], sc.max_new, arrived)
            arrived += 1
        rows_before, prefill_before, passes_before = engine.rows, engine.prefill_rows, engine.passes
        ended_before = len(engine.finished)
        t0 = time.perf_counter()
        engine.step()
        if engine.passes > passes_before:  # an idle step (nothing arrived yet) makes no pass
            out.pass_s.append(time.perf_counter() - t0)
            out.pass_decode_rows.append(engine.rows - rows_before)
            out.pass_prefill_rows.append(engine.prefill_rows - prefill_before)
            rows = out.pass_decode_rows[-1] + out.pass_prefill_rows[-1]
            memory = {"kv": (pool.n_blocks - len(pool.free)) * per_block,  # in use, or idle and cached
                      "saved_states": saved_state_bytes(cache),
                      "slot_states": (len(engine.active) + len(engine.finished) - ended_before) * per_state,
                      "logits": rows * row_bytes}  # the sequences of the pass (those that ended in it included)
            if sum(memory.values()) > peak:
                peak, out.memory = sum(memory.values()), memory | {"total": sum(memory.values()), "pass_rows": rows}
            saved_peak = max(saved_peak, memory["saved_states"])
        step += 1
    out.wall_s = time.perf_counter() - t_first
    out.graphs = graph_delta(graphs_before, model.placement.graph_counts())
    bounds = np.cumsum([0] + [d + p for d, p in zip(out.pass_decode_rows, out.pass_prefill_rows)])
    for i, seq in enumerate(seqs):
        out.tokens.append(seq.tokens)
        out.ttft_s.append(first_s[i] - arrived_s[i])
        out.ttft_steps.append(first_pass[i] - arrived_pass[i] + 1)
        out.ttft_rows.append(int(bounds[first_pass[i] + 1] - bounds[arrived_pass[i]]))
    reused = [s.stats.prefix_tokens_reused for s in engine.finished]
    out.counts = {"prefill_rows": engine.prefill_rows, "full_prefills": sum(r == 0 for r in reused),
                  "prefix_tokens_reused": sum(reused), "preemptions": engine.preemptions, "passes": engine.passes,
                  "kv_blocks_peak": pool.peak_used, "kv_blocks": pool.n_blocks,
                  "saved_state_bytes_peak": saved_peak, "largest_pass_rows": int(np.diff(bounds).max())}
    if cache is not None:
        out.counts |= {"prefix_hits": cache.hits, "prefix_states_saved": cache.states_saved}
    return out


def saved_state_bytes(cache: PrefixCache | None) -> int:
    """The saved GDN states a cache holds now, read without touching it (its own state_bytes() forgets stale ones)."""
    if cache is None:
        return 0
    return sum(conv.nbytes + ssm.nbytes for e in cache.with_state.values() if cache.valid(e) for conv, ssm in e.state)


def summary(values) -> dict:
    """{median, p90, min, max} of a list of figures (p90 interpolated between its two nearest values)."""
    v = np.asarray(values, float)
    return {"median": float(np.median(v)), "p90": float(np.percentile(v, 90)), "min": float(v.min()),
            "max": float(v.max())}


def warm_up(model: Model, sc: Scenario) -> None:
    """Every pass shape once, untimed: 1 .. slots sequences in a pass, chunked and whole, with and without the
    cache (the cpu backend compiles its ragged kernels once for each count of sequences: seconds each, cold)."""
    small = Scenario(requests=sc.slots + 1, prefix=2 * sc.block_size, own=2, max_new=4, gap=1, slots=sc.slots,
                     chunk=sc.chunk, block_size=sc.block_size, drafter=sc.drafter, draft_n=sc.draft_n)
    prompts = small.prompts(model.cfg.n_vocab)
    for prefix_cache, chunked in ((False, False), (True, True)):
        run(model, small, prompts, prefix_cache, chunked)


def config_report(runs: list[Run], chunk: int | None) -> dict:
    """One configuration over its rounds: timings as medians with their spread, exact figures from the last round
    (every round makes the same passes). chunk: its prefill rows a pass (None: whole prompts)."""
    last, n = runs[-1], len(runs[-1].ttft_s)
    per_request_ms = [1e3 * statistics.median(r.ttft_s[i] for r in runs) for i in range(n)]
    tok_s = [sum(map(len, r.tokens)) / r.wall_s for r in runs]
    running = [(s, p) for r in runs for s, d, p in zip(r.pass_s, r.pass_decode_rows, r.pass_prefill_rows) if d]
    alone = [1e3 * s for s, p in running if not p]  # running slots' passes with no joining rows
    full_chunk = [1e3 * s for r in runs for s, p in zip(r.pass_s, r.pass_prefill_rows) if chunk and p == chunk]
    return {"ttft_ms": summary(per_request_ms),
            "ttft_ms_median_range": [min(m := [1e3 * statistics.median(r.ttft_s) for r in runs]), max(m)],
            "ttft_steps": summary(last.ttft_steps), "ttft_rows": summary(last.ttft_rows),
            "tok_s": statistics.median(tok_s), "tok_s_range": [min(tok_s), max(tok_s)],
            "wall_s": statistics.median(r.wall_s for r in runs),
            "rows": int(sum(last.pass_decode_rows) + sum(last.pass_prefill_rows)), **last.counts,
            "wait_rows_max": max((p for d, p in zip(last.pass_decode_rows, last.pass_prefill_rows) if d), default=0),
            "running_pass_rows_max": max((d + p for d, p in zip(last.pass_decode_rows, last.pass_prefill_rows) if d),
                                         default=0),
            "step_ms": {"running_alone_median": statistics.median(alone) if alone else None,
                        "longest_with_running_slots": 1e3 * max((s for s, _ in running), default=0.0),
                        "full_chunk_pass_median": statistics.median(full_chunk) if full_chunk else None},
            "memory_peak": last.memory, "graphs": last.graphs}


def goals(configs: dict, runs: dict, chunk: int) -> dict:
    """The issue's three goals, cache+chunk against baseline: each its figures, its target and whether it is met."""
    base, both = configs["baseline"], configs["cache+chunk"]
    speedups = [statistics.median(b.ttft_s) / statistics.median(c.ttft_s) for b, c in zip(runs["baseline"],
                                                                                           runs["cache+chunk"])]
    prefill = both["prefill_rows"] / base["prefill_rows"]
    ttft = base["ttft_ms"]["median"] / both["ttft_ms"]["median"]
    step = both["step_ms"]
    return {
        "prefill_rows": {"baseline": base["prefill_rows"], "cache+chunk": both["prefill_rows"], "ratio": prefill,
                         "goal": "<= 1/8", "met": prefill <= 1 / 8},
        "ttft": {"baseline_ms": base["ttft_ms"]["median"], "cache+chunk_ms": both["ttft_ms"]["median"],
                 "speedup": ttft, "speedup_range": [min(speedups), max(speedups)],
                 "rows_speedup": base["ttft_rows"]["median"] / both["ttft_rows"]["median"],
                 "steps_speedup": base["ttft_steps"]["median"] / both["ttft_steps"]["median"], "goal": ">= 4x",
                 "met": ttft >= 4},
        "running_slot_delay": {"wait_rows_max": both["wait_rows_max"], "chunk": chunk,
                               "baseline_wait_rows_max": base["wait_rows_max"], "goal": "<= one chunk of rows",
                               "met": both["wait_rows_max"] <= chunk,
                               "longest_step_ms": step["longest_with_running_slots"],
                               "running_alone_step_ms": step["running_alone_median"],
                               "full_chunk_pass_ms": step["full_chunk_pass_median"],
                               "baseline_longest_step_ms": base["step_ms"]["longest_with_running_slots"]},
    }


def checks(report: dict, rounds: int) -> list[str]:
    """What in a serving report contradicts its exact figures, or is too noisy to quote (empty: nothing found)."""
    out, configs, ttft = [], report["configs"], report["goals"]["ttft"]
    # a pass costs a fixed part plus a part per row, so a wait of n passes and r rows costs n a + r b: the clock's
    # ratio of two waits lies between their ratios of passes and of rows (WIDE either side for the noise)
    lo, hi = sorted((ttft["steps_speedup"], ttft["rows_speedup"]))
    if not lo / WIDE <= ttft["speedup"] <= hi * WIDE:
        out.append(f"time to first token: cache+chunk {ttft['speedup']:.2f}x sooner than the baseline by the clock, "
                   f"but {ttft['steps_speedup']:.2f}x by the passes and {ttft['rows_speedup']:.2f}x by the rows "
                   "waited through, which bound it: the configurations ran on a machine whose load changed")
    lo, hi = ttft["speedup_range"]
    if lo < 4 <= hi or hi < 4 <= lo:
        out.append(f"the time-to-first-token goal holds in some rounds only ({lo:.2f}-{hi:.2f}x)")
    for a, ca in configs.items():
        for b, cb in configs.items():
            if ca["rows"] >= 1.5 * cb["rows"] and ca["tok_s"] > WIDE * cb["tok_s"]:
                out.append(f"{a} computed {ca['rows'] / cb['rows']:.1f}x the rows of {b} for the same tokens yet ran "
                           f"{ca['tok_s'] / cb['tok_s']:.2f}x its tok/s: one of the runs was disturbed")
    if rounds > 1:
        noisy = [f"{name}.{key}" for name, c in configs.items() for key in ("ttft_ms_median_range", "tok_s_range")
                 if c[key][0] > 0 and c[key][1] / c[key][0] > WIDE]
        if noisy:
            out.append(f"noisy (rounds spanning more than {WIDE}x): {', '.join(noisy)}; rerun on a quieter machine "
                       "before quoting them")
    return out


def serving(model: Model, sc: Scenario, rounds: int = 1, say: Callable[[str], None] = lambda msg: None) -> dict:
    """The whole serving report as a dict (the --json output of `python -m tinyspec bench --serving`): the four
    configurations interleaved `rounds` times after a warm-up, the goals and the checks."""
    sc.check(model.cfg.n_ctx)
    prompts = sc.prompts(model.cfg.n_vocab)
    say(f"warm-up (untimed: 1 .. {sc.slots} sequences a pass, chunked and whole, cache on and off)")
    warm_up(model, sc)
    runs: dict[str, list[Run]] = {name: [] for name in CONFIGS}
    for r in range(rounds):
        for name, (prefix_cache, chunked) in CONFIGS.items():
            say(f"round {r + 1}/{rounds}: {name}")
            out = run(model, sc, prompts, prefix_cache, chunked)
            base = runs["baseline"][0].tokens if runs["baseline"] else out.tokens
            if out.tokens != base:
                raise RuntimeError(f"bench --serving: the {name} configuration changed an output (an engine bug)")
            runs[name].append(out)
            say(f"  {out.wall_s:.1f} s, {out.counts['prefill_rows']} prefill rows, median time to first token "
                f"{1e3 * statistics.median(out.ttft_s):.0f} ms")
    configs = {name: config_report(rs, sc.chunk if CONFIGS[name][1] else None) for name, rs in runs.items()}
    setup = asdict(sc) | {
        "kv_blocks": sc.n_blocks(), "kv_block_bytes": BlockPool(model.cfg, 1, sc.block_size).bytes_per_block(),
        "gdn_state_bytes": gdn_state_bytes(model), "rounds": rounds}
    report = {"model": str(model.path or ""), "backend": model.backend, "setup": setup, "configs": configs,
              "goals": goals(configs, runs, sc.chunk)}
    report["checks"] = checks(report, rounds)
    return report


def serving_text(report: dict) -> str:
    """The serving report for a reader (what `bench --serving` prints without --json)."""
    sc, out = report["setup"], []
    how = f"{sc['drafter']} k = {sc['draft_n']}" if sc["drafter"] else "plain decoding"
    out.append(f"{report['model']}  backend {report['backend']}")
    out.append(f"serving: {sc['requests']} requests = {sc['prefix']} shared + {sc['own']} own tokens, {sc['max_new']} "
               f"new each ({how}), one every {sc['gap']} steps, {sc['slots']} slots, chunk {sc['chunk']}, "
               f"{sc['kv_blocks']} KV blocks of {sc['block_size']}; {sc['rounds']} round(s)")
    out.append(f"{'':12} {'first token: median':>19} {'p90':>7} {'min-max':>13} {'steps':>5} {'rows':>6} "
               f"{'tok/s':>7} {'prefill rows':>12} {'whole':>5} {'waited':>6} {'longest step':>12} {'memory peak':>11}")
    for name, c in report["configs"].items():
        t, m = c["ttft_ms"], c["memory_peak"]
        out.append(f"{name:12} {t['median']:16.0f} ms {t['p90']:7.0f} {t['min']:6.0f}-{t['max']:<6.0f} "
                   f"{c['ttft_steps']['median']:5.0f} {c['ttft_rows']['median']:6.0f} {c['tok_s']:7.2f} "
                   f"{c['prefill_rows']:12d} {c['full_prefills']:5d} {c['wait_rows_max']:6d} "
                   f"{c['step_ms']['longest_with_running_slots']:9.0f} ms {m['total'] / 1e6:8.1f} MB")
    out.append("  (steps, rows: median passes and rows from arrival to first token, exact; whole: requests that "
               "prefilled their whole prompt; waited: most joining rows in a pass beside running slots)")
    for name, c in report["configs"].items():
        m = c["memory_peak"]
        out.append(f"  memory at {name}'s peak pass ({m['pass_rows']} rows): KV {m['kv'] / 1e6:.1f} MB, saved states "
                   f"{m['saved_states'] / 1e6:.1f} MB, slot states {m['slot_states'] / 1e6:.1f} MB, logits "
                   f"{m['logits'] / 1e6:.1f} MB; KV blocks in use at most {c['kv_blocks_peak']} of {c['kv_blocks']}, "
                   f"saved states at most {c['saved_state_bytes_peak'] / 1e6:.1f} MB")
    g = report["goals"]
    p, t, d = g["prefill_rows"], g["ttft"], g["running_slot_delay"]
    verdict = {True: "met", False: "NOT met"}
    out.append(f"goal: prefill rows   cache+chunk {p['cache+chunk']} / baseline {p['baseline']} = {p['ratio']:.3f} "
               f"(<= 1/8): {verdict[p['met']]}")
    out.append(f"goal: first token    median {t['speedup']:.1f}x sooner ({t['speedup_range'][0]:.1f}-"
               f"{t['speedup_range'][1]:.1f}x over rounds; {t['rows_speedup']:.1f}x fewer rows waited) (>= 4x): "
               f"{verdict[t['met']]}")
    ms = lambda v: "-" if v is None else f"{v:.0f} ms"  # noqa: E731
    out.append(f"goal: running slots  waited at most {d['wait_rows_max']} joining rows a step (chunk {d['chunk']}; "
               f"baseline {d['baseline_wait_rows_max']}) (<= one chunk): {verdict[d['met']]}; longest step "
               f"{ms(d['longest_step_ms'])} (baseline {ms(d['baseline_longest_step_ms'])}; running slots alone "
               f"{ms(d['running_alone_step_ms'])}, a pass of one full chunk {ms(d['full_chunk_pass_ms'])})")
    if sc["rounds"] == 1:
        out.append("note            one round: spreads are over requests, not rounds (--spec-repeats 3 for those)")
    for name, c in report["configs"].items():
        if c["graphs"] is not None:  # (the cuda backend: one Engine a run, its states and pool new, so its keys too)
            g = c["graphs"]
            out.append(f"  CUDA graphs in {name}'s last round: {g['captured']} captured, {g['evicted']} evicted, "
                       f"{g['failed']} failed; {g['replays']} passes replayed, {g['plain']} plain")
    for check in report["checks"]:
        out.append(f"CHECK           {check}")
    if not report["checks"]:
        out.append("checks          no contradiction found" + (f"; every round spans under {WIDE}x"
                                                               if sc["rounds"] > 1 else ""))
    return "\n".join(out)
