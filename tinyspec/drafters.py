"""Every drafter tinyspec offers, by name: the one registry the CLI, the demo and bench read.

    name     what drafts                                          k_max  its own flags
    mtp      the target's own MTP (nextn) head, chained k times   8      --draft-vocab --ranking --draft-p-min --tree
    lookup   n-grams of the prompt and the output so far          8      --tree
    draft    a separate small model with the same vocabulary      4      --draft-model --draft-vocab --ranking
    mtp+lookup  the MTP head's tree and lookup's branches, one tree  8    mtp's, --tree (default 2)

--tree W: the drafter proposes a tree of up to k nodes, up to W guesses per node (tree.py), verified in one pass
(the engine's tree pass; spec_tree.py's rule); mtp and lookup draft chains by default (W = 1).

A kind builds the drafter for ONE sequence; the engine makes the others of a batch with `another()`
(drafting.Drafter), so a kind needs no batch form. k_max is the largest draft length `generate --spec NAME` lets
the adaptive draft length try by default: mtp and draft end a step early after a draft they are unsure of
(fast/adaptive.py keep_drafting), so a long cap costs little where drafts are unsure; the shipped draft model is
slower at 8 than at 4 (docs/performance-log.md, old 29).

A kind declares the command-line flags it reads (Flag: name, help, default, a range check) and how their parsed
values become its DraftOptions (`options`). generate, batch and serve add every kind's flags, each once, check
them before a model loads, and name a flag given with a --spec that does not read it. So a new drafter is its
module and one entry here: no other file names it (tests/test_cli.py registers a toy one and runs it).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

from .drafting import Drafter


@dataclass(frozen=True)
class DraftOptions:
    """What a kind may need beyond the target: the draft model (draft), a draft vocabulary (mtp, draft:
    sampling.DraftVocabulary, e.g. the wing's draft_vocab.DraftVocab), the MTP head's p_min. A kind with options
    of its own subclasses this (a frozen dataclass with more fields) and makes them in its `options`."""
    draft_model: object = None  # a Model with the target's vocabulary
    vocab: object = None
    p_min: float = 0.0
    tree: int = 1  # guesses per node (mtp, lookup, mtp+lookup): > 1 drafts a tree (tree.py), 1 a chain


def _fine(value) -> str | None:
    return None


@dataclass(frozen=True)
class Flag:
    """A command-line flag a kind reads, as argparse takes it, plus what the CLI checks before a model loads."""
    name: str  # "--draft-vocab"; its value is args.draft_vocab
    help: str  # the kinds that read it are put in front: "mtp, draft: ..."
    type: Callable = str
    default: object = None
    metavar: str | None = None
    check: Callable[[object], str | None] = _fine  # a value given -> why it is bad (None: fine)
    required: str | None = None  # the kind cannot run without it: what to give, for the error ("a small ... GGUF")
    shipped: Callable[[], object] | None = None  # its value when the command runs the shipped model (no --model)
    strict: bool = False  # given with a --spec that does not read it: an error, not a note that it is ignored

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")


def no_options(args, target, tokenizer) -> DraftOptions:
    return DraftOptions()


def has_everything(target) -> str | None:
    return None


@dataclass(frozen=True)
class DrafterKind:
    name: str  # the --spec value
    about: str  # one line for --help
    k_max: int  # the largest draft length the adaptive policy tries by default
    build: Callable[[object, DraftOptions], Drafter]  # (target Model, options) -> one sequence's drafter
    needs_draft_model: bool = False  # bench and bench --serving time only the kinds that run on the target alone
    flags: tuple[Flag, ...] = ()
    options: Callable[[object, object, object], DraftOptions] = no_options  # (parsed args, target, tokenizer)
    unavailable: Callable[[object], str | None] = has_everything  # target -> why this kind cannot draft for it


def draft_vocab(args, model, tokenizer=None):
    """--draft-vocab N: the N most frequent tokens (fast/draft_vocab.py), ranked by --ranking, the file's record or,
    given the tokenizer, the cached standard-library count. N = None (generate's default): AUTO_SIZE above
    AUTO_ABOVE tokens, else the whole vocabulary; 0: the whole vocabulary."""
    from .fast.draft_vocab import AUTO_ABOVE, AUTO_SIZE, DraftVocab, ranking_for

    n = args.draft_vocab
    if n is None and tokenizer is not None and model.cfg.n_vocab > AUTO_ABOVE:
        n = AUTO_SIZE
    if not n:
        return None
    if n >= model.cfg.n_vocab:
        print(f"tinyspec: note: --draft-vocab {n} covers the whole vocabulary of {model.cfg.n_vocab} tokens: "
              "drafting over all of it", file=sys.stderr)
        return None
    ranking = ranking_for(model, args.ranking, tokenizer, progress=lambda msg: print(msg, file=sys.stderr))
    return DraftVocab(ranking, n, model.cfg.n_vocab)


VOCAB_FLAGS = (
    Flag("--draft-vocab", "score only the N most frequent tokens when drafting (FR-Spec; output unchanged; default: "
         "32768 for vocabularies over 65536 tokens, else all; 0: all)", int, metavar="N",
         check=lambda n: None if n >= 0 else f"--draft-vocab must be >= 0 (0: the whole vocabulary), got {n}"),
    Flag("--ranking", "token ids by frequency for --draft-vocab (default: the model file's training.token_ranking, "
         "else a count over the Python standard library's sources, computed once and cached)", metavar="FILE.npy"),
)


def _shipped_draft() -> str:
    from .assets import DRAFT

    return str(DRAFT)


TREE_FLAG = Flag("--tree", "draft a tree: up to W guesses per node, verified in one pass (mtp, lookup: default 1, "
                 "a chain; mtp+lookup: default 2)", int, None, "W",
                 check=lambda w: None if 1 <= w <= 8 else f"--tree must be in 1..8, got {w}")


def _mtp(target, o: DraftOptions) -> Drafter:
    from .mtp import MTPDrafter

    return MTPDrafter(target, o.vocab, p_min=o.p_min, tree=o.tree)


def _mtp_options(args, target, tokenizer, tree: int = 1) -> DraftOptions:
    """tree: the kind's default when --tree is not given."""
    return DraftOptions(vocab=draft_vocab(args, target, tokenizer), p_min=args.draft_p_min,
                        tree=tree if args.tree is None else args.tree)


def _lookup(target, o: DraftOptions) -> Drafter:
    from .lookup import LookupDrafter

    return LookupDrafter(tree=o.tree)


def _lookup_options(args, target, tokenizer) -> DraftOptions:
    return DraftOptions(tree=1 if args.tree is None else args.tree)


def _mtp_lookup(target, o: DraftOptions) -> Drafter:
    from .lookup import LookupDrafter
    from .mixed import MixedDrafter
    from .mtp import MTPDrafter

    return MixedDrafter(MTPDrafter(target, o.vocab, p_min=o.p_min), LookupDrafter(), tree=o.tree)


def _no_mtp_head(target) -> str | None:
    return None if target.cfg.n_nextn else "this model has no MTP head"


def _draft(target, o: DraftOptions) -> Drafter:
    from .draft import DraftModelDrafter

    if o.draft_model is None:
        raise ValueError("--spec draft needs --draft-model FILE (a small qwen35 GGUF with the same vocabulary)")
    return DraftModelDrafter(o.draft_model, target=target, vocab=o.vocab)


def _draft_options(args, target, tokenizer) -> DraftOptions:
    from .backends import load_model

    return DraftOptions(load_model(args.draft_model, target.backend), draft_vocab(args, target, tokenizer))


P_MIN_FLAG = Flag("--draft-p-min", "stop drafting after a draft the head gives probability < P (llama.cpp's "
                  "--spec-draft-p-min; 0, the default: draft every position the draft length allows)", float, 0.0,
                  "P", check=lambda p: None if 0 <= p <= 1 else f"--draft-p-min must be in [0, 1], got {p}",
                  strict=True)

DRAFTERS = {kind.name: kind for kind in (
    DrafterKind("mtp", "the model's own nextn head, chained k times", 8, _mtp, options=_mtp_options,
                flags=VOCAB_FLAGS + (P_MIN_FLAG, TREE_FLAG), unavailable=_no_mtp_head),
    DrafterKind("lookup", "n-grams from the prompt and output", 8, _lookup, flags=(TREE_FLAG,),
                options=_lookup_options),
    DrafterKind("draft", "a separate small model, --draft-model", 4, _draft, needs_draft_model=True,
                options=_draft_options, flags=(Flag(
                    "--draft-model", "draft model GGUF (same vocabulary as --model; default with the shipped model: "
                    "the shipped draft model)", metavar="FILE", required="a small qwen35 GGUF with the same vocabulary",
                    shipped=_shipped_draft),) + VOCAB_FLAGS),
    DrafterKind("mtp+lookup", "the MTP head's tree and prompt-lookup branches, verified as one tree", 8, _mtp_lookup,
                flags=VOCAB_FLAGS + (P_MIN_FLAG, TREE_FLAG), unavailable=_no_mtp_head,
                options=lambda args, target, tokenizer: _mtp_options(args, target, tokenizer, tree=2)),
)}


def spec_choices() -> tuple[str, ...]:
    """--spec's values: none (plain decoding) and every kind registered."""
    return ("none",) + tuple(DRAFTERS)


def build_drafter(name: str, target, options: DraftOptions = DraftOptions()) -> Drafter | None:
    """The drafter `name` for one sequence of `target` (None for "none": plain decoding)."""
    if name == "none":
        return None
    if name not in DRAFTERS:
        raise ValueError(f"unknown drafter {name!r} (choose from {', '.join(spec_choices())})")
    return DRAFTERS[name].build(target, options)


def spec_help() -> str:
    """--spec's help: every kind with what it drafts."""
    return "drafter: none (plain), " + ", ".join(f"{k.name} ({k.about})" for k in DRAFTERS.values())


def every_flag() -> dict[str, tuple[Flag, list[str]]]:
    """Every kind's flags, each once (the first kind's spec of it), with the names of the kinds that read it."""
    flags: dict[str, tuple[Flag, list[str]]] = {}
    for kind in DRAFTERS.values():
        for flag in kind.flags:
            flags.setdefault(flag.name, (flag, []))[1].append(kind.name)
    return flags


def check_flags(args) -> list[str]:
    """Before a model loads: each drafter flag given is in range, the chosen kind has the flags it requires, and a
    strict flag is not given with a --spec that does not read it (ValueError). Returns the flags given that the
    chosen kind does not read (ignored: the caller notes them)."""
    kind = DRAFTERS.get(args.spec)
    reads = {flag.name for flag in kind.flags} if kind else set()
    ignored = []
    for flag, readers in every_flag().values():
        value = getattr(args, flag.dest)
        if value == flag.default:
            continue
        if why := flag.check(value):
            raise ValueError(why)
        if flag.name not in reads and flag.strict:
            raise ValueError(f"{flag.name} needs --spec {' or --spec '.join(readers)} (got --spec {args.spec})")
        if flag.name not in reads:
            ignored.append(flag.name)
    for flag in kind.flags if kind else ():
        if flag.required and getattr(args, flag.dest) is None:
            raise ValueError(f"--spec {kind.name} needs {flag.name} {flag.metavar} ({flag.required})")
    return ignored


def shipped_flags(args) -> None:
    """The command runs the shipped model (no --model): the chosen kind's flags not given take their shipped
    values (--spec draft: the shipped draft model)."""
    for flag in DRAFTERS[args.spec].flags if args.spec in DRAFTERS else ():
        if flag.shipped is not None and getattr(args, flag.dest) is None:
            setattr(args, flag.dest, flag.shipped())


def drafter_from_flags(args, target, tokenizer=None) -> Drafter | None:
    """--spec's drafter for one sequence (a batch's other slots get another() of it), or None: plain decoding."""
    kind = DRAFTERS.get(args.spec)
    if kind is None:
        return None
    return kind.build(target, kind.options(args, target, tokenizer))
