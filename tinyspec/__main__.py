"""Command line: `python -m tinyspec <command>`: the parser and the dispatch, nothing more.

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
    demo [--backend B] [--max-new N] [--json]       the demo: plain vs MTP vs lookup vs draft model on the shipped model
    (no command)                                    the same demo with its defaults

Errors are one line on stderr and exit code 2.

Each command's flags are added by its own add_* function; what a command does lives in the module that owns the
job: cli_run.py (logits, generate, batch, serve), cli_bench.py, gguf_view.py (inspect), convert.py, fast/synth.py,
demo.py. The drafters and their own flags come from the registry (drafters.py): --spec lists every kind
registered, and each kind's flags, help and defaults are its entry's.
"""

from __future__ import annotations

import argparse
import sys


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

# after the check: a shadowed package has nothing more to import
from . import cli_bench, cli_run, drafters  # noqa: E402
from .backends import BackendError  # noqa: E402
from .gguf import GGUFError  # noqa: E402
from .gguf_view import print_inspect  # noqa: E402


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


class Parser(argparse.ArgumentParser):
    """argparse with its errors as one line, like every other error here: "tinyspec generate: error: ..."
    (argparse prints its usage block first; --help still prints it all). Subcommands' parsers are of this class."""

    def error(self, message: str):
        self.exit(2, f"{self.prog.removeprefix('python -m ')}: error: {message} (see {self.prog} --help)\n")


def add_backend_arg(p: argparse.ArgumentParser, default: str | None = None) -> None:
    from .backends import BACKENDS

    p.add_argument("--backend", choices=BACKENDS, default=default,
                   help="numpy: the oracle (weights expanded to float32); cpu: Numba kernels on the packed weights; "
                        "cuda: CuPy kernels on a GPU (default: "
                        + (default or "$TINYSPEC_BACKEND if set, else cuda if a GPU, else cpu") + ")")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="cpu backend: threads for the Numba kernels (default: NUMBA_NUM_THREADS, the cores); on a "
                        "machine busy with other work, fewer can be faster (idle threads sleep rather than spin)")


def add_prompt_args(p: argparse.ArgumentParser, required: bool = True,
                    prompt_help: str = "prompt text (encoded with the file's own tokenizer)") -> None:
    p.add_argument("--model", help="qwen35 GGUF file (default: the model tinyspec ships, as the demo runs it)")
    src = p.add_mutually_exclusive_group(required=required)
    src.add_argument("--prompt", help=prompt_help)
    src.add_argument("--prompt-file", metavar="FILE", help="prompt text read from a UTF-8 file ('-': standard input)")
    src.add_argument("--tokens", help="prompt as comma-separated token ids, e.g. 1,2,3")


def add_decoding_args(p: argparse.ArgumentParser, max_new_help: str, seed_help: str) -> None:
    """The flags generate and batch share: what to decode and how, and which drafter (add_drafter_args)."""
    p.add_argument("--max-new", type=int, default=32, help=max_new_help)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    p.add_argument("--seed", type=int, default=0, help=seed_help)
    add_drafter_args(p)


def add_drafter_args(p: argparse.ArgumentParser) -> None:
    """--spec, one of the registry's kinds, and every kind's own flags, each once, its help led by the kinds that
    read it (drafters.py)."""
    p.add_argument("--spec", choices=drafters.spec_choices(), default="none",
                   help=drafters.spec_help() + "; with many sequences, a drafter that runs a model makes every "
                                               "slot's drafts in one pass per draft depth")
    for flag, readers in drafters.every_flag().values():
        p.add_argument(flag.name, type=flag.type, default=flag.default, metavar=flag.metavar,
                       help=f"{', '.join(readers)}: {flag.help}")


def add_slot_args(p: argparse.ArgumentParser) -> None:
    """The flags batch and serve share: how many sequences at once, one k for all of them, the prefix cache."""
    p.add_argument("--slots", type=int, default=4,
                   help="sequences decoded at once; the others wait for a free slot, in order (default 4)")
    p.add_argument("--adaptive", action="store_true",
                   help="choose one k for every slot each step, up to --draft-n, from the measured cost of a pass of "
                        "R rows (fast/batch_draft_length.py): k = 0, plain decoding, where drafting would lose as "
                        "the batch fills the pass. Greedy output is unchanged; sampled output keeps the model's law "
                        "but no longer repeats a solo run's seed")
    p.add_argument("--prefix-cache", action="store_true",
                   help="keep the KV blocks of prompt prefixes already prefilled and the GDN states saved along them "
                        "(tinyspec/prefix_cache.py): a prompt that starts like an earlier one prefills only the rest; "
                        "output unchanged")


