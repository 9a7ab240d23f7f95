"""The commands that run a model over prompts: `logits`, `generate`, `batch`, `serve` (__main__.py parses, this runs).

Each command goes the same way, so a mistake costs no model load:

    1. check every flag that needs no model (sampling, draft lengths, the drafter's own flags: drafters.check_flags),
       read the prompt (prompts.py), and name the flags the chosen --spec ignores
    2. load the model (the shipped one without --model, as the demo runs it) and its tokenizer
    3. build the drafter from its registry entry (drafters.drafter_from_flags) and run
    4. print the output on stdout and the summary on stderr (report.py words it)

A ValueError anywhere is the user's mistake: __main__.main prints it as one line and exits 2.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import replace

import numpy as np

from .drafters import DRAFTERS, check_flags, drafter_from_flags, shipped_flags
from .prompts import check_prompt_args, prompt_tokens, read_prompts, too_long

BATCH_DRAFT_N = 3  # batch and serve --draft-n's default: the same k for every slot every step
SERVE_CTX = 8192  # serve's default context per request (at most the model's): the KV pool holds --slots of them


def open_model(path: str, backend: str | None = None):
    """The model at `path` on `backend` and its tokenizer, loading progress on stderr."""
    from .backends import first_run_compiles, load_model
    from .tokenizer import Tokenizer

    def progress(done: int, total: int) -> None:
        if sys.stderr.isatty() or done == total:
            end = "\n" if done == total else ""
            print(f"\rloading {path}: {done}/{total} tensors", end=end, file=sys.stderr, flush=True)

    model = load_model(path, backend, progress)
    if first_run_compiles(model.backend):
        print("note: first run of the cpu backend here: Numba compiles its kernels as they are first used "
              "(about a minute, once; cached on disk after)", file=sys.stderr)
    return model, Tokenizer.from_gguf(model.metadata)


def shipped_model_default(args) -> None:
    """No --model: the model tinyspec ships (as the demo runs it), and for the chosen --spec its flags' shipped
    values (--spec draft: the shipped draft model unless --draft-model names one)."""
    if args.model is None:
        from .assets import TARGET

        args.model = str(TARGET)
        if hasattr(args, "spec"):
            shipped_flags(args)


def drafting_args(args) -> list[str]:
    """The flags of --spec and its drafter, checked before a model loads -> the drafter flags it ignores."""
    from .drafting import check_draft_length

    shipped_model_default(args)
    if args.draft_n is not None:
        check_draft_length(args.draft_n, "--draft-n")
    return check_flags(args)


def decoding_args(args):
    """The flags generate and batch share, checked before a model loads -> (their SamplingParams, the drafter
    flags --spec ignores)."""
    from .sampling import SamplingParams

    if not args.temperature >= 0 or args.temperature == float("inf"):
        raise ValueError(f"--temperature must be a finite number >= 0 (0: greedy), got {args.temperature}")
    if args.top_k < 0:
        raise ValueError(f"--top-k must be >= 0 (0: off), got {args.top_k}")
    if not 0 < args.top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1] (1: off), got {args.top_p}")
    if args.max_new < 0:
        raise ValueError(f"--max-new must be >= 0, got {args.max_new}")
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    return SamplingParams(args.temperature, args.top_k, args.top_p), drafting_args(args)


def note_ignored(args, given_unused: list[tuple[str, bool]], ignored: list[str], also: str = "") -> None:
    """One note on stderr naming the flags given that this run does not read (the command's own that are
    given_unused, and the drafter flags --spec ignores)."""
    if names := [flag for flag, unused in given_unused if unused] + ignored:
        print(f"tinyspec {args.command}: note: {', '.join(names)} ignored with --spec {args.spec}{also}",
              file=sys.stderr)


def run_logits(args) -> int:
    """logits: the model's logits and hidden rows (and the MTP head's logits) over a prompt, to an .npz."""
    from pathlib import Path

    from .mtp import MTPHead, shift_hidden

    path = Path(args.out)  # np.savez appends .npz to a name without it: say so up front, and refuse a folder
    if path.is_dir() or args.out.endswith(("/", "\\")):
        raise ValueError(f"--out {args.out}: is a folder; give a file name such as {path / 'logits.npz'}")
    out_path = str(path if path.suffix == ".npz" else path.with_name(path.name + ".npz"))
    if not path.parent.is_dir():  # said before the model loads, not after the pass
        raise ValueError(f"cannot write {out_path}: no folder {path.parent}")
    shipped_model_default(args)
    check_prompt_args(args)
    model, tokenizer = open_model(args.model, args.backend)
    tokens = prompt_tokens(args, tokenizer, model.cfg.n_ctx)
    logits, hidden = model.forward(np.array(tokens), model.new_state())
    out = {"tokens": np.array(tokens, np.int64), "logits": logits, "hidden": hidden}
    if model.cfg.n_nextn:
        head = MTPHead(model)
        out["mtp_logits"], _ = head.forward(np.array(tokens), shift_hidden(hidden), head.new_cache())
    try:
        np.savez(out_path, **out)
    except OSError as e:  # (main's error_text would call it "cannot read")
        raise ValueError(f"cannot write {out_path}: {e.strerror or e}") from None
    print(f"wrote {out_path}: " + ", ".join(f"{k} {list(v.shape)}" for k, v in out.items()))
    return 0


def run_generate(args) -> int:
    """generate: one prompt, plain or speculative; the text (streamed on a terminal), then a summary on stderr."""
    from .drafting import check_draft_length
    from .generate import generate, warm_up
    from .report import mark_style, marks_legend, render_marked, run_summary
    from .textstream import StreamPrinter, text_ids

    params, ignored = decoding_args(args)
    if args.draft_max is not None:
        check_draft_length(args.draft_max, "--draft-max", low=1)
    check_prompt_args(args)
    spec = args.spec != "none"
    note_ignored(args, [("--draft-n", args.draft_n is not None and not spec),
                        ("--draft-max", args.draft_max is not None and (not spec or args.draft_n is not None)),
                        ("--show", args.show and (not spec or args.json))], ignored,
                 " and --json" if args.json and args.show else "")
    adaptive = args.draft_n is None  # default: choose k per step, up to --draft-max
    draft_n = args.draft_n if not adaptive else args.draft_max or (DRAFTERS[args.spec].k_max if spec else 0)
    model, tokenizer = open_model(args.model, args.backend)
    tokens = prompt_tokens(args, tokenizer, model.cfg.n_ctx)
    stream = not args.json and (args.stream if args.stream is not None else sys.stdout.isatty())
    printer = StreamPrinter(tokenizer, tokenizer.eog_ids) if stream else None
    drafter = drafter_from_flags(args, model, tokenizer)
    policy = None
    if adaptive and drafter is not None:
        from .fast.adaptive import AdaptiveDraftLength

        policy = AdaptiveDraftLength.for_drafter(drafter, draft_n, model)
    warmup_s = warm_up(model, drafter)  # kernels loaded before the run, so its prefill and tok/s are the run's own
    result = generate(model, tokens, args.max_new, params, np.random.default_rng(args.seed), stop_ids=tokenizer.eog_ids,
                      drafter=drafter, draft_n=None if adaptive else draft_n, policy=policy, on_emit=printer)
    shown = text_ids(result.tokens, tokenizer.eog_ids)  # the end-of-generation token's text left out
    text = tokenizer.decode(shown)
    if args.json:
        print(json.dumps({"prompt_tokens": result.prompt_tokens, "tokens": result.tokens, "text": text,
                          "stats": result.stats | {"warmup_ms": 1000 * warmup_s}}))
        return 0
    if printer is not None:
        printer.close()
    else:
        print(text)
    if args.show and drafter is not None and result.marks:  # the same text again, marked by how each token was made
        style = mark_style(sys.stdout)
        print("\n--- the same output, marked: " + marks_legend(style))
        print(render_marked(tokenizer, shown, result.marks, style))
    print(run_summary(result.stats), file=sys.stderr)
    return 0


def batch_policy(args, k: int | None):
    """--adaptive: one k for every slot, up to k, priced by the measured cost of a pass of R rows; else None."""
    if not args.adaptive or k is None:
        return None
    from .fast.batch_draft_length import BatchDraftLength

    return BatchDraftLength(k)


def run_batch(args) -> int:
    """batch: many prompts in --slots slots; each sequence's text as it ends (in input order), then a summary."""
    from .batch import batch_generate
    from .generate import warm_up
    from .report import batch_summary
    from .scheduler import EngineOptions, blocks_per_run, check_prompt
    from .textstream import text_ids

    options = EngineOptions(slots=args.slots, chunk=args.chunk, n_blocks=args.kv_blocks, block_size=args.block_size,
                            prefix_cache=args.prefix_cache)  # checked before the model loads
    params, ignored = decoding_args(args)
    texts = read_prompts(args.prompts)
    note_ignored(args, [("--draft-n", args.draft_n is not None and args.spec == "none"),
                        ("--adaptive", args.adaptive and args.spec == "none")], ignored)
    model, tokenizer = open_model(args.model, args.backend)
    long = [text is not None and too_long(tokenizer, text, model.cfg.n_ctx) for text, _ in texts]  # before encoding
    texts = [(None, why) if why else (text, error) for (text, error), why in zip(texts, long)]
    prompts = [tokenizer.encode(text) if text is not None else [] for text, _ in texts]
    errors = [error or check_prompt(model, p, args.max_new) for (_, error), p in zip(texts, prompts)]
    k = None if args.spec == "none" else BATCH_DRAFT_N if args.draft_n is None else args.draft_n
    drafter = drafter_from_flags(args, model, tokenizer)
    if args.kv_blocks is not None:  # a run the pool could never hold (the scheduler's own rule: scheduler.run_blocks)
        blocks = functools.cache(lambda n: blocks_per_run(model, drafter, n, args.block_size))  # (per run length)
        for i, p in enumerate(prompts):
            need = 0 if errors[i] else blocks(len(p) + args.max_new + (k or 0) + 1)
            if need > args.kv_blocks:
                errors[i] = f"it needs {need} KV blocks of {args.block_size}, --kv-blocks is {args.kv_blocks}"
    if all(errors):
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ValueError(f"no prompt can run: prompt 0: {errors[0]}{more}")
    print(f"[batch] model {args.model} ({args.backend or model.backend}), {args.slots} slots, {len(prompts)} prompts"
          f"{f' ({sum(map(bool, errors))} cannot run)' if any(errors) else ''}, --spec {args.spec}"
          f"{'' if k is None else f' k <= {k}, chosen per step' if args.adaptive else f' k = {k}'}, up to {args.max_new} new tokens each", file=sys.stderr, flush=True)
    for i, error in enumerate(errors):
        if error:
            print(f"[batch] prompt {i}: skipped: {error}", file=sys.stderr, flush=True)

    ended, shown = {}, [0]  # the sequences that ended, by index; how many are printed

    def text(seq) -> str:  # without the end-of-generation token's text (textstream.text_ids)
        return tokenizer.decode(text_ids(seq.tokens, tokenizer.eog_ids))

    def show(seq) -> None:  # as sequences end, in input order: each once every earlier one has ended
        ended[seq.index] = seq
        while shown[0] < len(prompts) and (shown[0] in ended or errors[shown[0]]):
            if shown[0] in ended:
                print(f"[{shown[0]}] {text(ended.pop(shown[0]))}", flush=True)
            shown[0] += 1

    policy = batch_policy(args, k)
    warmup_s = warm_up(model, drafter, pooled=True)  # kernels loaded before the clock starts (the headline's tok/s)
    result = batch_generate(model, [[] if error else p for p, error in zip(prompts, errors)], args.max_new,
                            drafter=drafter,
                            draft_n=None if policy else k, policy=policy,
                            seeds=[args.seed + i for i in range(len(prompts))], on_finish=None if args.json else show,
                            options=replace(options, params=params, stop_ids=tuple(tokenizer.eog_ids)))
    sequences = []
    for seq, error in zip(result.sequences, errors):
        if seq.error and not error:  # the engine could not run it after all
            print(f"[batch] prompt {seq.index}: skipped: {seq.error}", file=sys.stderr)
        error = error or seq.error  # a bad JSON line's own message, not the engine's "the prompt is empty"
        sequences.append({"index": seq.index, "prompt_tokens": seq.prompt_tokens, "tokens": seq.tokens,
                          "text": text(seq), "stats": seq.stats, "error": error})
    stats = result.stats | {"sequences": len(sequences), "failed": sum(bool(s["error"]) for s in sequences),
                            "spec": args.spec, "draft_n": result.stats["k_max"], "adaptive": policy is not None,
                            "warmup_ms": 1000 * warmup_s}
    if args.json:
        print(json.dumps({"sequences": sequences, "stats": stats}))
        return 0
    for i in sorted(ended):  # after one the engine could not run after all: the rest, in order
        print(f"[{i}] {text(ended[i])}", flush=True)
    for line in batch_summary(stats, sequences):
        print(line, file=sys.stderr)
    return 0


