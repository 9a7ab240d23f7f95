"""Speculative decoding: draft k tokens cheaply, verify them with ONE target pass, keep what agrees.

The loop (pending = the next token, already chosen but not yet fed to the target):

    Step 1  draft    d_1..d_k = drafter.propose(pending, k)         with proposal laws q_1..q_k (k from
                     the policy's plan; a drafter may stop early or propose nothing)
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

Where the numbers are (issue 27): greedy, the target's logits and hidden rows stay where the model computes
(Model.forward(to_host=False)): the rule of step 3 is the kernels' accept_greedy, which on the cuda backend
runs on the device and brings back the run's two ints (fast/cuda_accept.py), and the drafters take the hidden
rows where they are. The greedy drafts of MTP and the draft model stay on the device while drafting, and the
loop asks them to stay there (propose(..., on_device=True), from a drafter whose drafts_on_device is True):
the verify pass is fed [pending] + those device ids, and accept_greedy brings back the run and the drafts in
one transfer ([n, token, d_1..d_k]), so every greedy verify step costs one sync. Without asking, propose
brings its drafts to the host once, at the end of drafting (fetch_drafts: what notebooks and batch.py read).
A drafter asked for each draft's probability (p_min, a floor, a stop rule's keep_going), with a draft
vocabulary, or sampling, reads on the host per draft: one sync each. Sampled, the laws are read on the host.

Stops (EOS, stop ids, the token cap) can land inside the emitted run: the run is cut there and the
rollback keeps exactly the tokens before the cut, so every piece of state (target KV, GDN, MTP KV,
drafter) always equals that of a sequence that plainly decoded the emitted tokens. The final
emitted token is never fed (as in plain generation), and a pending token is never redrawn.

Lossless. Greedy output equals plain greedy output token for token because the target computes
each verify row bit for bit as a one-token decode would (batch invariance, see ops.linear,
attention.py and gdn.py) and greedy acceptance is an equality test. Sampled output has exactly the
target's law by the rejection rule (spec_sampling.py).

Two objects are handed to the loop, and everything that crosses between them is in these signatures:

    Drafter (lookup.LookupDrafter, mtp.MTPDrafter, draft.DraftModelDrafter)
        start(prompt, hidden, k_max)       after the target prefilled the prompt (hidden [n, D] post-norm,
                                           where the model computes when greedy: a device array on cuda)
        propose(pending, k, params, rng, stop=None) -> Draft(tokens [<= k], q_rows, probs, withdrawn)
                                           tokens: host ints (a drafter that drafts on the device fetches
                                           them once, at the end: fetch_drafts)
        propose(..., on_device=True)       asked only of a drafter whose drafts_on_device is True, only when
                                           greedy: -> Draft(tokens=None, ids [k'] where its model computes)
                                           if it drafted there (or host tokens, if it did not); the loop
                                           fills tokens from the verify step's one transfer (with_tokens)
        commit(fed, hidden)                the target kept these tokens (fed[0] = pending) with hidden rows
        stops_by_confidence                True if propose honours stop.keep_going (it knows each draft's p)
        drafts_on_device                   True if propose takes on_device (mtp.MTPDrafter, DraftModelDrafter)
    DraftPolicy (FixedDraftLength here; tinyspec.fast.adaptive.AdaptiveDraftLength in the wing)
        k_max                              drafts a step at most (sizes the snapshot ring)
        plan(room) -> Plan(k, stop)        how many drafts this step, and when a drafter may stop earlier
        observe(draft, n_accepted, step_s) what the step gave and cost
        summary() -> dict | None           for the stats

k is always a number of drafts; a verify pass feeds k + 1 tokens (the pending one and the drafts).
Many sequences at once: batch.py runs these steps for every slot of a batch in one verify pass (the same
accept and token_marks per slot; MTPDrafter and DraftModelDrafter draft through coroutines, run_alone here).

Official implementation: llama.cpp examples/speculative-simple + common/speculative.cpp
(docs/qwen35.md section 5). Papers: Leviathan et al. 2023, Chen et al. 2023.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol, Sequence

import numpy as np

from .kernels import NUMPY, Kernels
from .model import Model
from .sampling import SamplingParams, pick, probs_from_logits
from .spec_sampling import verify_step

# Drafts per verify pass, at most. The ring holds a state per draft (19 MB each at the 0.8B shape), and a
# pass of more drafts never pays: at acceptance a a step emits at most 1 / (1 - a) tokens (20 at a = 0.95).
MAX_DRAFT = 64


def check_draft_length(k: int, what: str = "the draft length", low: int = 0) -> int:
    """k drafts a pass, checked against MAX_DRAFT: the one place the limit is enforced (the CLI calls it with
    its flag's name, and low = 1 where 0 would mean nothing, before it loads a model)."""
    if not isinstance(k, (int, np.integer)) or not low <= k <= MAX_DRAFT:
        raise ValueError(f"{what} must be in {low}..{MAX_DRAFT} drafts per verify pass, got {k}")
    return int(k)


def check_lengths(model: Model, n_prompt: int, max_new: int, k_max: int = 0) -> None:
    """Reject a generation that cannot run before anything is allocated: an empty prompt, a negative or
    too long draft, or a prompt and output that do not fit the model's context (qwen35.context_length)."""
    if n_prompt < 1:
        raise ValueError("the prompt is empty: give at least one token")
    if max_new < 0:
        raise ValueError(f"max_new (tokens to generate) must be >= 0, got {max_new}")
    check_draft_length(k_max)
    n_ctx = model.cfg.n_ctx
    if n_prompt + max_new > n_ctx:
        room = f"at most {n_ctx - n_prompt} new tokens after this prompt" if n_prompt < n_ctx else "a shorter prompt"
        raise ValueError(f"a prompt of {n_prompt} tokens and {max_new} new tokens exceed the model's context length "
                         f"{n_ctx} (context_length in the file): ask for {room}")


@dataclass(frozen=True)
class StopRule:
    """When a drafter that knows how sure it is (Drafter.stops_by_confidence) stops short of k drafts.

    keep_going(probs): after each draft, given the probability the drafter gave each draft so far: draft
    another? (the adaptive policy's keep_drafting). floor (greedy only): a draft the drafter gives less than
    this is withdrawn, not proposed, and drafting stops (Draft.withdrawn says so). Honoured by the drafters
    that can (mtp.MTPDrafter both; draft.DraftModelDrafter keep_going only); others ignore the rule."""
    keep_going: Callable[[list[float]], bool] | None = None
    floor: float = 0.0


@dataclass(frozen=True)
class Draft:
    """What a drafter proposes for one step: everything the loop and the policy read.

    The drafts are in one of two places, never both: `tokens`, host ints (what propose returns by default), or
    `ids`, left where the drafter's model computes (only when the engine asked for it, propose(on_device=True),
    and then tokens is None until the verify step's one transfer brings them back: with_tokens)."""
    tokens: list[int] | None = field(default_factory=list)  # d_1..d_k' (k' <= k); None while they are in `ids`
    q_rows: list = field(default_factory=list)  # per draft its proposal law q [N], or None: one-hot on it
    probs: list[float] = field(default_factory=list)  # per draft the drafter's probability of it, if it knows
    withdrawn: bool = False  # a draft was made, found under the floor and not proposed (drafting stopped there)
    ids: object = None  # [k'] int64 where the drafter's model computes (a device array on cuda), or None

    @property
    def n(self) -> int:
        """Drafts proposed, known on the host wherever they are (an array's shape needs no transfer)."""
        return len(self.tokens) if self.tokens is not None else int(self.ids.shape[0])

    def with_tokens(self, tokens: list[int]) -> Draft:
        """This draft with its drafts as host ints (fetched with the verify step's run): what the loop reads after."""
        return replace(self, tokens=[int(t) for t in tokens], ids=None)


NO_DRAFT = Draft()


def fetch_drafts(ids: list, model: Model) -> list[int]:  # k [1] ids where `model` computes -> k host ints
    """The greedy drafts a drafter made where its model computes (mtp.py, draft.py: each an argmax, fed to the
    next pass from there) brought to the host in one transfer: drafting's one sync on the cuda backend, a
    plain read on the NumPy ones (their device is the host). What propose does by default; asked for
    on_device=True, a drafter returns them as Draft.ids instead (device_draft)."""
    return [int(t) for t in model.to_host(np.concatenate(ids))] if ids else []


def device_draft(ids: list, q_rows: list, probs: list, withdrawn: bool = False) -> Draft:
    """A Draft whose k' >= 1 greedy drafts (each a [1] id where the drafter's model computes) stay there as one
    [k'] array: no transfer; the engine feeds them to the verify pass and fetches them with its run."""
    return Draft(None, q_rows, probs, withdrawn, ids=np.concatenate(ids))


@dataclass(frozen=True)
class Plan:
    k: int  # drafts at most this step (0: a plain decoding step)
    stop: StopRule | None = None


class Drafter(Protocol):
    stops_by_confidence: bool
    drafts_on_device: bool  # True: propose takes on_device and may then return Draft.ids (the module docstring)

    def start(self, prompt: list[int], hidden: np.ndarray, k_max: int) -> None: ...

    def propose(self, pending: int, k: int, params: SamplingParams, rng: np.random.Generator,
                stop: StopRule | None = None) -> Draft: ...  # (..., on_device: bool = False) if drafts_on_device

    def commit(self, fed: list[int], hidden: np.ndarray) -> None: ...


def run_alone(drafting, step: Callable[[list], list]) -> Draft:
    """Run a drafting coroutine (MTPDrafter.drafting, DraftModelDrafter.drafting) to the Draft it returns: each
    pass it yields is made by step([ask]) -> [answer] and sent back. (batch.run_together makes the passes of
    many sequences' coroutines as one pass per round.)"""
    try:
        ask = next(drafting)
        while True:
            ask = drafting.send(step([ask])[0])
    except StopIteration as done:
        return done.value


class DraftPolicy(Protocol):
    k_max: int

    def plan(self, room: int) -> Plan: ...

    def observe(self, draft: Draft, n_accepted: int, step_s: float) -> None: ...

    def summary(self) -> dict | None: ...


@dataclass
class FixedDraftLength:
    """The textbook policy: k drafts every step (fewer only where max_new leaves less room)."""
    k_max: int

    def __post_init__(self):
        self.k_max = check_draft_length(self.k_max)

    def plan(self, room: int) -> Plan:
        return Plan(min(self.k_max, room))

    def observe(self, draft: Draft, n_accepted: int, step_s: float) -> None:
        pass

    def summary(self) -> None:
        return None


@dataclass
class SpecStats:
    k_max: int  # drafts a step at most (the policy's)
    steps: int = 0  # target passes after the prefill (a plain step, no drafts, is one too)
    plain_steps: int = 0  # of which drafted nothing (k = 0: the policy's choice, or no room left)
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # [i] = steps whose draft i+1 was accepted
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_length_histogram: dict[int, int] = field(default_factory=dict)  # accepted drafts per step -> steps
    phase_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    rollbacks: int = 0
    wall_s: float = 0.0
    adaptive: dict | None = None  # the policy's summary (the adaptive policy's chosen k's and estimates)

    def __post_init__(self):
        self.accepted_per_position = self.accepted_per_position or [0] * self.k_max
        self.drafted_per_position = self.drafted_per_position or [0] * self.k_max

    def record(self, n_drafted: int, n_accepted: int) -> None:
        self.steps += 1
        self.plain_steps += n_drafted == 0
        self.drafted += n_drafted
        self.accepted += n_accepted
        for i in range(n_drafted):
            self.drafted_per_position[i] += 1
            self.accepted_per_position[i] += i < n_accepted
        self.accepted_length_histogram[n_accepted] = self.accepted_length_histogram.get(n_accepted, 0) + 1

    def as_dict(self) -> dict:
        decode_s = self.wall_s - self.phase_s["prefill"]
        return {
            "k_max": self.k_max, "steps": self.steps, "plain_steps": self.plain_steps, "drafted": self.drafted,
            "accepted": self.accepted,
            "emitted": self.emitted,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "mean_accepted_length": (self.accepted + self.steps) / self.steps if self.steps else 0.0,
            "accepted_per_position": [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)],
            "accepted_length_histogram": {str(k): v for k, v in sorted(self.accepted_length_histogram.items())},
            "phase_ms": {k: 1000 * v for k, v in self.phase_s.items()},
            "rollbacks": self.rollbacks,
            "tokens_per_s": self.emitted / decode_s if decode_s > 0 else 0.0,
        } | ({"adaptive": self.adaptive} if self.adaptive is not None else {})


