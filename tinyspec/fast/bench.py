"""bench: what speculation costs and buys on one model and backend, measured in one run.

    decode_tok_s       1 / median time of a one-token forward pass (greedy decode after a prefill)
    step_profile       where that one-token pass's time goes, taken after every timed run (fast/step_profile.py,
                       which says exactly what each figure means): kernel_calls_per_token (calls into Numba's
                       compiled kernels; 0 on numpy), parallel_regions_per_token (calls of parallel=True kernels
                       while Numba runs more than one thread: each wakes the OpenMP pool),
                       one_thread_parallel_calls_per_token (parallel kernels called on one thread: no region),
                       python_calls_per_token, builtin_calls_per_token (C calls cProfile sees), outside_kernels_share
                       (1 - the kernels' seconds under cProfile / a plain step's median: the share of a step spent
                       in Python, NumPy and dispatch; 1.0 on numpy), outside_kernels_share_profiled (the same inside
                       the profiled steps: inflated by the profiler's cost per Python call), step_ms, kernel_ms,
                       profiled_step_ms, threads, by_kernel; null with --profile-steps 0 and on cuda (asynchronous
                       GPU launches: the figures would not describe them)
    verify_cost_ratio  median time of a verify pass of T tokens (with the model's ring) / a one-token pass, keyed
                       by T = k + 1 (the pending token and k drafts): T = 1, 2, 4, 8 are k = 0, 1, 3, 7 drafts
    rollback           which ring the verify passes use (Model.placement.rollback: snapshot or replay, state.py)
    weight_gb_s        bytes of weights a decode step reads / its median time (a MoE layer: n_expert_used experts)
    copy_gb_s          np.copyto of a 256 MB buffer where the weights live (the GPU's memory for the cuda
                       backend, 1 GB there), the memory bandwidth this machine gives right now
    spec[drafter]      tok_s (after the prefill), speedup over plain greedy, acceptance_rate,
                       mean_accepted_length, phase_ms
                       (mtp, lookup, synthetic; mtp_vocab with a draft vocabulary; mtp_synth[_vocab]: real MTP
                       drafting at a synthetic acceptance, --synth-len; mtp_adaptive[_vocab]: k chosen per step, with
                       --draft-vocab what `generate --spec mtp` runs on a large vocabulary; mtp_synth_adaptive[_vocab]:
                       both, --synth-len with --adaptive)
    experts            (a qwen35moe model) verify passes of T = 1..9 (k = 0..8) are timed, and distinct_per_layer[T]
                       is the mean number of distinct experts such a pass reads per MoE layer (expert_union.py),
                       uniform_union[T] what independent uniform routing gives (random synth routers come close;
                       a trained router shares experts between neighbours and reads fewer)
    graphs             (cuda) what the CUDA graphs did over the whole run (Placement.graph_counts: captured keys,
                       failed ones with their reasons, replays, plain calls, evicted graphs), summed, and by_use:
                       "rule" (the greedy rule, fast/cuda_accept.py) and "forward" (the forward passes,
                       fast/cuda_pass.py) each on its own; null on numpy and cpu, which capture none. A failed
                       capture is also a CHECK line (it runs, slower)
    slots[B]           (bench --slots 1,2,4,8) many sequences at once (batch.py), B of them in B slots:
                       plain_tok_s, spec_tok_s (aggregate tokens/s over all slots after the prefills),
                       rows_per_pass / spec_rows_per_pass (verify rows per target pass: B for plain), speedup,
                       identical (every sequence's spec tokens equal its plain ones); slots_setup: the drafter
                       (mtp, or mtp_synth with --synth-len), k, tokens per sequence and how the B prompts differ

Speculation pays when verify_cost_ratio[k + 1] stays well below the tokens a step emits (mean_accepted_length):
decode is memory-bound, so a kernel that reads each weight once for all k + 1 rows makes the extra rows nearly free.
The `synthetic` drafter (synthetic.py) proposes the target's true greedy continuation with a chosen acceptance
rate, so the engine's speedup can be measured on random-weight models (synth.py) whose own drafts mean nothing.
All runs are greedy; every speculative output is checked equal to the plain one (`identical`).

Timings are medians of `repeats` runs taken back to back in this process (these machines are shared and noisy,
LESSONS 18): quote ratios from one report, not across reports. The verify sizes are timed interleaved, and so
are the plain and speculative runs (--spec-repeats): a speedup is the median of ratios of runs taken back to back.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import numpy as np

from .adaptive import AdaptiveDraftLength
from .draft_vocab import DraftVocab
from .step_costs import bushy_tree, reset_to, verify_times  # noqa: F401  (bench's timings; tests import them here)
from .step_profile import step_profile, step_profile_text, verify_profile, verify_profile_text
from ..generate import generate
from ..drafters import DRAFTERS, DraftOptions, build_drafter
from ..model import Model
from ..mtp import MTPDrafter
from .synthetic import SyntheticDrafter, acceptance_for_mean_length, expected_mean_accepted_length


def median_time(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def claim(holds, what: str) -> bool:
    """A timing claim a notebook makes: printed with whether this run bears it out, never asserted. A wall-clock
    ratio is the machine's as much as the code's (a busy neighbour breaks it), so the notebooks assert what is
    structural (bytes, passes, rows, tokens) and report timings with this."""
    holds = bool(holds)
    print(("holds in this run: " if holds else "NOT borne out by this run (a busy machine?): ") + what)
    return holds


def spread(values: list[float]) -> list[float]:
    """[min, max] of the timings a median was taken over: what the median's noise looks like."""
    return [min(values), max(values)]


