"""Measure the shipped models against the quality bars of issue 5, with tinyspec itself (no torch).

    python tools/eval_tiny.py [--target tinyspec/assets/tiny-target.gguf] [--draft ...] [--json]

  heldout_loss        mean next-token cross-entropy (nats) of the target on held-out standard-library files
                      (the files tools/train_tiny.py held out: every 50th by CRC32 of its path)
  mtp depth 1 / 3     greedy speculative decoding with the MTP head drafting k = 1 and k = 3 tokens per verify
                      pass on prompts cut from those held-out files: acceptance rate and mean accepted length
                      (tokens emitted per verify pass = accepted drafts + 1)
  lookup (edit)       prompt-lookup drafting (k = 8) on "edit this code" prompts whose answer repeats the input
  draft model         the small draft model drafting k = 3
  --rank-prompts      only this: CANDIDATES ranked by their 64-token greedy continuations (good(): parses, no line
                      more than twice, no loop inside a line): where the README's first examples are chosen from
Every speculative output is checked equal to plain greedy decoding of the same prompt.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from tinyspec.backends import load_model  # noqa: E402
from tinyspec.demo import EDITS, PROMPTS  # noqa: E402
from tinyspec.fast.draft_vocab import RANKING_KEY  # noqa: E402
from tinyspec.draft import DraftModelDrafter  # noqa: E402
from tinyspec.generate import generate  # noqa: E402
from tinyspec.lookup import LookupDrafter  # noqa: E402
from tinyspec.mtp import MTPDrafter  # noqa: E402
from tinyspec.tokenizer import Tokenizer  # noqa: E402
from train_tiny import corpus_files, read_texts  # noqa: E402

ASSETS = REPO / "tinyspec" / "assets"


def heldout_prompts(tok: Tokenizer, n: int, length: int) -> list[list[int]]:
    """n prompts of `length` tokens, each from a different held-out file, starting at a line in its middle."""
    _, _, held = corpus_files()
    out = []
    for text in read_texts(held):
        lines = text.splitlines(keepends=True)
        if len(lines) < 40:
            continue
        ids = tok.encode("".join(lines[len(lines) // 2:]))
        if len(ids) >= length:
            out.append(ids[:length])
        if len(out) == n:
            break
    return out


def bytes_per_token(tok: Tokenizer) -> float:
    """UTF-8 bytes of the held-out files per token of `tok`: loss per token / this = loss per byte, which
    compares models with different tokenizers (a larger vocabulary packs more bytes into a token)."""
    texts = read_texts(corpus_files()[2])
    return sum(len(t.encode("utf-8")) for t in texts) / sum(len(tok.encode(t)) for t in texts)


def token_nats(model, ids: list[int]) -> np.ndarray:
    """-log p(ids[i+1] | ids[:i+1]) for each i, from a fresh state: the cross-entropy of every predicted token."""
    logits, _ = model.forward(np.array(ids[:-1]), model.new_state())
    logits = logits.astype(np.float64)
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    return logz - logits[np.arange(len(ids) - 1), ids[1:]]


def heldout_loss_per_byte(model, tok: Tokenizer, chunk: int = 256) -> dict:
    """Cross-entropy per UTF-8 byte over every held-out file, the measure that compares models with different
    tokenizers: each file is cut into pieces of `chunk` tokens, each piece run from a fresh state, and the loss of
    every predicted token (all but a piece's first) is summed and divided by those tokens' bytes."""
    nats = n_bytes = n_tokens = 0.0
    for text in read_texts(corpus_files()[2]):
        ids = tok.encode(text)
        for s in range(0, len(ids) - 1, chunk):
            piece = ids[s:s + chunk]
            if len(piece) < 2:
                continue
            nats += float(np.sum(token_nats(model, piece)))
            n_bytes += sum(len(tok.decode_bytes([t])) for t in piece[1:])
            n_tokens += len(piece) - 1
    return {"nats_per_byte": nats / n_bytes, "nats_per_token": nats / n_tokens, "tokens": int(n_tokens),
            "bytes": int(n_bytes), "chunk": chunk}


def heldout_loss(model, tok: Tokenizer, n_windows: int, length: int) -> float:
    """Mean next-token cross-entropy over n_windows windows of `length` tokens of held-out text."""
    _, _, held = corpus_files()
    eot = tok.eog_ids[0] if tok.eog_ids else None
    stream = []
    for text in read_texts(held):
        stream += tok.encode(text) + ([eot] if eot is not None else [])
    rng = np.random.default_rng(1234)
    losses = []
    for start in rng.integers(0, len(stream) - length - 1, n_windows):
        losses.append(float(np.mean(token_nats(model, stream[start:start + length + 1]))))
    return float(np.mean(losses))


# The prompts a newcomer meets first (the README's generate examples) are chosen from these by rank_prompts, not by
# reading outputs: openings of the kind the shipped model was trained on (the standard library's sources).
# A bare signature invites the model to go on with the line (a "# type: ignore" comment), so most candidates end
# where a body starts: after a newline, or after a docstring that says what the body should do.
CANDIDATES = ["def fib(n):", "def is_prime(n):", "def read_lines(path):", "def flatten(items):", "def main():",
              "class Stack:", "class Point:", "def parse_args(argv):", "def __init__(self, name):",
              "with open(path) as f:", "for i in range(10):", "import os\nimport sys\n\n\ndef main():\n",
              'def fib(n):\n    """Return the n-th Fibonacci number."""\n',
              'def is_prime(n):\n    """Return True if n is a prime number."""\n',
              'def read_lines(path):\n    """Return the lines of a text file."""\n',
              'def flatten(items):\n    """Flatten a list of lists into one list."""\n',
              'class Stack:\n    """A last-in first-out stack."""\n\n    def __init__(self):\n',
              "class Point:\n    def __init__(self, x, y):\n",
              "import os\n\n\ndef list_files(root):\n",
              "def main():\n    parser = argparse.ArgumentParser()\n",
              'if __name__ == "__main__":\n',
              "try:\n    import json\nexcept ImportError:\n",
              "    def __repr__(self):\n        return ",
              "def add(a, b):\n    return ", "def read_config(path):\n", "def load(path):\n"]


def continuation(model, tok: Tokenizer, prompt: str, n: int = 64) -> dict:
    """The greedy continuation of a prompt: how often its most repeated non-blank line occurs (a loop shows as a
    count far above 2) and whether prompt + continuation, cut after its last complete line, compiles as Python
    (ast; an open block at the cut is closed with `pass` first, an indented prompt is read inside a class)."""
    import ast

    text = tok.decode(generate(model, tok.encode(prompt), n, stop_ids=tok.eog_ids).tokens)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    whole = (prompt + text)[: (prompt + text).rfind("\n") + 1] or prompt + text
    whole = ("class _:\n" if prompt[:1].isspace() else "") + whole  # a method's body starts indented
    parses = False
    for tail in ("", "    pass\n", "        pass\n", "            pass\n"):
        try:
            ast.parse(whole + tail)
            parses = True
            break
        except SyntaxError:
            continue
    words = re.findall(r"[A-Za-z]+|\d+|[^A-Za-z\d\s]", text)  # a loop inside a line or a name ("-zero-zero",
    # "[], [], []", "module_module_module") counts too:
    grams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]  # the share of word 3-grams seen before
    return {"max_line_repeats": max((lines.count(ln) for ln in lines), default=0), "parses": parses,
            "repeated_trigrams": round(1 - len(set(grams)) / len(grams), 3) if grams else 0.0, "text": text}


def continuations(model, tok: Tokenizer, n: int = 64) -> dict:
    """continuation() of the demo's prompts and of `def fib(n):`."""
    return {prompt: continuation(model, tok, prompt, n) for prompt in PROMPTS + ["def fib(n):"]}


def rank_prompts(model, tok: Tokenizer, candidates: list[str] = CANDIDATES, n: int = 64) -> list[tuple[str, dict]]:
    """The candidates by how well the model continues them, best first: those that meet the bar (good(): it parses,
    repeats no line more than twice and loops inside no line) first, then the smaller share of repeated word
    3-grams (candidate order breaks ties)."""
    scored = [(p, continuation(model, tok, p, n)) for p in candidates]
    return sorted(scored, key=lambda pc: (not good(pc[1]), pc[1]["repeated_trigrams"]))


def good(c: dict) -> bool:
    """A continuation a newcomer may be shown: it parses, repeats no line more than twice (issue 49's bar) and repeats
    at most 30% of its word 3-grams (a loop inside one line, which the line count misses)."""
    return c["parses"] and c["max_line_repeats"] <= 2 and c["repeated_trigrams"] <= 0.3


def spec_stats(model, prompts, make_drafter, k: int, max_new: int, plain: dict) -> dict:
    """plain: prompt (tuple) -> plain greedy tokens, filled on first use and shared between calls."""
    steps = drafted = accepted = 0
    identical = True
    for p in prompts:
        res = generate(model, p, max_new, drafter=make_drafter(), draft_n=k)
        if tuple(p) not in plain:
            plain[tuple(p)] = generate(model, p, max_new).tokens
        identical &= res.tokens == plain[tuple(p)]
        steps, drafted, accepted = steps + res.stats["steps"], drafted + res.stats["drafted"], accepted + res.stats["accepted"]
    return {"k": k, "prompts": len(prompts), "acceptance_rate": accepted / drafted if drafted else 0.0,
            "mean_accepted_length": (accepted + steps) / steps if steps else 0.0, "identical_to_plain": identical}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--target", type=Path, default=ASSETS / "tiny-target.gguf")
    ap.add_argument("--draft", type=Path, default=ASSETS / "tiny-draft.gguf")
    ap.add_argument("--backend", default=None, help="numpy, cpu or cuda (default: tinyspec's default)")
    ap.add_argument("--prompts", type=int, default=12, help="held-out prompts (12)")
    ap.add_argument("--max-new", type=int, default=48, help="tokens generated per prompt (48)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rank-prompts", action="store_true",
                    help="only rank CANDIDATES by their 64-token greedy continuations (what the README's examples use)")
    a = ap.parse_args(argv)
    target, draft = load_model(a.target, a.backend), load_model(a.draft, a.backend)
    tok = Tokenizer.from_gguf(target.metadata)
    if a.rank_prompts:
        ranked = rank_prompts(target, tok)
        if a.json:
            print(json.dumps([{"prompt": p, **c} for p, c in ranked], indent=1))
            return 0
        for p, c in ranked:
            print(f"{p[:30]!r:34} {'good' if good(c) else 'poor'}: parses {c['parses']!s:5}  most repeated line "
                  f"x{c['max_line_repeats']}  repeated word 3-grams {c['repeated_trigrams']:.2f}")
        return 0
    prompts = heldout_prompts(tok, a.prompts, 64)
    edits = [tok.encode(orig + "\n\n" + start) for orig, start in EDITS]
    plain = {}  # plain greedy outputs, computed once per prompt
    report = {
        "target": str(a.target), "draft": str(a.draft),
        "training": {k: v for k, v in target.metadata.items() if k.startswith("training.") and k != RANKING_KEY},
        "heldout_loss": heldout_loss(target, tok, 16, 128),
        "heldout_loss_draft": heldout_loss(draft, tok, 16, 128),
        "heldout_bytes_per_token": bytes_per_token(tok),
        "heldout_per_byte": heldout_loss_per_byte(target, tok),
        "heldout_per_byte_draft": heldout_loss_per_byte(draft, tok),
        "mtp_depth1": spec_stats(target, prompts, lambda: MTPDrafter(target), 1, a.max_new, plain),
        "mtp_depth3": spec_stats(target, prompts, lambda: MTPDrafter(target), 3, a.max_new, plain),
        "lookup_edit": spec_stats(target, edits, lambda: LookupDrafter(n_max=4), 8, a.max_new, plain),
        "draft_model": spec_stats(target, prompts, lambda: DraftModelDrafter(draft, target=target), 3,
                                  a.max_new, plain),
        "continuations": continuations(target, tok),
        "sample": tok.decode(prompts[0]) + "|>>>|" + tok.decode(plain[tuple(prompts[0])]),
    }
    if a.json:
        print(json.dumps(report, indent=1))
        return 0
    bpt = report["heldout_bytes_per_token"]
    for who in ("", "_draft"):
        r = report["heldout_per_byte" + who]
        print(f"held-out files, {r['chunk']}-token pieces: {'draft' if who else 'target'} {r['nats_per_byte']:.4f} "
              f"nats/byte ({r['nats_per_token']:.3f} nats/token over {r['tokens']:,} tokens)")
    print(f"held-out loss: target {report['heldout_loss']:.3f}, draft {report['heldout_loss_draft']:.3f} nats/token; "
          f"{bpt:.2f} bytes/token: target {report['heldout_loss'] / bpt:.4f}, draft "
          f"{report['heldout_loss_draft'] / bpt:.4f} nats/byte")
    for key in ("mtp_depth1", "mtp_depth3", "lookup_edit", "draft_model"):
        r = report[key]
        print(f"{key:<12} k={r['k']}  acceptance {r['acceptance_rate']:.3f}  mean accepted length "
              f"{r['mean_accepted_length']:.3f}  ({r['prompts']} prompts, identical to plain: {r['identical_to_plain']})")
    for prompt, c in report["continuations"].items():
        print(f"continuation of {prompt[:30]!r}: most repeated line x{c['max_line_repeats']}, parses: {c['parses']}")
    print("sample (prompt|>>>|greedy continuation):\n" + report["sample"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