PHASES = ("prefill", "draft", "verify", "sample", "rollback")


class PhaseClock:
    """Seconds per phase: lap(name) charges the time since the previous lap to `name`; step() is the time since
    the step began (what a policy is told a step cost)."""

    def __init__(self, phase_s: dict[str, float]):
        self.phase_s, self.now = phase_s, time.perf_counter
        self.t_start = self.t_step = self.t_lap = self.now()

    def begin_step(self) -> None:
        self.t_step = self.t_lap = self.now()

    def lap(self, phase: str) -> None:
        t = self.now()
        self.phase_s[phase] += t - self.t_lap
        self.t_lap = t

    def step(self) -> float:
        return self.now() - self.t_step

    def total(self) -> float:
        return self.now() - self.t_start


def cut_at_stop(emitted: list[int], stops: set[int], room: int) -> list[int]:
    """A stop token inside the run ends it there (emitted, then nothing); max_new leaves `room` tokens."""
    for j, token in enumerate(emitted):
        if token in stops:
            return emitted[: min(j + 1, room)]
    return emitted[:room]


def accept(logits: np.ndarray, fed: list[int], draft: Draft, params: SamplingParams,
           rng: np.random.Generator, kern: Kernels = NUMPY) -> tuple[int, int]:
    """Step 3 on one sequence's verify rows (logits [k+1, N] for fed = [pending, d_1..d_k]): the number of drafts
    the rule keeps and the target's own next token (a correction, or a bonus after all k). Greedy, the logits
    may be where the model computes and kern.accept_greedy reads them there; sampled, they are host rows."""
    if params.greedy:  # the same tokens as verify_step on one-hot laws, straight from the logits
        n_accepted, token, _ = kern.accept_greedy(logits, fed[1:])
        return n_accepted, token
    p_rows = [probs_from_logits(row, params) for row in logits]
    return verify_step(p_rows, fed[1:], list(draft.q_rows), rng)


