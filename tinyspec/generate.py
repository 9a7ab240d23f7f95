"""Plain autoregressive generation: prefill the prompt, then one forward per new token.

    logits, _ = model.forward(prompt, state)          prefill: every prompt token in one pass
    repeat:   x = sample(probs(logits[-1]))           stop at EOS, a stop token or max_new
              logits, _ = model.forward([x], state)

This is the baseline speculative decoding must reproduce exactly (greedy) or in distribution (sampled).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .model import Model
from .report import MARKS, marks_legend, render_marked, wants_colour  # noqa: F401  (long imported from here)
from .sampling import SamplingParams, pick


@dataclass
class SeqResult:
    """One sequence's output, from generate() or from the engine (speculate.py, batch.py)."""
    index: int  # position in the input (generate: 0)
    prompt_tokens: list[int]
    tokens: list[int] = field(default_factory=list)  # generated ids, exactly as the sequence alone gets them
    marks: list[str] = field(default_factory=list)  # per token: target (plain, or the first), accepted, correction, bonus
    stats: dict = field(default_factory=dict)
    error: str | None = None  # the prompt could not run (empty, too long, bad ids): reported, others run
    params: SamplingParams | None = None  # how it samples (Engine.add: the engine's unless given its own)
    stop_ids: frozenset[int] | None = None  # the ids that end it (Engine.add: the engine's unless given its own)


def generate(model: Model, prompt_tokens, max_new: int, params: SamplingParams = SamplingParams(),
             rng: np.random.Generator | None = None, stop_ids: tuple[int, ...] = (), chunked_prefill: bool = False,
             drafter=None, draft_n: int | None = None, policy=None, on_emit=None) -> SeqResult:
    """Generate up to max_new tokens after prompt_tokens. A stop id is emitted and then ends generation.

    drafter: None for plain decoding, or a speculative drafter (mtp.MTPDrafter, lookup.LookupDrafter,
    draft.DraftModelDrafter) proposing draft_n tokens per verify pass (default 3), or as many as `policy`
    plans each step (drafting.DraftPolicy, e.g. tinyspec.fast.adaptive.AdaptiveDraftLength) (speculate.py).
    on_emit(tokens, marks): called as tokens are decided (plain: one at a time, marked "target"; speculative:
    a verify step's run at once), for streamed output.
    """
    from .speculate import check_lengths, speculative_generate

    prompt = [int(t) for t in prompt_tokens]
    if drafter is not None and chunked_prefill:
        raise ValueError("chunked_prefill is for plain decoding: a speculative run prefills with the scan")
    if drafter is not None:
        spec = speculative_generate(model, drafter, prompt, max_new, draft_n, params, rng, stop_ids, policy, on_emit)
        return SeqResult(0, prompt, spec.tokens, spec.marks, spec.stats.as_dict())
    check_lengths(model, len(prompt), max_new)
    if rng is None:
        rng = np.random.default_rng()
    state = model.new_state()
    t0 = time.perf_counter()
    on_host = not params.greedy  # greedy: the argmax where the logits are, one int back (Model.forward's to_host)
    logits, _ = model.forward(np.array(prompt), state, chunked=chunked_prefill, to_host=on_host)
    t_prefill = time.perf_counter() - t0
    out: list[int] = []
    t1 = time.perf_counter()
    step_s = []  # each one-token pass, timed: its spread is the run's noise
    while len(out) < max_new:
        token = pick(logits[-1], params, rng)
        out.append(token)
        if on_emit is not None:
            on_emit([token], ["target"])
        if token in stop_ids or len(out) == max_new:
            break
        t = time.perf_counter()
        logits, _ = model.forward(np.array([token]), state, to_host=on_host)
        step_s.append(time.perf_counter() - t)
    t_decode = time.perf_counter() - t1
    stats = {"prompt_tokens": len(prompt), "generated": len(out), "prefill_s": t_prefill, "decode_s": t_decode,
             "decode_tok_s": len(out) / t_decode if t_decode > 0 else 0.0} | step_ms(step_s)
    return SeqResult(0, prompt, out, ["target"] * len(out), stats)


def step_ms(step_s: list[float]) -> dict:
    """The steps' times as {"step_ms": {median, min, max}} (nothing when no step was timed): how steady the
    run's own timing was, so a reader can tell a slow run from a noisy one."""
    if not step_s:
        return {}
    ms = sorted(1000 * s for s in step_s)
    return {"step_ms": {"median": ms[len(ms) // 2] if len(ms) % 2 else (ms[len(ms) // 2 - 1] + ms[len(ms) // 2]) / 2,
                        "min": ms[0], "max": ms[-1], "steps": len(ms)}}
