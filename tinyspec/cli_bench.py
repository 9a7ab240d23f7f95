"""The `bench` command: from its flags to fast/bench.py's report (or, with --serving, fast/bench_serving.py's).

Every flag is checked before the model loads. Which drafters it times comes from the registry (drafters.py):
by default every kind that drafts with the target alone (no draft model to name), plus the wing's synthetic
drafter; the MTP variants (--synth-len, --draft-vocab, --adaptive, --slots) time the MTP head by design.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from .cli_run import open_model, shipped_model_default
from .drafters import DRAFTERS, draft_vocab
from .drafting import check_draft_length
from .assets import TARGET
from .prompts import check_prompt_args, prompt_tokens


def target_alone() -> list[str]:
    """The kinds bench can time with nothing but the target (no --draft-model)."""
    return [kind.name for kind in DRAFTERS.values() if not kind.needs_draft_model]


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def run_bench(args) -> int:
    """bench: decode, verify-pass and speculative timings of one model (--serving: the serving scenario)."""
    from .fast.bench import bench, report_text

    shipped_model_default(args)
    if args.serving:
        return run_bench_serving(args)
    given = [flag for flag, value in (("--requests", args.requests), ("--prefix", args.prefix), ("--own", args.own),
                                      ("--gap", args.gap), ("--chunk", args.chunk), ("--block-size", args.block_size),
                                      ("--kv-blocks", args.kv_blocks)) if value is not None]
    if given:
        raise ValueError(f"{', '.join(given)}: the serving scenario's, only with --serving")
    args.max_new = 128 if args.max_new is None else args.max_new
    args.drafters = ",".join(target_alone() + ["synthetic"]) if args.drafters is None else args.drafters
    check_draft_length(args.draft_n, "--draft-n", low=1)
    slot_counts = parse_slot_counts(args.slots) if args.slots is not None else ()
    sizes = parse_verify_sizes(args.verify_sizes) if args.verify_sizes is not None else None
    if args.prompt_len < 1:
        raise ValueError(f"--prompt-len must be >= 1, got {args.prompt_len}")
    check_prompt_args(args, required=False)  # no prompt: random ids
    model, tokenizer = open_model(args.model, args.backend)
    model = with_graphs(model, args.graphs)
    if args.tokens is not None or args.prompt is not None:
        tokens = prompt_tokens(args, tokenizer, model.cfg.n_ctx)
    elif model.path is not None and model.path.resolve() == TARGET.resolve():  # the shipped model: the demo's
        from .demo import EDIT_PROMPT  # edit prompt, real text, so the acceptance bench reports is the demo's

        tokens = tokenizer.encode(EDIT_PROMPT)
    else:  # random ids (a synth file's random weights read no text): the timings do not depend on what they say
        if args.prompt_len + max(args.max_new, args.decode_n, 8) > model.cfg.n_ctx:
            raise ValueError(f"--prompt-len {args.prompt_len} leaves no room for the timed tokens in the model's "
                             f"context length {model.cfg.n_ctx}")
        tokens = [int(t) for t in np.random.default_rng(0).integers(0, model.cfg.n_vocab, args.prompt_len)]
    drafters = tuple(d for d in args.drafters.split(",") if d)
    choices = target_alone() + ["synthetic"]
    if bad := [d for d in drafters if d not in choices]:
        raise ValueError(f"--drafters: unknown {', '.join(bad)} (choose from {', '.join(choices)})")
    if not 0 <= args.synth_acceptance <= 1:
        raise ValueError(f"--synth-acceptance must be in [0, 1], got {args.synth_acceptance}")
    if args.draft_n < 1 or args.max_new < 1 or args.repeats < 1 or args.decode_n < 1 or args.spec_repeats < 1:
        raise ValueError("--draft-n, --max-new, --repeats, --spec-repeats and --decode-n must be >= 1")
    if args.tree is not None and not 1 <= args.tree <= 8:
        raise ValueError(f"--tree must be in 1..8, got {args.tree}")
    if args.profile_steps is not None and args.profile_steps < 0:
        raise ValueError(f"--profile-steps must be >= 0 (0: no step profile), got {args.profile_steps}")
    if args.synth_len is not None and not 1 <= args.synth_len <= args.draft_n + 1:
        raise ValueError(f"--synth-len must be in 1..{args.draft_n + 1} (tokens per step with --draft-n "
                         f"{args.draft_n}), got {args.synth_len}")
    if slot_counts and not model.cfg.n_nextn:
        raise ValueError("--slots times batched MTP drafting: this model has no MTP head")
    if (args.synth_len is not None or args.adaptive or args.draft_vocab) and not model.cfg.n_nextn:
        raise ValueError("--synth-len, --adaptive and --draft-vocab time MTP drafting: this model has no MTP head")
    if args.draft_vocab is not None and args.draft_vocab < 1:
        raise ValueError(f"--draft-vocab must be >= 1, got {args.draft_vocab}")
    if args.synth_len is not None or args.adaptive or args.draft_vocab:
        drafters = tuple(dict.fromkeys(drafters + ("mtp",)))
    if args.rollback is not None:  # the same weights with the other ring
        from dataclasses import replace

        model = model.with_placement(replace(model.placement, rollback=args.rollback))
    slots_policy = None
    if slot_counts and args.adaptive:  # the batch-aware draft length, a third run at every B
        from .fast.batch_draft_length import BatchDraftLength

        slots_policy = lambda B: BatchDraftLength(args.draft_n)  # noqa: E731
    report = bench(model, tokens, decode_n=args.decode_n, sizes=sizes, repeats=args.repeats, max_new=args.max_new,
                   draft_n=args.draft_n, synth_acceptance=args.synth_acceptance, drafters=drafters,
                   synth_len=args.synth_len, draft_vocab=draft_vocab(args, model), adaptive=args.adaptive,
                   spec_repeats=args.spec_repeats, slot_counts=slot_counts, slots_policy=slots_policy,
                   profile_steps=args.profile_steps, tree=args.tree, say=say)
    print(json.dumps(report) if args.json else report_text(report))
    return 0


def run_bench_serving(args) -> int:
    """bench --serving: requests sharing a prefix arrive over time, served with and without the prefix cache and
    chunked prefill (fast/bench_serving.py); prints its report."""
    from .fast.bench_serving import Scenario, serving, serving_text

    ignored = [flag for flag, given in (("--prompt/--prompt-file/--tokens", args.prompt is not None or
                                         args.prompt_file is not None or args.tokens is not None),
                                        ("--synth-len", args.synth_len is not None), ("--adaptive", args.adaptive),
                                        ("--draft-vocab", args.draft_vocab is not None),
                                        ("--rollback", args.rollback is not None)) if given]
    if ignored:
        print(f"tinyspec bench: note: {', '.join(ignored)} ignored with --serving", file=sys.stderr)
    drafters = [d for d in (args.drafters or "").split(",") if d]
    if len(drafters) > 1 or drafters and drafters[0] not in target_alone():
        raise ValueError(f"--serving decodes plainly or with one drafter: "
                         f"{' or '.join('--spec ' + name for name in target_alone())}, got {args.drafters!r}")
    check_draft_length(args.draft_n, "--draft-n", low=1)
    try:
        slots = 4 if args.slots is None else int(args.slots)
    except ValueError:
        raise ValueError(f"--serving: --slots is the engine's slot count, one number, got {args.slots!r}") from None
    if args.spec_repeats < 1:
        raise ValueError(f"--spec-repeats must be >= 1, got {args.spec_repeats}")
    defaults = Scenario()
    sc = Scenario(requests=defaults.requests if args.requests is None else args.requests,
                  prefix=defaults.prefix if args.prefix is None else args.prefix,
                  own=defaults.own if args.own is None else args.own,
                  max_new=defaults.max_new if args.max_new is None else args.max_new,
                  gap=defaults.gap if args.gap is None else args.gap, slots=slots,
                  chunk=defaults.chunk if args.chunk is None else args.chunk,
                  block_size=defaults.block_size if args.block_size is None else args.block_size,
                  kv_blocks=args.kv_blocks, drafter=drafters[0] if drafters else None, draft_n=args.draft_n)
    sc.check(n_ctx=sys.maxsize)  # the flags, before a long load; the context after it
    model = with_graphs(open_model(args.model, args.backend)[0], args.graphs)
    if sc.drafter and (why := DRAFTERS[sc.drafter].unavailable(model)):
        raise ValueError(f"--spec {sc.drafter}: {why}")
    report = serving(model, sc, args.spec_repeats, say=say)
    print(json.dumps(report) if args.json else serving_text(report))
    return 0


def with_graphs(model, graphs: str):
    """bench --graphs: "on" keeps the model as loaded; "off" gives the cuda backend's placement with every launch plain
    (no CUDA graph captured), to measure what the graphs save. Only the cuda backend captures any."""
    if graphs == "on":
        return model
    if model.backend != "cuda":
        raise ValueError("--graphs off: only the cuda backend captures CUDA graphs")
    from .backends import cuda_placement

    return model.with_placement(cuda_placement(graphs=False))


def parse_slot_counts(text: str) -> tuple[int, ...]:
    """bench --slots 1,2,4,8 -> (1, 2, 4, 8): distinct counts >= 1, in the order given."""
    try:
        counts = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise ValueError(f"--slots must be comma-separated slot counts such as 1,2,4,8, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise ValueError(f"--slots: slot counts must be >= 1, got {text!r}")
    return tuple(dict.fromkeys(counts))


def parse_verify_sizes(text: str) -> tuple[int, ...]:
    """bench --verify-sizes 1..9 or 1,2,4,8 -> (1, ..., 9) or (1, 2, 4, 8): distinct sizes >= 1, sorted, starting at
    1 (every verify_cost_ratio is a pass's time over the one-token pass's)."""
    lo, dots, hi = text.replace(" ", "").partition("..")
    try:
        sizes = list(range(int(lo), int(hi) + 1)) if dots else [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise ValueError(f"--verify-sizes must be 1..9 or comma-separated sizes such as 1,2,4,8, got {text!r}") from None
    sizes = sorted(set(sizes))
    if not sizes or sizes[0] != 1:
        raise ValueError(f"--verify-sizes: sizes must be >= 1 and include 1 (the pass the others are a ratio of), "
                         f"got {text!r}")
    return tuple(sizes)
