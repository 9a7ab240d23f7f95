"""MTP speculation step by step in tinyspec and in llama.cpp, on the same file and prompts: where they part, and why.

    python tools/compare_llamacpp_mtp.py --llama-build BUILD [--model FILE] [--max-new 64] [--draft-n 3] [--json]
    python tools/compare_llamacpp_mtp.py --llama-build BUILD --spec draft --draft-model SMALL.gguf   # the draft model

llama.cpp's side is its own example, `llama-speculative-simple` (built from the llama.cpp sources the docs name,
`cmake --build BUILD --target llama-speculative-simple`), run greedy (`--temp 0`) with `--spec-type draft-mtp`
(or `--spec-type draft-simple -md` for a draft model), its debug log on (`-v`) and its weights not repacked (`-nr`:
ggml's AMX kernels stop with SIGILL on a VM that lists AMX but does not allow it): per draft position the drafter's three best candidates
with their probabilities (common/speculative.cpp: renormalised over the sampler's top 10), and per verify step
"accepted n/m draft tokens, the last target token is: (id)". tinyspec's side runs the same model, prompts and k
through its engine (generate.speculative_generate, greedy, a fixed k) with a drafter that records the same top
three (softmax over its 10 best logits, as llama.cpp's top-k 10 sampler renormalises) and a policy that records
what each step drafted and kept.

Twice, because the two loops do not start at the same place:

    tinyspec    prefills the whole prompt; the prefill's last row gives the first token, which is never a
                draft; the first verify step drafts the second generated token onward
    llama.cpp   prefills the prompt but its last token (speculative-simple.cpp: "keep the last token separate"),
                which becomes id_last; the first verify step drafts the FIRST generated token

so the two runs verify different windows of the same text: every step's drafts start one position apart, and
the acceptance rates differ although each drafter and target computes the same numbers. "tinyspec as llama.cpp
starts" runs tinyspec's engine from llama.cpp's phase: the prompt but its last token is the history and the
last token is the first pending one (the state a resumed sequence starts from, scheduler.py), with llama.cpp's
cap on drafts (n_predict - generated - 1), and with a draft model llama.cpp's checkpoint path played (Steps). That
run is compared with llama.cpp's step by step: the first step whose drafts or kept count differ is reported with
both sides' candidates and its reason (why): llama.cpp drafting past its -n budget, the two targets' greedy texts
parting at a near tie (the target's top-2 logit gap, by tinyspec's model), or the drafters' near tie
(docs/llamacpp-speculation.md).

Needs: a llama.cpp build with llama-speculative-simple (--llama-build or $TINYSPEC_LLAMA_BUILD). Writes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tinyspec.assets import DRAFT, TARGET  # noqa: E402
from tinyspec.backends import load_model  # noqa: E402
from tinyspec.demo import EDIT_PROMPT, PROMPTS  # noqa: E402
from tinyspec.draft import DraftModelDrafter  # noqa: E402
from tinyspec.drafting import FixedDraftLength, Plan  # noqa: E402
from tinyspec.generate import speculative_generate  # noqa: E402
from tinyspec.mtp import MTPDrafter  # noqa: E402
from tinyspec.scheduler import EngineOptions  # noqa: E402
from tinyspec.sequence import SeqResult  # noqa: E402
from tinyspec.speculate import Engine  # noqa: E402
from tinyspec.tokenizer import Tokenizer  # noqa: E402

TOP = 3  # candidates shown per draft position (as llama.cpp's debug log prints them)
SAMPLER_TOP_K = 10  # llama.cpp's draft sampler: top-k 10, probabilities renormalised over those


def top_candidates(scores) -> list[tuple[int, float]]:
    """[(id, p)] of the TOP best tokens, p the softmax over the SAMPLER_TOP_K best logits (llama.cpp's draft law)."""
    logits = np.asarray(scores, np.float64).reshape(-1)
    best = np.argsort(-logits, kind="stable")[:SAMPLER_TOP_K]
    p = np.exp(logits[best] - logits[best[0]])
    p /= p.sum()
    return [(int(t), float(q)) for t, q in zip(best[:TOP], p[:TOP])]


class Steps(FixedDraftLength):
    """A fixed k that records, per verify step, the drafts the drafter proposed and how many the target kept.

    restores=True plays llama.cpp's checkpoint path (a target that cannot drop positions: a draft model beside a
    hybrid target): after a step that kept fewer than its drafts, llama.cpp restores the target and decodes the
    kept tokens and the correction again, which gives one more token and no drafting; here that is a step of
    k = 0 (the same state, the same token), recorded as the restored step's "reverified"."""

    def __init__(self, k: int, restores: bool = False):
        super().__init__(k)
        self.restores, self.restoring = restores, False
        self.steps: list[dict] = []
        self.passes: list[list] = []  # per step, the drafter's candidates at each draft position

    def plan(self, rooms, prefill_rows=0):
        self.passes.append([])
        if self.restoring:
            return [Plan(0) for _ in rooms]
        return super().plan(rooms, prefill_rows)

    def observe(self, drafts, accepted, draft_s, verify_s, rows) -> None:
        (draft,), (n,) = drafts, accepted
        if self.restoring:  # the plain step standing for llama.cpp's second decode of the restored tokens
            self.restoring = False
            self.steps[-1]["reverified"] = True
            return
        self.steps.append({"drafts": list(draft.tokens), "accepted": int(n), "candidates": self.passes[-1]})
        self.restoring = self.restores and n < draft.n


def traced_drafter(spec: str, model, draft_model, policy: Steps):
    """The drafter of `spec`, each of its draft passes' top candidates recorded into policy.passes."""
    base = MTPDrafter if spec == "mtp" else DraftModelDrafter

    class Traced(base):
        def draft_pass(self, asks):
            out = super().draft_pass(asks)
            for answer in out:  # MTP: (h_mtp, scores) per ask; a draft model: its scores
                scores = answer[1] if isinstance(answer, tuple) else answer
                policy.passes[-1].append(top_candidates(model.to_host(scores)))
            return out

    return Traced(model) if spec == "mtp" else Traced(draft_model, target=model)


def tinyspec_run(model, draft_model, spec: str, prompt: list[int], max_new: int, k: int, eog,
                 llama_phase: bool) -> dict:
    """One greedy run on tinyspec's engine, its verify steps recorded. llama_phase: as llama-speculative-simple
    runs: started where it starts (the prompt's last token is the first pending one, the drafts capped at
    max_new - generated - 1) and, with a draft model, its checkpoint restores played (Steps)."""
    policy = Steps(k, restores=llama_phase and spec == "draft")
    drafter = traced_drafter(spec, model, draft_model, policy)
    if not llama_phase:
        out = speculative_generate(model, drafter, prompt, max_new, policy=policy, stop_ids=eog)
        tokens = out.tokens
    else:
        seq = SeqResult(0, prompt[:-1], tokens=[prompt[-1]], marks=["prompt"])  # decided: the first pending token
        engine = Engine(model, drafter, policy, EngineOptions(stop_ids=tuple(eog)))
        engine.add(seq, max_new + 1, np.random.default_rng(0))  # room: (max_new + 1) - (n + 1) - 1 drafts
        while not engine.done():
            engine.step()
        tokens = seq.tokens[1:]
    drafted = sum(len(s["drafts"]) for s in policy.steps)  # the drafting steps (a restore's decode is none)
    kept = sum(s["accepted"] for s in policy.steps)
    return {"tokens": tokens, "steps": policy.steps, "drafted": drafted, "accepted": kept}


STEP = re.compile(r"accepted (\d+)/(\d+) draft tokens, the last target token is: \((-?\d+)\)")
PARTIAL = re.compile(r"partial acceptance: (\d+) < (\d+), restoring checkpoint")
CAND = re.compile(r"draft candidate\s+(\d+), pos\s+(\d+):\s+(-?\d+) \(\s*([0-9.eE+-]+)\)")
SUMMARY = re.compile(r"n_(drafted|accept)\s*=\s*(\d+)")


def llamacpp_run(build: Path, model: Path, spec: str, draft_model: Path | None, text: str, max_new: int,
                 k: int) -> dict:
    """llama-speculative-simple, greedy, debug log on: its verify steps parsed from the log."""
    binary = build / "bin" / "llama-speculative-simple"
    cmd = [str(binary), "-m", str(model), "-p", text, "-n", str(max_new), "--temp", "0", "--seed", "0",
           "-c", "2048", "-t", "2", "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0", "-v", "-nr"]
    cmd += ["--spec-type", "draft-mtp"] if spec == "mtp" else ["--spec-type", "draft-simple", "-md", str(draft_model)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    log = run.stdout + run.stderr  # the debug lines are on stderr, the text (two newlines, prompt, output) on stdout
    if run.returncode != 0:
        raise RuntimeError(f"llama-speculative-simple failed ({run.returncode}): {log[-2000:]}")
    return parse_log(log) | {"text": run.stdout[2 + len(text):]}


def parse_log(log: str) -> dict:
    """llama-speculative-simple's debug log -> its verify steps (drafts, kept, the target's last token, the
    drafter's candidates) and the totals it reports itself."""
    steps, passes, reverify = [], [], False
    for line in log.splitlines():
        if (m := CAND.search(line)) is not None:
            rank, pos, token, p = int(m[1]), int(m[2]), int(m[3]), float(m[4])
            if rank == 0 and pos == 0:
                passes.append([])  # a new drafting (its first position)
            if rank == 0:
                passes[-1].append([])
            passes[-1][-1].append((token, p))
        elif (m := PARTIAL.search(line)) is not None:
            # a target that cannot drop positions (no rollback slots: a draft model beside a hybrid target) was
            # restored to its checkpoint: this verify step kept m[1] of m[2]; the kept tokens and the correction
            # are verified again as the next "draft", which is all accepted and is no drafting of its own
            n, m_ = int(m[1]), int(m[2])
            cands = passes.pop(0) if passes and m_ else []
            steps.append({"drafts": [c[0][0] for c in cands][:m_], "accepted": n, "candidates": cands[:m_],
                          "restored": True})
            reverify = True
        elif (m := STEP.search(line)) is not None:
            n, m_ = int(m[1]), int(m[2])
            if reverify:  # the restored step's tokens, decoded again: counted by llama.cpp, not a drafting
                steps[-1]["last"], steps[-1]["reverified"], reverify = int(m[3]), [n, m_], False
                continue
            cands = passes.pop(0) if passes and m_ else []
            steps.append({"drafts": [c[0][0] for c in cands][:m_], "accepted": n, "last": int(m[3]),
                          "candidates": cands[:m_]})
    totals = dict((name, int(v)) for name, v in SUMMARY.findall(log))  # what llama.cpp itself reports
    return {"steps": steps, "drafted": sum(len(s["drafts"]) for s in steps),
            "accepted": sum(s["accepted"] for s in steps),
            "reported": {"drafted": totals.get("drafted"), "accepted": totals.get("accept")}}


def first_difference(ours: list[dict], theirs: list[dict]) -> dict | None:
    """The first drafting step whose drafts or kept count differ, both sides' steps shown; None if none does."""
    ours, theirs = [s for s in ours if s["drafts"]], [s for s in theirs if s["drafts"]]
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a["drafts"] != b["drafts"] or a["accepted"] != b["accepted"]:
            return {"step": i, "tinyspec": a, "llama.cpp": b}
    if len(ours) != len(theirs):
        return {"step": min(len(ours), len(theirs)), "tinyspec": "ended" if len(ours) < len(theirs) else ours[len(theirs)],
                "llama.cpp": "ended" if len(theirs) < len(ours) else theirs[len(ours)]}
    return None


def llamacpp_tokens(steps: list[dict]) -> list[int] | None:
    """llama.cpp's output ids, from its steps (kept drafts, then the target's own token); None where a restored step
    hides its correction (the log prints only the token after it)."""
    if any(s.get("restored") for s in steps):
        return None
    return [t for s in steps for t in s["drafts"][: s["accepted"]] + [s["last"]]]


def texts_part(model, tok, prompt: list[int], ours: list[int], theirs: list[int] | None, their_text: str) -> dict | None:
    """Where the greedy outputs part: the first position whose token differs (from llama.cpp's ids where its log
    gives them all, else the first of ours whose text is not llama.cpp's, and the one before it, which may be
    the same characters cut differently), with the target's top-2 gap there by tinyspec's model: a near tie is
    where rounding decides (ggml rounds activations to 8 bits before each quantized matmul; LESSONS 9). None:
    ours is a prefix of theirs."""
    if theirs is not None:
        at = [next((n for n, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)]
    else:
        n = next((n for n in range(len(ours)) if not their_text.startswith(tok.decode(ours[: n + 1]))), None)
        at = [None] if n is None else [m for m in (n - 1, n) if m >= 0]
    if at[0] is None:
        return None
    gaps = []
    for n in at:
        logits, _ = model.forward(np.array(prompt + ours[:n]), model.new_state())
        row = np.sort(np.asarray(model.to_host(logits[-1]), np.float64))[::-1]
        gaps.append(float(row[0] - row[1]))
    return {"token": at[-1], "ours": int(ours[at[-1]]), "top2_gap": min(gaps)}


NEAR = 0.05  # a near tie: two logits (the target's) or two probabilities (the drafter's) closer than this


def why(diff: dict | None, parted: dict | None, ours: list[dict]) -> str:
    """The reason the first differing step differs, from the evidence (the module docstring): the end of the
    budget, the texts parting at the target's near tie, the drafter's near tie; else 'unexplained'."""
    if diff is None:
        return "every drafting step the same"
    if diff["tinyspec"] == "ended":
        return "llama.cpp drafts past its -n budget (a cap of 0 drafts reads as no cap)"
    steps = [s for s in ours if s["drafts"]]
    emitted = sum(s["accepted"] + 1 + bool(s.get("reverified")) for s in steps[: diff["step"]])
    if parted is not None and parted["token"] <= emitted + len(steps[diff["step"]]["drafts"]) and \
            parted["top2_gap"] < NEAR:
        return f"the greedy texts part at a near tie of the target (top-2 gap {parted['top2_gap']:.4f})"
    a, b = diff["tinyspec"], diff["llama.cpp"]
    for ca, cb, da, db in zip(a["candidates"], b["candidates"], a["drafts"], b["drafts"]):
        if da != db:
            gaps = [abs(c[0][1] - c[1][1]) for c in (ca, cb) if len(c) > 1]
            if gaps and min(gaps) < NEAR:
                return f"the drafters' near tie (their top-2 probabilities {min(gaps):.3f} apart)"
            break
    return "unexplained"


def max_prob_gap(ours: list[dict], theirs: list[dict]) -> float:
    """Largest difference in the drafter's candidate probabilities where both sides drafted the same tokens."""
    gap = 0.0
    for a, b in zip(ours, theirs):
        if a["drafts"] != b["drafts"]:
            break
        for ca, cb in zip(a["candidates"], b["candidates"]):
            if ca and cb and ca[0][0] == cb[0][0]:
                gap = max(gap, abs(ca[0][1] - cb[0][1]))
    return gap


def compare(build: Path, model_path: Path, spec: str, draft_path: Path | None, texts: list[str], max_new: int,
            k: int, backend: str, say=print) -> dict:
    model = load_model(model_path, backend)
    draft_model = load_model(draft_path, backend) if spec == "draft" else None
    tok = Tokenizer.from_gguf(model.metadata)
    report = {"model": str(model_path), "spec": spec, "k": k, "max_new": max_new, "prompts": [], "totals": {}}
    totals = {name: [0, 0] for name in ("tinyspec", "tinyspec_as_llamacpp_starts", "llama.cpp")}
    for text in texts:
        prompt = tok.encode(text)
        runs = {"tinyspec": tinyspec_run(model, draft_model, spec, prompt, max_new, k, tok.eog_ids, False),
                "tinyspec_as_llamacpp_starts": tinyspec_run(model, draft_model, spec, prompt, max_new, k,
                                                            tok.eog_ids, True),
                "llama.cpp": llamacpp_run(build, model_path, spec, draft_path, text, max_new, k)}
        for name, r in runs.items():
            totals[name][0] += r["drafted"]
            totals[name][1] += r["accepted"]
        as_llama = runs["tinyspec_as_llamacpp_starts"]
        same = first_difference(as_llama["steps"], runs["llama.cpp"]["steps"])
        parted = texts_part(model, tok, prompt, as_llama["tokens"], llamacpp_tokens(runs["llama.cpp"]["steps"]),
                            runs["llama.cpp"]["text"])
        entry = {"prompt": text, "prompt_tokens": len(prompt), "why": why(same, parted, as_llama["steps"]),
                 "texts_part": parted,
                 "drafted_accepted": {name: [r["drafted"], r["accepted"]] for name, r in runs.items()},
                 "llamacpp_reports": runs["llama.cpp"]["reported"],
                 "first_difference_from_llamacpp_phase": same,
                 "first_step_windows": {"tinyspec": runs["tinyspec"]["steps"][:1],
                                        "llama.cpp": runs["llama.cpp"]["steps"][:1]},
                 "max_top1_probability_gap": max_prob_gap(runs["tinyspec_as_llamacpp_starts"]["steps"],
                                                          runs["llama.cpp"]["steps"])}
        report["prompts"].append(entry)
        say(f"{text[:30]!r:34} drafted/kept " + ", ".join(f"{n} {d}/{a}" for n, (d, a) in
                                                           entry["drafted_accepted"].items())
            + f"; from llama.cpp's start: {entry['why']}")
    report["totals"] = {name: {"drafted": d, "accepted": a, "acceptance": a / d if d else 0.0}
                        for name, (d, a) in totals.items()}
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-build", type=Path, default=os.environ.get("TINYSPEC_LLAMA_BUILD"),
                    help="a llama.cpp build folder holding bin/llama-speculative-simple ($TINYSPEC_LLAMA_BUILD)")
    ap.add_argument("--model", type=Path, default=TARGET, help="the target GGUF (default: the shipped one)")
    ap.add_argument("--spec", choices=("mtp", "draft"), default="mtp")
    ap.add_argument("--draft-model", type=Path, default=DRAFT, help="--spec draft: the draft GGUF (the shipped one)")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--draft-n", type=int, default=3)
    ap.add_argument("--backend", default="numpy", help="tinyspec's backend (numpy: the oracle)")
    ap.add_argument("--json", action="store_true", help="the whole report as JSON on stdout")
    args = ap.parse_args(argv)
    if args.llama_build is None or not (args.llama_build / "bin" / "llama-speculative-simple").is_file():
        print("compare_llamacpp_mtp: give --llama-build, a llama.cpp build with bin/llama-speculative-simple",
              file=sys.stderr)
        return 2
    report = compare(args.llama_build, args.model, args.spec, args.draft_model if args.spec == "draft" else None,
                     PROMPTS + [EDIT_PROMPT], args.max_new, args.draft_n, args.backend,
                     say=lambda msg: print(msg, file=sys.stderr))
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for name, t in report["totals"].items():
            print(f"{name:28} drafted {t['drafted']:4d}, kept {t['accepted']:4d}: acceptance {t['acceptance']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
