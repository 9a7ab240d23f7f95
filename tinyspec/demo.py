"""The demo `python -m tinyspec` runs: plain decoding vs three drafters, as chains and as trees, on the model
tinyspec ships.

The shipped target (tinyspec/assets/tiny-target.gguf) is a real qwen35 model, trained by tools/train_tiny.py
(on a GPU, `--preset gpu`) on the Python standard library and the sources of torch and transformers: Gated
DeltaNet layers with full attention every third layer, and an MTP (nextn) block trained jointly. The draft model
(tiny-draft.gguf) is a smaller qwen35 with the same tokenizer.
For each method, every prompt is decoded greedily, in ROUNDS rounds with the methods' order turned each round; the
table gives the median over rounds of tokens/s over all prompts, the median speedup over plain decoding in the same
round, the acceptance rate (kept drafts / drafted) and the mean accepted length (tokens emitted per
verify pass: accepted drafts + the target's own token). Greedy speculative output must equal the plain output
token for token; the demo checks it and says so. Then one generation is shown, as plain text and again with
how each token was made (render_marked: colour on a terminal, marks in a pipe, a legend line): an "edit
this code" answer, where the output can repeat its input and speculation has most to gain.

Backend: the fastest one this machine has (tinyspec.backends.default_backend: cpu with Numba, cuda with a
GPU), because what speculation buys shows only where a verify pass of k + 1 tokens costs about as much as a
one-token pass. On the NumPy oracle (`--backend numpy`) every row is its own matrix-vector product in Python,
so a pass of 4 tokens costs several one-token passes and speculation roughly breaks even on this small model.
The first cpu run compiles the Numba kernels (cached on disk after); the demo says so before it waits.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from .assets import ASSETS, DRAFT, TARGET  # noqa: F401  (ASSETS: the notebooks read it from here)
from .backends import default_backend, first_run_compiles, load_model
from .batch import batch_generate
from .drafters import DRAFTERS, DraftOptions, build_drafter
from .generate import generate
from .report import mark_style, marks_legend, render_marked
from .scheduler import EngineOptions
from .textstream import text_ids
from .tokenizer import Tokenizer

# Continuations of held-out-style code, and one "edit this code" prompt whose answer repeats its input.
PROMPTS = [
    "import os\nimport sys\n\n\ndef main():\n",
    "class Stack:\n    \"\"\"A last-in first-out stack.\"\"\"\n\n    def __init__(self):\n",
    "    def __repr__(self):\n        return ",
]
# (original, the start of its edited copy): the continuation should repeat most of the original.
# tools/eval_tiny.py measures prompt lookup on these; notebook 05 compares the drafters on them.
EDITS = [
    ("def read_config(path):\n    with open(path) as f:\n        lines = f.read().splitlines()\n"
     "    result = {}\n    for line in lines:\n        key, value = line.split('=', 1)\n"
     "        result[key.strip()] = value.strip()\n    return result\n",
     "def read_config(path, encoding='utf-8'):\n    with open(path, encoding=encoding) as f:\n"),
    ("class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
     "    def __repr__(self):\n        return f'Point({self.x}, {self.y})'\n\n"
     "    def __eq__(self, other):\n        return self.x == other.x and self.y == other.y\n",
     "class Point3:\n    def __init__(self, x, y):\n"),
    ("def copy_file(src, dst):\n    with open(src, 'rb') as fsrc:\n        with open(dst, 'wb') as fdst:\n"
     "            while True:\n                buf = fsrc.read(16384)\n                if not buf:\n"
     "                    break\n                fdst.write(buf)\n",
     "def copy_file(src, dst, length=16384):\n    with open(src, 'rb') as fsrc:\n"),
]
EDIT_PROMPT = EDITS[0][0] + "\n\n" + EDITS[0][1]  # the one the demo shows
# "X auto" is what `generate --spec X` runs by default: k chosen per step, up to its k_max (fast/adaptive.py), from
# the step costs measured on this machine before the table (fast/step_costs.py); the others draft a fixed k
METHODS = [("plain", 0), ("mtp", 3), ("mtp auto", DRAFTERS["mtp"].k_max), ("lookup", DRAFTERS["lookup"].k_max),
           ("lookup auto", DRAFTERS["lookup"].k_max), ("draft auto", DRAFTERS["draft"].k_max),
           ("mtp tree", 4), ("mtp+lookup", 4)]
# The rows that draft trees (tree.py), W guesses a node and k nodes in one pass: `generate --spec mtp --tree 2
# --draft-n 4` and `--spec mtp+lookup --draft-n 4` (the MTP head's tree with prompt-lookup branches)
TREES = {"mtp tree": 2, "mtp+lookup": 2}


def method_drafter(name: str, target, draft):
    """The drafter a row of METHODS runs (None for plain): its kind is the name's first word."""
    kind = name.split()[0]
    return None if kind == "plain" else build_drafter(kind, target, DraftOptions(draft_model=draft,
                                                                                   tree=TREES.get(name, 1)))


