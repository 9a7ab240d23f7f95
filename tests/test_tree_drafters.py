"""Draft trees: the builder (tree.TreeBuilder) on hand-made branches, then the drafters that grow trees (lookup,
the MTP head, the two mixed) on handmade histories and the shipped tiny model."""

import numpy as np
import pytest

from tinyspec import tree
from tinyspec.assets import TARGET
from tinyspec.backends import load_model
from tinyspec.drafters import DRAFTERS, DraftOptions, build_drafter
from tinyspec.fast.draft_vocab import DraftVocab
from tinyspec.lookup import CONFIDENCE, LookupDrafter, find_draft, find_drafts, lookup_branches
from tinyspec.mixed import MixedDrafter
from tinyspec.mtp import MTPDrafter, top_tokens
from tinyspec.sampling import SamplingParams, probs_from_logits
from tinyspec.tree import Guess, TreeBuilder, grow

GREEDY, SAMPLED = SamplingParams(), SamplingParams(temperature=1.0)


def one_hot(tokens, scores, source="a"):
    return [Guess(t, None, s) for t, s in zip(tokens, scores)], source


def first_child_path(parents, tokens):
    """The tokens along each node's first child from the root: the tree's best path (rows 1, 2, ...)."""
    kids, row, out = tree.children(parents), 0, []
    while kids[row]:
        row = kids[row][0]
        out.append(tokens[row - 1])
    return out


# ----------------------------------------------------------------------------------------------- the builder


def test_chain_in_is_chain_out():
    grown = grow([one_hot([5, 6, 7], [0.9, 0.8, 0.7])], budget=3)
    assert grown.tokens == [5, 6, 7] and grown.parents == (0, 1, 2) and grown.draft().parents == (0, 1, 2)
    assert grow([one_hot([5, 6, 7], [0.9, 0.8, 0.7])], budget=2).tokens == [5, 6]  # cut from the end


def test_one_hot_prefixes_merge_and_drawn_guesses_never_do():
    # two sources agree on [5, 6], then part: one trie, [5, 6] proposed by both, the larger score kept
    grown = grow([one_hot([5, 6, 7], [0.9, 0.8, 0.7], "mtp"), one_hot([5, 6, 8], [0.5, 0.85, 0.3], "lookup")], 8)
    assert grown.tokens == [5, 6, 7, 8] and grown.parents == (0, 1, 2, 2)
    assert grown.sources[:2] == [("mtp", "lookup"), ("mtp", "lookup")] and grown.scores[1] == 0.85
    # a drawn guess (q given) of the same token stays its own node, and a one-hot one beside it too
    q = np.full(10, 0.1)
    builder = TreeBuilder()
    a = builder.add(0, Guess(5, q, 0.5))
    b = builder.add(0, Guess(5, q, 0.5))
    c = builder.add(0, Guess(5, None, 0.9))
    assert len({a, b, c}) == 3 and builder.add(0, Guess(5, None, 0.2)) == c  # one-hot twins merge


def test_budget_keeps_the_best_nodes_prefix_closed():
    # a leaf scoring more than its parent cannot be kept without the parent: prefix-closed, best first
    branches = [one_hot([1, 2, 3], [0.9, 0.5, 0.4]), one_hot([4, 5], [0.6, 0.95]), one_hot([6], [0.55])]
    grown = grow(branches, budget=3)
    assert sorted(grown.tokens) == [1, 4, 5]  # 1 (0.9), then 4 (0.6) opens 5 (0.95); 6 (0.55) and 2 (0.5) lose
    tree.check_parents(grown.parents)
    for i, p in enumerate(grown.parents, start=1):  # every kept node's parent is kept (row 0 is the root)
        assert p < i
    assert len(grow(branches, budget=0).tokens) == 0 and grow(branches, 0).draft().parents is None


def test_rows_are_depth_first_with_siblings_best_first_and_ties_by_insertion():
    grown = grow([one_hot([1, 2], [0.3, 0.2]), one_hot([3, 4], [0.8, 0.1]), one_hot([3, 5], [0.8, 0.7]),
                  one_hot([9], [0.3])], budget=10)
    # root's kids: 3 (0.8) before 1 (0.3) before 9 (0.3, added after 1); under 3: 5 (0.7) before 4 (0.1)
    assert grown.tokens == [3, 5, 4, 1, 2, 9] and grown.parents == (0, 1, 1, 0, 4, 0)
    assert first_child_path(grown.parents, grown.tokens) == [3, 5]


