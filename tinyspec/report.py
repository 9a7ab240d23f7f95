"""How a run reads: its tokens marked by how each was made, and the summary lines of generate and batch runs.

    render_marked    the text again, its runs marked: colours on a terminal; in a pipe or a file, ⟦accepted drafts⟧
                     ⦃corrections⦄ ⟪bonus tokens⟫, marks code's own brackets never are (mark_style); where the
                     stream cannot encode them, and in a notebook, [accepted] {correction} <bonus>
    run_summary      generate's line on stderr: tokens, target passes, tok/s, acceptance (or a plain run's speed)
    batch_summary    batch's lines on stderr: throughput, KV pool peak, prefix cache, the draft-length choices,
                     each sequence's acceptance

The numbers are the ones the engine reports (speculate.SpecStats, generate's plain stats, batch_generate's
stats); this module only words them, so the CLI, the demo and a notebook say the same thing the same way.
"""

from __future__ import annotations

import os

# How a speculative run produced each token (speculate.py): a draft the target agreed with, the target's own token
# after a rejected draft (a correction), its token after all k drafts were kept (the bonus), or a plain target
# token (the first one, and every token of a step that drafted nothing).
MARKS = ("accepted", "correction", "bonus", "target")
_BRACKETS = {"accepted": "[{}]", "correction": "{{{}}}", "bonus": "<{}>", "target": "{}"}
_UNICODE = {"accepted": "\u27e6{}\u27e7", "correction": "\u2983{}\u2984", "bonus": "\u27ea{}\u27eb", "target": "{}"}  # ⟦ ⟧ ⦃ ⦄ ⟪ ⟫
_COLOURS = {"accepted": "\x1b[32m", "correction": "\x1b[33m", "bonus": "\x1b[36m", "target": ""}  # green yellow cyan
STYLES = ("colour", "unicode", "brackets")


def render_marked(tokenizer, tokens: list[int], marks: list[str], colour: bool | str = False) -> str:
    """Text with each run of same-marked tokens marked by how it was produced, in a style (mark_style): "brackets"
    (colour=False; a notebook): [accepted drafts] {correction} <bonus>, target tokens plain; "unicode" (a pipe or a
    file: code has brackets of its own, these it has not): ⟦accepted⟧ ⦃correction⦄ ⟪bonus⟫; "colour" (colour=True,
    a terminal): the same runs in green, yellow and cyan. A run is decoded as one piece, so a character split across
    tokens stays whole and a run of accepted drafts reads as the phrase it is: `[ with open](src)` not
    `[ with][ open]`."""
    style = _style(colour)
    colour, marked = style == "colour", _UNICODE if style == "unicode" else _BRACKETS
    out, run, mark = [], [], None
    for t, m in [*zip(tokens, marks), (None, None)]:
        if m != mark and run:
            text = tokenizer.decode(run)
            if colour and _COLOURS[mark]:
                c = _COLOURS[mark]  # coloured line by line, so a margin printed before each line stays plain
                out.append(c + text.replace("\n", "\x1b[0m\n" + c) + "\x1b[0m")
            else:
                out.append(marked[mark].format(text) if not colour else text)
            run = []
        if t is not None:
            run.append(t)
        mark = m
    return "".join(out)


def wants_colour(stream) -> bool:
    """Colour on a terminal, unless NO_COLOR is set (no-color.org); marks anywhere else."""
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR")


def mark_style(stream) -> str:
    """How render_marked marks text written to `stream`: "colour" on a terminal (wants_colour), else "unicode"
    where the stream's encoding holds the marks (a pipe or a file, as UTF-8 almost always is), else "brackets"."""
    if wants_colour(stream):
        return "colour"
    try:
        "".join(_UNICODE.values()).encode(getattr(stream, "encoding", None) or "ascii")
    except (UnicodeEncodeError, LookupError):
        return "brackets"
    return "unicode"


def _style(colour: bool | str) -> str:
    if isinstance(colour, str):
        if colour not in STYLES:
            raise ValueError(f"a marks style is one of {', '.join(STYLES)}, got {colour!r}")
        return colour
    return "colour" if colour else "brackets"


def marks_legend(colour: bool | str = False) -> str:
    """The one-line key to render_marked's marks, in the same style."""
    style = _style(colour)
    if style == "colour":
        return ("\x1b[32mgreen\x1b[0m: drafts the target accepted  \x1b[33myellow\x1b[0m: the target's correction  "
                "\x1b[36mcyan\x1b[0m: its bonus token after k accepted drafts  plain: a target-only step")
    m = _UNICODE if style == "unicode" else _BRACKETS
    return (f"{m['accepted'].format('...')}: drafts the target accepted  {m['correction'].format('...')}: the target's "
            f"correction  {m['bonus'].format('...')}: its bonus token after k accepted drafts  unmarked: a target-only "
            "step")


def run_summary(s: dict) -> str:
    """One line for a generate() run's stats: speculative (SpecStats.as_dict) or plain."""
    if "steps" not in s:
        return f"[{s['generated']} tokens, prefill {s['prefill_s']:.2f} s, decode {s['decode_tok_s']:.1f} tok/s]"
    chosen = s.get("adaptive", {}).get("chosen_k", {})  # the most drafts the policy allowed, per step
    ks = ", steps by the drafts allowed " + " ".join(f"{k}:{n}" for k, n in chosen.items()) if chosen else ""
    plain = f" ({s['plain_steps']} of them plain: no drafts made)" if s["plain_steps"] else ""
    return (f"[{s['emitted']} tokens in {s['steps']} target passes{plain}, {s['tokens_per_s']:.1f} tok/s, "
            f"{_acceptance(s)}, {s['mean_accepted_length']:.2f} tokens/step{ks}]")


def _acceptance(s: dict) -> str:
    return f"acceptance {s['acceptance_rate']:.2f}" if s["drafted"] else "no drafts made"


def batch_summary(s: dict, sequences: list[dict]) -> list[str]:
    """The lines after a batch: its stats (batch_generate's, plus sequences, failed, spec, adaptive) and, when
    it drafted, each sequence's acceptance (sequences: {"index", "tokens", "stats", "error"} in input order)."""
    lines = [f"[batch] {s['generated']} tokens from {s['sequences'] - s['failed']} sequences in {s['wall_s']:.2f} s: "
             f"{s['tok_s']:.1f} tok/s ({s['decode_tok_s']:.1f} after the prefills), {s['steps']} steps, "
             f"{s['rows_per_pass']:.2f} rows per pass, KV peak {s['kv_blocks_peak']} of {s['kv_blocks']} blocks "
             f"of {s['kv_block_size']} ({s['kv_bytes_peak'] / 1e6:.2f} MB), {s['prefill_rows']} prefill rows, "
             f"{s['preemptions']} preemptions"]
    if "prefix_hits" in s:  # run with the prefix cache
        lines.append(f"[batch] prefix cache: {s['prefix_hits']} hits, {s['prefix_tokens_reused']} prompt tokens "
                     f"reused, {s['prefix_states_kept']} GDN states kept ({s['prefix_state_bytes'] / 1e6:.2f} MB)")
    if s["adaptive"]:
        lines.append(f"[batch] batch-aware draft length: steps per k {s['policy']['chosen_k']}")
    if s["spec"] != "none":
        lines += [f"[batch] sequence {seq['index']}: {len(seq['tokens'])} tokens, {_acceptance(seq['stats'])}, "
                  f"{seq['stats']['mean_accepted_length']:.2f} tokens/step" for seq in sequences if not seq["error"]]
    return lines
