"""Tree acceptance is lossless: what verify_tree emits, then plain sampling, has exactly the target's law.

The main test ENUMERATES: a small vocabulary, toy target and drafter laws that depend on the whole prefix, and a
tree recipe whose candidates are fixed tokens (one-hot q) or drawn from the drafter's law after their path. For
every tree the drafter can draw (weighted by its probability) the rule's outcomes are enumerated exactly
(outcome_law mirrors verify_tree with the module's accept_probability and residual), and every run is extended
to L tokens by sampling the target after it. The joint law of those L tokens must equal the target's chain law
to 1e-12. A chi-square test ties verify_tree itself to outcome_law; the hand-worked, greedy and chain tests pin
the walk exactly.
"""

import itertools
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from law_checks import assert_counts_follow
from tinyspec.sampling import SamplingParams, probs_from_logits
from tinyspec.spec_sampling import accept_probability, residual, verify_greedy, verify_step
from tinyspec.spec_tree import verify_tree, verify_tree_greedy
from tinyspec.tree import chain_parents, children, path_to

V = 3  # vocabulary size for the enumerations
L = 3  # the enumerated trees have depth <= 2: a run emits at most 3 tokens


def one_hot(i: int, n: int = V) -> np.ndarray:
    e = np.zeros(n)
    e[i] = 1.0
    return e


def logits_with_top(tops: list[int], n: int = 4) -> np.ndarray:  # -> [len(tops), n]
    """Logits whose row r has its maximum at tops[r] (row r also ties token n - 1 with a lower id, as a decoy)."""
    logits = np.zeros((len(tops), n), np.float32)
    for r, t in enumerate(tops):
        logits[r, t] = 2.0
        logits[r, n - 1] = max(logits[r, n - 1], 1.0)
    return logits


class ConstRng:
    """Every uniform is u: the greedy rule must not depend on it."""

    def __init__(self, u: float):
        self.u = u

    def random(self) -> float:
        return self.u


# --------------------------------------------------------------------------------- greedy, hand-worked


def test_greedy_hand_worked():
    #   0 - 1 (2) - 3 (0)          the root has two children with token 2: the first, row 1, is taken
    #   |         `- 4 (1)
    #   `- 2 (2) - 5 (1)
    parents, tokens = (0, 0, 1, 1, 2), [2, 2, 0, 1, 1]
    assert verify_tree_greedy(logits_with_top([2, 1, 3, 3, 0, 3]), tokens, parents) == ([0, 1, 4], 0)  # leaf: bonus
    assert verify_tree_greedy(logits_with_top([2, 0, 3, 1, 3, 3]), tokens, parents) == ([0, 1, 3], 1)
    assert verify_tree_greedy(logits_with_top([2, 2, 3, 3, 3, 3]), tokens, parents) == ([0, 1], 2)  # no child is 2
    assert verify_tree_greedy(logits_with_top([0, 1, 1, 1, 1, 1]), tokens, parents) == ([0], 0)  # root: no match
    tied = logits_with_top([1, 0, 0, 0, 0, 0])
    tied[0, 2] = 2.0  # tokens 1 and 2 both maximal at the root: argmax is the first, 1, though rows 1, 2 hold 2
    assert verify_tree_greedy(tied, tokens, parents) == ([0], 1)


def test_greedy_chain_hand_worked():
    logits = logits_with_top([3, 1, 0, 2])
    for drafts, expected in (([3, 1, 0], ([0, 1, 2, 3], 2)), ([3, 2, 0], ([0, 1], 1)), ([], ([0], 3))):
        assert verify_tree_greedy(logits[:len(drafts) + 1], drafts, chain_parents(len(drafts))) == expected
        assert verify_greedy(logits[:len(drafts) + 1], drafts) == (len(expected[0]) - 1, expected[1])


@settings(max_examples=200, deadline=None)
@given(k=st.integers(0, 5), n=st.integers(2, 5), seed=st.integers(0, 2**32 - 1), right=st.integers(0, 5))
def test_greedy_chain_is_verify_greedy(k, n, seed, right):
    rng = np.random.default_rng(seed)
    logits = rng.integers(0, 3, (k + 1, n)).astype(np.float32)  # many ties: the first maximum
    drafts = [int(np.argmax(logits[i])) if i < right else int(rng.integers(n)) for i in range(k)]
    path, next_token = verify_tree_greedy(logits, drafts, chain_parents(k))
    assert (len(path) - 1, next_token) == verify_greedy(logits, drafts)
    assert path == list(range(len(path)))


