"""Speculative decoding: draft k tokens cheaply, verify them with ONE target pass, keep what agrees.

The loop (pending = the next token, already chosen but not yet fed to the target):

    Step 1  draft    d_1..d_k = drafter.propose(pending)            with proposal laws q_1..q_k
    Step 2  verify   logits = target.forward([pending, d_1..d_k])   one pass of k+1 tokens ("folded":
                     row i is the target's law p_i for the token after input i, so row k doubles as
                     the next step's logits and there is never a separate "commit" forward)
    Step 3  accept   keep d_1..d_m while the rule accepts (greedy: d_i == argmax p_{i-1}); then a
                     correction from the residual law, or, if all k were kept, a bonus token from p_k
    Step 4  rollback the pass fed k+1 tokens but only pending + d_1..d_m are kept: restore every GDN
                     layer from the snapshot ring slot m (written during the pass, no recompute; or,
                     with a ReplayRing, rescan the m+1 kept tokens from the pre-pass memory), truncate
                     the KV caches, tell the drafter which tokens were kept
    Step 5  emit     d_1..d_m and the new token, which becomes the next pending token

Stops (EOS, stop ids, the token cap) can land inside the emitted run: the run is cut there and the
rollback keeps exactly the tokens before the cut, so every piece of state (target KV, GDN, MTP KV,
drafter) always equals that of a sequence that plainly decoded the emitted tokens. The final
emitted token is never fed (as in plain generation), and a pending token is never redrawn.

Lossless. Greedy output equals plain greedy output token for token because the target computes
each verify row bit for bit as a one-token decode would (batch invariance, see ops.linear,
attention.py and gdn.py) and greedy acceptance is an equality test. Sampled output has exactly the
target's law by the rejection rule (spec_sampling.py).

Drafter protocol (lookup.LookupDrafter, mtp.MTPDrafter, draft.DraftModelDrafter):
    start(prompt, hidden)                  after the target prefilled the prompt (hidden [n, D] post-norm)
    propose(pending, k, params, rng)       -> (drafts [<= k], q rows: a law over the vocab or None = one-hot)
    commit(fed, hidden)                    the target kept these tokens (fed[0] = pending) with hidden rows

Official implementation: llama.cpp examples/speculative-simple + common/speculative.cpp
(../shared/reference/qwen35.md section 5). Papers: Leviathan et al. 2023, Chen et al. 2023.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

from .fast.adaptive import AdaptiveDraftLength
from .model import Model
from .sampling import SamplingParams, pick, probs_from_logits
from .spec_sampling import verify_greedy, verify_step

# Drafts per verify pass, at most. The ring holds a state per draft (19 MB each at the 0.8B shape), and a
# pass of more drafts never pays: at acceptance a a step emits at most 1 / (1 - a) tokens (20 at a = 0.95).
MAX_DRAFT = 64


def check_lengths(model: Model, n_prompt: int, max_new: int, draft_n: int = 0) -> None:
    """Reject a generation that cannot run before anything is allocated: an empty prompt, a negative or
    too long draft, or a prompt and output that do not fit the model's context (qwen35.context_length)."""
    if n_prompt < 1:
        raise ValueError("the prompt is empty: give at least one token")
    if max_new < 0:
        raise ValueError(f"max_new (tokens to generate) must be >= 0, got {max_new}")
    if not 0 <= draft_n <= MAX_DRAFT:
        raise ValueError(f"the draft length must be in 0..{MAX_DRAFT} tokens per verify pass, got {draft_n}")
    n_ctx = model.cfg.n_ctx
    if n_prompt + max_new > n_ctx:
        room = f"at most {n_ctx - n_prompt} new tokens after this prompt" if n_prompt < n_ctx else "a shorter prompt"
        raise ValueError(f"a prompt of {n_prompt} tokens and {max_new} new tokens exceed the model's context length "
                         f"{n_ctx} (context_length in the file): ask for {room}")


class Drafter(Protocol):
    def start(self, prompt: list[int], hidden: np.ndarray) -> None: ...

    def propose(self, pending: int, k: int, params: SamplingParams,
                rng: np.random.Generator) -> tuple[list[int], list[np.ndarray | None]]: ...

    def commit(self, fed: list[int], hidden: np.ndarray) -> None: ...


@dataclass
class SpecStats:
    draft_n: int
    steps: int = 0  # verify passes
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # [i] = steps whose draft i+1 was accepted
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_length_histogram: dict[int, int] = field(default_factory=dict)  # accepted drafts per step -> steps
    phase_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(("prefill", "draft", "verify", "sample", "rollback"), 0.0))
    rollbacks: int = 0
    wall_s: float = 0.0
    adaptive: dict | None = None  # the adaptive policy's chosen k's and estimates (adaptive.py)

    def record(self, n_drafted: int, n_accepted: int) -> None:
        self.steps += 1
        self.drafted += n_drafted
        self.accepted += n_accepted
        for i in range(n_drafted):
            self.drafted_per_position[i] += 1
            self.accepted_per_position[i] += i < n_accepted
        self.accepted_length_histogram[n_accepted] = self.accepted_length_histogram.get(n_accepted, 0) + 1

    def as_dict(self) -> dict:
        decode_s = self.wall_s - self.phase_s["prefill"]
        return {
            "draft_n": self.draft_n, "steps": self.steps, "drafted": self.drafted, "accepted": self.accepted,
            "emitted": self.emitted,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "mean_accepted_length": (self.accepted + self.steps) / self.steps if self.steps else 0.0,
            "accepted_per_position": [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)],
            "accepted_length_histogram": {str(k): v for k, v in sorted(self.accepted_length_histogram.items())},
            "phase_ms": {k: 1000 * v for k, v in self.phase_s.items()},
            "rollbacks": self.rollbacks,
            "tokens_per_s": self.emitted / decode_s if decode_s > 0 else 0.0,
        } | ({"adaptive": self.adaptive} if self.adaptive is not None else {})