def measured_costs(target, draft, prompt: list[int]) -> dict:
    """{kind: StepCosts} for every auto row's drafter, measured here now (the wing's; imported here: the rest of
    the demo, like the core, runs without tinyspec.fast)."""
    from .fast.step_costs import measure_step_costs

    return {name.split()[0]: measure_step_costs(target, method_drafter(name, target, draft), k, prompt)
            for name, k in METHODS if name.endswith("auto")}


def auto_policy(drafter, k_max: int, costs=None):
    """The wing's adaptive draft-length policy, what `generate --spec X` runs by default, starting from the step
    costs measured on this machine (costs: a StepCosts, or None for the prior guess)."""
    from .fast.adaptive import AdaptiveDraftLength

    return AdaptiveDraftLength.for_drafter(drafter, k_max, costs=costs)


def run_method(name: str, k: int, target, draft, prompts: list[list[int]], max_new: int, stop_ids,
               costs: dict | None = None) -> dict:
    tokens = steps = drafted = accepted = 0
    outputs, seconds, phase_ms, decode_s = [], 0.0, {}, 0.0
    for prompt in prompts:
        t0 = time.perf_counter()
        drafter = method_drafter(name, target, draft)
        policy = auto_policy(drafter, k, (costs or {}).get(name.split()[0])) if name.endswith("auto") else None
        res = generate(target, prompt, max_new, stop_ids=stop_ids, drafter=drafter, draft_n=None if policy else k,
                       policy=policy)
        seconds += time.perf_counter() - t0
        outputs.append(res)
        tokens += len(res.tokens)
        if drafter is not None:
            steps += res.stats["steps"]
            drafted += res.stats["drafted"]
            accepted += res.stats["accepted"]
            for phase, ms in res.stats["phase_ms"].items():
                phase_ms[phase] = phase_ms.get(phase, 0.0) + ms
        else:
            decode_s += res.stats["decode_s"]
    return {"outputs": outputs, "tok_s": tokens / seconds, "tokens": tokens,
            "acceptance": accepted / drafted if drafted else None,
            "mean_len": (accepted + steps) / steps if steps else None,
            "verify_ms": phase_ms.get("verify", 0.0) / steps if steps else None,  # a verify pass
            "draft_ms": phase_ms.get("draft", 0.0) / drafted if drafted else None,  # a draft
            "decode_ms": 1000 * decode_s / tokens if drafter is None and tokens else None}  # a one-token step


SLOTS = 3  # the batch section's slots
ROUNDS = 3  # timed rounds of the table (medians)


