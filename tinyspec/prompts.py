"""Where the CLI's prompts come from, checked before a model loads (a bad flag is told at once, not after a load).

    --prompt TEXT         the text, encoded with the file's own tokenizer
    --prompt-file FILE    the text of a UTF-8 file ('-': standard input), for prompts longer than a command line
    --tokens 1,2,3        token ids, as they are
    --prompts FILE        batch: one prompt a line, or JSON lines {"prompt": ...}; a bad line is that prompt's
                          error (reported, the others run)

A text too long for the context is refused from its byte length alone, before it is encoded: no token is longer
than the tokenizer's max_token_bytes, so len(bytes) / max_token_bytes tokens at least (encoding a megabyte
without a space is quadratic: minutes of silence before the same refusal).
"""

from __future__ import annotations

import json
import sys


def read_text(source: str, flag: str) -> str:
    """The text of a UTF-8 file, or of standard input for '-'; a file that cannot be read is one line naming it."""
    try:
        if source == "-":
            return sys.stdin.read()
        with open(source, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise ValueError(f"{flag} {source}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except IsADirectoryError:
        raise ValueError(f"{flag} {source}: is a folder") from None
    except FileNotFoundError:
        raise ValueError(f"{flag} {source}: no such file") from None


def parse_token_list(text: str) -> list[int]:
    """--tokens "1, 2,3" -> [1, 2, 3] (the vocabulary's bound is checked by the model)."""
    try:
        tokens = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise ValueError(f"--tokens must be comma-separated integers, got {text!r}") from None
    if not tokens:
        raise ValueError("--tokens is empty: give at least one token id")
    if bad := [t for t in tokens if not 0 <= t < 2**31]:
        raise ValueError(f"--tokens: ids must be in 0..2^31-1 (and below the model's vocabulary size), got {bad[0]}")
    return tokens


def check_prompt_args(args, required: bool = True) -> None:
    """Before a model loads: --prompt-file's text becomes args.prompt, --tokens is checked, and (if required) a
    prompt was given."""
    if getattr(args, "prompt_file", None) is not None:
        args.prompt = read_text(args.prompt_file, "--prompt-file")
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


def read_prompts(source: str) -> list[tuple[str | None, str | None]]:
    """batch --prompts FILE ('-': standard input) -> one (text, error) per prompt, in order. A line is a prompt;
    blank lines are skipped; a line starting with '{' is a JSON object whose "prompt" field is the prompt text
    (a bad one is that prompt's error, the others run). No prompt at all is an error of the whole file."""
    prompts = []
    for n, line in enumerate(read_text(source, "--prompts").splitlines(), 1):
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