def random_tree(rng: np.random.Generator, n: int, top: np.ndarray, n_vocab: int) -> tuple[tuple, list]:
    """n drafts, each under a random earlier row, with a token that is often its parent row's argmax."""
    parents = tuple(int(rng.integers(i)) for i in range(1, n + 1))
    tokens = [int(top[p]) if rng.random() < 0.6 else int(rng.integers(n_vocab)) for p in parents]
    return parents, tokens


def soft_law_with(token: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """A proposal law that could have drawn `token` (positive mass on it)."""
    q = rng.dirichlet(np.ones(n))
    q[token] += 0.5
    return q / q.sum()


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 7), n_vocab=st.integers(2, 4), seed=st.integers(0, 2**32 - 1),
       u=st.sampled_from([0.0, 0.5, float(np.nextafter(1.0, 0.0)), None]))
def test_temperature_zero_is_greedy_whatever_the_uniforms(n, n_vocab, seed, u):
    """One-hot target laws (temperature 0): verify_tree keeps the greedy path and emits the greedy next token,
    for deterministic and for sampled candidates, with constant extreme uniforms or a real stream."""
    rng = np.random.default_rng(seed)
    logits = rng.integers(0, 3, (n + 1, n_vocab)).astype(np.float32)  # ties: the first maximum
    parents, tokens = random_tree(rng, n, np.argmax(logits, axis=-1), n_vocab)
    q_rows = [soft_law_with(t, n_vocab, rng) if rng.random() < 0.5 else None for t in tokens]
    p_rows = [probs_from_logits(row, SamplingParams()) for row in logits]
    coins = np.random.default_rng(seed + 1) if u is None else ConstRng(u)
    assert verify_tree(p_rows, tokens, parents, q_rows, coins) == verify_tree_greedy(logits, tokens, parents)


# --------------------------------------------------------------------------------- a chain is verify_step


@pytest.mark.parametrize("seed", range(20))
def test_chain_is_verify_step_with_the_same_uniforms(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(0, 5))
    p_rows = [rng.dirichlet(np.ones(V)) for _ in range(k + 1)]
    q_rows = [rng.dirichlet(np.ones(V)) if rng.random() < 0.5 else None for _ in range(k)]
    drafts = [int(rng.choice(V, p=q)) if q is not None else int(rng.integers(V)) for q in q_rows]
    tree_rng, step_rng = np.random.default_rng(seed + 100), np.random.default_rng(seed + 100)
    path, next_token = verify_tree(p_rows, drafts, chain_parents(k), q_rows, tree_rng)
    m, step_next = verify_step(p_rows, drafts, q_rows, step_rng)
    assert (path, next_token) == (list(range(m + 1)), step_next)
    assert tree_rng.random() == step_rng.random()  # the same number of uniforms drawn


def test_bad_lengths_and_parents():
    p, rng = one_hot(0), np.random.default_rng(0)
    with pytest.raises(ValueError, match="2 drafts need 2 parents, 3 target rows and 2 draft rows, got 2, 2 and 2"):
        verify_tree([p, p], [1, 2], (0, 0), [None, None], rng)
    with pytest.raises(ValueError, match="got 1, 3 and 2"):
        verify_tree([p, p, p], [1, 2], (0,), [None, None], rng)
    with pytest.raises(ValueError, match="got 2, 3 and 1"):
        verify_tree([p, p, p], [1, 2], (0, 0), [None], rng)
    with pytest.raises(ValueError, match="draft 2's parent must be a row before it"):
        verify_tree([p, p, p], [1, 2], (0, 2), [None, None], rng)
    with pytest.raises(ValueError, match="2 drafts need 2 parents and 3 logit rows, got 2 and 2"):
        verify_tree_greedy(np.zeros((2, V)), [1, 2], (0, 1))
    with pytest.raises(ValueError, match="draft 1's parent must be a row before it"):
        verify_tree_greedy(np.zeros((2, V)), [1], (1,))


# --------------------------------------------------------------------------------- exact enumeration