def api_keys(args) -> tuple[str, ...]:
    """serve's accepted keys: --api-key (or TINYSPEC_API_KEY) and the lines of --api-key-file."""
    import os

    keys = [args.api_key or os.environ.get("TINYSPEC_API_KEY") or ""]
    if args.api_key_file:
        try:
            with open(args.api_key_file, encoding="utf-8") as f:
                keys += f.read().splitlines()
        except OSError as e:
            raise ValueError(f"cannot read --api-key-file {args.api_key_file}: {e.strerror}") from None
        if not any(k.strip() for k in keys):
            raise ValueError(f"--api-key-file {args.api_key_file} holds no key")
    return tuple(k.strip() for k in keys if k.strip())


def run_serve(args) -> int:
    """serve: the HTTP server (serve.py) until Ctrl-C or `kill`."""
    import signal
    from pathlib import Path

    from .drafting import FixedDraftLength
    from .generate import warm_up
    from .scheduler import EngineOptions

    try:
        from .serve import Limits, Server
    except ImportError as e:  # the serve extra is not installed
        raise ValueError(f"serve needs the serve extra ({e.name} is missing): pip install 'tinyspec[serve]'") from None

    options = EngineOptions(slots=args.slots, chunk=args.chunk, prefix_cache=args.prefix_cache)  # before the model loads
    limits = Limits(api_keys=api_keys(args), served_model_names=tuple(args.served_model_name or ()),
                    max_tokens=args.max_tokens, request_timeout_s=args.request_timeout, max_body=args.max_body,
                    max_connections=args.max_connections, max_waiting=args.max_waiting)
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535 (0: any free port), got {args.port}")
    if args.ctx is not None and args.ctx < 1:
        raise ValueError(f"--ctx must be >= 1, got {args.ctx}")
    note_ignored(args, [("--draft-n", args.draft_n is not None and args.spec == "none"),
                        ("--adaptive", args.adaptive and args.spec == "none")], drafting_args(args))
    k = None if args.spec == "none" else BATCH_DRAFT_N if args.draft_n is None else args.draft_n
    model, tokenizer = open_model(args.model, args.backend)
    policy = batch_policy(args, k)
    if policy is None and k is not None:
        policy = FixedDraftLength(k)
    ctx = min(model.cfg.n_ctx, SERVE_CTX) if args.ctx is None else args.ctx
    log = (lambda line: print(f"[serve] {line}", file=sys.stderr, flush=True)) if args.verbose else None
    drafter = drafter_from_flags(args, model, tokenizer)
    warm_up(model, drafter, pooled=True)  # kernels loaded before the port opens: the first request waits for none
    try:
        server = Server(model, tokenizer, Path(args.model).stem, options, drafter,
                        policy, args.spec, ctx, args.host, args.port, log, limits)
    except OSError as e:  # the port is taken, the address is not this machine's
        raise ValueError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    spec = "plain decoding" if k is None else f"--spec {args.spec}, k {'<= ' if args.adaptive else '= '}{k}"
    print(f"tinyspec serve: listening on {server.url} (model {server.model_name}, {args.slots} slots, {spec}, "
          f"{ctx} tokens per request{', chat template' if server.chat else ', no chat template'}"
          f"{', API key required' if limits.api_keys else ''}); Ctrl-C stops", flush=True)
    if not limits.api_keys and args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"tinyspec serve: warning: listening on {args.host} with no --api-key: anyone who can reach this "
              "address can use it", file=sys.stderr, flush=True)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C: KeyboardInterrupt, even if started with it ignored
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill` stops it as Ctrl-C does
    server.serve_forever()
    print("tinyspec serve: stopped", flush=True)
    return 0
