"""One sequence, plain or speculative: the engine (speculate.py) with one slot.

    generate(model, prompt, max_new)                         plain decoding: prefill, then one token a pass
    generate(model, prompt, max_new, drafter=MTPDrafter(m))  speculative: k drafts verified a pass
    warm_up(model, drafter)                                  a throwaway run first, so no timed pass pays for loading

Plain decoding is the engine with no drafter: every step feeds the pending token alone and takes the target's
own next token, the baseline speculative decoding must reproduce exactly (greedy) or in law (sampled). Written
once, in the engine's step, so a plain run and a speculative one differ only by the drafter.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .drafting import Drafter, DraftPolicy, policy_for
from .model import Model
from .sampling import SamplingParams
from .scheduler import EngineOptions, check_lengths
from .sequence import SeqResult, SpecStats
from .speculate import Engine


@dataclass
class SpecResult:
    tokens: list[int]  # emitted after the prompt
    stats: SpecStats
    state: object  # the target's ModelState: prompt + tokens[:-1] fed
    marks: list[str] = field(default_factory=list)  # per token: target (first), accepted, correction, bonus


def speculative_generate(model: Model, drafter: Drafter | None, prompt: Sequence[int], max_new: int,
                         draft_n: int | None = None, params: SamplingParams = SamplingParams(),
                         rng: np.random.Generator | None = None, stop_ids: Sequence[int] = (),
                         policy: DraftPolicy | None = None,
                         on_emit: Callable[[list[int], list[str]], None] | None = None,
                         chunked_prefill: bool = False) -> SpecResult:
    """Generate up to max_new tokens after `prompt`: the engine with one slot. drafter None: plain decoding; else
    draft_n drafts per verify pass (default 3), or as many as `policy` plans each step
    (tinyspec.fast.adaptive.AdaptiveDraftLength; its k_max bounds them). on_emit(tokens, marks): called with each
    step's emitted tokens as they are decided."""
    policy = policy_for(0 if drafter is None and policy is None else draft_n, policy)
    prompt = [int(t) for t in prompt]
    check_lengths(model, len(prompt), max_new, policy.k_max)
    seq = SeqResult(0, prompt)
    engine = Engine(model, drafter, policy, EngineOptions(params=params, stop_ids=tuple(stop_ids),
                                                          chunked_prefill=chunked_prefill),
                    on_emit=(lambda _, tokens, marks: on_emit(tokens, marks)) if on_emit else None)
    engine.add(seq, max_new, rng if rng is not None else np.random.default_rng())
    if seq.error is not None:
        raise ValueError(seq.error)
    while not engine.done():
        engine.step()
    done = engine.finished[0]
    done.stats.phase_s, done.stats.adaptive = engine.phase_s, policy.summary()
    return SpecResult(seq.tokens, done.stats, done.state, seq.marks)


def generate(model: Model, prompt_tokens, max_new: int, params: SamplingParams = SamplingParams(),
             rng: np.random.Generator | None = None, stop_ids: Sequence[int] = (), chunked_prefill: bool = False,
             drafter: Drafter | None = None, draft_n: int | None = None, policy: DraftPolicy | None = None,
             on_emit: Callable[[list[int], list[str]], None] | None = None) -> SeqResult:
    """Generate up to max_new tokens after prompt_tokens (speculative_generate, as a SeqResult with its stats). A
    stop id is emitted and then ends generation. chunked_prefill (plain only): the prompt's GDN layers in their
    chunked form (gdn.py), faster for long prompts, equal to the scan to float rounding."""
    prompt = [int(t) for t in prompt_tokens]
    spec = speculative_generate(model, drafter, prompt, max_new, draft_n, params, rng, stop_ids, policy, on_emit,
                                chunked_prefill)
    return SeqResult(0, prompt, spec.tokens, spec.marks, spec.stats.as_dict() | {"prompt_tokens": len(prompt)})


WARM_PROMPT = (1, 2, 3, 1, 2, 3)  # repeats itself, so prompt lookup drafts too


def warm_up(model: Model, drafter: Drafter | None = None, k: int = 2, pooled: bool = False) -> float:
    """Run what a generation runs once, on throwaway state, and return its seconds: a process's first pass of each
    kind pays for loading its kernels (the cpu backend: ~0.4 s of Numba reading its disk cache for the shipped model,
    or the compile itself on a cold cache; cuda: compiles and graph captures), and a run timed after this reports
    its prefill and its tokens/s without that. A prefill, a decode step, a verify pass with the model's ring and a
    rollback from it, then a 4-token generation of the engine with a fresh drafter (drafter.another(): the
    caller's is untouched) drafting k a step; pooled: two sequences in one pool of KV blocks, as batch and serve run."""
    t0 = time.perf_counter()
    state, ring = model.new_state(), model.new_ring(2)
    model.forward(list(WARM_PROMPT[:2]), state)
    model.forward(list(WARM_PROMPT[2:4]), state, ring=ring)
    ring.restore(state, 0)
    options = EngineOptions(slots=2, run_length=len(WARM_PROMPT) + 4 + k + 2) if pooled else EngineOptions()
    engine = Engine(model, drafter.another() if drafter is not None else None, policy_for(k if drafter else 0, None),
                    options)
    for i in range(options.slots):
        engine.add(SeqResult(i, list(WARM_PROMPT)), 4, np.random.default_rng(i))
    while not engine.done():
        engine.step()
    return time.perf_counter() - t0