def outcome_law(p_rows, tokens, parents, q_rows) -> dict[tuple[tuple[int, ...], int], float]:
    """The exact law of verify_tree's (path, next_token) on one drafted tree, without sampling: at a row, try the
    children in order; child j is kept with probability a_j (then walk on from it), else the law becomes the
    residual; after the last child the next token is drawn from the law left."""
    kids, out = children(parents), defaultdict(float)

    def walk(path: tuple[int, ...], weight: float) -> None:
        law = p_rows[path[-1]]
        for child in kids[path[-1]]:
            q_draft, token = q_rows[child - 1], tokens[child - 1]
            a = accept_probability(law, q_draft, token)
            if a > 0:
                walk(path + (child,), weight * a)
            law, weight = residual(law, q_draft, token), weight * (1 - a)
        for x in np.flatnonzero(law * weight > 0):
            out[path, int(x)] += weight * law[x]

    walk((0,), 1.0)
    return out


class ToyModels:
    """A target and a drafter whose laws over V tokens depend on the whole prefix (the tokens after the pending
    one), fixed by the seed: soft laws, laws with a zero, and one-hots."""

    def __init__(self, seed: int):
        self.seed = seed

    def law(self, kind: int, prefix: tuple[int, ...]) -> np.ndarray:  # -> [V]
        rng = np.random.default_rng([self.seed, kind, len(prefix), *prefix])
        w, style = rng.dirichlet(np.ones(V)), rng.random()
        if style < 0.25:
            w[rng.integers(V)] = 0.0
        elif style < 0.35:
            w = one_hot(int(rng.integers(V)))
        return w / w.sum()

    def target(self, prefix):
        return self.law(0, tuple(prefix))

    def draft(self, prefix):
        return self.law(1, tuple(prefix))


def fixed(token: int, *kids):
    """A deterministic candidate (q one-hot on token), with its children's recipes."""
    return token, kids


def drawn(*kids):
    """A candidate drawn from the drafter's law after its path, independently of its siblings."""
    return None, kids


RECIPES = {  # the root's candidates; depth <= 2, 2-3 children a node
    # a sampled root candidate may equal the one-hot 0 (kept as separate rows); the one-hot 0 comes twice (unmerged)
    "mixed": (fixed(0, drawn(), fixed(1)), drawn(fixed(2), drawn()), fixed(0)),
    # a duplicate one-hot pair merged into one row: its children joined under it
    "merged": (fixed(0, drawn(), fixed(1), fixed(2)), drawn(drawn(), fixed(0))),
    "iid": (drawn(drawn(), drawn()), drawn(), drawn()),  # SpecInfer: i.i.d. candidates from one q at each node
    "deterministic": (fixed(1, fixed(0), fixed(2)), fixed(2, fixed(2)), fixed(0, fixed(1))),
    "chain": (drawn(drawn()),),
}


def rows_of(recipe) -> list[tuple[int, int | None]]:
    """The recipe's candidates in row order, a parent before its children: (parent row, token or None = drawn)."""
    rows = []

    def visit(row: int, candidates) -> None:
        for token, kids in candidates:
            rows.append((row, token))
            visit(len(rows), kids)

    visit(0, recipe)
    return rows


def prefix_of(parents, tokens, row: int) -> tuple[int, ...]:
    """The draft tokens on the path to row (the root's pending token not included)."""
    return tuple(tokens[r - 1] for r in path_to(parents, row)[1:])


def drafted_trees(recipe, toy: ToyModels):
    """Every tree the drafter can draft from the recipe, with its probability: (weight, tokens, q_rows)."""
    rows = rows_of(recipe)
    parents = [p for p, _ in rows]

    def extend(tokens, q_rows, weight):
        if len(tokens) == len(rows):
            yield weight, tokens, q_rows
            return
        parent, token = rows[len(tokens)]
        if token is not None:
            yield from extend(tokens + [token], q_rows + [None], weight)
            return
        q_draft = toy.draft(prefix_of(parents, tokens, parent))
        for x in np.flatnonzero(q_draft > 0):
            yield from extend(tokens + [int(x)], q_rows + [q_draft], weight * q_draft[x])

    return tuple(parents), extend([], [], 1.0)


def extended_law(recipe, toy: ToyModels) -> dict[tuple[int, ...], float]:
    """The joint law of the first L tokens when a verify_tree run is followed by plain sampling from the target."""
    joint = defaultdict(float)

    def continue_run(emitted: tuple[int, ...], prob: float) -> None:
        if len(emitted) >= L:
            joint[emitted[:L]] += prob
            return
        for x, p in enumerate(toy.target(emitted)):
            if p > 0:
                continue_run(emitted + (x,), prob * p)

    parents, trees = drafted_trees(recipe, toy)
    total = 0.0
    for weight, tokens, q_rows in trees:
        total += weight
        p_rows = [toy.target(prefix_of(parents, tokens, row)) for row in range(len(tokens) + 1)]
        outcomes = outcome_law(p_rows, tokens, parents, q_rows)
        assert sum(outcomes.values()) == pytest.approx(1.0, abs=1e-12)
        for (path, next_token), prob in outcomes.items():
            continue_run(prefix_of(parents, tokens, path[-1]) + (next_token,), weight * prob)
    assert total == pytest.approx(1.0, abs=1e-12)
    return joint


