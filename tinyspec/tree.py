"""A draft tree: several guesses for the next tokens, verified in one pass.

A chain proposes d_1..d_k, each the guess for the token after the one before it. A tree proposes several
guesses at a point: a node is one draft token, and its parent is the token it follows. The verify pass feeds
the pending token and every node, one row each, in topological order (a parent before its children):

    row 0            the pending token (the root: chosen, not yet fed)
    row i (1..n)     draft i, the token after row parents[i-1]      parents[i-1] < i

    parents (0, 1, 2)          the chain d_1 d_2 d_3             0 - 1 - 2 - 3
    parents (0, 0, 1, 1, 3)    two guesses after the pending     0 - 1 - 3 - 5
                               token, two after the first        |    `- 4
                                                                 `- 2

Row i sits at position pos + depth(i) (pos: the tokens its sequence holds before the pass) and must compute
exactly what a one-token decode of its path (the root, its ancestors, itself) computes there: its attention
sees the prefix and its ancestors only, and the Gated DeltaNet state it starts from is its parent's state
after the parent's token (gdn.gdn_recurrent_tree). After acceptance a path from the root is kept (spec_tree.py),
and the sequence is rolled back to it: the GDN state of the path's last row from the ring, the path's KV rows
moved to the positions a plain decode would have written (state.ModelState.keep_path).

Growing a tree (TreeBuilder, grow): drafters propose candidate nodes, each with a score, the estimated
probability that its path is accepted; one-hot guesses of the same token under the same parent merge (a trie);
the `budget` best are kept, best first (a node only with its parent), and laid out depth first, siblings in the
order acceptance should try them. Drawn guesses (sampled, with their law q) are never merged or reordered.

Official implementation of the idea: SpecInfer (Miao et al. 2024, token-tree verification), Medusa and
EAGLE-2 (draft trees over a transformer: a mask); SGLang's GDN kernels take parent indices (docs/peers.md).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

from .drafting import Draft


def chain_parents(k: int) -> tuple[int, ...]:
    """The chain of k drafts as a tree: draft i follows row i - 1."""
    return tuple(range(k))


def check_parents(parents: Sequence[int]) -> tuple[int, ...]:
    """parents as a tuple of ints, each draft's parent an earlier row (0 .. i-1 for draft i); else a ValueError."""
    out = tuple(int(p) for p in parents)
    for i, p in enumerate(out, start=1):
        if not 0 <= p < i:
            raise ValueError(f"draft {i}'s parent must be a row before it (0 .. {i - 1}), got {p}")
    return out


def is_chain(parents: Sequence[int]) -> bool:
    return all(int(p) == i for i, p in enumerate(parents))


def depths(parents: Sequence[int]) -> np.ndarray:  # n parents -> [n + 1] depths, row 0 (the root) at 0
    """Each row's depth: how many drafts its path holds (its position is pos + depth)."""
    out = np.zeros(len(parents) + 1, np.int64)
    for i, p in enumerate(parents, start=1):
        out[i] = out[p] + 1
    return out


def path_to(parents: Sequence[int], row: int) -> list[int]:
    """The rows from the root to `row`, root first: [0, ..., row]."""
    path = [int(row)]
    while path[-1]:
        path.append(int(parents[path[-1] - 1]))
    return path[::-1]


def children(parents: Sequence[int]) -> list[list[int]]:
    """Per row (0 .. n) its children's rows, in row order (the order acceptance tries them)."""
    out: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents, start=1):
        out[p].append(i)
    return out


def levels(parents: Sequence[int]) -> list[np.ndarray]:
    """The rows grouped by depth, shallowest first: every row's parent is in the level before its own, so a level's
    rows can be computed together once the previous level is done."""
    d = depths(parents)
    return [np.flatnonzero(d == level) for level in range(int(d.max()) + 1)]