def test_drawn_siblings_keep_draw_order_and_go_first():
    """Acceptance is exact for independent draws tried in draw order: a later draw is neither put before an
    earlier one nor kept without it, whatever the scores say; one-hot siblings follow the draws."""
    q = np.full(4, 0.25)
    builder = TreeBuilder()
    builder.add(0, Guess(1, None, 0.99))
    for token, score in [(2, 0.1), (3, 0.5), (2, 0.4)]:
        builder.add(0, Guess(token, q, score))
    grown = builder.grow(4)
    assert grown.tokens == [2, 3, 2, 1] and all(q is not None for q in grown.q_rows[:3])
    assert builder.grow(2).tokens == [2, 1]  # the first draw (0.1) comes before any later one


# --------------------------------------------------------------------------------------------------- lookup


def test_find_drafts_on_a_handmade_history():
    h = [5, 6, 7, 1, 5, 6, 7, 2, 6, 9, 5, 6]
    # [5 6] at 4 -> [7, 2], at 0 -> [7, 1]; [6] at 8 -> [9, 5]: a new next token goes before [7, 1]
    assert find_drafts(h, 2, m=3) == [[7, 2], [9, 5], [7, 1]]
    assert find_drafts(h, 2, m=1) == [find_draft(h, 2)]
    assert find_drafts(h, 2, n_min=2, m=3) == [[7, 2], [7, 1]]  # no 1-gram: only the [5 6] matches
    assert find_drafts([5, 6, 7, 9, 5, 6, 7, 8, 5, 6], 3, m=3) == [[7, 8, 5], [7, 9, 5]]  # repeats are dropped
    # a longer continuation found later is kept (the tree merges the shared prefix); none: no branch
    assert find_drafts([4, 4, 4], 5, m=3) == [[4], [4, 4]] and find_drafts([1, 2, 3], 3, m=3) == []


def test_lookup_tree_and_its_chain():
    h = [5, 6, 7, 1, 5, 6, 7, 2, 6, 9, 5]
    chain, wide = LookupDrafter(), LookupDrafter(tree=3)
    for d in (chain, wide):
        d.start(h, None)
    rng = np.random.default_rng(0)
    assert chain.propose(6, 5, GREEDY, rng).parents is None  # tree=1: find_draft's chain, as before
    draft = wide.propose(6, 5, GREEDY, rng)
    assert draft.n <= 5 and all(q is None for q in draft.q_rows) and draft.probs == []
    tree.check_parents(draft.parents)
    # [7 2 6 9 ..] scores 0.8 ** d, [9 5 ..] 0.4 * 0.8 ** (d - 1), [7 1 ..] merges into 7: the best five nodes
    assert draft.tokens == [7, 2, 6, 9, 9] and draft.parents == (0, 1, 2, 3, 0)
    assert wide.propose(6, 0, GREEDY, rng).n == 0
    scores = [[g.score for g in path] for path in lookup_branches([([7, 2], 2), ([9], 1)])]
    assert scores == [[CONFIDENCE, CONFIDENCE ** 2], [CONFIDENCE * 0.5]]
    assert wide.another().tree == 3


# ------------------------------------------------------------------------------------------------ the MTP head


@pytest.fixture(scope="module")
def target():
    return load_model(TARGET, "numpy")


@pytest.fixture(scope="module")
def prefilled(target):
    """A prompt the tiny model repeats, its hidden rows, and the target's greedy pending token."""
    prompt = [int(t) for t in np.tile(np.arange(40, 52), 3)]
    logits, hidden = target.forward(np.array(prompt), target.new_state())
    return prompt, hidden, int(np.argmax(logits[-1]))


def started(drafter, prefilled):
    prompt, hidden, _ = prefilled
    drafter.start(prompt, hidden, 8)
    return drafter


def test_mtp_tree_one_is_the_chain_drafter(target, prefilled):
    pending = prefilled[2]
    for params in (GREEDY, SAMPLED):
        a = started(MTPDrafter(target), prefilled).propose(pending, 5, params, np.random.default_rng(3))
        b = started(MTPDrafter(target, tree=1), prefilled).propose(pending, 5, params, np.random.default_rng(3))
        assert a.tokens == b.tokens and a.parents is None and b.parents is None