def demo(max_new: int = 40, backend: str | None = None, out=sys.stdout, as_json: bool = False) -> int:
    """The demo; as_json: no text, one JSON object on `out` (the table, the checks, the costs) for scripts."""
    def say(line: str = "") -> None:
        if not as_json:
            print(line, file=out, flush=True)

    if not TARGET.is_file() or not DRAFT.is_file():
        raise OSError(f"the shipped models are missing from {ASSETS} (tiny-target.gguf, tiny-draft.gguf); "
                      "reinstall tinyspec or run tools/train_tiny.py all --assets tinyspec/assets")
    backend = backend or default_backend()
    t0 = time.perf_counter()
    if first_run_compiles(backend):
        say(f"(first run of the {backend} backend on this machine: compiling its kernels, a line per group as "
            "each is done; cached on disk after)")
        from .fast.warm import warm  # every kernel, one process per core (the wing's; the core runs without it)

        warm(say=lambda line: say("  " + line))
    target, draft = load_model(TARGET, backend), load_model(DRAFT, backend)
    tok = Tokenizer.from_gguf(target.metadata)
    meta = target.metadata
    trunk = ["attention" if not r else "GDN" for r in target.cfg.recurrent]
    say("tinyspec demo: speculative decoding on the shipped qwen35 model")
    say(f"  target  {TARGET.name}: {target.cfg.n_trunk} layers ({trunk.count('GDN')} Gated DeltaNet + "
        f"{trunk.count('attention')} gated attention) + MTP head, d={target.cfg.n_embd}, vocab {target.cfg.n_vocab}, "
        f"trained on {meta.get('training.corpus', '?')}, held-out loss {meta.get('training.loss.heldout', 0):.2f}")
    say(f"  draft   {DRAFT.name}: {draft.cfg.n_trunk} layers, d={draft.cfg.n_embd}")
    prompts = [tok.encode(p) for p in PROMPTS + [EDIT_PROMPT]]
    stop_ids = tok.eog_ids
    longest = max(prompts, key=len)  # a long prefill takes the threaded scan and attention: compile those too
    for name, k in METHODS:  # compile each method's kernels before timing (Numba caches them on disk): a verify
        run_method(name, k, target, draft, [longest], 2, stop_ids)  # pass takes kernels a plain step does not
    batch_generate(target, [p[:3] for p in prompts[:SLOTS]], 1,
                   options=EngineOptions(slots=SLOTS))  # and the batch path's
    costs = measured_costs(target, draft, prompts[-1])  # what a step costs here, for the auto rows' policies
    say(f"  backend {backend}; loaded and warmed up in {time.perf_counter() - t0:.1f} s; "
        f"{len(prompts)} prompts x {max_new} new tokens, greedy")
    say()
    # ROUNDS rounds of every method, the order turned each round, so a burst of load on a shared machine hits
    # every row alike: each row's tok/s and speedup are the medians of its rounds, a speedup taken within a round
    rounds = []
    for i in range(ROUNDS):
        order = METHODS[i % len(METHODS):] + METHODS[:i % len(METHODS)]
        rounds.append({name: run_method(name, k, target, draft, prompts, max_new, stop_ids, costs) for name, k in order})
    results = {name: dict(rounds[0][name], tok_s=statistics.median(r[name]["tok_s"] for r in rounds),
                          speedup=statistics.median(r[name]["tok_s"] / r["plain"]["tok_s"] for r in rounds))
               for name, _ in METHODS}
    base = results["plain"]["tok_s"]
    say(f"  {'method':<11} {'k':>3} {'tok/s':>8} {'speedup':>8} {'acceptance':>11} {'tokens/step':>12}")
    for name, k in METHODS:
        r = results[name]
        acc = f"{r['acceptance']:.2f}" if r["acceptance"] is not None else "-"
        mean = f"{r['mean_len']:.2f}" if r["mean_len"] is not None else "1.00"
        k_shown = f"<={k}" if name.endswith("auto") else k if k else "-"
        say(f"  {name:<11} {k_shown:>3} {r['tok_s']:8.1f} {r['speedup']:7.2f}x {acc:>11} {mean:>12}")
    say(f"  {' and '.join(TREES)}: draft trees of k nodes, up to {max(TREES.values())} guesses a node, verified in one "
        "pass, each row a decode of its own path (tree.py)")
    plains = [r["plain"]["tok_s"] for r in rounds]  # the table's noise: plain's spread over the rounds
    drift = (max(plains) - min(plains)) / min(plains)
    say(f"  noise: medians of {ROUNDS} rounds, the methods in turned order; plain ran at {min(plains):.1f}-"
        f"{max(plains):.1f} tok/s, {100 * drift:.0f}% apart; "
        f"{'read a difference under that as noise' if drift < 0.25 else 'the machine is busy: treat the table as rough'}")
    checks = []
    for name, k in METHODS:  # a speedup above the tokens a step emits cannot be right: say so, do not hide it
        r = results[name]
        if r["mean_len"] is not None and r["speedup"] > 1.05 * r["mean_len"]:
            checks.append(f"{name}'s {r['speedup']:.2f}x exceeds its {r['mean_len']:.2f} tokens a step: a timing "
                          "was disturbed")
            say("  CHECK: " + checks[-1])
    plain = [o.tokens for o in results["plain"]["outputs"]]
    same = all([o.tokens for o in r[name]["outputs"]] == plain for r in rounds for name, _ in METHODS)
    say()
    say(f"  greedy outputs identical to plain decoding for every method and prompt: {'yes' if same else 'NO'}")
    lookup_edit = generate(target, prompts[-1], max_new, stop_ids=stop_ids, drafter=build_drafter("lookup", target), draft_n=8)
    lookup_len = lookup_edit.stats["mean_accepted_length"]
    say(f"  lookup on the edit-this-code prompt alone: {lookup_len:.2f} tokens/step")
    say()
    mtp, step = results["mtp"], results["plain"]["decode_ms"]
    verify, per_draft = mtp["verify_ms"] / step, mtp["draft_ms"] / step
    curve = costs["mtp"].curve()
    say(f"  What a step costs here (measured before the table; the auto rows' policies start from it): a verify pass")
    say(f"  of 4 tokens {costs['mtp'].verify[3] / costs['mtp'].verify[0]:.2f} one-token passes, one MTP draft "
        f"{costs['mtp'].draft / costs['mtp'].verify[0]:.2f}, one lookup draft "
        f"{costs['lookup'].draft / costs['lookup'].verify[0]:.2f}; an MTP step of k = 3 {curve[3]:.2f}.")
    mtp_speedup = mtp["speedup"]
    say(f"  In the table's mtp k = 3 run a verify pass of 4 tokens cost {verify:.2f} one-token steps and each draft "
        f"{per_draft:.2f} of one,")
    if mtp_speedup < 1.0:
        say(f"  so a step cost {verify + 3 * per_draft:.2f} steps' time for its {mtp['mean_len']:.2f} tokens: "
            "speculation loses where a pass of k + 1")
        say("  tokens costs far more than one. Here the weights fit in the CPU's cache, so each extra row is paid in")
        say("  arithmetic; where reading the weights is the work (a real model on a GPU or a large CPU model;")
        say("  `python -m tinyspec bench` on a `synth` file times it) the same drafts pay. The auto rows decide this")
        say("  per step from measured costs, and draft only when a step's tokens outweigh its cost.")
    else:
        say(f"  so a step cost {verify + 3 * per_draft:.2f} steps' time and emitted {mtp['mean_len']:.2f} tokens, "
            f"hence {mtp_speedup:.2f}x.")
    say()
    together = many_sequences(target, prompts, max_new, stop_ids, plain, base, say)
    say()
    shown_edit, shown, shown_len = showcase(target, tok, stop_ids, costs["mtp"])
    answer = text_ids(shown.tokens, stop_ids)  # the end-of-generation token's text left out, as `generate` does
    style = mark_style(out)
    kept = shown.stats["accepted"] / max(1, len(shown.tokens))
    say(f"One generation with --spec mtp, on the edit prompt of {len(EDITS)} where its drafts made the most tokens "
        f"a step in this run ({shown_len:.2f}):")
    say(f"  the prompt asks for an edit of a function; {100 * kept:.0f}% of the answer's tokens are drafts the target "
        "kept.")
    say()
    say("  prompt:")
    say(gutter(shown_edit))
    say("  answer (plain text, as `generate` prints it):")
    say(gutter(tok.decode(answer)))
    say("  the same answer, marked by how each token was made:")
    say(gutter(render_marked(tok, answer, shown.marks, style)))
    say("  " + marks_legend(style))
    if as_json:
        table = [{"method": name, "k": k, "adaptive": name.endswith("auto"), "tree": TREES.get(name, 1),
                  "tok_s": results[name]["tok_s"],
                  "speedup": results[name]["speedup"], "acceptance": results[name]["acceptance"],
                  "tokens_per_step": results[name]["mean_len"] or 1.0} for name, k in METHODS]
        print(json.dumps({"backend": backend, "max_new": max_new, "prompts": len(prompts), "table": table,
                          "rounds": ROUNDS, "plain_tok_s_range": [min(plains), max(plains)], "noise": drift,
                          "identical": same,
                          "batch_identical": together, "lookup_edit_tokens_per_step": lookup_len,
                          "step_costs": {kind: c.as_dict() for kind, c in costs.items()},
                          "showcase_tokens_per_step": shown_len, "checks": checks}), file=out)
    return 0 if same and together else 1


