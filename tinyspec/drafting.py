"""The drafting contract: what a drafter proposes, how a policy plans, and how many sequences draft together.

The speculative engine (speculate.py) and every drafter (lookup.py, mtp.py, draft.py, the wing's synthetic
drafter) import this module and nothing of each other. Everything that crosses between them is here:

    Draft        what a drafter proposes for one step: d_1..d_k' (k' <= k) with, per draft, the law q it was
                 drawn from (None: one-hot, a greedy or deterministic draft) and the drafter's probability of it
    StopRule     when a drafter that knows how sure it is stops short of k drafts
    Plan         what a policy asks of one sequence this step: k drafts at most, and a StopRule
    Drafter      the protocol every drafter follows, one drafter per sequence (below)
    DraftPolicy  the protocol every policy follows: k per sequence per step, told what each step gave and cost

A drafter's proposing is a coroutine. Drafting k tokens with a model (the MTP head, a draft model) is k passes
of that model, one per draft depth; a batch of B sequences wants those passes made together, one pass of B rows
per depth, not B passes of one row. So a drafter does not run its model itself: `drafting(...)` is a generator
that yields each pass it needs (an object only its own `draft_pass` reads), is sent the answer, and returns the
Draft. `run_alone` drives one sequence's coroutine; `run_together` drives many in lockstep, each round ONE
`draft_pass` over every sequence still drafting. A drafter with no model (lookup) returns from its coroutine at
once (`no_passes`). A coroutine draws from its own random stream in its own order and the passes are
batch-invariant, so a sequence's Draft is the same alone or together.

Where the drafts are. A greedy draft over the whole vocabulary is an argmax where the drafter's model computes
(a device array on the cuda backend), and its next pass embeds it from there. Asked `on_device=True` (the engine
asks when greedy), such a drafter leaves its k' drafts there as one array, `Draft.ids`, with `Draft.tokens`
None: the engine feeds them to the verify pass from there, and its greedy rule brings them back with the run, in
one transfer (Draft.with_tokens). A drafter that drafts on the host (lookup, sampled drafts, a draft vocabulary)
ignores on_device and returns host tokens.

k is always a number of drafts; a verify pass feeds k + 1 tokens (the pending one and the drafts). A drafter may
propose a tree instead of a chain (Draft.parents, tree.py): k nodes, each the guess for the token after its parent
row, the same k + 1 rows; the engine verifies it in one pass and keeps a path (spec_tree.py). What the drafter is
then told (commit) is the kept path's tokens and hidden rows, as for a chain.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Generator, Protocol

import numpy as np

from .sampling import SamplingParams

# Drafts per verify pass, at most. The ring holds a state per draft (19 MB each at the 0.8B shape), and a
# pass of more drafts never pays: at acceptance a a step emits at most 1 / (1 - a) tokens (20 at a = 0.95).
MAX_DRAFT = 64


def check_draft_length(k: int, what: str = "the draft length", low: int = 0) -> int:
    """k drafts a pass, checked against MAX_DRAFT: the one place the limit is enforced (the CLI calls it with
    its flag's name, and low = 1 where 0 would mean nothing, before it loads a model)."""
    if not isinstance(k, (int, np.integer)) or not low <= k <= MAX_DRAFT:
        raise ValueError(f"{what} must be in {low}..{MAX_DRAFT} drafts per verify pass, got {k}")
    return int(k)


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
    """What a drafter proposes for one step: everything the engine and the policy read.

    The drafts are in one of two places, never both: `tokens`, host ints, or `ids`, left where the drafter's
    model computes (only when asked, drafting(on_device=True); tokens is then None until the verify step's
    one transfer brings them back: with_tokens)."""
    tokens: list[int] | None = field(default_factory=list)  # d_1..d_k' (k' <= k); None while they are in `ids`
    q_rows: list = field(default_factory=list)  # per draft its proposal law q [N], or None: one-hot on it
    probs: list[float] = field(default_factory=list)  # per draft the drafter's probability of it, if it knows
    withdrawn: bool = False  # a draft was made, found under the floor and not proposed (drafting stopped there)
    ids: object = None  # [k'] int64 where the drafter's model computes (a device array on cuda), or None
    parents: tuple[int, ...] | None = None  # a tree (tree.py): per draft i (row i) its parent row, 0 the pending
    #                                         token; None: a chain (draft i follows draft i - 1)

    @property
    def is_tree(self) -> bool:
        """Whether the drafts branch somewhere (a tree given as parents 0, 1, 2, ... is a chain)."""
        return self.parents is not None and any(p != i for i, p in enumerate(self.parents))

    @property
    def n(self) -> int:
        """Drafts proposed, known on the host wherever they are (an array's shape needs no transfer)."""
        return len(self.tokens) if self.tokens is not None else int(self.ids.shape[0])

    def with_tokens(self, tokens: list[int]) -> Draft:
        """This draft with its drafts as host ints (fetched with the verify step's run): what the engine reads after."""
        return replace(self, tokens=[int(t) for t in tokens], ids=None)


NO_DRAFT = Draft()


@dataclass(frozen=True)
class Plan:
    k: int  # drafts at most this step (0: a plain decoding step)
    stop: StopRule | None = None


Drafting = Generator[object, object, Draft]  # yields the passes it needs, is sent each answer, returns the Draft


class Drafter(Protocol):
    """One sequence's drafter. The engine calls, per sequence:

        start(prompt, hidden, k_max, resume)   after the target prefilled the prompt (hidden [n, D]: the
                                       target's post-norm rows, where the model computes when greedy); resume:
                                       None, or what release() returned when this sequence was preempted
        drafting(pending, k, params, rng, stop, on_device) -> a coroutine of passes returning a Draft of <= k
                                       drafts after the pending token (on_device: see the module docstring)
        draft_pass(asks) -> answers    several sequences' passes (what their coroutines yielded) made as one
        commit(fed, hidden)            the target kept these tokens (fed[0] = pending), with its hidden rows
        release() -> resume            its sequence is preempted or done: forget it (every KV block back to the
                                       pool); returns what start() needs to rebuild exactly the state it had
                                       (the engine keeps it with the sequence, unread, and hands it back)
        another(pool) -> Drafter       a drafter for another sequence, sharing this one's model and weights;
                                       pool: the engine's paged.BlockPool its KV takes blocks from (None: its
                                       own memory)
        stops_by_confidence            True if drafting honours stop.keep_going (it knows each draft's p)
        kv_table                       the paged.KVTable of the KV it keeps in the pool (None: it keeps none,
                                       or no pool)

    The KV a drafter keeps (the MTP head's, a draft model's) is memory like the target's: with a pool it takes
    the pool's blocks, and the engine budgets them as it budgets the target's, through kv_table alone. What makes
    that possible is one rule every drafter keeps: its KV holds at most the positions its sequence's target state
    holds, plus k + 2 during a drafting of k (it is fed the same kept tokens, then the pending one and k - 1
    drafts: plus k; the two more are room for the MTP head's filler rows, mtp.HeadPass.pad_to).
    """

    stops_by_confidence: bool

    def start(self, prompt: list[int], hidden: np.ndarray, k_max: int, resume: object = None) -> None: ...

    def drafting(self, pending: int, k: int, params: SamplingParams, rng: np.random.Generator,
                 stop: StopRule | None = None, on_device: bool = False) -> Drafting: ...

    def draft_pass(self, asks: list) -> list: ...

    def commit(self, fed: list[int], hidden: np.ndarray) -> None: ...

    def release(self) -> object: ...

    def another(self, pool=None) -> "Drafter": ...

    @property
    def kv_table(self): ...


class KeepsNoKV:
    """The memory half of the Drafter protocol for a drafter that keeps no KV (lookup; test doubles): no table, and
    its state is rebuilt exactly from the history alone, so release() has nothing to hand back."""

    kv_table = None

    def release(self) -> None:
        return None


class Proposing:
    """What every drafter offers a reader beside the protocol: propose, one sequence's Draft, its passes made
    one at a time (the engine drives drafting itself, run_together)."""

    def propose(self: Drafter, pending: int, k: int, params: SamplingParams, rng: np.random.Generator,
                stop: StopRule | None = None, on_device: bool = False) -> Draft:
        return run_alone(self.drafting(pending, k, params, rng, stop, on_device), self.draft_pass)


def no_passes(draft: Draft) -> Drafting:
    """The coroutine of a drafter that runs no model (lookup): it asks for no pass and returns `draft`."""
    return draft
    yield  # a generator function: the bare `yield` is never reached


def run_alone(drafting: Drafting, draft_pass: Callable[[list], list]) -> Draft:
    """Run one drafting coroutine to its Draft: each pass it yields is made by draft_pass([ask]) and sent back."""
    return run_together([drafting], draft_pass)[0]


def run_together(drafting: list[Drafting], draft_pass: Callable[[list], list]) -> list[Draft]:
    """Run several drafting coroutines to their Drafts in lockstep: each round, the passes every coroutine still
    running asks for are made by ONE draft_pass(asks) -> answers."""
    drafts: list[Draft | None] = [None] * len(drafting)
    asks = {}
    for b, coroutine in enumerate(drafting):
        try:
            asks[b] = next(coroutine)
        except StopIteration as done:
            drafts[b] = done.value
    while asks:
        answers = draft_pass(list(asks.values()))
        for (b, _), answer in zip(list(asks.items()), answers):
            try:
                asks[b] = drafting[b].send(answer)
            except StopIteration as done:
                drafts[b] = done.value
                del asks[b]
    return drafts


def fetch_drafts(ids: list, model) -> list[int]:  # k [1] ids where `model` computes -> k host ints
    """Greedy drafts made where a drafter's model computes brought to the host in one transfer (a plain read on
    the NumPy backends, whose device is the host): what drafting returns when not asked to leave them there."""
    return [int(t) for t in model.to_host(np.concatenate(ids))] if ids else []


def device_draft(ids: list, q_rows: list, probs: list, withdrawn: bool = False) -> Draft:
    """A Draft whose k' >= 1 greedy drafts (each a [1] id where the drafter's model computes) stay there as one
    [k'] array: no transfer; the engine feeds them to the verify pass and fetches them with its run."""
    return Draft(None, q_rows, probs, withdrawn, ids=np.concatenate(ids))


class DraftPolicy(Protocol):
    """How many drafts each sequence of the engine makes this step (one sequence: a list of one).

    k_max                                      drafts a step at most (sizes the rollback rings)
    plan(rooms, prefill_rows) -> [Plan]        rooms[b]: the drafts sequence b's max_new leaves room for;
                                               prefill_rows: joining prompts' chunk rows in the same pass
    observe(drafts, accepted, draft_s, verify_s, rows)   what the step drafted and kept per sequence, and what
                                               it cost: verify_s the target's pass of `rows` rows, draft_s the
                                               rest of the step (drafting, the drafter's commit of the kept
                                               rows, acceptance, rollback: all that grows with k besides rows)
    summary() -> dict | None                   for the stats"""

    k_max: int

    def plan(self, rooms: list[int], prefill_rows: int = 0) -> list[Plan]: ...

    def observe(self, drafts: list[Draft], accepted: list[int], draft_s: float, verify_s: float,
                rows: int) -> None: ...

    def summary(self) -> dict | None: ...


@dataclass
class FixedDraftLength:
    """The textbook policy: k drafts every step for every sequence (fewer where max_new leaves less room)."""
    k_max: int

    def __post_init__(self):
        self.k_max = check_draft_length(self.k_max)

    def plan(self, rooms: list[int], prefill_rows: int = 0) -> list[Plan]:
        return [Plan(min(self.k_max, room)) for room in rooms]

    def observe(self, drafts: list[Draft], accepted: list[int], draft_s: float, verify_s: float, rows: int) -> None:
        pass

    def summary(self) -> None:
        return None


def policy_for(draft_n: int | None, policy: DraftPolicy | None, default: int = 3) -> DraftPolicy:
    """draft_n alone: a fixed k (`default` if neither is given); a policy: its k_max, which a draft_n given too
    must equal."""
    if policy is None:
        return FixedDraftLength(default if draft_n is None else draft_n)
    if draft_n is not None and draft_n != policy.k_max:
        raise ValueError(f"draft_n={draft_n} and a policy of k_max={policy.k_max} disagree: give one of them")
    return policy