def add_inspect(sub) -> None:
    p = sub.add_parser("inspect", help="show a GGUF file's metadata and tensor table",
                       description="Show a GGUF file's metadata (long arrays summarised) and its tensors "
                                   "(name, ggml type, NumPy-order shape, absolute offset, bytes).")
    p.add_argument("file", help="path to a .gguf file")
    p.add_argument("--json", action="store_true",
                   help='print {"metadata": {...}, "tensors": [{"name", "type", "shape", "offset", "nbytes"}]} '
                        "with every array in full")
    p.set_defaults(func=lambda args: print_inspect(args.file, args.json))


def add_logits(sub) -> None:
    p = sub.add_parser("logits", help="run the model over a prompt and save logits/hidden (to compare engines)",
                       description="Run the model (by default on the NumPy oracle) over a prompt and write an .npz "
                                   "with tokens [T], logits [T,N], hidden [T,D] (post final norm) and, if the model has an MTP block, mtp_logits [T,N] "
                                   "(row p from token p and hidden p-1, a zero hidden at p = 0).")
    add_prompt_args(p)
    p.add_argument("--out", required=True, help="output .npz path")
    add_backend_arg(p, "numpy")
    p.set_defaults(func=cli_run.run_logits)


def add_generate(sub) -> None:
    p = sub.add_parser("generate", help=f"generate text: plain or speculative (--spec {'|'.join(drafters.DRAFTERS)}), "
                                        "greedy or sampled",
                       description="Generate up to --max-new tokens after the prompt; stops at the end-of-sequence token.")
    add_prompt_args(p)
    add_decoding_args(p, max_new_help="tokens to generate (default 32)", seed_help="seed of the sampling RNG (default 0)")
    p.add_argument("--draft-n", type=int, default=None,
                   help="a fixed number of draft tokens per verify pass (default: adaptive, chosen per step for the "
                        "most tokens per second from measured acceptance and step costs, up to --draft-max)")
    p.add_argument("--draft-max", type=int, default=None,
                   help="largest draft length the adaptive choice tries (default: "
                        + ", ".join(f"{kind.name} {kind.k_max}" for kind in drafters.DRAFTERS.values())
                        + "; a drafter that knows how sure it is ends a step early after a draft it is unsure of, "
                          "where the next one would not pay)")
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
    p.set_defaults(func=cli_run.run_generate)


