"""The demo `python -m tinyspec` runs: plain decoding vs three drafters on the model tinyspec ships.

The shipped target (tinyspec/assets/tiny-target.gguf) is a real qwen35 model, trained by tools/train_tiny.py
(on a GPU, `--preset gpu`) on the Python standard library and the sources of torch and transformers: Gated
DeltaNet layers with full attention every third layer, and an MTP (nextn) block trained jointly. The draft model
(tiny-draft.gguf) is a smaller qwen35 with the same tokenizer.
For each method, every prompt is decoded greedily; the table gives tokens/s over all prompts, the speedup over
plain decoding, the acceptance rate (kept drafts / drafted) and the mean accepted length (tokens emitted per
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
SHOWN = EDITS[2][0] + "\n\n" + EDITS[2][1]  # the generation the demo prints with its drafts marked
# "mtp auto" is what `generate --spec mtp` runs by default: k chosen per step, up to its k_max (fast/adaptive.py)
METHODS = [("plain", 0), ("mtp", 3), ("mtp auto", DRAFTERS["mtp"].k_max), ("lookup", DRAFTERS["lookup"].k_max),
           ("draft", DRAFTERS["draft"].k_max)]


def auto_policy(drafter, k_max: int):
    """The wing's adaptive draft-length policy, what `generate --spec mtp` runs by default: the demo's "auto" row
    and its shown generation (imported here: the rest of the demo, like the core, runs without tinyspec.fast)."""
    from .fast.adaptive import AdaptiveDraftLength

    return AdaptiveDraftLength.for_drafter(drafter, k_max)


def run_method(name: str, k: int, target, draft, prompts: list[list[int]], max_new: int, stop_ids) -> dict:
    tokens = steps = drafted = accepted = 0
    outputs, seconds, phase_ms, decode_s = [], 0.0, {}, 0.0
    for prompt in prompts:
        kind = name.split()[0]  # a drafter of drafters.py, or "plain"
        t0 = time.perf_counter()
        drafter = build_drafter(kind, target, DraftOptions(draft_model=draft)) if kind != "plain" else None
        policy = auto_policy(drafter, k) if name.endswith("auto") else None
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


def demo(max_new: int = 40, backend: str | None = None, out=sys.stdout) -> int:
    def say(line: str = "") -> None:
        print(line, file=out, flush=True)

    if not TARGET.is_file() or not DRAFT.is_file():
        raise OSError(f"the shipped models are missing from {ASSETS} (tiny-target.gguf, tiny-draft.gguf); "
                      "reinstall tinyspec or run tools/train_tiny.py all --assets tinyspec/assets")
    backend = backend or default_backend()
    t0 = time.perf_counter()
    if first_run_compiles(backend):
        say(f"(first run of the {backend} backend on this machine: compiling its kernels, about a minute; "
            "cached on disk after)")
        from .fast.warm import warm  # every kernel, one process per core (the wing's; the core runs without it)

        warm()
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
    say(f"  backend {backend}; loaded and warmed up in {time.perf_counter() - t0:.1f} s; "
        f"{len(prompts)} prompts x {max_new} new tokens, greedy")
    say()
    results = {name: run_method(name, k, target, draft, prompts, max_new, stop_ids) for name, k in METHODS}
    base = results["plain"]["tok_s"]
    say(f"  {'method':<8} {'k':>3} {'tok/s':>8} {'speedup':>8} {'acceptance':>11} {'tokens/step':>12}")
    for name, k in METHODS:
        r = results[name]
        acc = f"{r['acceptance']:.2f}" if r["acceptance"] is not None else "-"
        mean = f"{r['mean_len']:.2f}" if r["mean_len"] is not None else "1.00"
        k_shown = f"<={k}" if name.endswith("auto") else k if k else "-"
        say(f"  {name:<8} {k_shown:>3} {r['tok_s']:8.1f} {r['tok_s'] / base:7.2f}x {acc:>11} {mean:>12}")
    again = run_method("plain", 0, target, draft, prompts, max_new, stop_ids)["tok_s"]  # the table's noise
    drift = abs(again - base) / min(again, base)
    say(f"  noise: plain timed again after the table ran at {again:.1f} tok/s, {100 * drift:.0f}% from the first; "
        f"{'read a difference under that as noise' if drift < 0.25 else 'the machine is busy: treat the table as rough'}")
    for name, k in METHODS:  # a speedup above the tokens a step emits cannot be right: say so, do not hide it
        r = results[name]
        if r["mean_len"] is not None and r["tok_s"] / base > 1.05 * r["mean_len"]:
            say(f"  CHECK: {name}'s {r['tok_s'] / base:.2f}x exceeds its {r['mean_len']:.2f} tokens a step: a timing "
                "was disturbed")
    plain = [o.tokens for o in results["plain"]["outputs"]]
    same = all([o.tokens for o in results[name]["outputs"]] == plain for name, _ in METHODS)
    say()
    say(f"  greedy outputs identical to plain decoding for every method and prompt: {'yes' if same else 'NO'}")
    lookup_edit = generate(target, prompts[-1], max_new, stop_ids=stop_ids, drafter=build_drafter("lookup", target), draft_n=8)
    say(f"  lookup on the edit-this-code prompt alone: {lookup_edit.stats['mean_accepted_length']:.2f} tokens/step")
    say()
    mtp, step = results["mtp"], results["plain"]["decode_ms"]
    verify, per_draft = mtp["verify_ms"] / step, mtp["draft_ms"] / step
    say(f"  Why the speedup is not the tokens/step: here a verify pass of 4 tokens costs {verify:.2f} one-token steps")
    say(f"  and each MTP draft {per_draft:.2f} of one, so a step of k = 3 costs {verify + 3 * per_draft:.2f} steps' time "
        f"for its {mtp['mean_len']:.2f} tokens.")
    say("  Speculation pays where a pass of k + 1 tokens costs about one: where reading the weights, not multiplying")
    say("  them, is the work (a real model on a GPU or a large CPU model; `python -m tinyspec bench` on a `synth`")
    say("  file times it). This model's weights fit in the CPU's cache, so each row of a pass is paid in arithmetic.")
    say()
    together = many_sequences(target, prompts, max_new, stop_ids, plain, base, say)
    say()
    drafter = build_drafter("mtp", target)
    shown = generate(target, tok.encode(SHOWN), 32, stop_ids=stop_ids, drafter=drafter,
                     policy=auto_policy(drafter, 8))
    answer = text_ids(shown.tokens, stop_ids)  # the end-of-generation token's text left out, as `generate` does
    style = mark_style(out)
    say("One generation with --spec mtp: the prompt asks for an edit of a function, so the answer can copy most of it.")
    say()
    say("  prompt:")
    say(gutter(SHOWN))
    say("  answer (plain text, as `generate` prints it):")
    say(gutter(tok.decode(answer)))
    say("  the same answer, marked by how each token was made:")
    say(gutter(render_marked(tok, answer, shown.marks, style)))
    say("  " + marks_legend(style))
    return 0 if same and together else 1


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