@pytest.mark.parametrize("width, k", [(2, 4), (3, 6), (4, 8)])
def test_greedy_mtp_tree_is_the_chain_with_the_heads_next_best_beside_it(target, prefilled, width, k):
    pending = prefilled[2]
    chain = started(MTPDrafter(target), prefilled).propose(pending, k, GREEDY, np.random.default_rng(0))
    drafter = started(MTPDrafter(target, tree=width), prefilled)
    draft = drafter.propose(pending, k, GREEDY, np.random.default_rng(0))
    parents = tree.check_parents(draft.parents)
    assert 1 <= draft.n <= k and all(q is None for q in draft.q_rows) and len(draft.probs) == draft.n
    spine = first_child_path(parents, draft.tokens)
    assert spine == chain.tokens[:len(spine)]  # the chain part is the chain drafter's drafts
    # each spine node's other children are the head's next-best tokens after the spine so far
    replay = started(MTPDrafter(target), prefilled)
    head_logits = replay_head_logits(replay, pending, spine)
    kids, row = tree.children(parents), 0
    for depth, logits in enumerate(head_logits):
        tokens, probs = top_tokens(logits, width)
        got = [draft.tokens[c - 1] for c in kids[row]]
        assert got[0] == tokens[0] and set(got[1:]) <= set(tokens[1:])
        assert np.allclose([draft.probs[c - 1] for c in kids[row]], [probs[tokens.index(t)] for t in got])
        if depth + 1 < len(spine):
            row = kids[row][0]
    assert drafter.cache.n == len(prefilled[0])  # the drafting's rows are dropped, as the chain's


def replay_head_logits(drafter, pending, spine):
    """The head's logits at each depth of the spine, one pass per token (the chain's passes, made by hand)."""
    from tinyspec.mtp import HeadPass

    out, ask = [], None
    ask, _ = drafter._first_pass(pending, len(spine))
    for token in spine:
        h, logits = drafter.draft_pass([ask])[0]
        out.append(np.asarray(logits))
        ask = HeadPass([token], h, drafter.fed_cache, drafter.scores)
    return out


def test_sampled_mtp_tree_siblings_are_independent_draws_from_q(target, prefilled):
    pending, width, k = prefilled[2], 3, 8
    draft = started(MTPDrafter(target, tree=width), prefilled).propose(pending, k, SAMPLED, np.random.default_rng(7))
    parents = tree.check_parents(draft.parents)
    assert draft.n <= k and all(q is not None for q in draft.q_rows)
    kids = tree.children(parents)
    for row, rows in enumerate(kids):
        laws = [draft.q_rows[c - 1] for c in rows]
        assert all(law is laws[0] for law in laws)  # siblings: draws from their parent's one law q
        assert all(draft.probs[c - 1] == laws[0][draft.tokens[c - 1]] for c in rows)
    # the same draws, in the same order, from a generator seeded alike: chain draw, then width - 1 more
    chain = started(MTPDrafter(target), prefilled).propose(pending, 1, SAMPLED, np.random.default_rng(7))
    rng = np.random.default_rng(7)
    first = kids[0][0]
    assert draft.tokens[first - 1] == chain.tokens[0]
    q = probs_from_logits(replay_head_logits(started(MTPDrafter(target), prefilled), pending, [0])[0], SAMPLED)
    rng.random()  # the chain's draw
    expected = [int(min(np.searchsorted(np.cumsum(q), rng.random() * np.cumsum(q)[-1], side="right"), q.size - 1))
                for _ in range(width - 1)]
    assert [draft.tokens[c - 1] for c in kids[0][1:]] == expected[:len(kids[0]) - 1]