def showcase(target, tok, stop_ids, costs) -> tuple[str, object, float]:
    """(prompt, its generation, its tokens per step): the edit prompt of EDITS on which MTP drafting, as `generate
    --spec mtp` runs it, made the most tokens a step, each generated once here (32 tokens)."""
    best = None
    for original, start in EDITS:
        text = original + "\n\n" + start
        drafter = build_drafter("mtp", target)
        res = generate(target, tok.encode(text), 32, stop_ids=stop_ids, drafter=drafter,
                       policy=auto_policy(drafter, 8, costs))
        length = res.stats.get("mean_accepted_length") or 1.0
        if best is None or length > best[2]:
            best = (text, res, length)
    return best


def gutter(text: str) -> str:
    """text set apart from the demo's own lines: each line behind a bar."""
    return "\n".join("    | " + line for line in text.rstrip("\n").split("\n"))


def many_sequences(target, prompts, max_new: int, stop_ids, plain: list[list[int]], base: float, say) -> bool:
    """The same prompts decoded SLOTS at a time (batch.py: one verify pass a step for every slot), plain and with
    MTP drafting; says the aggregate tok/s and whether every sequence got its plain tokens."""
    slots, rows = SLOTS, {}
    say(f"Many sequences at once ({slots} slots: one verify pass a step for all of them, `python -m tinyspec batch`):")
    ok = True
    for name, drafter, k in (("plain", None, None), ("mtp", build_drafter("mtp", target), 3)):
        t0 = time.perf_counter()
        res = batch_generate(target, prompts, max_new, drafter=drafter, draft_n=k,
                             options=EngineOptions(slots=slots, stop_ids=stop_ids))
        tok_s = sum(len(s.tokens) for s in res.sequences) / (time.perf_counter() - t0)
        ok = ok and [s.tokens for s in res.sequences] == plain
        rows[name] = res.stats["rows_per_pass"]
        say(f"  {name:<6} {tok_s:8.1f} tok/s over all slots ({tok_s / base:.2f}x one sequence at a time), "
            f"{rows[name]:.1f} rows per pass")
    say(f"  every sequence identical to its plain decoding alone: {'yes' if ok else 'NO'}")
    return ok