def draw(parents: Sequence[int], tokens: Sequence[int], pending: int | None = None) -> str:
    """The tree as text, one row a line, indented by depth: how notebooks and error messages show it."""
    d, lines = depths(parents), []
    order = []

    def visit(row: int, kids: list[list[int]]) -> None:
        order.append(row)
        for child in kids[row]:
            visit(child, kids)

    visit(0, children(parents))
    for row in order:
        token = ("pending" if pending is None else str(pending)) if row == 0 else str(tokens[row - 1])
        lines.append(f"{'  ' * int(d[row])}{'' if row == 0 else '`- '}[{row}] {token}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- growing a tree


@dataclass(frozen=True)
class Guess:
    """One candidate node: a draft token, the law it was drawn from, and how likely it is to be kept."""
    token: int
    q: np.ndarray | None = None  # the law [N] it was drawn from; None: one-hot on it (a deterministic guess)
    score: float = 1.0  # the estimated probability that its path (the root .. it) is accepted
    prob: float | None = None  # the drafter's probability of it (Draft.probs), if it knows one
    key: tuple | None = None  # what kind of guess it is, for Calibration (None: not calibrated)


class Grown(NamedTuple):
    """A grown tree in row order: the Draft's fields, and per row its score and the sources that proposed it."""
    tokens: list[int]
    q_rows: list
    probs: list[float]  # per row, or [] when some row's drafter gave none
    parents: tuple[int, ...]
    scores: list[float]
    sources: list[tuple[str, ...]]
    keys: list = []  # per row its Guess.key

    def draft(self, withdrawn: bool = False) -> Draft:
        return Draft(self.tokens, self.q_rows, self.probs, withdrawn, parents=self.parents if self.tokens else None)


class TreeBuilder:
    """Candidate branches merged into a trie, then the `budget` most likely nodes kept, as a draft tree.

        add(parent, guess) / add_path(guesses)   a node under `parent` (0: the root, the pending token)
        grow(budget) -> Grown                    best first: the kept nodes are prefix-closed (a node only
                                                 with its parent) and, where scores fall along every path,
                                                 the top `budget` by score (ties: the node added first)

    Merging. Two one-hot guesses (q None) of the same token under the same parent are one node (its score the
    larger, its sources both): a deterministic token proposed twice is one candidate. A drawn guess (q given) is
    never merged: acceptance (spec_tree.py) is exact only when each drawn candidate is an independent draw.

    Drawn siblings (q given) keep their draw order, both in rows and in what is kept: the r-th draw is kept only
    with the draws before it, and they come before their one-hot siblings; one-hot siblings are ordered by score,
    highest first (acceptance tries a node's children in row order). For the law to stay exact, a drawn guess's
    score must not depend on its own token (nor on later draws): then whether it is kept, and where it is tried,
    says nothing of its value. (Whether a later candidate is tried may depend on the earlier ones: after they are
    rejected the rest samples the residual law exactly whatever they were.)

    Rows come out depth first: a node's subtree follows it, so the best path (each node's first child) is
    rows 1, 2, 3, ...: a chain in is the chain out, parents (0, 1, 2, ...)."""

    def __init__(self):
        self.guesses: list[Guess | None] = [None]  # per node; node 0 is the root (the pending token)
        self.parent: list[int] = [-1]
        self.sources: list[list[str]] = [[]]
        self.kids: list[list[int]] = [[]]  # per node its children, in the order they were added

    def __len__(self) -> int:  # candidate nodes, the root not counted
        return len(self.guesses) - 1

    def add(self, parent: int, guess: Guess, source: str = "") -> int:
        """A guess under node `parent` -> its node (an existing one when it merges)."""
        if guess.q is None:
            for kid in self.kids[parent]:
                old = self.guesses[kid]
                if old.q is None and old.token == guess.token:  # the same deterministic token: one node
                    prob = old.prob if old.prob is not None else guess.prob
                    best = old if old.score >= guess.score else guess
                    self.guesses[kid] = Guess(old.token, None, best.score, prob, best.key)
                    if source not in self.sources[kid]:
                        self.sources[kid].append(source)
                    return kid
        node = len(self.guesses)
        self.guesses.append(Guess(int(guess.token), guess.q, float(guess.score), guess.prob, guess.key))
        self.parent.append(parent)
        self.sources.append([source])
        self.kids.append([])
        self.kids[parent].append(node)
        return node

    def add_path(self, path: Sequence[Guess], source: str = "") -> list[int]:
        """A branch from the root: path[0] after the pending token, path[i] after path[i - 1] -> its nodes."""
        nodes, node = [], 0
        for guess in path:
            node = self.add(node, guess, source)
            nodes.append(node)
        return nodes

    def _ordered(self, node: int) -> list[int]:
        """node's children in the order acceptance tries them: draws in draw order, then one-hot by score."""
        drawn = [c for c in self.kids[node] if self.guesses[c].q is not None]
        one_hot = [c for c in self.kids[node] if self.guesses[c].q is None]
        return drawn + sorted(one_hot, key=lambda c: (-self.guesses[c].score, c))

    def grow(self, budget: int) -> Grown:
        """The `budget` nodes picked best first (a node is a candidate once its parent is kept; a drawn node once
        the draws before it are), in depth-first rows."""
        kept, frontier = set(), []

        def offer(node: int) -> None:  # node's children become candidates: every one-hot, the first draw
            drawn = [c for c in self.kids[node] if self.guesses[c].q is not None]
            for c in [c for c in self.kids[node] if self.guesses[c].q is None] + drawn[:1]:
                heapq.heappush(frontier, (-self.guesses[c].score, c))

        offer(0)
        while frontier and len(kept) < budget:
            _, node = heapq.heappop(frontier)
            kept.add(node)
            offer(node)
            if self.guesses[node].q is not None:  # the next draw under the same parent
                siblings = [c for c in self.kids[self.parent[node]] if self.guesses[c].q is not None]
                after = siblings.index(node) + 1
                if after < len(siblings):
                    heapq.heappush(frontier, (-self.guesses[siblings[after]].score, siblings[after]))
        rows, stack = {0: 0}, [c for c in reversed(self._ordered(0)) if c in kept]
        order = []
        while stack:  # depth first: a node, then its subtree
            node = stack.pop()
            rows[node] = len(order) + 1
            order.append(node)
            stack.extend(c for c in reversed(self._ordered(node)) if c in kept)
        guesses = [self.guesses[n] for n in order]
        probs = [g.prob for g in guesses]
        return Grown([g.token for g in guesses], [g.q for g in guesses],
                     probs if all(p is not None for p in probs) else [],
                     tuple(rows[self.parent[n]] for n in order), [g.score for g in guesses],
                     [tuple(self.sources[n]) for n in order], [g.key for g in guesses])


class Calibration:
    """How often each kind of guess is kept once its parent is: the scores a tree is grown by, learned online.

    A tree of n nodes costs a verify pass of n + 1 rows whatever its shape, and returns, on average, the sum over
    its nodes of P(node kept) = the product along its path of c(node) = P(node kept | its parent kept). So at a
    given number of rows the best tree holds the n nodes of largest path products: what TreeBuilder.grow keeps,
    best first, with score = that product. The chain is one such tree, so a tree is grown only where its nodes
    are estimated to return more than the chain's deeper ones, and how well it does that rests on c.

    A drafter's own number is not c: the shipped MTP head gives its first guess p ~ 0.6 where the target keeps
    it ~0.9 of the time, and lookup has no number at all. So c is counted: per key (the drafter's kind of guess:
    ("mtp", its first guess or not, its probability's decile), ("lookup", the best match or not, the suffix length
    matched, first token or not)), the nodes tried (their
    parent was kept) and kept, with `weight` pseudo-counts of the drafter's prior guess:

        c(key) = (kept + weight * prior) / (tried + weight)

    propose(grown) remembers the tree a step verifies; learn(fed) counts that step: the path the target kept is read off the kept tokens (fed: the pending
    token, then the kept drafts; a child whose token is the next kept one is kept, the first in row order, as
    spec_tree's greedy rule takes it); every child of a kept row was tried. The children of the path's last row
    count as not kept, which is wrong only when a stop or max_new cut the step's run there.

    A sequence's drafter keeps its own Calibration, fed only with its own sequence's steps, so its drafts (and a
    sampled sequence's draws) are the same alone or in a batch. A drawn guess's key holds nothing of the token
    drawn (TreeBuilder: its score must not depend on it), and the counts come from earlier steps only."""

    def __init__(self, weight: float = 4.0):
        self.weight = weight
        self.kept: dict[tuple, float] = {}
        self.tried: dict[tuple, float] = {}
        self.proposed: Grown | None = None  # the tree its drafter proposed last, until the step's kept tokens come

    def rate(self, key: tuple, prior: float) -> float:
        """c(key): the share of such guesses kept once their parent was, the prior counting `weight` times."""
        return (self.kept.get(key, 0.0) + self.weight * prior) / (self.tried.get(key, 0.0) + self.weight)

    def propose(self, grown: "Grown", withdrawn: bool = False) -> Draft:
        """The drafter proposes `grown`: its Draft, and the tree remembered for learn()."""
        self.proposed = grown
        return grown.draft(withdrawn)

    def learn(self, fed: Sequence[int]) -> None:
        """Count the step that verified the tree last proposed and kept `fed` (the pending token, then the kept
        drafts); nothing when the step drafted no tree."""
        grown, self.proposed = self.proposed, None
        if grown is None:
            return
        kids = children(grown.parents)
        row = 0
        for depth in range(len(fed)):
            nxt = None
            if depth + 1 < len(fed):
                nxt = next((c for c in kids[row] if grown.tokens[c - 1] == fed[depth + 1]), None)
            for c in kids[row]:
                key = grown.keys[c - 1] if grown.keys else None
                if key is not None:
                    self.tried[key] = self.tried.get(key, 0.0) + 1
                    self.kept[key] = self.kept.get(key, 0.0) + (c == nxt)
            if nxt is None:
                return
            row = nxt


def p_bin(p: float) -> int:
    """A probability's decile, 0 .. 9: the calibration key of a guess that comes with one."""
    return min(int(p * 10), 9)


def grow(branches: Sequence[tuple[Sequence[Guess], str]], budget: int) -> Grown:
    """Branches from the root (each a path of guesses and its source's name) merged and cut to `budget` nodes."""
    builder = TreeBuilder()
    for path, source in branches:
        builder.add_path(path, source)
    return builder.grow(budget)