def add_batch(sub) -> None:
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
    add_slot_args(p)
    p.add_argument("--draft-n", type=int, default=None,
                   help=f"draft tokens per slot and verify pass, the same for every slot every step "
                        f"(0..64, default {cli_run.BATCH_DRAFT_N})")
    p.add_argument("--chunk", type=int, default=None,
                   help="prefill rows per pass at most: a joining prompt is fed this many tokens a step as rows of "
                        "the running slots' verify pass, so they wait at most this many extra rows a step (default: "
                        "each prompt whole, in one pass)")
    p.add_argument("--kv-blocks", type=int, default=None,
                   help="KV pool size in blocks of --block-size positions, a drafter's KV (one that runs a model) "
                        "counted with the target's (default: room for --slots of the longest runs); a smaller pool makes "
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
    p.set_defaults(func=cli_run.run_batch)


def add_serve(sub) -> None:
    p = sub.add_parser("serve", help="an OpenAI-shaped HTTP server over one batch engine (pip install 'tinyspec[serve]')",
                       description="Serve the model over HTTP in the OpenAI shape, on uvicorn and Starlette (the serve "
                                   "extra: pip install 'tinyspec[serve]'): POST "
                                   "/v1/completions (prompt, max_tokens, temperature, top_p, top_k, seed, stop, "
                                   "stream as server-sent events), POST /v1/chat/completions when the file carries "
                                   "a chat template (rendered with jinja2), GET /v1/models, /health, /v1/stats "
                                   "(requests, tok/s, acceptance) and /metrics (Prometheus). Every request joins ONE running engine of --slots "
                                   "slots (continuous batching, one verify pass per step for all) and gets exactly "
                                   "the tokens it gets alone: greedy, those of `generate`; sampled with a seed, "
                                   "those of `generate --seed S --temperature T --top-p P --spec X --draft-n K` "
                                   "with the server's --spec and --draft-n. Each response carries its own "
                                   "speculation stats. Limits on bodies, connections, deadlines and tokens keep one "
                                   "client from freezing or starving the others; --api-key asks for a key. Ctrl-C "
                                   "cancels what is running and exits 0. See docs/http-server.md (and what it is "
                                   "not: a multi-tenant gateway).")
    p.add_argument("--model", help="qwen35 GGUF file (default: the model tinyspec ships, as the demo runs it)")
    add_slot_args(p)
    p.add_argument("--draft-n", type=int, default=None,
                   help=f"draft tokens per slot and verify pass (0..64, default {cli_run.BATCH_DRAFT_N}); a fixed k keeps "
                        "a seeded request's tokens those of `generate --draft-n K`")
    add_drafter_args(p)
    p.add_argument("--ctx", type=int, default=None, metavar="N",
                   help=f"tokens per request at most, prompt and output (default: the model's context length, at "
                        f"most {cli_run.SERVE_CTX}); the KV pool holds --slots of them")
    p.add_argument("--chunk", type=int, default=64, metavar="N",
                   help="a joining prompt enters the running pass N rows at a time, so running requests wait at most "
                        "N extra rows a step (default 64); output unchanged")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080; 0: any free port, printed)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="require `Authorization: Bearer KEY` on /v1/* (401 without it; /health and /metrics stay "
                        "open); default: the TINYSPEC_API_KEY environment variable, if set")
    p.add_argument("--api-key-file", default=None, metavar="FILE",
                   help="read the accepted keys from FILE, one per line (keeps them out of the process list)")
    p.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="the names a request's \"model\" may give (default: the file's name); others are a 404")
    p.add_argument("--max-tokens", type=int, default=1024, metavar="N",
                   help="a request's max_tokens at most (larger: 400), and a chat request's default when it gives "
                        "none (default 1024; a completion's default stays OpenAI's 16)")
    p.add_argument("--request-timeout", type=float, default=600.0, metavar="S",
                   help="seconds from a request's arrival to its last token (then 504; default 600)")
    p.add_argument("--max-body", type=int, default=2 << 20, metavar="BYTES",
                   help="request body size at most (413 beyond; default 2 MiB: a prompt of 8192 tokens of text is "
                        "about 32 KB)")
    p.add_argument("--max-connections", type=int, default=256, metavar="N",
                   help="open connections at most; more get a 503 and are closed (default 256)")
    p.add_argument("--max-waiting", type=int, default=256, metavar="N",
                   help="requests waiting for a slot at most; more get a 503 (default 256)")
    p.add_argument("--verbose", action="store_true", help="log every HTTP request on stderr")
    add_backend_arg(p)
    p.set_defaults(func=cli_run.run_serve)


def add_convert(sub) -> None:
    p = sub.add_parser("convert", help="convert a Hugging Face Qwen3.5 checkpoint to a qwen35 GGUF",
                       description="Convert a Hugging Face Qwen3.5 checkpoint folder (config.json, *.safetensors, "
                                   "tokenizer.json) into a qwen35 GGUF with the tensors, storage types and metadata "
                                   "llama.cpp's convert_hf_to_gguf.py writes. Needs only NumPy. Progress goes to stderr.")
    p.add_argument("hf_dir", help="checkpoint folder (Qwen3_5ForCausalLM or Qwen3_5ForConditionalGeneration)")
    p.add_argument("-o", "--out", required=True, help="output .gguf path")
    p.add_argument("--outtype", choices=["f32", "f16", "q8_0", "q4_k_m"], default="f32",
                   help="type of the 2-D weights (default f32); norms, conv and 1-D tensors stay F32, and q8_0 "
                        "falls back to f16 for rows that are not a multiple of 32; q4_k_m: llama-quantize "
                        "Q4_K_M's per-tensor mix (Q4_K, Q6_K, and 32-value blocks for rows not a multiple of 256)")
    p.add_argument("--mtp", choices=["include", "exclude", "only"], default="include",
                   help="the MTP (nextn) block: include it (default), exclude it (llama.cpp --no-mtp), or write "
                        "only it with token_embd/output_norm/output (llama.cpp --mtp, a draft sidecar)")
    p.set_defaults(func=cmd_convert)