def chain_law(toy: ToyModels) -> dict[tuple[int, ...], float]:
    """The target's law of L tokens: the product of its conditionals."""
    return {seq: float(np.prod([toy.target(seq[:i])[t] for i, t in enumerate(seq)]))
            for seq in itertools.product(range(V), repeat=L)}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("recipe", RECIPES)
def test_emitted_law_is_the_target_chain(recipe, seed):
    toy = ToyModels(seed)
    joint, exact = extended_law(RECIPES[recipe], toy), chain_law(toy)
    assert set(joint) <= set(exact)
    for seq, p in exact.items():
        assert joint.get(seq, 0.0) == pytest.approx(p, abs=1e-12), seq
    first = np.zeros(V)
    for seq, p in joint.items():
        first[seq[0]] += p
    np.testing.assert_allclose(first, toy.target(()), rtol=0, atol=1e-12)  # the first token: p_rows[0]


def test_one_hot_duplicates_merge():
    """Consequence (a): a second one-hot candidate with a token already tried is never kept, and the outcomes are
    those of the tree without it (and without its subtree)."""
    rng = np.random.default_rng(5)
    p_rows = [rng.dirichlet(np.ones(V)) for _ in range(5)]
    with_pair = outcome_law(p_rows, [0, 1, 0, 2], (0, 0, 0, 3), [None, p_rows[1], None, None])  # rows 1 and 3: 0
    without = outcome_law(p_rows[:3], [0, 1], (0, 0), [None, p_rows[1]])
    assert dict(with_pair) == pytest.approx(dict(without), abs=1e-15)
    assert all(3 not in path for path, _ in with_pair)


def test_sampled_duplicates_must_not_be_dropped():
    """Consequence (b): two candidates drawn i.i.d. from q. Kept as two rows the first token has law p; a builder
    that drops the second when it repeats the first changes the law (its stage would have changed the residual)."""
    p, q, bonus = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.2, 0.6]), np.full(V, 1 / V)
    kept, dropped = np.zeros(V), np.zeros(V)
    for x1, x2 in itertools.product(range(V), repeat=2):
        two = [p, bonus, bonus], [x1, x2], (0, 0), [q, q]
        one = [p, bonus], [x1], (0,), [q]
        for law, tree in ((kept, two), (dropped, one if x1 == x2 else two)):
            for (path, next_token), prob in outcome_law(*tree).items():
                first = tree[1][path[1] - 1] if len(path) > 1 else next_token  # a kept draft, or the correction
                law[first] += q[x1] * q[x2] * prob
    np.testing.assert_allclose(kept, p, rtol=0, atol=1e-12)
    assert np.abs(dropped - p).max() > 0.01, dropped


# --------------------------------------------------------------------------------- Monte Carlo, end to end


def test_verify_tree_follows_outcome_law_chi_square():
    """verify_tree itself, sampled, on one mixed tree: the (path, next_token) counts follow outcome_law.

        0 - 1 (0, one-hot) - 4 (2, sampled)      rows 1 and 3: a duplicate one-hot pair, unmerged
        |                  `- 5 (1, one-hot)     row 2: sampled, the same token as row 6's one-hot
        |- 2 (1, sampled)  - 6 (1, one-hot)
        `- 3 (0, one-hot)
    """
    n_vocab, rng = 4, np.random.default_rng(7)
    parents, tokens = (0, 0, 0, 1, 1, 2), [0, 1, 0, 2, 1, 1]
    p_rows = [rng.dirichlet(np.ones(n_vocab)) for _ in range(7)]
    q_rows = [None, rng.dirichlet(np.ones(n_vocab)), None, rng.dirichlet(np.ones(n_vocab)), None, None]
    exact = outcome_law(p_rows, tokens, parents, q_rows)
    n_runs, counts = 4000, defaultdict(int)
    for _ in range(n_runs):
        path, next_token = verify_tree(p_rows, tokens, parents, q_rows, rng)
        counts[tuple(path), next_token] += 1
    assert_counts_follow(dict(counts), dict(exact), n_runs, min_cells=8)