def token_marks(draft: Draft, n_accepted: int) -> list[str]:
    """How each token of a step's run was produced: accepted drafts, then the target's own token."""
    last = "target" if not draft.tokens else "bonus" if n_accepted == len(draft.tokens) else "correction"
    return ["accepted"] * n_accepted + [last]  # a plain step's token is the target's own, as in plain decoding


@dataclass
class SpecResult:
    tokens: list[int]  # emitted after the prompt
    stats: SpecStats
    state: object  # the target's ModelState: prompt + tokens[:-1] fed
    marks: list[str] = field(default_factory=list)  # per token: target (first), accepted, correction, bonus


def speculative_generate(model: Model, drafter: Drafter, prompt: Sequence[int], max_new: int,
                         draft_n: int | None = None, params: SamplingParams = SamplingParams(),
                         rng: np.random.Generator | None = None, stop_ids: Sequence[int] = (),
                         policy: DraftPolicy | None = None,
                         on_emit: Callable[[list[int], list[str]], None] | None = None) -> SpecResult:
    """Generate up to max_new tokens after `prompt`, with draft_n drafts per verify pass (default 3), or as many
    as `policy` plans each step (tinyspec.fast.adaptive.AdaptiveDraftLength; its k_max bounds them).
    on_emit(tokens, marks): called with each step's emitted tokens as they are decided (streamed output)."""
    policy = _policy(draft_n, policy)
    prompt, stops = [int(t) for t in prompt], {int(t) for t in stop_ids}
    check_lengths(model, len(prompt), max_new, policy.k_max)
    rng = rng if rng is not None else np.random.default_rng()
    stats = SpecStats(policy.k_max)
    clock = PhaseClock(stats.phase_s)
    state, ring = model.new_state(), model.new_ring(policy.k_max + 1)  # the ring: allocated once, k+1 slots
    on_host = not params.greedy  # greedy: logits and hidden stay where the model computes (the module docstring)
    logits, hidden = model.forward(np.array(prompt), state, to_host=on_host)  # prefill: [n, N], [n, D]
    drafter.start(prompt, hidden, policy.k_max)
    clock.lap("prefill")
    out, marks = [], []
    pending = pick(logits[-1], params, rng) if max_new else None  # chosen, not yet fed to the target
    if pending is not None:
        out, marks = [pending], ["target"]
        if on_emit:
            on_emit([pending], ["target"])
    while out and pending not in stops and len(out) < max_new:
        clock.begin_step()
        # Step 1: draft (never more than max_new leaves room for: each step also emits the target's own token)
        plan = policy.plan(min(policy.k_max, max_new - len(out) - 1))
        draft = propose(drafter, pending, plan, params, rng)
        clock.lap("draft")
        # Step 2: verify: one target pass over [pending, d_1..d_k]; the ring receives the state after each token
        if draft.tokens is None:  # greedy drafts left on the device: fed from there, fetched with the run
            ids = model.to_device(draft.ids)  # [k] (a no-op when drafter and target share a device)
            fed_ids = np.concatenate([model.to_device(np.array([pending])), ids])  # [k+1] (embed_rows: unchecked)
            logits, hidden = model.forward(fed_ids, state, ring=ring, to_host=False)  # [k+1, N], [k+1, D]
            clock.lap("verify")
            # Step 3, greedy: the rule where the logits are; the run and the drafts come back in one transfer
            n_accepted, new_token, tokens = model.kernels.accept_greedy(logits, ids)
            draft = draft.with_tokens(tokens)
            fed = [pending] + draft.tokens
        else:
            fed = [pending] + [int(d) for d in draft.tokens]
            logits, hidden = model.forward(np.array(fed), state, ring=ring if draft.tokens else None,
                                           to_host=on_host)  # [k+1, N], [k+1, D]
            clock.lap("verify")
            # Step 3: accept the longest prefix the rule keeps, then the target's own token (a correction or a bonus)
            n_accepted, new_token = accept(logits, fed, draft, params, rng, model.kernels)
        emitted = cut_at_stop(fed[1 : 1 + n_accepted] + [new_token], stops, max_new - len(out))
        clock.lap("sample")
        # Step 4: rollback: keep pending + the emitted tokens but the last one (the next pending token)
        n_keep = len(emitted)
        if n_keep < len(fed):
            ring.restore(state, n_keep - 1)
            stats.rollbacks += 1
        clock.lap("rollback")
        drafter.commit(fed[:n_keep], hidden[:n_keep])
        clock.lap("draft")  # the drafter's bookkeeping counts as drafting
        # Step 5: emit
        kinds = token_marks(draft, n_accepted)
        out += emitted
        marks += kinds[:n_keep]
        pending = emitted[-1]
        stats.record(len(draft.tokens), n_accepted)
        policy.observe(draft, n_accepted, clock.step())
        if on_emit:
            on_emit(emitted, kinds[:n_keep])
    stats.emitted, stats.wall_s, stats.adaptive = len(out), clock.total(), policy.summary()
    return SpecResult(out, stats, state, marks)


def propose(drafter: Drafter, pending: int, plan: Plan, params: SamplingParams, rng: np.random.Generator) -> Draft:
    """Step 1 as the loop asks for it: nothing when the plan drafts nothing; greedy, from a drafter that can
    (drafts_on_device), the drafts left where its model computes (Draft.ids: the verify step feeds them from
    there and brings them back with its run, one transfer for both); otherwise host tokens."""
    if not plan.k:
        return NO_DRAFT
    if params.greedy and drafter.drafts_on_device:
        return drafter.propose(pending, plan.k, params, rng, plan.stop, on_device=True)
    return drafter.propose(pending, plan.k, params, rng, plan.stop)


def _policy(draft_n: int | None, policy: DraftPolicy | None) -> DraftPolicy:
    """draft_n alone: a fixed k (3 if neither is given); a policy: its k_max, which a draft_n given too must equal."""
    if policy is None:
        return FixedDraftLength(3 if draft_n is None else draft_n)
    if draft_n is not None and draft_n != policy.k_max:
        raise ValueError(f"draft_n={draft_n} and a policy of k_max={policy.k_max} disagree: give one of them")
    return policy