WIDE = 1.25  # a figure whose timings span more than this factor (max / min) is flagged as noisy


def checks(report: dict) -> list[str]:
    """What in a report cannot be right, or is too noisy to quote: each a sentence (empty: nothing found).

    Contradictions: a verify pass of several tokens timed cheaper than a one-token pass; a speedup above the tokens
    a verify step emits (a step costs at least a one-token pass, so it cannot return more than its tokens); plain
    generation's tok/s far from the decode rate of its own one-token passes. Noise: a figure whose timings span
    more than WIDE x. A busy machine is the usual cause; the figures are still reported, with this list."""
    out = []
    ratio = report["verify_cost_ratio"]
    for T, r in ratio.items():
        if T > 1 and r < 0.95:
            out.append(f"a verify pass of {T} tokens was timed at {r:.2f}x a one-token pass: cheaper than one token, "
                       "so one of the two timings was disturbed")
    for name, s in report["spec"].items():
        if s["speedup"] > 1.05 * s["mean_accepted_length"]:
            out.append(f"{name}: a speedup of {s['speedup']:.2f}x exceeds the {s['mean_accepted_length']:.2f} tokens "
                       "a verify step emits: plain or speculative runs were disturbed")
    plain, decode = report.get("plain_tok_s"), report["decode_tok_s"]
    if plain and not 0.5 < plain / decode < 1.5:
        out.append(f"plain generation ran at {plain:.2f} tok/s beside one-token passes at {decode:.2f} tok/s: "
                   "the two should agree within overheads, so one was disturbed")
    graphs = report.get("graphs")
    if graphs and graphs["failed"]:
        out.append(f"{graphs['failed']} CUDA graph capture(s) failed, those shapes ran as plain launches: "
                   f"{graphs['reasons']}")
    noisy = [name for name, (lo, hi) in noise_ranges(report) if lo > 0 and hi / lo > WIDE]
    if noisy:
        out.append(f"noisy (timings spanning more than {WIDE}x): {', '.join(noisy)}; rerun with more repeats or on "
                   "a quieter machine before quoting them")
    return out


def noise_ranges(report: dict) -> list[tuple[str, list[float]]]:
    """Every (figure, [min, max]) the report carries."""
    out = [("decode_ms", report["decode_ms_range"])]
    out += [(f"verify_ms[{T}]", r) for T, r in report["verify_ms_range"].items()]
    out += [(f"verify_tree_ms[{T}]", r) for T, r in report.get("verify_tree_ms_range", {}).items()]
    if report.get("plain_tok_s_range"):
        out.append(("plain_tok_s", report["plain_tok_s_range"]))
    out += [(f"spec.{name}.speedup", s["speedup_range"]) for name, s in report["spec"].items()]
    return out