@dataclass
class SpecResult:
    tokens: list[int]  # emitted after the prompt
    stats: SpecStats
    state: object  # the target's ModelState: prompt + tokens[:-1] fed
    marks: list[str] = field(default_factory=list)  # per token: target (first), accepted, correction, bonus


def speculative_generate(model: Model, drafter: Drafter, prompt: Sequence[int], max_new: int, draft_n: int = 3,
                         params: SamplingParams = SamplingParams(), rng: np.random.Generator | None = None,
                         stop_ids: Sequence[int] = (), adaptive: AdaptiveDraftLength | None = None,
                         on_emit: Callable[[list[int], list[str]], None] | None = None) -> SpecResult:
    """Generate up to max_new tokens after `prompt`, drafting up to draft_n tokens per verify pass.

    adaptive: choose each step's k in 0..draft_n with this policy (adaptive.py) instead of always draft_n.
    on_emit(tokens, marks): called with each step's emitted tokens as they are decided (streamed output)."""
    prompt = [int(t) for t in prompt]
    check_lengths(model, len(prompt), max_new, draft_n)
    rng = rng if rng is not None else np.random.default_rng()
    stops = set(int(t) for t in stop_ids)
    stats = SpecStats(draft_n, accepted_per_position=[0] * draft_n, drafted_per_position=[0] * draft_n)
    clock = time.perf_counter
    t_start = clock()

    # the policy lends the drafter its rules for this generation, given back at the end: a drafter that reports
    # how sure it is stops where the policy says (adaptive.py keep_drafting), and one that can withdraw a guess
    # does so under the policy's floor (mtp.py p_floor)
    lent = {}
    if adaptive is not None and adaptive.use_confidence and hasattr(drafter, "keep_going"):
        lent["keep_going"], adaptive.by_confidence = adaptive.keep_drafting, True
    if adaptive is not None and hasattr(drafter, "p_floor"):
        lent["p_floor"] = max(drafter.p_floor, adaptive.floor)
    own = {name: getattr(drafter, name) for name in lent}  # the drafter as it came (it may run again alone)
    for name, value in lent.items():
        setattr(drafter, name, value)
    state = model.new_state()
    ring = model.new_ring(draft_n + 1)  # allocated once for the whole generation, where the state lives
    logits, hidden = model.forward(np.array(prompt), state)
    drafter.start(prompt, hidden)
    stats.phase_s["prefill"] = clock() - t_start
    out: list[int] = []
    if max_new == 0:
        for name, value in own.items():
            setattr(drafter, name, value)
        return SpecResult(out, stats, state)
    pending = pick(logits[-1], params, rng)
    out.append(pending)
    marks = ["target"]
    if on_emit is not None:
        on_emit([pending], ["target"])

    while pending not in stops and len(out) < max_new:
        # Step 1: draft, never more than the cap leaves room for (each step also emits one target token)
        t0 = t_step = clock()
        room = min(draft_n, max_new - len(out) - 1)
        k = adaptive.choose(room) if adaptive is not None else room
        drafts, q_rows = drafter.propose(pending, k, params, rng) if k else ([], [])
        # Step 2: one target pass over [pending, drafts]; the ring receives the state after each token
        t1 = clock()
        batch = [pending] + [int(d) for d in drafts]
        logits, hidden = model.forward(np.array(batch), state, ring=ring if drafts else None)  # 1 token: kept
        # Step 3: accept the longest prefix the rule keeps, then a correction or a bonus token
        t2 = clock()
        if params.greedy:  # the same tokens as verify_step on one-hot laws, straight from the logits
            n_accepted, new_token = verify_greedy(logits, batch[1:])
        else:
            p_rows = [probs_from_logits(row, params) for row in logits]
            n_accepted, new_token = verify_step(p_rows, batch[1:], list(q_rows), rng)
        emitted = batch[1 : 1 + n_accepted] + [new_token]
        for j, token in enumerate(emitted):  # a stop inside the run cuts it there
            if token in stops:
                emitted = emitted[: j + 1]
                break
        emitted = emitted[: max_new - len(out)]
        # Step 4: keep pending + the emitted tokens but the last one (it is the next pending token)
        t3 = clock()
        n_keep = len(emitted)
        if n_keep < len(batch):
            ring.restore(state, n_keep - 1)
            stats.rollbacks += 1
        t4 = clock()
        drafter.commit(batch[:n_keep], hidden[:n_keep])  # drafter bookkeeping counts as drafting time
        t0 -= clock() - t4
        # Step 5: emit
        out.extend(emitted)
        kinds = ["accepted"] * n_accepted + ["bonus" if n_accepted == len(drafts) else "correction"]
        marks.extend(kinds[: len(emitted)])
        pending = emitted[-1]
        stats.record(len(drafts), n_accepted)
        if adaptive is not None:
            adaptive.update(len(drafts), n_accepted, clock() - t_step, getattr(drafter, "probs", None) if drafts else None,
                            withdrawn=bool(k and getattr(drafter, "withdrawn", False)))
        for phase, dt in zip(("draft", "verify", "sample", "rollback"), (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            stats.phase_s[phase] += dt
        if on_emit is not None:
            on_emit(emitted, marks[len(marks) - len(emitted):])
    stats.emitted = len(out)
    stats.wall_s = clock() - t_start
    stats.adaptive = adaptive.as_dict() if adaptive is not None else None
    for name, value in own.items():
        setattr(drafter, name, value)
    return SpecResult(out, stats, state, marks)