def add_synth(sub) -> None:
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


def add_bench(sub) -> None:
    p = sub.add_parser("bench", help="measure decode tok/s, the cost of verify passes of T = 1, 2, 4, 8 tokens "
                                     "(k = T - 1 drafts), bandwidth and spec speedups; --serving: time to first token "
                                     "and prefill rows with and without the prefix cache and chunked prefill",
                       description="Measure, in one run: decode tokens/s; the time of a verify pass of T = 2, 4, 8 "
                                   "tokens (k = T - 1 drafts) as a ratio to a one-token pass; weight bytes read per second during decode vs a memory-copy bandwidth; "
                                   "plain vs speculative greedy tokens/s with acceptance (each drafter that runs on "
                                   "the target alone, and a synthetic drafter that proposes the true greedy continuation "
                                   "with --synth-acceptance, for random-weight models made by `synth`). With "
                                   "--serving, a serving scenario instead: requests sharing a prefix arrive over "
                                   "time, with and without the prefix cache and chunked prefill (its flags below).")
    add_prompt_args(p, required=False, prompt_help="prompt text (default: the demo's edit prompt on the shipped "
                                                   "model, real text; --prompt-len random ids on a --model file)")
    p.add_argument("--prompt-len", type=int, default=32,
                   help="random prompt length when no prompt is given to a --model file (32)")
    add_backend_arg(p)
    p.add_argument("--decode-n", type=int, default=16, help="one-token passes timed for decode (16)")
    p.add_argument("--profile-steps", type=int, default=None, metavar="N",
                   help="after the timed runs, N rounds of a plain, a cProfiled and a hooked one-token pass: kernel "
                        "calls, parallel regions and Python calls per token and the share of a step outside the "
                        "kernels (step_profile in the report; 0: skip it; not on cuda) (default: --decode-n)")
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
    alone = cli_bench.target_alone()
    p.add_argument("--drafters", "--spec", default=None,
                   help=f"comma-separated drafters to time against plain: {', '.join(alone + ['synthetic'])} (default "
                        "all of them; '' for none; --spec is the same option); with --serving, one drafter for every "
                        f"request ({' or '.join(alone)}; default none: plain decoding)")
    p.add_argument("--synth-acceptance", type=float, default=0.8, help="acceptance rate of the synthetic drafter (0.8)")
    p.add_argument("--tree", type=int, default=None, metavar="W",
                   help="also time spec.mtp_tree and spec.lookup_tree (trees of up to W guesses a node, --draft-n "
                        "nodes: the same rows as the chains) and build mtp+lookup with W (default: 2)")
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
    p.set_defaults(func=cli_bench.run_bench)


def add_demo(sub) -> None:
    p = sub.add_parser("demo", help="the demo (also what `python -m tinyspec` runs): speculation on the shipped model",
                       description="Decode a few prompts greedily with the shipped qwen35 model (tinyspec/assets) "
                                   "plainly and with MTP, prompt-lookup and draft-model speculation; print tokens/s, "
                                   "speedup, acceptance and tokens per verify pass, check the outputs are identical, "
                                   "and show one generation with its accepted drafts marked.")
    add_backend_arg(p)
    p.add_argument("--max-new", type=int, default=40, help="tokens per prompt (40)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object instead of the text: the table, whether every output equals plain "
                        "decoding, lookup on the edit prompt, the step costs measured here")
    p.set_defaults(func=lambda args: demo_main(args.backend, args.max_new, args.json))


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = Parser(
        prog="python -m tinyspec",
        description="tinyspec: speculative decoding on hybrid Gated-DeltaNet (qwen35) models, every piece readable.",
    )
    parser.add_argument("--version", action="version", version=f"tinyspec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in (add_inspect, add_logits, add_generate, add_batch, add_serve, add_convert, add_synth, add_bench, add_demo):
        add(sub)
    return parser


def demo_main(backend: str | None = None, max_new: int = 40, as_json: bool = False) -> int:
    from .demo import demo

    if max_new < 1:
        raise ValueError(f"--max-new must be >= 1, got {max_new}")
    return demo(max_new=max_new, backend=backend, as_json=as_json)


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
