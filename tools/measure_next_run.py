"""What a next training run needs from the last one: the residual's size and error, and whether AdamW's moments matter.

    python tools/measure_next_run.py residual --threads 1       # at the shipped shapes (tinyspec/assets)
    python tools/measure_next_run.py moments --threads 1        # going on with and without them (CPU, ~15 min)

residual  The shipped target and draft (the gpu preset's shapes) are loaded with train_tiny.init_from_gguf, moved off
          the Q8_0 grid by a few AdamW steps on random tokens (as any training step moves every weight by about
          the learning rate), exported as train_tiny does (Q8_0 + tiny-NAME.residual.gguf), and loaded back with and
          without the residual (and with one written unscaled, scale=1.0): the files' sizes and each way's largest
          error against the float weights.
moments   A small model (MOMENTS_RECIPE: 0.76 M parameters with its MTP block, the smoke preset's 512-token BPE on
          the standard library; 100 k held-out tokens) trains CUT steps; its checkpoint then goes on for up to
          max(AFTER) steps of the same schedule from starts that differ only in what came back from the last run:
              ckpt                  the float weights and AdamW's moments (a resume from ckpt.pt)
              fresh moments         the float weights, AdamW's moments and step count started over
              rebuilt (20 passes)   the same, then train_tiny's moment_passes = 20 (gradient passes at lr 0)
              q8_0 + residual, ...  the exported Q8_0 file + its residual (train_tiny --init), rebuilt
              q8_0 alone, fresh     the Q8_0 file alone (--init before the residual), fresh moments
          each of the first three with three batch seeds after the cut (SEEDS: how far equally good runs drift
          apart), and prints the held-out loss (train_tiny.evaluate, WINDOWS windows) after each of AFTER steps.
          The learning rate stays the schedule's (about 1.5e-3 at the cut, no warm-up again): the harshest case
          for fresh moments, whose first steps AdamW's bias correction makes about lr per weight.
Figures and the machine: docs/performance-log.md, 2026-11-28 "what a next training run needs".
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

import train_tiny as tt
from gguf_residual import residual_path, write_residual

from tinyspec.convert import convert

MOMENTS_RECIPE = tt.Recipe(tt.Arch(hidden=128, ffn=256, layers=4, heads=2, head_dim=32, gdn_dim=16, interval=2),
                           steps=400, batch=8, seq=128, lr=2e-3, warmup=20)
CUT, AFTER, SEEDS, WINDOWS = 150, (0, 5, 10, 20, 40, 80, 160), (0, 1, 2), 256


def weights(torch, model, mtp) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()} | (
        {f"mtp.{k}": v.detach().cpu().numpy().copy() for k, v in mtp.state_dict().items()} if mtp is not None else {})


def residual(args) -> dict:
    import torch

    out, results = Path(tempfile.mkdtemp(prefix="next-run-")), {}
    tok = out / "tokenizer"  # convert wants a tokenizer.json; one BPE token is enough for the weights' files
    tok.mkdir()
    (tok / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}))
    (tok / "tokenizer_config.json").write_text("{}")
    for name in ("target", "draft"):
        recipe, shipped = tt.PRESETS["gpu"][name], REPO / "tinyspec" / "assets" / f"tiny-{name}.gguf"
        vocab = tt.PRESETS["gpu"]["vocab"]
        torch.manual_seed(0)
        model, mtp = tt.build(torch, recipe.arch, vocab, vocab - 1)
        tt.init_from_gguf(torch, model, mtp, shipped)
        params = list(model.parameters()) + (list(mtp.parameters()) if mtp is not None else [])
        opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
        rng = np.random.default_rng(0)
        for _ in range(args.steps):  # off the Q8_0 grid, as training leaves every weight
            batch = torch.from_numpy(rng.integers(0, vocab, size=(2, 66)))
            opt.zero_grad()
            tt.losses(torch, model, mtp, batch, replace(recipe, seq=64))[0].backward()
            opt.step()
        exact = weights(torch, model, mtp)
        tt.export_hf(torch, model, mtp, out / name / "hf", tok)
        main = out / f"tiny-{name}.gguf"
        tt.to_gguf(out / name / "hf", main, "q8_0", {})
        row = {"main_MB": main.stat().st_size / 1e6, "residual_MB": residual_path(main).stat().st_size / 1e6,
               "shipped_MB": shipped.stat().st_size / 1e6}
        convert(out / name / "hf", out / "f32.gguf", "f32")  # the residual unscaled: fp16-subnormal block scales
        unscaled = out / "unscaled.residual.gguf"
        write_residual(main, out / "f32.gguf", unscaled, scale=1.0)
        for label, res in (("q8_0", None), ("residual", residual_path(main)), ("unscaled", unscaled)):
            torch.manual_seed(1)
            fresh, fresh_mtp = tt.build(torch, recipe.arch, vocab, vocab - 1)
            tt.init_from_gguf(torch, fresh, fresh_mtp, main, res)
            got = weights(torch, fresh, fresh_mtp)
            row[f"{label}_max_err"] = max(float(np.abs(got[k] - w).max()) for k, w in exact.items())
            row[f"{label}_max_err_over_max_w"] = max(float(np.abs(got[k] - w).max() / np.abs(w).max())
                                                     for k, w in exact.items() if w.ndim == 2)
        results[name] = row
        print(name, json.dumps({k: round(v, 9) for k, v in row.items()}), flush=True)
    shutil.rmtree(out)
    return results


def moments(args) -> dict:
    import torch

    work = Path(args.work or tempfile.mkdtemp(prefix="next-run-"))
    base = work / "base"
    tt.main(["corpus", "--preset", "smoke", "--out", str(base), "--threads", "1"])  # the standard library
    torch.set_num_threads(args.threads)  # main() set its own
    z = np.load(base / "tokens.npz")
    train_ids, held_ids = z["train"], z["held"]
    vocab, eot = tt.PRESETS["smoke"]["vocab"], tt.PRESETS["smoke"]["vocab"] - 1
    recipe = MOMENTS_RECIPE

    def run(out: Path, n: int, seed: int, passes: int) -> None:  # n more steps from out/target/ckpt.pt
        tt.train("target", recipe, vocab, eot, train_ids, held_ids, out, seed, "cpu", 10**9, stop_after=n,
                 moment_passes=passes)

    def held_out(out: Path) -> float:
        state = torch.load(out / "target" / "ckpt.pt", weights_only=False)
        model, mtp = tt.build(torch, recipe.arch, vocab, eot)
        model.load_state_dict(state["model"])
        mtp.load_state_dict(state["mtp"])
        return tt.evaluate(torch, model, mtp, held_ids, recipe, n=WINDOWS)["loss"]

    if not (base / "target" / "ckpt.pt").exists():
        run(base, CUT, 0, 0)
    # the checkpoint's Q8_0 file and residual, exported as train_tiny exports (export_now: no further step)
    for part in ("target", "tokenizer"):
        shutil.copytree(base / part, work / "export" / part, dirs_exist_ok=True)
    tt.train("target", recipe, vocab, eot, train_ids, held_ids, work / "export", 0, "cpu", 10**9, export_now=True)
    main = work / "export" / "tiny-target.gguf"
    tt.to_gguf(work / "export" / "target" / "hf", main, "q8_0", {})
    state = torch.load(base / "target" / "ckpt.pt", weights_only=False)
    fresh = state | {"opt": state["opt"] | {"state": {}}}  # AdamW without moments: they start over
    from_file = {}
    for label, res in (("residual", residual_path(main)), ("q8_0", None)):
        torch.manual_seed(1)
        model, mtp = tt.build(torch, recipe.arch, vocab, eot)
        tt.init_from_gguf(torch, model, mtp, main, res)
        from_file[label] = fresh | {"model": model.state_dict(), "mtp": mtp.state_dict()}
    starts = {  # label -> (checkpoint to go on from, moment passes, batch seeds after the cut)
        "ckpt": (state, 0, SEEDS), "fresh moments": (fresh, 0, SEEDS), "rebuilt (20 passes)": (fresh, 20, SEEDS),
        "q8_0 + residual, rebuilt (20)": (from_file["residual"], 20, SEEDS[:1]),
        "q8_0 alone, fresh moments": (from_file["q8_0"], 0, SEEDS[:1])}
    table = {}
    for label, (start, passes, seeds) in starts.items():
        for seed in seeds:
            out = work / "runs" / f"{label}-{seed}".replace(" ", "_")
            shutil.rmtree(out, ignore_errors=True)
            (out / "target").mkdir(parents=True)
            torch.save(start | {"seed": seed}, out / "target" / "ckpt.pt")  # other seeds: other batches from CUT on
            row, done = [], 0
            for n in AFTER:
                if n > done:
                    run(out, n - done, seed, passes if done == 0 else 0)
                    done = n
                row.append(round(float(held_out(out)), 4))
            table[f"{label}, seed {seed}"] = row
            print(f"{label + f', seed {seed}':<40}", " ".join(f"{x:.4f}" for x in row), flush=True)
    print(json.dumps({"cut": CUT, "after": AFTER, "windows": WINDOWS, "held_out": table}))
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["residual", "moments"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5, help="residual: AdamW steps off the grid")
    ap.add_argument("--lr", type=float, default=1.5e-4, help="residual: their learning rate (the copy phase's)")
    ap.add_argument("--work", help="moments: a folder to keep the runs in (default: a new temporary folder)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    tt.keep_freed_memory()
    {"residual": residual, "moments": moments}[args.what](args)


if __name__ == "__main__":
    main()
