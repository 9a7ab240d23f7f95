"""Every drafter tinyspec offers, by name: the one registry the CLI, the demo and bench read.

    name     what drafts                                              largest k the adaptive policy tries
    mtp      the target's own MTP (nextn) head, chained k times       8
    lookup   n-grams of the prompt and the output so far              8
    draft    a separate small model with the same vocabulary          4

A kind builds the drafter for ONE sequence; the engine makes the others of a batch with `another()`
(drafting.Drafter), so a kind needs no batch form. k_max is what `generate --spec NAME` lets the adaptive draft
length try by default: mtp and draft end a step early after a draft they are unsure of (fast/adaptive.py
keep_drafting), so a long cap costs little where drafts are unsure; the shipped draft model is slower at 8 than
at 4 (docs/performance-log.md, old 29).

A new drafter is one entry here (and its module).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .drafting import Drafter


@dataclass(frozen=True)
class DraftOptions:
    """What a kind may need beyond the target: the draft model (draft), a draft vocabulary (mtp, draft:
    sampling.DraftVocabulary, e.g. the wing's draft_vocab.DraftVocab), the MTP head's p_min."""
    draft_model: object = None  # a Model with the target's vocabulary
    vocab: object = None
    p_min: float = 0.0


@dataclass(frozen=True)
class DrafterKind:
    name: str  # the --spec value
    about: str  # one line for --help
    k_max: int  # the largest draft length the adaptive policy tries by default
    build: Callable[[object, DraftOptions], Drafter]  # (target Model, options) -> one sequence's drafter
    uses_vocab: bool = False  # drafts over a draft vocabulary when given one
    needs_draft_model: bool = False


def _mtp(target, o: DraftOptions) -> Drafter:
    from .mtp import MTPDrafter

    return MTPDrafter(target, o.vocab, p_min=o.p_min)


def _lookup(target, o: DraftOptions) -> Drafter:
    from .lookup import LookupDrafter

    return LookupDrafter()


def _draft(target, o: DraftOptions) -> Drafter:
    from .draft import DraftModelDrafter

    if o.draft_model is None:
        raise ValueError("--spec draft needs --draft-model FILE (a small qwen35 GGUF with the same vocabulary)")
    return DraftModelDrafter(o.draft_model, target=target, vocab=o.vocab)


DRAFTERS = {kind.name: kind for kind in (
    DrafterKind("mtp", "the model's own nextn head, chained k times", 8, _mtp, uses_vocab=True),
    DrafterKind("lookup", "n-grams from the prompt and output", 8, _lookup),
    DrafterKind("draft", "a separate small model, --draft-model", 4, _draft, uses_vocab=True, needs_draft_model=True),
)}
SPEC_CHOICES = ("none",) + tuple(DRAFTERS)  # --spec


def build_drafter(name: str, target, options: DraftOptions = DraftOptions()) -> Drafter | None:
    """The drafter `name` for one sequence of `target` (None for "none": plain decoding)."""
    if name == "none":
        return None
    if name not in DRAFTERS:
        raise ValueError(f"unknown drafter {name!r} (choose from {', '.join(SPEC_CHOICES)})")
    return DRAFTERS[name].build(target, options)


def spec_help() -> str:
    """--spec's help: every kind with what it drafts."""
    return "drafter: none (plain), " + ", ".join(f"{k.name} ({k.about})" for k in DRAFTERS.values())
