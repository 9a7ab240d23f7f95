"""Command line: `python -m tinyspec <command>`.

    inspect FILE.gguf [--json]                      metadata and tensor table of a GGUF file
    logits [--model FILE] --prompt TEXT --out X.npz logits / hidden / MTP logits of a prompt
    generate [--model FILE] --prompt TEXT           greedy or sampled decoding, plain or speculative (--spec)
                                                    (logits and generate: the shipped model without --model)
    batch [--model FILE] --prompts FILE [--slots N] many prompts at once in N slots, plain or speculative (--spec),
                                                    one verify pass per step for all; each prompt's tokens are
                                                    those `generate` gives it alone (--seed S: prompt i's is S + i)
    serve [--model FILE] [--slots N] [--port P]     an OpenAI-shaped HTTP server (/v1/completions, chat, models,
                                                    health, stats) over one batch engine, plain or speculative
    convert HF_DIR -o OUT.gguf [--outtype f16]      Hugging Face Qwen3.5 checkpoint -> qwen35 GGUF
    synth --shape 27b --quant q4_k_m -o OUT.gguf    random-weight qwen35 GGUF at a real Qwen3.5 shape (35b-a3b: MoE)
    bench --model FILE [--backend cpu] [--json]     decode tok/s, 1/2/4/8-token verify pass costs, bandwidth, speedups
                                                    (--slots 1,2,4,8: also many sequences at once, plain vs MTP;
                                                    --serving: requests sharing a prefix arrive over time, with and
                                                    without the prefix cache and chunked prefill)
    demo [--backend B] [--max-new N]                the demo: plain vs MTP vs lookup vs draft model on the shipped model
    (no command)                                    the same demo with its defaults

Errors are one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter


def shadowed_by_a_folder() -> str | None:
    """Why `python -m tinyspec` cannot run here: a folder named tinyspec in the working directory (a clone of the
    repository, say) is found before the installed package and imported as an empty namespace package."""
    package = sys.modules[__package__]
    if package.__spec__.origin is not None:
        return None
    where = ", ".join(str(p) for p in package.__spec__.submodule_search_locations)
    return (f"the folder {where} is imported as the package tinyspec instead of the installed one (Python looks in "
            "the working directory first): run from another folder, or from inside that folder")


if __name__ == "__main__" and (why := shadowed_by_a_folder()):
    print(f"tinyspec: error: {why}", file=sys.stderr)
    sys.exit(2)

import numpy as np  # noqa: E402  (after the check: a shadowed package has nothing more to import)

from .backends import BackendError  # noqa: E402
from .gguf import GGUFError, GGUFFile, read_gguf  # noqa: E402

LONG_ARRAY = 8  # arrays longer than this are summarised in the text view


def _short(value) -> str:
    """One-line text for a metadata value; long arrays show their length, type and first items."""
    if isinstance(value, np.ndarray):
        items = value.tolist()
        kind = str(value.dtype)
    elif isinstance(value, list):
        items, kind = value, "items"
    else:
        return repr(value)
    if len(items) <= LONG_ARRAY:
        return repr(items)
    head = ", ".join(repr(x) if not isinstance(x, (list, np.ndarray)) else "[...]" for x in items[:4])
    return f"[{head}, ...] ({len(items)} {kind})"


def _jsonable(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list):
        return [_jsonable(x) for x in value]
    return value


def inspect_json(g: GGUFFile) -> dict:
    return {
        "metadata": {k: _jsonable(v) for k, v in g.metadata.items()},
        "tensors": [
            {"name": t.name, "type": t.ggml_type.name, "shape": list(t.shape), "offset": t.offset, "nbytes": t.nbytes}
            for t in g.tensors.values()
        ],
    }


def inspect_text(g: GGUFFile) -> str:
    lines = [
        f"{g.path}: GGUF v{g.version}, {g.file_size:,} bytes, alignment {g.alignment}, "
        f"{len(g.fields)} metadata keys, {len(g.tensors)} tensors",
        "",
        "metadata:",
    ]
    width = max((len(k) for k in g.metadata), default=0)
    for key, value in g.metadata.items():
        field = g.fields[key]
        kind = f"{field.item_type.name}[]" if field.item_type is not None else field.type.name
        lines.append(f"  {key:<{width}}  {kind:<9} {_short(value)}")
    lines += ["", "tensors:"]
    rows = [("name", "type", "shape", "offset", "bytes")]
    rows += [(t.name, t.ggml_type.name, "x".join(map(str, t.shape)), f"{t.offset:,}", f"{t.nbytes:,}") for t in g.tensors.values()]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        lines.append(f"  {r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]:>{widths[3]}}  {r[4]:>{widths[4]}}")
    counts = Counter(t.ggml_type.name for t in g.tensors.values())
    total = sum(t.nbytes for t in g.tensors.values())
    lines += ["", "types: " + ", ".join(f"{n} x{c}" for n, c in counts.most_common()) + f"; tensor data {total:,} bytes"]
    return "\n".join(lines)


def cmd_inspect(args) -> int:
    with read_gguf(args.file) as g:
        if args.json:
            json.dump(inspect_json(g), sys.stdout)
            sys.stdout.write("\n")
        else:
            print(inspect_text(g))
    return 0


def parse_token_list(text: str) -> list[int]:
    try:
        tokens = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise ValueError(f"--tokens must be comma-separated integers, got {text!r}") from None
    if not tokens:
        raise ValueError("--tokens is empty: give at least one token id")
    if bad := [t for t in tokens if not 0 <= t < 2**31]:
        raise ValueError(f"--tokens: ids must be in 0..2^31-1 (and below the model's vocabulary size), got {bad[0]}")
    return tokens


def load_model(path: str, backend: str | None = None):
    from .backends import first_run_compiles, load_model as load
    from .tokenizer import Tokenizer

    def progress(done: int, total: int) -> None:
        if sys.stderr.isatty() or done == total:
            end = "\n" if done == total else ""
            print(f"\rloading {path}: {done}/{total} tensors", end=end, file=sys.stderr, flush=True)

    model = load(path, backend, progress)
    if first_run_compiles(model.backend):
        print("note: first run of the cpu backend here: Numba compiles its kernels as they are first used "
              "(about half a minute, once; cached on disk after)", file=sys.stderr)
    return model, Tokenizer.from_gguf(model.metadata)


def read_prompt_file(args) -> None:
    """--prompt-file FILE: its text becomes args.prompt (for prompts longer than a command line takes)."""
    if getattr(args, "prompt_file", None) is None:
        return
    try:
        args.prompt = sys.stdin.read() if args.prompt_file == "-" else open(args.prompt_file, encoding="utf-8").read()
    except UnicodeDecodeError as e:
        raise ValueError(f"--prompt-file {args.prompt_file}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except IsADirectoryError:
        raise ValueError(f"--prompt-file {args.prompt_file}: is a folder") from None


def shipped_model_default(args, draft: bool = False) -> None:
    """generate / logits without --model run the model tinyspec ships (as the demo does), and with draft=True
    (generate --spec draft) the shipped draft model unless --draft-model names one."""
    if args.model is None:
        from .demo import DRAFT, TARGET

        args.model = str(TARGET)
        if draft and not args.draft_model:
            args.draft_model = str(DRAFT)


def check_prompt_args(args, required: bool = True) -> None:
    """Before a model loads: read --prompt-file, check --tokens, and (if required) that a prompt was given."""
    read_prompt_file(args)
    if args.tokens is not None:
        parse_token_list(args.tokens)
    elif required and not args.prompt:
        raise ValueError("the prompt is empty: give --prompt TEXT or --tokens IDS")


def prompt_tokens(args, tokenizer, n_ctx: int | None = None) -> list[int]:
    """The prompt as token ids; with n_ctx, a text that cannot fit is refused before it is encoded."""
    if args.tokens is not None:
        return parse_token_list(args.tokens)
    if not args.prompt:
        raise ValueError("the prompt is empty: give --prompt TEXT or --tokens IDS")
    if n_ctx is not None and (why := too_long(tokenizer, args.prompt, n_ctx)):
        raise ValueError(why)
    return tokenizer.encode(args.prompt)


def too_long(tokenizer, text: str, n_ctx: int) -> str | None:
    """Why `text` cannot fit a context of n_ctx tokens, told by its byte length alone (None: it may fit)."""
    fewest = tokenizer.fewest_tokens(text)
    if fewest <= n_ctx:
        return None
    return (f"the prompt is {len(text.encode('utf-8', errors='replace')):,} bytes, so at least {fewest:,} tokens "
            f"(no token is longer than {tokenizer.max_token_bytes} bytes): more than the model's context length "
            f"{n_ctx:,} (context_length in the file)")


def npz_path(out: str) -> str:
    """np.savez appends .npz to a name without it: say so up front, and refuse a folder."""
    from pathlib import Path

    path = Path(out)
    if path.is_dir() or out.endswith(("/", "\\")):
        raise ValueError(f"--out {out}: is a folder; give a file name such as {path / 'logits.npz'}")
    return str(path if path.suffix == ".npz" else path.with_name(path.name + ".npz"))


def cmd_logits(args) -> int:
    from .mtp import MTPHead, shift_hidden

    out_path = npz_path(args.out)
    shipped_model_default(args)
    check_prompt_args(args)
    model, tokenizer = load_model(args.model, args.backend)
    tokens = prompt_tokens(args, tokenizer, model.cfg.n_ctx)
    logits, hidden = model.forward(np.array(tokens), model.new_state())
    out = {"tokens": np.array(tokens, np.int64), "logits": logits, "hidden": hidden}
    if model.cfg.n_nextn:
        head = MTPHead(model)
        out["mtp_logits"], _ = head.forward(np.array(tokens), shift_hidden(hidden), head.new_cache())
    np.savez(out_path, **out)
    print(f"wrote {out_path}: " + ", ".join(f"{k} {list(v.shape)}" for k, v in out.items()))
    return 0


def draft_vocab(args, model, tokenizer=None):
    """--draft-vocab N: the N most frequent tokens (fast/draft_vocab.py), ranked by --ranking, the file's record or,
    given the tokenizer, the cached standard-library count. N = None (generate's default): AUTO_SIZE above
    AUTO_ABOVE tokens, else the whole vocabulary; 0: the whole vocabulary."""
    from .fast.draft_vocab import AUTO_ABOVE, AUTO_SIZE, DraftVocab, ranking_for

    n = args.draft_vocab
    if n is None and tokenizer is not None and model.cfg.n_vocab > AUTO_ABOVE:
        n = AUTO_SIZE
    if not n:
        return None
    if n >= model.cfg.n_vocab:
        print(f"tinyspec: note: --draft-vocab {n} covers the whole vocabulary of {model.cfg.n_vocab} tokens: "
              "drafting over all of it", file=sys.stderr)
        return None
    ranking = ranking_for(model, args.ranking, tokenizer, progress=lambda msg: print(msg, file=sys.stderr))
    return DraftVocab(ranking, n, model.cfg.n_vocab)


def make_drafter(args, model, tokenizer=None):
    """--spec's drafter for one sequence (drafters.py; a batch's other slots get another() of it), or None."""
    from .backends import load_model as load
    from .drafters import DRAFTERS, DraftOptions, build_drafter

    kind = DRAFTERS.get(args.spec)
    if kind is None:
        return None
    if kind.needs_draft_model and not args.draft_model:
        raise ValueError(f"--spec {kind.name} needs --draft-model FILE (a small qwen35 GGUF with the same vocabulary)")
    draft_model = load(args.draft_model, model.backend) if kind.needs_draft_model else None
    vocab = draft_vocab(args, model, tokenizer) if kind.uses_vocab else None
    return build_drafter(kind.name, model, DraftOptions(draft_model, vocab, args.draft_p_min))


class StreamPrinter:
    """on_emit for generate(): writes tokens to stdout as they are decided, through an incremental UTF-8 decoder
    (a character may end in the next token), so the stream equals the final text."""

    def __init__(self, tokenizer):
        import codecs

        self.tokenizer = tokenizer
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, tokens: list[int], marks: list[str]) -> None:
        sys.stdout.write(self.utf8.decode(self.tokenizer.decode_bytes(tokens)))
        sys.stdout.flush()

    def close(self) -> None:
        sys.stdout.write(self.utf8.decode(b"", final=True) + "\n")
        sys.stdout.flush()


def decoding_args(args):
    """The flags generate and batch share, checked before a model loads (the shipped model when --model is
    absent) -> their SamplingParams."""
    from .sampling import SamplingParams
    from .drafting import check_draft_length

    shipped_model_default(args, draft=args.spec == "draft")
    if not args.temperature >= 0 or args.temperature == float("inf"):
        raise ValueError(f"--temperature must be a finite number >= 0 (0: greedy), got {args.temperature}")
    if args.top_k < 0:
        raise ValueError(f"--top-k must be >= 0 (0: off), got {args.top_k}")
    if not 0 < args.top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1] (1: off), got {args.top_p}")
    params = SamplingParams(args.temperature, args.top_k, args.top_p)
    if args.max_new < 0:
        raise ValueError(f"--max-new must be >= 0, got {args.max_new}")
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    if args.draft_n is not None:
        check_draft_length(args.draft_n, "--draft-n")
    if args.draft_vocab is not None and args.draft_vocab < 0:
        raise ValueError(f"--draft-vocab must be >= 0 (0: the whole vocabulary), got {args.draft_vocab}")
    if args.spec == "draft" and not args.draft_model:
        raise ValueError("--spec draft needs --draft-model FILE (a small qwen35 GGUF with the same vocabulary)")
    return params


def cmd_generate(args) -> int:
    from .drafters import DRAFTERS
    from .generate import generate
    from .drafting import check_draft_length

    params = decoding_args(args)
    if args.draft_max is not None:
        check_draft_length(args.draft_max, "--draft-max", low=1)
    if not 0 <= args.draft_p_min <= 1:
        raise ValueError(f"--draft-p-min must be in [0, 1], got {args.draft_p_min}")
    if args.draft_p_min and args.spec != "mtp":
        raise ValueError(f"--draft-p-min needs --spec mtp (got --spec {args.spec})")
    check_prompt_args(args)
    ignored = [flag for flag, given, used in (
        ("--draft-n", args.draft_n is not None, args.spec != "none"),
        ("--draft-max", args.draft_max is not None, args.spec != "none" and args.draft_n is None),
        ("--draft-model", args.draft_model, args.spec == "draft"),
        ("--draft-vocab", args.draft_vocab is not None, args.spec in ("mtp", "draft")),
        ("--ranking", args.ranking, args.spec in ("mtp", "draft")),
        ("--show", args.show, args.spec != "none" and not args.json)) if given and not used]
    if ignored:
        print(f"tinyspec generate: note: {', '.join(ignored)} ignored with --spec {args.spec}"
              f"{' and --json' if args.json and args.show else ''}", file=sys.stderr)
    adaptive = args.draft_n is None  # default: choose k per step, up to --draft-max
    draft_n = args.draft_n if not adaptive else args.draft_max or (DRAFTERS[args.spec].k_max if args.spec in DRAFTERS else 0)
    model, tokenizer = load_model(args.model, args.backend)
    tokens = prompt_tokens(args, tokenizer, model.cfg.n_ctx)
    stream = not args.json and (args.stream if args.stream is not None else sys.stdout.isatty())
    printer = StreamPrinter(tokenizer) if stream else None
    drafter = make_drafter(args, model, tokenizer)
    policy = None
    if adaptive and drafter is not None:
        from .fast.adaptive import AdaptiveDraftLength

        policy = AdaptiveDraftLength.for_drafter(drafter, draft_n, model)
    result = generate(model, tokens, args.max_new, params, np.random.default_rng(args.seed), stop_ids=tokenizer.eog_ids,
                      drafter=drafter, draft_n=None if adaptive else draft_n, policy=policy, on_emit=printer)
    text = tokenizer.decode(result.tokens)
    if args.json:
        print(json.dumps({"prompt_tokens": result.prompt_tokens, "tokens": result.tokens, "text": text,
                          "stats": result.stats}))
        return 0
    from .generate import marks_legend, render_marked, wants_colour

    if printer is not None:
        printer.close()
    else:
        print(text)
    if args.show and drafter is not None and result.marks:  # the same text again, marked by how each token was made
        colour = wants_colour(sys.stdout)
        print("\n--- the same output, marked: " + marks_legend(colour))
        print(render_marked(tokenizer, result.tokens, result.marks, colour))
    s = result.stats
    if "steps" in s:  # speculative
        chosen = s.get("adaptive", {}).get("chosen_k", {})  # the most drafts the policy allowed, per step
        ks = ", steps by the drafts allowed " + " ".join(f"{k}:{n}" for k, n in chosen.items()) if chosen else ""
        acceptance = f"acceptance {s['acceptance_rate']:.2f}" if s["drafted"] else "no drafts made"
        plain = f" ({s['plain_steps']} of them plain: no drafts made)" if s["plain_steps"] else ""
        print(f"[{s['emitted']} tokens in {s['steps']} target passes{plain}, {s['tokens_per_s']:.1f} tok/s, {acceptance}, "
              f"{s['mean_accepted_length']:.2f} tokens/step{ks}]", file=sys.stderr)
    else:
        print(f"[{s['generated']} tokens, prefill {s['prefill_s']:.2f} s, decode {s['decode_tok_s']:.1f} tok/s]",
              file=sys.stderr)
    return 0


BATCH_DRAFT_N = 3  # batch --draft-n's default: the same k for every slot every step (drafting.FixedDraftLength)


def read_prompts(source: str) -> list[tuple[str | None, str | None]]:
    """batch --prompts FILE ('-': standard input) -> one (text, error) per prompt, in order. A line is a prompt;
    blank lines are skipped; a line starting with '{' is a JSON object whose "prompt" field is the prompt text
    (a bad one is that prompt's error, the others run). No prompt at all is an error of the whole file."""
    try:
        text = sys.stdin.read() if source == "-" else open(source, encoding="utf-8").read()
    except UnicodeDecodeError as e:
        raise ValueError(f"--prompts {source}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except IsADirectoryError:
        raise ValueError(f"--prompts {source}: is a folder") from None
    except FileNotFoundError:
        raise ValueError(f"--prompts {source}: no such file") from None
    prompts = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if not line.lstrip().startswith("{"):
            prompts.append((line, None))
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            prompts.append((None, f"line {n}: not a JSON object ({e.msg} at column {e.colno})"))
            continue
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
            prompts.append((None, f'line {n}: a JSON line needs a "prompt" field with the prompt text'))
            continue
        prompts.append((item["prompt"], None))
    if not prompts:
        raise ValueError(f"--prompts {source}: no prompts (give one per line, or JSON lines with a \"prompt\" field)")
    return prompts


def cmd_batch(args) -> int:
    from .batch import batch_generate, check_prompt

    if args.slots < 1:
        raise ValueError(f"--slots must be >= 1 (sequences decoded at once), got {args.slots}")
    if args.chunk is not None and args.chunk < 1:
        raise ValueError(f"--chunk must be >= 1 (prefill rows per pass), got {args.chunk}")
    if (args.kv_blocks is not None and args.kv_blocks < 1) or args.block_size < 1:
        raise ValueError(f"--kv-blocks and --block-size must be >= 1, got {args.kv_blocks} and {args.block_size}")
    params = decoding_args(args)
    texts = read_prompts(args.prompts)
    ignored = [flag for flag, given, used in (
        ("--draft-n", args.draft_n is not None, args.spec != "none"),
        ("--adaptive", args.adaptive, args.spec != "none"),
        ("--draft-model", args.draft_model, args.spec == "draft"),
        ("--draft-vocab", args.draft_vocab is not None, args.spec in ("mtp", "draft")),
        ("--ranking", args.ranking, args.spec in ("mtp", "draft"))) if given and not used]
    if ignored:
        print(f"tinyspec batch: note: {', '.join(ignored)} ignored with --spec {args.spec}", file=sys.stderr)
    model, tokenizer = load_model(args.model, args.backend)
    long = [text is not None and too_long(tokenizer, text, model.cfg.n_ctx) for text, _ in texts]  # before encoding
    texts = [(None, why) if why else (text, error) for (text, error), why in zip(texts, long)]
    prompts = [tokenizer.encode(text) if text is not None else [] for text, _ in texts]
    errors = [error or check_prompt(model, p, args.max_new) for (_, error), p in zip(texts, prompts)]
    if all(errors):
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ValueError(f"no prompt can run: prompt 0: {errors[0]}{more}")
    k = None if args.spec == "none" else BATCH_DRAFT_N if args.draft_n is None else args.draft_n
    print(f"[batch] model {args.model} ({args.backend or model.backend}), {args.slots} slots, {len(prompts)} prompts"
          f"{f' ({sum(map(bool, errors))} cannot run)' if any(errors) else ''}, --spec {args.spec}"
          f"{'' if k is None else f' k <= {k}, chosen per step' if args.adaptive else f' k = {k}'}, up to {args.max_new} new tokens each", file=sys.stderr, flush=True)
    for i, error in enumerate(errors):
        if error:
            print(f"[batch] prompt {i}: skipped: {error}", file=sys.stderr, flush=True)

    ended, shown = {}, [0]  # the sequences that ended, by index; how many are printed

    def show(seq) -> None:  # as sequences end, in input order: each once every earlier one has ended
        ended[seq.index] = seq
        while shown[0] < len(prompts) and (shown[0] in ended or errors[shown[0]]):
            if shown[0] in ended:
                print(f"[{shown[0]}] {tokenizer.decode(ended.pop(shown[0]).tokens)}", flush=True)
            shown[0] += 1

    policy = None
    if args.adaptive and k is not None:  # one k for every slot, priced by the measured cost of a pass of R rows
        from .fast.batch_draft_length import BatchDraftLength

        policy, k = BatchDraftLength(k), None
    result = batch_generate(model, prompts, args.max_new, slots=args.slots,
                            drafter=make_drafter(args, model, tokenizer), draft_n=k, policy=policy,
                            params=params, seeds=[args.seed + i for i in range(len(prompts))],
                            stop_ids=tokenizer.eog_ids, on_finish=None if args.json else show, chunk=args.chunk,
                            n_blocks=args.kv_blocks, block_size=args.block_size, prefix_cache=args.prefix_cache)
    sequences = []
    for seq, error in zip(result.sequences, errors):
        if seq.error and not error:  # the engine could not run it after all
            print(f"[batch] prompt {seq.index}: skipped: {seq.error}", file=sys.stderr)
        error = error or seq.error  # a bad JSON line's own message, not the engine's "the prompt is empty"
        sequences.append({"index": seq.index, "prompt_tokens": seq.prompt_tokens, "tokens": seq.tokens,
                          "text": tokenizer.decode(seq.tokens), "stats": seq.stats, "error": error})
    stats = result.stats | {"sequences": len(sequences), "failed": sum(bool(s["error"]) for s in sequences),
                            "spec": args.spec, "draft_n": result.stats["k_max"], "adaptive": policy is not None}
    if args.json:
        print(json.dumps({"sequences": sequences, "stats": stats}))
        return 0
    for i in sorted(ended):  # after one the engine could not run after all: the rest, in order
        print(f"[{i}] {tokenizer.decode(ended[i].tokens)}", flush=True)
    s = stats
    print(f"[batch] {s['generated']} tokens from {s['sequences'] - s['failed']} sequences in {s['wall_s']:.2f} s: "
          f"{s['tok_s']:.1f} tok/s ({s['decode_tok_s']:.1f} after the prefills), {s['steps']} steps, "
          f"{s['rows_per_pass']:.2f} rows per pass, KV peak {s['kv_blocks_peak']} of {s['kv_blocks']} blocks "
          f"of {s['kv_block_size']} ({s['kv_bytes_peak'] / 1e6:.2f} MB), {s['prefill_rows']} prefill rows, "
          f"{s['preemptions']} preemptions", file=sys.stderr)
    if args.prefix_cache:
        print(f"[batch] prefix cache: {s['prefix_hits']} hits, {s['prefix_tokens_reused']} prompt tokens reused, "
              f"{s['prefix_states_kept']} GDN states kept ({s['prefix_state_bytes'] / 1e6:.2f} MB)", file=sys.stderr)
    if policy is not None:
        print(f"[batch] batch-aware draft length: steps per k {s['policy']['chosen_k']}", file=sys.stderr)
    if args.spec != "none":
        for seq in sequences:
            if not seq["error"]:
                q = seq["stats"]
                acceptance = f"acceptance {q['acceptance_rate']:.2f}" if q["drafted"] else "no drafts made"
                print(f"[batch] sequence {seq['index']}: {len(seq['tokens'])} tokens, {acceptance}, "
                      f"{q['mean_accepted_length']:.2f} tokens/step", file=sys.stderr)
    return 0


def cmd_serve(args) -> int:
    import signal
    from pathlib import Path

    from .drafting import FixedDraftLength, check_draft_length
    from .serve import Server

    if args.slots < 1:
        raise ValueError(f"--slots must be >= 1 (sequences decoded at once), got {args.slots}")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535 (0: any free port), got {args.port}")
    if args.ctx is not None and args.ctx < 1:
        raise ValueError(f"--ctx must be >= 1, got {args.ctx}")
    if args.chunk < 1:
        raise ValueError(f"--chunk must be >= 1 (prefill rows per pass), got {args.chunk}")
    k = None if args.spec == "none" else BATCH_DRAFT_N if args.draft_n is None else args.draft_n
    if k is not None:
        check_draft_length(k, "--draft-n")
    if args.draft_vocab is not None and args.draft_vocab < 0:
        raise ValueError(f"--draft-vocab must be >= 0 (0: the whole vocabulary), got {args.draft_vocab}")
    shipped_model_default(args, draft=args.spec == "draft")
    model, tokenizer = load_model(args.model, args.backend)
    policy = None if k is None else FixedDraftLength(k)
    if args.adaptive and k is not None:  # one k for every slot, priced by the measured cost of a pass of R rows
        from .fast.batch_draft_length import BatchDraftLength

        policy = BatchDraftLength(k)
    ctx = min(model.cfg.n_ctx, SERVE_CTX) if args.ctx is None else args.ctx
    log = (lambda line: print(f"[serve] {line}", file=sys.stderr, flush=True)) if args.verbose else None
    try:
        server = Server(model, tokenizer, Path(args.model).stem, args.slots, make_drafter(args, model, tokenizer),
                        policy, args.spec, ctx, args.host, args.port, log, args.chunk, args.prefix_cache)
    except OSError as e:  # the port is taken, the address is not this machine's
        raise ValueError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    spec = "plain decoding" if k is None else f"--spec {args.spec}, k {'<= ' if args.adaptive else '= '}{k}"
    print(f"tinyspec serve: listening on {server.url} (model {server.model_name}, {args.slots} slots, {spec}, "
          f"{ctx} tokens per request{', chat template' if server.chat else ', no chat template'}); Ctrl-C stops",
          flush=True)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C: KeyboardInterrupt, even if started with it ignored
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill` stops it as Ctrl-C does
    server.serve_forever()
    print("tinyspec serve: stopped", flush=True)
    return 0


SERVE_CTX = 8192  # serve's default context per request (at most the model's): the KV pool holds --slots of them


def cmd_convert(args) -> int:
    from .convert import convert

    convert(args.hf_dir, args.out, args.outtype, progress=lambda msg: print(msg, file=sys.stderr), mtp=args.mtp)
    print(f"wrote {args.out}")
    return 0


def cmd_synth(args) -> int:
    from .fast.synth import synth_model

    size = synth_model(args.output, args.shape, args.quant, args.seed, args.layers,
                       progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(f"wrote {args.output} ({size / 1e9:.2f} GB)")
    return 0


def cmd_bench(args) -> int:
    from .drafters import DRAFTERS
    from .fast.bench import bench, report_text
    from .drafting import check_draft_length

    shipped_model_default(args)
    if args.serving:
        return cmd_bench_serving(args)
    given = [flag for flag, value in (("--requests", args.requests), ("--prefix", args.prefix), ("--own", args.own),
                                      ("--gap", args.gap), ("--chunk", args.chunk), ("--block-size", args.block_size),
                                      ("--kv-blocks", args.kv_blocks)) if value is not None]
    if given:
        raise ValueError(f"{', '.join(given)}: the serving scenario's, only with --serving")
    args.max_new = 128 if args.max_new is None else args.max_new
    args.drafters = "mtp,lookup,synthetic" if args.drafters is None else args.drafters
    check_draft_length(args.draft_n, "--draft-n", low=1)
    slot_counts = parse_slot_counts(args.slots) if args.slots is not None else ()
    sizes = parse_verify_sizes(args.verify_sizes) if args.verify_sizes is not None else None
    if args.prompt_len < 1:
        raise ValueError(f"--prompt-len must be >= 1, got {args.prompt_len}")
    check_prompt_args(args, required=False)  # no prompt: random ids
    model, tokenizer = load_model(args.model, args.backend)
    model = with_graphs(model, args.graphs)
    if args.tokens is not None or args.prompt is not None:
        tokens = prompt_tokens(args, tokenizer, model.cfg.n_ctx)
    else:  # random ids: the timings do not depend on what the tokens say
        if args.prompt_len + max(args.max_new, args.decode_n, 8) > model.cfg.n_ctx:
            raise ValueError(f"--prompt-len {args.prompt_len} leaves no room for the timed tokens in the model's "
                             f"context length {model.cfg.n_ctx}")
        tokens = [int(t) for t in np.random.default_rng(0).integers(0, model.cfg.n_vocab, args.prompt_len)]
    drafters = tuple(d for d in args.drafters.split(",") if d)
    choices = [k.name for k in DRAFTERS.values() if not k.needs_draft_model] + ["synthetic"]
    if bad := [d for d in drafters if d not in choices]:
        raise ValueError(f"--drafters: unknown {', '.join(bad)} (choose from {', '.join(choices)})")
    if not 0 <= args.synth_acceptance <= 1:
        raise ValueError(f"--synth-acceptance must be in [0, 1], got {args.synth_acceptance}")
    if args.draft_n < 1 or args.max_new < 1 or args.repeats < 1 or args.decode_n < 1 or args.spec_repeats < 1:
        raise ValueError("--draft-n, --max-new, --repeats, --spec-repeats and --decode-n must be >= 1")
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
                   spec_repeats=args.spec_repeats, slot_counts=slot_counts, slots_policy=slots_policy, say=lambda msg: print(f"[bench] {msg}", file=sys.stderr, flush=True))
    print(json.dumps(report) if args.json else report_text(report))
    return 0


def cmd_bench_serving(args) -> int:
    """bench --serving: requests sharing a prefix arrive over time, served with and without the prefix cache and
    chunked prefill (fast/bench_serving.py); prints its report."""
    from .drafting import check_draft_length
    from .fast.bench_serving import Scenario, serving, serving_text

    ignored = [flag for flag, given in (("--prompt/--prompt-file/--tokens", args.prompt is not None or
                                         args.prompt_file is not None or args.tokens is not None),
                                        ("--synth-len", args.synth_len is not None), ("--adaptive", args.adaptive),
                                        ("--draft-vocab", args.draft_vocab is not None),
                                        ("--rollback", args.rollback is not None)) if given]
    if ignored:
        print(f"tinyspec bench: note: {', '.join(ignored)} ignored with --serving", file=sys.stderr)
    drafters = [d for d in (args.drafters or "").split(",") if d]
    if len(drafters) > 1 or drafters and drafters[0] not in ("mtp", "lookup"):
        raise ValueError(f"--serving decodes plainly or with one drafter: --spec mtp or --spec lookup, got "
                         f"{args.drafters!r}")
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
    model = with_graphs(load_model(args.model, args.backend)[0], args.graphs)
    if sc.drafter == "mtp" and not model.cfg.n_nextn:
        raise ValueError("--spec mtp: this model has no MTP head")
    report = serving(model, sc, args.spec_repeats, say=lambda msg: print(f"[bench] {msg}", file=sys.stderr, flush=True))
    print(json.dumps(report) if args.json else serving_text(report))
    return 0


def with_graphs(model, graphs: str):
    """bench --graphs: "on" keeps the model as loaded; "off" gives the cuda backend's kernels with every launch plain
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


def add_backend_arg(p: argparse.ArgumentParser, default: str | None = None) -> None:
    from .backends import BACKENDS

    p.add_argument("--backend", choices=BACKENDS, default=default,
                   help="numpy: the oracle (weights expanded to float32); cpu: Numba kernels on the packed weights; "
                        "cuda: CuPy kernels on a GPU (default: "
                        + (default or "$TINYSPEC_BACKEND if set, else cuda if a GPU, else cpu") + ")")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="cpu backend: threads for the Numba kernels (default: NUMBA_NUM_THREADS, the cores); on a "
                        "machine busy with other work, fewer can be faster (idle threads sleep rather than spin)")


def add_prompt_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="qwen35 GGUF file (default: the model tinyspec ships, as the demo runs it)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (encoded with the file's own tokenizer)")
    src.add_argument("--prompt-file", metavar="FILE", help="prompt text read from a UTF-8 file ('-': standard input)")
    src.add_argument("--tokens", help="prompt as comma-separated token ids, e.g. 1,2,3")


def add_decoding_args(p: argparse.ArgumentParser, max_new_help: str, seed_help: str) -> None:
    """The flags generate and batch share: what to decode and how, and which drafter (drafters.py)."""
    from .drafters import spec_help, SPEC_CHOICES

    p.add_argument("--max-new", type=int, default=32, help=max_new_help)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    p.add_argument("--seed", type=int, default=0, help=seed_help)
    p.add_argument("--spec", choices=SPEC_CHOICES, default="none",
                   help=spec_help() + "; with many sequences, mtp and draft make every slot's drafts in one pass "
                                      "per draft depth")
    p.add_argument("--draft-model", help="draft model GGUF for --spec draft (same vocabulary as --model; default "
                                         "with the shipped model: the shipped draft model)")
    p.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                   help="mtp/draft: score only the N most frequent tokens when drafting (FR-Spec; output unchanged; "
                        "default: 32768 for vocabularies over 65536 tokens, else all; 0: all)")
    p.add_argument("--ranking", default=None, metavar="FILE.npy",
                   help="token ids by frequency for --draft-vocab (default: the model file's training.token_ranking, "
                        "else a count over the Python standard library's sources, computed once and cached)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tinyspec",
        description="tinyspec: speculative decoding on hybrid Gated-DeltaNet (qwen35) models, every piece readable.",
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"tinyspec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("inspect", help="show a GGUF file's metadata and tensor table",
                       description="Show a GGUF file's metadata (long arrays summarised) and its tensors "
                                   "(name, ggml type, NumPy-order shape, absolute offset, bytes).")
    p.add_argument("file", help="path to a .gguf file")
    p.add_argument("--json", action="store_true",
                   help='print {"metadata": {...}, "tensors": [{"name", "type", "shape", "offset", "nbytes"}]} '
                        "with every array in full")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("logits", help="run the model over a prompt and save logits/hidden (to compare engines)",
                       description="Run the model (by default on the NumPy oracle) over a prompt and write an .npz "
                                   "with tokens [T], logits [T,N], hidden [T,D] (post final norm) and, if the model has an MTP block, mtp_logits [T,N] "
                                   "(row p from token p and hidden p-1, a zero hidden at p = 0).")
    add_prompt_args(p)
    p.add_argument("--out", required=True, help="output .npz path")
    add_backend_arg(p, "numpy")
    p.set_defaults(func=cmd_logits)

    p = sub.add_parser("generate", help="generate text: plain or speculative (--spec mtp|lookup|draft), greedy or sampled",
                       description="Generate up to --max-new tokens after the prompt; stops at the end-of-sequence token.")
    add_prompt_args(p)
    add_decoding_args(p, max_new_help="tokens to generate (default 32)", seed_help="seed of the sampling RNG (default 0)")
    p.add_argument("--draft-n", type=int, default=None,
                   help="a fixed number of draft tokens per verify pass (default: adaptive, chosen per step for the "
                        "most tokens per second from measured acceptance and step costs, up to --draft-max)")
    p.add_argument("--draft-max", type=int, default=None,
                   help="largest draft length the adaptive choice tries (default: mtp 8, lookup 8, draft 4; mtp and draft "
                        "end a step early after a draft they are unsure of, where the next one would not pay)")
    p.add_argument("--draft-p-min", type=float, default=0.0, metavar="P",
                   help="mtp: stop drafting after a draft the head gives probability < P (llama.cpp's --spec-draft-p-min; "
                        "0, the default: draft every position the draft length allows)")
    p.add_argument("--show", action="store_true",
                   help="after the output, print it again marked by how each token was made: accepted drafts "
                        "[in brackets], corrections {in braces}, bonus tokens <in angle brackets> (in colour on a "
                        "terminal; NO_COLOR=1 turns colour off)")
    p.add_argument("--json", action="store_true",
                   help='print {"prompt_tokens", "tokens", "text", "stats"} as JSON; stats of a plain run: generated, '
                        'prefill_s, decode_s, decode_tok_s; of a speculative run (speculate.SpecStats): k_max, steps, '
                        'plain_steps, drafted, accepted, acceptance_rate, mean_accepted_length, phase_ms, tokens_per_s, '
                        'and the adaptive policy\'s choices')
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=None,
                   help="print tokens as they are decided: one at a time plain, a verify step's whole run at once "
                        "speculative (default: when the output is a terminal)")
    add_backend_arg(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("batch", help="generate for many prompts at once (slots, one verify pass per step for all)",
                       description="Generate up to --max-new tokens after each prompt of a file, up to --slots "
                                   "sequences at a time (continuous batching: a finished sequence's slot takes the "
                                   "next prompt), plain or speculative; every step makes ONE target pass over every "
                                   "active slot's rows (tinyspec/batch.py). Each prompt gets exactly the tokens it "
                                   "gets alone: greedy, those of `generate` on that prompt; sampled, prompt i (0 "
                                   "first) draws from seed S + i (--seed S), the tokens of `generate --seed S+i` with "
                                   "the same --spec and --draft-n. A prompt that cannot run (too long for the "
                                   "context, a bad JSON line) is reported and the others run; exit 2 if none can.")
    p.add_argument("--model", help="qwen35 GGUF file (default: the model tinyspec ships, as the demo runs it)")
    p.add_argument("--prompts", required=True, metavar="FILE",
                   help="one prompt per line (blank lines skipped), or JSON lines with a \"prompt\" field (a line "
                        "starting with '{'); '-': standard input")
    p.add_argument("--slots", type=int, default=4,
                   help="sequences decoded at once; the other prompts wait for a free slot, in order (default 4)")
    p.add_argument("--draft-n", type=int, default=None,
                   help=f"draft tokens per slot and verify pass, the same for every slot every step "
                        f"(0..64, default {BATCH_DRAFT_N})")
    p.add_argument("--adaptive", action="store_true",
                   help="choose one k for every slot each step, up to --draft-n, from the measured cost of a pass of "
                        "R rows (fast/batch_draft_length.py): k = 0, plain decoding, where drafting would lose as "
                        "the batch fills the pass. Greedy output is unchanged; sampled output keeps the model's law "
                        "but no longer repeats a solo run's seed")
    p.add_argument("--chunk", type=int, default=None,
                   help="prefill rows per pass at most: a joining prompt is fed this many tokens a step as rows of "
                        "the running slots' verify pass, so they wait at most this many extra rows a step (default: "
                        "each prompt whole, in one pass)")
    p.add_argument("--prefix-cache", action="store_true",
                   help="share the KV blocks of prompt prefixes already prefilled and start from a saved GDN state "
                        "(tinyspec/prefix_cache.py): a prompt that starts like an earlier one prefills only the rest")
    p.add_argument("--kv-blocks", type=int, default=None,
                   help="KV pool size in blocks of --block-size positions, the drafter's KV (mtp, draft) counted "
                        "with the target's (default: room for --slots of the longest runs); a smaller pool makes "
                        "sequences wait or be preempted (resumed by recompute)")
    p.add_argument("--block-size", type=int, default=16,
                   help="positions per KV block, the unit the pool hands out and the prefix cache shares (default 16)")
    add_decoding_args(p, max_new_help="tokens to generate per prompt at most (default 32)",
                      seed_help="sampling seed S: prompt i (0 first, blank lines not counted) uses S + i (default 0)")
    p.add_argument("--json", action="store_true",
                   help='print {"sequences": [{"index", "prompt_tokens", "tokens", "text", "stats", "error"}], '
                        '"stats": {"tok_s", "decode_tok_s", "steps", "rows_per_pass", "kv_blocks_peak", '
                        '"kv_bytes_peak", ...}} as JSON, sequences in input order (default: each sequence\'s text '
                        'as it finishes, in input order, "[index] text", then a summary on stderr)')
    add_backend_arg(p)
    p.set_defaults(func=cmd_batch, draft_p_min=0.0)

    from .drafters import SPEC_CHOICES, spec_help

    p = sub.add_parser("serve", help="an OpenAI-shaped HTTP server over one batch engine (standard library only)",
                       description="Serve the model over HTTP in the OpenAI shape, on the standard library: POST "
                                   "/v1/completions (prompt, max_tokens, temperature, top_p, top_k, seed, stop, "
                                   "stream as server-sent events), POST /v1/chat/completions when the file carries "
                                   "a chat template (rendered with jinja2), GET /v1/models, /health and /v1/stats "
                                   "(requests, tok/s, acceptance). Every request joins ONE running engine of --slots "
                                   "slots (continuous batching, one verify pass per step for all) and gets exactly "
                                   "the tokens it gets alone: greedy, those of `generate`; sampled with a seed, "
                                   "those of `generate --seed S --temperature T --top-p P --spec X --draft-n K` "
                                   "with the server's --spec and --draft-n. Each response carries its own "
                                   "speculation stats. Ctrl-C cancels what is running and exits 0. "
                                   "See docs/http-server.md.")
    p.add_argument("--model", help="qwen35 GGUF file (default: the model tinyspec ships, as the demo runs it)")
    p.add_argument("--slots", type=int, default=4,
                   help="sequences decoded at once; other requests wait for a free slot, in order (default 4)")
    p.add_argument("--spec", choices=SPEC_CHOICES, default="none", help=spec_help())
    p.add_argument("--draft-n", type=int, default=None,
                   help=f"draft tokens per slot and verify pass (0..64, default {BATCH_DRAFT_N}); a fixed k keeps "
                        "a seeded request's tokens those of `generate --draft-n K`")
    p.add_argument("--adaptive", action="store_true",
                   help="choose one k for every slot each step, up to --draft-n, from the measured cost of a pass "
                        "(as batch --adaptive): greedy output is unchanged; sampled output keeps the model's law "
                        "but no longer repeats a solo run's seed")
    p.add_argument("--draft-model", help="draft model GGUF for --spec draft (default with the shipped model: the "
                                         "shipped draft model)")
    p.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                   help="mtp/draft: score only the N most frequent tokens when drafting (output unchanged)")
    p.add_argument("--ranking", default=None, metavar="FILE.npy", help="token ids by frequency for --draft-vocab")
    p.add_argument("--ctx", type=int, default=None, metavar="N",
                   help=f"tokens per request at most, prompt and output (default: the model's context length, at "
                        f"most {SERVE_CTX}); the KV pool holds --slots of them")
    p.add_argument("--prefix-cache", action="store_true",
                   help="keep the KV blocks and GDN states of prompts seen before (tinyspec/prefix_cache.py): a prompt "
                        "that starts like an earlier one prefills only the rest; output unchanged")
    p.add_argument("--chunk", type=int, default=64, metavar="N",
                   help="a joining prompt enters the running pass N rows at a time, so running requests wait at most "
                        "N extra rows a step (default 64); output unchanged")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080; 0: any free port, printed)")
    p.add_argument("--verbose", action="store_true", help="log every HTTP request on stderr")
    add_backend_arg(p)
    p.set_defaults(func=cmd_serve, draft_p_min=0.0)

    p = sub.add_parser("convert", help="convert a Hugging Face Qwen3.5 checkpoint to a qwen35 GGUF",
                       description="Convert a Hugging Face Qwen3.5 checkpoint folder (config.json, *.safetensors, "
                                   "tokenizer.json) into a qwen35 GGUF with the tensors, storage types and metadata "
                                   "llama.cpp's convert_hf_to_gguf.py writes. Needs only NumPy. Progress goes to stderr.")
    p.add_argument("hf_dir", help="checkpoint folder (Qwen3_5ForCausalLM or Qwen3_5ForConditionalGeneration)")
    p.add_argument("-o", "--out", required=True, help="output .gguf path")
    p.add_argument("--outtype", choices=["f32", "f16", "q8_0"], default="f32",
                   help="type of the 2-D weights (default f32); norms, conv and 1-D tensors stay F32, and q8_0 "
                        "falls back to f16 for rows that are not a multiple of 32")
    p.add_argument("--mtp", choices=["include", "exclude", "only"], default="include",
                   help="the MTP (nextn) block: include it (default), exclude it (llama.cpp --no-mtp), or write "
                        "only it with token_embd/output_norm/output (llama.cpp --mtp, a draft sidecar)")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("synth", help="write a random-weight qwen35 GGUF at a real Qwen3.5 shape (for speed work)",
                       description="Write a qwen35 GGUF with random weights at the published Qwen3.5 shapes, the MTP "
                                   "block included, each tensor in the type llama-quantize picks for --quant. Random "
                                   "quantized blocks are written directly, one tensor at a time. Progress goes to stderr.")
    p.add_argument("--shape", choices=["0.8b", "2b", "9b", "27b", "35b-a3b"], required=True,
                   help="published model size (35b-a3b: the qwen35moe mixture of experts, 256 experts, 8 routed + 1 shared)")
    p.add_argument("--quant", choices=["q8_0", "q4_k_m"], required=True, help="llama-quantize ftype to imitate")
    p.add_argument("-o", "--output", required=True, help="output .gguf path")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    p.add_argument("--layers", type=int, help="trunk layers (default: the shape's; attention stays every 4th layer). "
                                              "35b-a3b at 40 layers is 21.7 GB in q4_k_m; --layers 4 (3.2 GB) fits a small machine")
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser("bench", help="measure decode tok/s, the cost of verify passes of T = 1, 2, 4, 8 tokens "
                                     "(k = T - 1 drafts), bandwidth and spec speedups; --serving: time to first token "
                                     "and prefill rows with and without the prefix cache and chunked prefill",
                       description="Measure, in one run: decode tokens/s; the time of a verify pass of T = 2, 4, 8 "
                                   "tokens (k = T - 1 drafts) as a ratio to a one-token pass; weight bytes read per second during decode vs a memory-copy bandwidth; "
                                   "plain vs speculative greedy tokens/s with acceptance (mtp when the model has the "
                                   "head, lookup, and a synthetic drafter that proposes the true greedy continuation "
                                   "with --synth-acceptance, for random-weight models made by `synth`). With "
                                   "--serving, a serving scenario instead: requests sharing a prefix arrive over "
                                   "time, with and without the prefix cache and chunked prefill (its flags below).")
    p.add_argument("--model", help="qwen35 GGUF file (default: the model tinyspec ships)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="prompt text (default: --prompt-len random token ids)")
    src.add_argument("--prompt-file", metavar="FILE", help="prompt text read from a UTF-8 file ('-': standard input)")
    src.add_argument("--tokens", help="prompt as comma-separated token ids")
    p.add_argument("--prompt-len", type=int, default=32, help="random prompt length when no prompt is given (32)")
    add_backend_arg(p)
    p.add_argument("--decode-n", type=int, default=16, help="one-token passes timed for decode (16)")
    p.add_argument("--repeats", type=int, default=5, help="timings per verify size; the median is reported (5)")
    p.add_argument("--verify-sizes", default=None, metavar="T,T,..",
                   help="verify pass sizes to time, T = k + 1: comma-separated or a range such as 1..9, including 1 "
                        "(default 1,2,4,8; 1..9 on a MoE model)")
    p.add_argument("--max-new", type=int, default=None,
                   help="tokens per speculative run (128: about 45 verify steps at 2.95 tokens a step, so a synthetic "
                        "run's tokens per step land within a few percent of the set rate's); with --serving, tokens "
                        "per request (16)")
    p.add_argument("--draft-n", type=int, default=3, help="draft tokens per verify pass (3)")
    p.add_argument("--graphs", choices=("on", "off"), default="on",
                   help="cuda: replay the greedy rule and the forward passes from CUDA graphs (on), or launch every "
                        "kernel plainly (off), to measure what the graphs save")
    p.add_argument("--drafters", "--spec", default=None,
                   help="comma-separated drafters to time against plain: mtp, lookup, synthetic (default all three; "
                        "'' for none; --spec is the same option); with --serving, one drafter for every request "
                        "(mtp or lookup; default none: plain decoding)")
    p.add_argument("--synth-acceptance", type=float, default=0.8, help="acceptance rate of the synthetic drafter (0.8)")
    p.add_argument("--synth-len", type=float, default=None, metavar="L",
                   help="also time real MTP drafting whose drafts are right at the per-position rate p giving L tokens "
                        "per step, (1 - p^(k+1)) / (1 - p) = L, as llama.cpp's --spec-synth-len (spec.mtp_synth)")
    p.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                   help="also time the MTP runs drafting over the N most frequent tokens only (spec.*_vocab)")
    p.add_argument("--ranking", default=None, metavar="FILE.npy",
                   help="token ids by frequency for --draft-vocab (default: the file's training.token_ranking, "
                        "else id order)")
    p.add_argument("--adaptive", action="store_true",
                   help="also time MTP with k chosen per step (spec.mtp_adaptive; with --draft-vocab also "
                        "spec.mtp_adaptive_vocab, what generate --spec mtp runs on a large vocabulary; with "
                        "--synth-len also spec.mtp_synth_adaptive[_vocab]; on a MoE model the prior cost of k drafts "
                        "counts the experts the extra verify rows read); with --slots, "
                        "also the batch-aware draft length at every B (slots.B.policy_tok_s: one k for all slots "
                        "from the measured cost of a pass of R rows, 0 where drafting would lose)")
    p.add_argument("--rollback", choices=["snapshot", "replay"], default=None,
                   help="how verify passes keep what a rollback needs: snapshot (a GDN state per token, copied back) "
                        "or replay (the state before the pass, the kept tokens rerun); default: the backend's "
                        "(replay on cpu, snapshot on numpy and cuda; tinyspec/state.py)")
    p.add_argument("--spec-repeats", type=int, default=1,
                   help="timed rounds of plain + every drafter, interleaved; medians, and speedup = the median of "
                        "the per-round ratios (1; use 3+ on a shared machine); with --serving, rounds of its four "
                        "configurations")
    p.add_argument("--slots", default=None, metavar="B,B,..",
                   help="also decode B sequences at once for each B (the prompt with its first token changed per "
                        "copy), plain vs batched MTP drafting at --draft-n (with --synth-len: at that synthetic "
                        "rate, MTP drafting paid for real): aggregate tok/s, rows per pass, speedup, identical; "
                        "with --serving, the engine's slot count, one number (4)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    g = p.add_argument_group(
        "serving scenario (--serving)",
        "Instead of the measurements above: --requests prompts of --prefix shared random tokens + --own of their "
        "own, one arriving every --gap engine steps, each generating --max-new greedy tokens in --slots slots, run four "
        "ways (baseline: no prefix cache, whole prompts; cache; chunk; cache+chunk), every output checked equal. "
        "Reports per configuration the time to first token (median, p90, min-max; also in steps and rows, exact), "
        "aggregate tok/s, prefill rows computed, the joining rows a running slot waited through, memory at the peak "
        "pass, and the goals of issue 36 (cache+chunk against baseline: prefill rows <= 1/8, median time to first "
        "token >= 4x sooner, no running slot delayed by more than one chunk). The two configurations without the "
        "cache recompute every prompt and take most of the time.")
    g.add_argument("--serving", action="store_true", help="run the serving scenario (fast/bench_serving.py)")
    g.add_argument("--requests", type=int, default=None, metavar="N", help="requests (16)")
    g.add_argument("--prefix", type=int, default=None, metavar="T", help="tokens every prompt shares (512)")
    g.add_argument("--own", type=int, default=None, metavar="T", help="tokens of its own after the prefix (16)")
    g.add_argument("--gap", type=int, default=None, metavar="STEPS",
                   help="request i arrives before engine step i x STEPS (8: with --chunk 64 each request arrives after "
                        "the first has prefilled the 512 shared tokens; a request admitted before that finds nothing "
                        "cached and prefills its whole prompt)")
    g.add_argument("--chunk", type=int, default=None, metavar="N", help="prefill rows a pass, chunked configurations (64)")
    g.add_argument("--block-size", type=int, default=None, metavar="N", help="positions a KV block (16)")
    g.add_argument("--kv-blocks", type=int, default=None, metavar="N",
                   help="KV pool size in blocks (default: room for --slots of the longest requests, none shared)")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("demo", help="the demo (also what `python -m tinyspec` runs): speculation on the shipped model",
                       description="Decode a few prompts greedily with the shipped qwen35 model (tinyspec/assets) "
                                   "plainly and with MTP, prompt-lookup and draft-model speculation; print tokens/s, "
                                   "speedup, acceptance and tokens per verify pass, check the outputs are identical, "
                                   "and show one generation with its accepted drafts marked.")
    add_backend_arg(p)
    p.add_argument("--max-new", type=int, default=40, help="tokens per prompt (40)")
    p.set_defaults(func=lambda args: demo_main(args.backend, args.max_new))
    return parser


def demo_main(backend: str | None = None, max_new: int = 40) -> int:
    from .demo import demo

    if max_new < 1:
        raise ValueError(f"--max-new must be >= 1, got {max_new}")
    return demo(max_new=max_new, backend=backend)


def error_text(e: Exception) -> str:
    """One line for an error: an OS error as "cannot read FILE: reason" rather than Python's "[Errno 2] ..."."""
    if isinstance(e, OSError) and e.strerror:
        return f"cannot read {e.filename}: {e.strerror}" if e.filename else e.strerror
    return str(e)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    parser.set_defaults(threads=None)  # commands without --threads
    args = parser.parse_args(argv)
    try:
        if args.threads is not None:
            from .fast.threads import set_threads

            set_threads(args.threads)
        if args.command is None:
            return demo_main()
        return args.func(args)
    except BrokenPipeError:  # e.g. piped into `head`
        return 0
    except KeyboardInterrupt:  # Ctrl-C: no traceback, and not glued to a streamed line
        sys.stdout.write("\n")
        sys.stdout.flush()
        print(f"tinyspec {args.command or 'demo'}: interrupted", file=sys.stderr)
        return 130
    except (GGUFError, ValueError, OSError, BackendError) as e:
        print(f"tinyspec {args.command or 'demo'}: error: {error_text(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