def copy_bandwidth(mb: int = 256, repeats: int = 5, xp=np) -> float:
    """GB/s of np.copyto between two buffers of `mb` MB (read + write counted once each), allocated by xp
    (the model's array module: CuPy puts them on the GPU, and each copy is waited for)."""
    src = xp.ones(mb * 2**20 // 8)
    dst = xp.empty_like(src)
    wait = (lambda: None) if xp is np else xp.cuda.Device().synchronize

    def copy():
        np.copyto(dst, src)
        wait()

    copy()
    return 2 * src.nbytes / median_time(copy, repeats) / 1e9


def weight_bytes(model: Model) -> int:
    """Bytes of weights one decode step reads: the matmul and small tensors of every layer and the output head;
    of a MoE layer's expert tensors, the n_expert_used of n_expert experts one token routes to."""
    seen, total = set(), 0
    for t in [model.output] + [t for layer in model.layers for t in layer.values()]:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.nbytes * model.cfg.n_expert_used // t.shape[0] if len(t.shape) == 3 else t.nbytes
    return total


def decode_times(model: Model, prompt: list[int], n: int) -> list[float]:
    """Seconds of each of n one-token forward passes, greedy decode steps after the prompt."""
    state = model.new_state()
    logits, _ = model.forward(np.array(prompt), state)
    token, times = int(np.argmax(logits[-1])), []
    for _ in range(n):
        t0 = time.perf_counter()
        logits, _ = model.forward(np.array([token]), state)
        times.append(time.perf_counter() - t0)
        token = int(np.argmax(logits[-1]))
    return times


def decode_time(model: Model, prompt: list[int], n: int) -> float:
    """Median seconds of a one-token forward pass, over n greedy decode steps after the prompt."""
    return statistics.median(decode_times(model, prompt, n))


VERIFY_PROFILE_SIZES = (1, 4, 9)  # the verify passes the step profile also profiles: where a pass's extra rows go


def verify_costs(model: Model, prompt: list[int], sizes=(1, 2, 4, 8), repeats: int = 5) -> dict[int, float]:
    """{T: median seconds of a verify pass of T tokens} (verify_times)."""
    return {T: statistics.median(t) for T, t in verify_times(model, prompt, sizes, repeats).items()}


def warm_up(model: Model, prompt: list[int], sizes, draft_n: int, drafters: dict[str, Callable],
            n_new: int = 12) -> None:
    """Run every shape that is timed once, untimed: the prompt pass, a one-token pass, each verify pass size with
    its ring, and a short run of each drafter. On a cold Numba cache the first call of a kernel compiles it (seconds),
    which a median of a few timings would not always hide."""
    state = model.new_state()
    model.forward(np.array(prompt), state)
    model.forward(np.array(prompt[:1]), state.copy())
    for T in sizes:
        model.forward(np.array((prompt * T)[:T]), state.copy(), ring=model.new_ring(T))
    if drafters:
        ref = generate(model, prompt, n_new).tokens
        for make in drafters.values():
            generate(model, prompt, n_new, drafter=make(ref), draft_n=draft_n)


def spec_runs(model: Model, prompt: list[int], max_new: int, draft_n: int, drafters: dict[str, Callable],
              repeats: int = 1, adaptive: tuple[str, ...] = ()) -> dict:
    """Plain greedy, then each drafter on the same prompt: tok/s, speedup, acceptance and equality with plain.
    speedup is the median over `repeats` of speculative / plain tok/s, each pair measured back to back.
    Drafters named in `adaptive` choose k per step (adaptive.py, up to draft_n drafts)."""
    rates: dict[str, list[float]] = {"plain": [], **{name: [] for name in drafters}}
    last, plain = {}, None
    for _ in range(repeats):  # interleaved: plain, then every drafter, then again - each ratio is a pair taken
        plain = generate(model, prompt, max_new)  # back to back, so a slow minute of a shared machine hits both
        rates["plain"].append(plain.stats["decode_tok_s"])  # tokens/s after the prefill (the same pass for all)
        for name, make in drafters.items():
            drafter = make(plain.tokens)
            policy = AdaptiveDraftLength.for_drafter(drafter, draft_n, model) if name in adaptive else None
            last[name] = generate(model, prompt, max_new, drafter=drafter, draft_n=None if policy else draft_n,
                                  policy=policy)
            rates[name].append(last[name].stats["tokens_per_s"])
    base = statistics.median(rates["plain"])
    out = {"plain": {"tok_s": base, "tok_s_range": spread(rates["plain"]), "tokens": len(plain.tokens)}}
    for name, res in last.items():
        ratios = [r / p for r, p in zip(rates[name], rates["plain"])]
        out[name] = {"tok_s": statistics.median(rates[name]), "speedup": statistics.median(ratios),
                     "speedup_range": spread(ratios),
                     "acceptance_rate": res.stats["acceptance_rate"],
                     "mean_accepted_length": res.stats["mean_accepted_length"], "identical": res.tokens == plain.tokens,
                     "draft_n": draft_n, "phase_ms": res.stats["phase_ms"]}
        if name in adaptive:
            out[name]["chosen_k"] = res.stats["adaptive"]["chosen_k"]
    return out


def slot_prompts(model: Model, prompt: list[int], n: int) -> list[list[int]]:
    """n prompts that differ slightly: copy c is the prompt with its first token moved up by c (mod the
    vocabulary), so copy 0 is the prompt itself and no two sequences of a batch are the same sequence."""
    return [[(prompt[0] + c) % model.cfg.n_vocab] + list(prompt[1:]) for c in range(n)]


def bench_slots(model: Model, prompt: list[int], slot_counts, max_new: int, draft_n: int,
                synth_len: float | None = None, repeats: int = 1,
                policy_factory: Callable[[int], object] | None = None, draft_vocab: DraftVocab | None = None) -> dict:
    """Many sequences at once (batch.batch_generate): for each B in slot_counts, B prompts (slot_prompts: the
    prompt with its first token changed per copy, so the sequences differ) decode max_new greedy tokens each
    in B slots, plainly (drafter None: one row per slot per pass) and speculatively: batched MTP drafting
    (MTPDrafter(model) for the first slot, another() for the others: one head pass per draft depth for every
    slot) at k = draft_n, or, with synth_len L, SyntheticDrafter at the per-position rate giving L tokens per
    step, drafting for real with the same batched MTP head (its tokens discarded; reference per prompt: its
    plain greedy run).

    Returns {B: {plain_tok_s, spec_tok_s, rows_per_pass, spec_rows_per_pass, speedup, identical,
    mean_accepted_length, acceptance_rate, kv_blocks_peak}}: tokens/s are aggregate over all slots after the
    prefills (batch stats decode_tok_s), medians over `repeats` rounds; speedup is the median of the per-round
    spec / plain ratios (each pair taken back to back); identical: every sequence's spec tokens equal its plain
    tokens. No stop ids, so every sequence runs max_new tokens and plain rows_per_pass is exactly B.
    policy_factory(B) -> a policy (drafting.DraftPolicy, e.g. fast.batch_draft_length.BatchDraftLength) for a
    third run at each B, "policy_tok_s" / "policy_speedup" / "policy" beside the fixed k's; draft_vocab: the
    MTP head drafts over it (cheaper drafting; the synthetic drafts are unchanged)."""
    from ..batch import batch_generate
    from ..scheduler import EngineOptions

    if not model.cfg.n_nextn:
        raise ValueError("bench --slots times batched MTP drafting: this model has no MTP head")
    synth_p = acceptance_for_mean_length(synth_len, draft_n) if synth_len is not None else None
    references: dict[tuple, list[int]] = {}
    for p in slot_prompts(model, prompt, max(slot_counts)):  # the plain greedy continuation of every copy
        references[tuple(p)] = generate(model, p, max_new).tokens

    def spec_drafter(B: int):
        mtp = MTPDrafter(model, vocab=draft_vocab)
        return mtp if synth_p is None else SyntheticDrafter(references, synth_p, seed=0, inner=mtp)

    def run(B: int, spec: bool, n_new: int = max_new, adaptive: bool = False):
        policy = policy_factory(B) if adaptive else None
        prompts = slot_prompts(model, prompt, B)
        return batch_generate(model, prompts, n_new, drafter=spec_drafter(B) if spec else None,
                              draft_n=None if policy is not None or not spec else draft_n, policy=policy,
                              options=EngineOptions(slots=B))

    for B in slot_counts:  # untimed: every pass shape once (a cold Numba cache compiles on first use)
        run(B, False, min(max_new, 8)), run(B, True, min(max_new, 8))
    rates: dict[int, dict[str, list[float]]] = {B: {"plain": [], "spec": [], "policy": []} for B in slot_counts}
    last: dict[int, tuple] = {}
    for _ in range(repeats):  # interleaved: plain then spec (then the policy) at each B, back to back
        for B in slot_counts:
            plain, spec = run(B, False), run(B, True)
            rates[B]["plain"].append(plain.stats["decode_tok_s"])
            rates[B]["spec"].append(spec.stats["decode_tok_s"])
            last[B] = plain, spec
            if policy_factory is not None:
                chosen = run(B, True, adaptive=True)
                rates[B]["policy"].append(chosen.stats["decode_tok_s"])
                last[B] += (chosen,)
    out = {}
    for B in slot_counts:
        plain, spec = last[B][:2]
        seqs = [s.stats for s in spec.sequences]
        steps, drafted, accepted = (sum(s[key] for s in seqs) for key in ("steps", "drafted", "accepted"))
        out[B] = {"plain_tok_s": statistics.median(rates[B]["plain"]),
                  "spec_tok_s": statistics.median(rates[B]["spec"]),
                  "rows_per_pass": plain.stats["rows_per_pass"], "spec_rows_per_pass": spec.stats["rows_per_pass"],
                  "speedup": statistics.median(s / p for s, p in zip(rates[B]["spec"], rates[B]["plain"])),
                  "identical": all(a.tokens == b.tokens and a.error is None for a, b in
                                   zip(plain.sequences, spec.sequences)),
                  "mean_accepted_length": (accepted + steps) / steps if steps else 0.0,
                  "acceptance_rate": accepted / drafted if drafted else 0.0,
                  "steps": plain.stats["steps"], "spec_steps": spec.stats["steps"],
                  "kv_blocks_peak": spec.stats["kv_blocks_peak"]}
        if policy_factory is not None:
            chosen = last[B][2]
            out[B] |= {"policy_tok_s": statistics.median(rates[B]["policy"]),
                       "policy_speedup": statistics.median(c / p for c, p in zip(rates[B]["policy"], rates[B]["plain"])),
                       "policy_identical": all(a.tokens == b.tokens for a, b in zip(plain.sequences, chosen.sequences)),
                       "policy": chosen.stats.get("policy")}
    return out


def bench(model: Model, prompt: list[int], *, decode_n: int = 16, sizes=None, repeats: int = 5,
          max_new: int = 128, draft_n: int = 3, synth_acceptance: float = 0.8, drafters: tuple[str, ...] = (),
          synth_len: float | None = None, draft_vocab: DraftVocab | None = None, adaptive: bool = False,
          spec_repeats: int = 1, slot_counts: tuple[int, ...] = (), slots_policy: Callable[[int], object] | None = None,
          profile_steps: int | None = None, tree: int | None = None,
          say: Callable[[str], None] = lambda msg: None) -> dict:
    """The whole report as a dict (the --json output of `python -m tinyspec bench`).

    synth_len L (needs the MTP head): also "mtp_synth", real MTP drafting whose drafts are right with the
    per-position rate p solving (1 - p^(k+1)) / (1 - p) = L (llama.cpp's --spec-synth-len); draft_vocab:
    also the "_vocab" variants of the MTP runs; adaptive: also "mtp_adaptive" (k chosen per step);
    slot_counts: also "slots" and "slots_setup", many sequences at once (bench_slots; slots_policy is its
    policy_factory); sizes: the verify passes timed, T = k + 1 starting at 1 (default 1, 2, 4, 8; 1..9 on a MoE
    model); profile_steps: the rounds of step_profile taken after every timed run (None: decode_n; 0: none,
    "step_profile" null; never on cuda); tree W: also "mtp_tree" and "lookup_tree" (trees of up to W guesses a node
    and draft_n nodes, the chains' rows), and mtp+lookup built with W (None: its default, 2)."""
    makers: dict[str, Callable] = {}
    for name in drafters:  # a registry drafter (drafters.py) that can draft for this model, or the wing's synthetic one
        if name in DRAFTERS and DRAFTERS[name].unavailable(model) is None:
            width = (tree or 2) if name == "mtp+lookup" else 1  # (the registry's default for a tree kind)
            makers[name] = lambda ref, name=name, width=width: build_drafter(name, model, DraftOptions(tree=width))
            if tree and name in ("mtp", "lookup"):
                makers[f"{name}_tree"] = lambda ref, name=name: build_drafter(name, model, DraftOptions(tree=tree))
        elif name == "synthetic":
            makers["synthetic"] = lambda ref: SyntheticDrafter(ref, synth_acceptance, seed=0)

    def mtp_drafter(vocab: DraftVocab | None = None):  # the registry's mtp, for the MTP variants below
        return build_drafter("mtp", model, DraftOptions(vocab=vocab))

    mtp = "mtp" in drafters and DRAFTERS["mtp"].unavailable(model) is None
    synth_p = acceptance_for_mean_length(synth_len, draft_n) if synth_len is not None else None
    if mtp and draft_vocab is not None:
        makers["mtp_vocab"] = lambda ref: mtp_drafter(draft_vocab)
    if mtp and synth_p is not None:
        makers["mtp_synth"] = lambda ref: SyntheticDrafter(ref, synth_p, seed=0, inner=mtp_drafter())
        if draft_vocab is not None:
            makers["mtp_synth_vocab"] = lambda ref: SyntheticDrafter(ref, synth_p, seed=0,
                                                                     inner=mtp_drafter(draft_vocab))
    if mtp and adaptive and synth_p is not None:  # the synthetic acceptance with k chosen per step
        makers["mtp_synth_adaptive"] = lambda ref: SyntheticDrafter(ref, synth_p, seed=0, inner=mtp_drafter())
        if draft_vocab is not None:
            makers["mtp_synth_adaptive_vocab"] = lambda ref: SyntheticDrafter(ref, synth_p, seed=0,
                                                                              inner=mtp_drafter(draft_vocab))
    if mtp and adaptive:
        makers["mtp_adaptive"] = lambda ref: mtp_drafter()
        if draft_vocab is not None:  # what `generate --spec mtp` runs on a large vocabulary by default
            makers["mtp_adaptive_vocab"] = lambda ref: mtp_drafter(draft_vocab)
    if sizes is None:  # a MoE verify pass costs what its expert union reads: k = 0..8
        sizes = tuple(range(1, 10)) if model.cfg.n_expert else (1, 2, 4, 8)
    say("warm-up (untimed: every pass shape and drafter once; compiles kernels on a cold cache)")
    warm_up(model, prompt, sizes, draft_n, makers)
    say("memory copy bandwidth")
    copy = copy_bandwidth(xp=model.xp) if model.xp is np else copy_bandwidth(1024, xp=model.xp)
    say(f"decode: {decode_n} one-token passes")
    decode = decode_times(model, prompt, decode_n)
    t1 = statistics.median(decode)
    say(f"verify passes of {', '.join(map(str, sizes))} tokens (k = {', '.join(str(T - 1) for T in sizes)} drafts)")
    verify = verify_times(model, prompt, sizes, repeats)
    costs = {T: statistics.median(t) for T, t in verify.items()}
    tree_verify = {}
    if tree:
        say(f"the same verify passes as trees of up to {tree} children a node")
        tree_verify = verify_times(model, prompt, sizes, repeats, tree)
    if makers:
        say(f"speculative runs: plain, {', '.join(makers)} ({max_new} tokens, k = {draft_n})")
    adaptive_runs = ("mtp_adaptive", "mtp_adaptive_vocab", "mtp_synth_adaptive", "mtp_synth_adaptive_vocab")
    spec = spec_runs(model, prompt, max_new, draft_n, makers, spec_repeats, adaptive_runs) if makers else {}
    if "synthetic" in spec:
        spec["synthetic"]["acceptance_setting"] = synth_acceptance
        spec["synthetic"]["expected_mean_accepted_length"] = expected_mean_accepted_length(synth_acceptance, draft_n)
    for name in ("mtp_synth", "mtp_synth_vocab", "mtp_synth_adaptive", "mtp_synth_adaptive_vocab"):
        if name in spec:
            spec[name] |= {"synth_len": synth_len, "acceptance_setting": synth_p,
                           "expected_mean_accepted_length": expected_mean_accepted_length(synth_p, draft_n)}
    for name in ("mtp_vocab", "mtp_synth_vocab", "mtp_adaptive_vocab", "mtp_synth_adaptive_vocab"):
        if name in spec:
            spec[name]["draft_vocab"] = len(draft_vocab)
    slots = {}
    if slot_counts:
        say(f"many sequences: {', '.join(map(str, slot_counts))} slots, plain and "
            f"{'mtp_synth' if synth_len is not None else 'mtp'} ({max_new} tokens each, k = {draft_n})")
        slots = bench_slots(model, prompt, slot_counts, max_new, draft_n, synth_len, spec_repeats, slots_policy,
                            draft_vocab)
    experts = {}
    if model.cfg.n_expert:
        from .expert_union import expert_union, uniform_union

        say("expert union: distinct experts read per MoE layer by verify passes of 1..9 tokens")
        E, k_e = model.cfg.n_expert, model.cfg.n_expert_used
        experts = {"n_expert": E, "n_expert_used": k_e, "distinct_per_layer": expert_union(model, prompt, sizes),
                   "uniform_union": {T: uniform_union(E, k_e, T) for T in sizes},
                   "note": "random (synth) routers spread tokens over the experts nearly uniformly; a trained router "
                           "sends neighbouring tokens to shared experts, so a real pass reads fewer"}
    profile, verify_prof, profile_steps = None, None, decode_n if profile_steps is None else profile_steps
    if profile_steps and model.backend != "cuda":  # after the timed runs, so it disturbs none of them
        say(f"step profile: {profile_steps} rounds of a plain, a profiled and a hooked one-token pass")
        profile = step_profile(model, profile_steps, prompt)
        say(f"verify profile: the same for verify passes of T = {', '.join(map(str, VERIFY_PROFILE_SIZES))} tokens")
        verify_prof = verify_profile(model, VERIFY_PROFILE_SIZES, profile_steps, prompt)
    wb = weight_bytes(model)
    report = {"model": str(model.path or ""), "backend": model.backend,
              "rollback": model.placement.rollback,
              "n_vocab": model.cfg.n_vocab, "n_embd": model.cfg.n_embd, "n_layer": model.cfg.n_trunk,
              "weight_bytes": wb, "prompt_tokens": len(prompt),
              "decode_tok_s": 1.0 / t1, "decode_ms": 1e3 * t1, "decode_ms_range": [1e3 * v for v in spread(decode)],
              "step_profile": profile, "verify_profile": verify_prof,
              "verify_ms": {k: 1e3 * v for k, v in costs.items()},
              "verify_ms_range": {T: [1e3 * v for v in spread(t)] for T, t in verify.items()},
              "verify_cost_ratio": {T: v / costs[sizes[0]] for T, v in costs.items()},
              "verify_tree_ms": {T: 1e3 * statistics.median(t) for T, t in tree_verify.items()},
              "verify_tree_ms_range": {T: [1e3 * v for v in spread(t)] for T, t in tree_verify.items()},
              "verify_tree_ratio": {T: statistics.median(t) / costs[T] for T, t in tree_verify.items()},
              "weight_gb_s": wb / t1 / 1e9, "copy_gb_s": copy, "weight_bw_fraction": wb / t1 / 1e9 / copy,
              "spec": {k: v for k, v in spec.items() if k != "plain"},
              "plain_tok_s": spec["plain"]["tok_s"] if spec else None,
              "plain_tok_s_range": spec["plain"]["tok_s_range"] if spec else None,
              "graphs": model.placement.graph_counts()}
    report["checks"] = checks(report)
    if experts:
        report["experts"] = experts
    if slot_counts:
        report["slots"] = slots
        report["slots_setup"] = {"drafter": "mtp_synth" if synth_len is not None else "mtp", "draft_n": draft_n,
                                 "max_new": max_new, "prompts": "B copies, copy c's first token moved up by c"}
        if synth_len is not None:
            p = acceptance_for_mean_length(synth_len, draft_n)
            report["slots_setup"] |= {"synth_len": synth_len, "acceptance_setting": p,
                                      "expected_mean_accepted_length": expected_mean_accepted_length(p, draft_n)}
    return report


def report_text(report: dict) -> str:
    """The report for a reader (what `bench` prints without --json)."""
    out: list[str] = []
    out.append(f"{report['model']}  backend {report['backend']}  ({report['weight_bytes'] / 1e6:.1f} MB of weights per token)")
    lo, hi = report["decode_ms_range"]
    out.append(f"decode          {report['decode_tok_s']:8.2f} tok/s   ({report['decode_ms']:.1f} ms per token, median; "
               f"{lo:.1f}-{hi:.1f} ms over the timed passes)")
    if report.get("step_profile"):
        out += step_profile_text(report["step_profile"])
    if report.get("verify_profile"):
        out += verify_profile_text(report["verify_profile"])
    out.append(f"bandwidth       {report['weight_gb_s']:8.2f} GB/s of weights, {report['copy_gb_s']:.2f} GB/s memory copy "
               f"({100 * report['weight_bw_fraction']:.0f}%)")
    out.append("verify cost     " + "  ".join(f"{T} tokens (k={T - 1}): {r:.2f}x"
                                              for T, r in report["verify_cost_ratio"].items()) + " a one-token pass")
    if report.get("verify_tree_ratio"):
        out.append("as a tree       " + "  ".join(f"{T} tokens: {report['verify_tree_ms'][T]:.2f} ms, {r:.2f}x the chain"
                                              for T, r in report["verify_tree_ratio"].items()))
    if "experts" in report:
        ex = report["experts"]
        out.append(f"experts         distinct experts a pass of T tokens reads per MoE layer ({ex['n_expert_used']} of "
                   f"{ex['n_expert']} a token; uniform routing in brackets):")
        out.append("                " + "  ".join(f"T={T}: {u:.1f} ({ex['uniform_union'][T]:.1f})"
                                                  for T, u in ex["distinct_per_layer"].items()))
        out.append(f"                (note: {ex['note']})")
    if report["spec"]:
        w = max(15, *(len(name) for name in report["spec"]))
        out.append(f"{'plain':<{w}} {report['plain_tok_s']:8.2f} tok/s")
        for name, s in report["spec"].items():
            expected = f" (set {s['expected_mean_accepted_length']:.2f})" if "expected_mean_accepted_length" in s else ""
            lo, hi = s["speedup_range"]
            out.append(f"{name:<{w}} {s['tok_s']:8.2f} tok/s   speedup {s['speedup']:.2f}x ({lo:.2f}-{hi:.2f})   acceptance "
                       f"{s['acceptance_rate']:.2f}   {s['mean_accepted_length']:.2f} tokens/step{expected}   "
                       f"{'identical' if s['identical'] else 'DIFFERENT'} to plain")
    if "slots" in report:
        setup = report["slots_setup"]
        expected = (f", set {setup['expected_mean_accepted_length']:.2f} tokens/step"
                    if "expected_mean_accepted_length" in setup else "")
        out.append(f"slots           B sequences at once, {setup['max_new']} tokens each, plain vs {setup['drafter']} "
                   f"(k = {setup['draft_n']}{expected}); tok/s over all slots")
        for B, s in report["slots"].items():
            out.append(f"  B = {B:<3}  plain {s['plain_tok_s']:8.2f} tok/s ({s['rows_per_pass']:.2f} rows/pass)   spec "
                       f"{s['spec_tok_s']:8.2f} tok/s ({s['spec_rows_per_pass']:.2f} rows/pass, "
                       f"{s['mean_accepted_length']:.2f} tokens/step)   speedup {s['speedup']:.2f}x   "
                       f"{'identical' if s['identical'] else 'DIFFERENT'} to plain")
            if "policy_tok_s" in s:
                chosen = (s["policy"] or {}).get("chosen_k", {})
                out.append(f"          batch-aware k {s['policy_tok_s']:8.2f} tok/s   speedup {s['policy_speedup']:.2f}x   "
                           f"steps per k {chosen}   {'identical' if s['policy_identical'] else 'DIFFERENT'} to plain")
    if report.get("graphs"):
        g = report["graphs"]
        for use, c in g.get("by_use", {"rule": g}).items():
            out.append(f"cuda graphs     {use:8s}{c['captured']} captured, {c['failed']} failed, {c['replays']} replays, "
                       f"{c['plain']} plain calls")
    for check in report.get("checks", []):
        out.append(f"CHECK           {check}")
    if not report.get("checks"):
        out.append(f"checks          no contradiction found; every timed figure spans under {WIDE}x")
    return "\n".join(out)