def test_mtp_tree_with_a_draft_vocabulary_maps_its_ids(target, prefilled):
    pending, n = prefilled[2], target.cfg.n_vocab
    vocab = DraftVocab(np.random.default_rng(5).permutation(n), n // 3, n)
    chain = started(MTPDrafter(target, vocab), prefilled).propose(pending, 4, GREEDY, np.random.default_rng(0))
    draft = started(MTPDrafter(target, vocab, tree=3), prefilled).propose(pending, 4, GREEDY, np.random.default_rng(0))
    spine = first_child_path(tree.check_parents(draft.parents), draft.tokens)
    assert spine == chain.tokens[:len(spine)] and set(draft.tokens) <= set(vocab.ids.tolist())


# ------------------------------------------------------------------------------------------------ the mixed


def handmade_lookup(mixed, pending, first):
    """The mixed drafter's lookup history set by hand: two short continuations after `pending`, one of them
    starting with `first` -> ([98, pending], [first, 99, 8, pending, 98]): 7 lookup nodes."""
    mixed.lookup.history = [7, pending, first, 99, 8, pending, 98]
    return [[98, pending], [first, 99, 8, pending, 98]]


def paths_of(draft):
    return [tuple(draft.tokens[r - 1] for r in tree.path_to(draft.parents, row)[1:]) for row in range(1, draft.n + 1)]


def test_mixed_tree_holds_both_and_merges_a_shared_one_hot_prefix(target, prefilled):
    pending, k, width = prefilled[2], 10, 2
    mtp = started(MTPDrafter(target, tree=width), prefilled).propose(pending, k, GREEDY, np.random.default_rng(0))
    head_first = mtp.tokens[0]
    mixed = started(MixedDrafter(MTPDrafter(target), LookupDrafter(), tree=width), prefilled)
    looked = handmade_lookup(mixed, pending, head_first)
    draft = mixed.propose(pending, k, GREEDY, np.random.default_rng(0))
    tree.check_parents(draft.parents)
    assert draft.n == k and all(q is None for q in draft.q_rows)
    paths = paths_of(draft)
    lookup_paths = {tuple(c[:d]) for c in looked for d in range(1, len(c) + 1)}
    assert {tuple(c[:1]) for c in looked} <= set(paths)  # every lookup branch starts in the tree,
    assert any(len(p) >= 2 for p in lookup_paths & set(paths))  # one goes deeper (the scores decide how deep)
    assert set(paths) - lookup_paths  # and nodes only the head proposed
    roots = [draft.tokens[i] for i, p in enumerate(draft.parents) if p == 0]
    assert roots.count(head_first) == 1 and len(roots) == len(set(roots))  # the shared first token: one node
    # lookup finds nothing: the mixed tree is the MTP tree
    mixed.lookup.history = []
    alone = mixed.propose(pending, k, GREEDY, np.random.default_rng(0))
    assert (alone.tokens, alone.parents) == (mtp.tokens, mtp.parents)


def test_mixed_sampled_never_merges_lookup_with_draws(target, prefilled):
    pending, k = prefilled[2], 12
    mixed = started(MixedDrafter(MTPDrafter(target), LookupDrafter(), tree=2), prefilled)
    draw = started(MTPDrafter(target), prefilled).propose(pending, 1, SAMPLED, np.random.default_rng(1)).tokens[0]
    handmade_lookup(mixed, pending, draw)  # lookup's guess is the head's first draw: still two nodes
    draft = mixed.propose(pending, k, SAMPLED, np.random.default_rng(1))
    tree.check_parents(draft.parents)
    drawn = [i for i, q in enumerate(draft.q_rows) if q is not None]
    assert drawn and len(drawn) < draft.n  # both sources are there
    roots = [i for i, p in enumerate(draft.parents) if p == 0]
    assert [draft.tokens[i] for i in roots].count(draw) == 2
    for rows in tree.children(draft.parents):  # the draws come first among siblings
        kinds = [draft.q_rows[c - 1] is None for c in rows]
        assert kinds == sorted(kinds)


def test_mixed_passes_the_protocol_through(target, prefilled):
    mixed = started(MixedDrafter(MTPDrafter(target), LookupDrafter(), tree=2), prefilled)
    prompt, hidden, pending = prefilled
    mixed.propose(pending, 3, GREEDY, np.random.default_rng(0))
    mixed.commit([pending], hidden[-1:])
    assert mixed.lookup.history == prompt + [pending] and mixed.mtp.queue
    assert mixed.stops_by_confidence and mixed.kv_table is None
    other = mixed.another()
    assert other.mtp.head is mixed.mtp.head and other.tree == 2
    window, counts = mixed.mtp.window, mixed.calibration
    head, calibration = mixed.release()  # the head's window and the tree scores' counts, for a resume
    assert (head.start, head.fed) == (window.start, window.fed) and calibration is counts and counts.tried
    again = MixedDrafter(MTPDrafter(target), LookupDrafter(), tree=2)
    again.start(prompt + [pending], np.concatenate([hidden, hidden[-1:]]), 8, (head, calibration))
    assert again.calibration is counts and again.mtp.window == window  # resumed as it stood


# ----------------------------------------------------------------------------------------------- the registry


def test_registry_builds_trees(target):
    kind = DRAFTERS["mtp+lookup"]
    assert kind.k_max == 8 and kind.unavailable(target) is None
    mixed = build_drafter("mtp+lookup", target, DraftOptions(tree=3))
    assert isinstance(mixed, MixedDrafter) and mixed.tree == 3
    assert build_drafter("mtp", target, DraftOptions(tree=2)).tree == 2
    assert build_drafter("lookup", target, DraftOptions(tree=4)).tree == 4
    flag = next(f for f in kind.flags if f.name == "--tree")
    assert flag.check(0) and flag.check(9) and flag.check(8) is None
    with pytest.raises(ValueError):
        MTPDrafter(target, tree=0)
