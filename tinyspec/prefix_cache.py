"""Prefix caching on a hybrid model: full KV blocks shared by reference, GDN states saved at chosen boundaries.

Many prompts start alike (a system prompt, a few-shot preamble, the earlier turns of a conversation, n samples
of one prompt). A transformer server keeps the KV blocks of such a prefix and lets every later sequence point
its block table at them (vLLM's automatic prefix caching, SGLang's radix cache). A KV block can be shared
because position j's keys depend only on tokens 0..j. On a hybrid model that is half the story: a Gated
DeltaNet layer keeps no per-position record, only a running state (conv window [C, w-1] and memory [n_v, K, V])
that has absorbed every token so far, so it exists only at the positions where somebody copied it out. A
sequence can start at depth d (blocks) only if the KV blocks 0..d-1 are cached AND a GDN state after block d-1
was saved (Marconi, Pan et al. 2024, makes the same observation for Mamba hybrids).

    entry    one cached full block: found by (its parent entry, the block's tokens), so by the tokens it holds
             and all before it (exact: no hash collisions); it names the pool block that holds the keys
             and values, and may hold a saved state (every GDN layer after this block) and the target's hidden
             rows of its positions (what a drafter's start() reads; the MTP head needs them)
    lookup   walk a new sequence's full blocks from the start while entries exist -> matched depth m (KV)
             and the deepest d <= m with a saved state: the sequence adopts blocks 0..d-1 (reference counts,
             paged.BlockPool), copies the state, and prefills only tokens d*bs onward
    eviction the pool owns the blocks: a cached block nobody uses is idle, and evicted least recently used
             when the pool needs a block (BlockPool.take); an entry whose block was evicted is stale and is
             dropped when next met. Saved states are capped at max_states, least recently used dropped first

Where states are saved (each costs a whole GDN state: ~19 MB at the 0.8B shape, ~50 KV blocks of 16 positions;
the engine cuts prefill chunks so that one ends at every save point):

    the prompt's end   the deepest block boundary before its last token: the same prompt again (n samples,
                       a retry, a preempted sequence resumed) or a longer one that starts with it (the next
                       turn of a conversation) starts there
    a branch point     a prompt whose first m blocks are cached but whose deepest state is at d < m recomputes
                       blocks d..m-1 and saves the state at m, where it leaves the cached path: the next prompt
                       with that shared prefix starts there (the first to share a prefix pays for it, as in
                       Marconi; the ones after it do not)
    every N blocks     optional (state_every): finer reuse of prefixes nobody has branched at yet, for memory

Speculation never writes into a shared or cached block: a sequence adopts only full blocks, so every position it
writes lies past them, and its rollbacks truncate only to positions it has written (BlockTable.check_writable
raises otherwise). A saved state is copied into a sequence's own state, never handed out.

Does NOT include: the MTP head's or a draft model's KV in the prefix cache (a draft model re-prefills its whole
prompt; the MTP head re-reads the cached hidden rows), blocks of generated tokens (only prefilled ones are
cached), a radix tree with partial-block matches, sharing across different pools.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


from .paged import BlockPool
from .state import ModelState


@dataclass(eq=False)
class Entry:
    """One cached full block (identity matters: the pool's `cached[block] is entry` says it is still valid)."""
    id: int  # > 0; 0 is the root, the parent of every first block
    block: int  # the pool block holding its keys and values
    depth: int  # blocks from the start through this one
    key: tuple = ()  # (parent entry id, the block's tokens): where `entries` finds it
    hidden: object = None  # [block_size, D] the target's hidden rows of its positions, or None
    state: list | None = None  # per GDN layer (conv [C, w-1], memory [n_v, K, V]) after this block, or None


@dataclass
class Match:
    """What lookup found for a sequence: adopt `blocks` (depth d = len(blocks)), copy the state of `entry`, their
    last (None: d = 0, nothing to start from)."""
    blocks: list[int]
    entry: Entry | None
    hidden: list  # per adopted block its hidden rows
    matched: int  # m >= d: full blocks whose KV is cached (a branch point at m when m > d)


class PrefixCache:
    """The entries of one BlockPool's cached blocks and the saved GDN states (the module docstring).

    max_states: saved states kept at most (each a full GDN state); state_every: also save every N blocks
    (0: only at prompt ends and branch points)."""

    def __init__(self, pool: BlockPool, max_states: int = 16, state_every: int = 0):
        if max_states < 0 or state_every < 0:
            raise ValueError(f"max_states and state_every must be >= 0, got {max_states}, {state_every}")
        self.pool, self.max_states, self.state_every = pool, int(max_states), int(state_every)
        self.entries: dict[tuple[int, tuple[int, ...]], Entry] = {}  # (parent id, block's tokens) -> entry
        self.with_state: OrderedDict[int, Entry] = OrderedDict()  # entry id -> entry, least recently used first
        self.next_id = 1
        self.hits = self.tokens_reused = self.states_saved = 0

    def valid(self, entry: Entry) -> bool:
        return self.pool.cached.get(entry.block) is entry

    def _walk(self, tokens: list[int], n_blocks: int) -> list[Entry]:
        """The valid entries of tokens' first n_blocks full blocks, from the start, up to the first missing one."""
        bs, parent, path = self.pool.block_size, 0, []
        for j in range(n_blocks):
            key = (parent, tuple(tokens[j * bs : (j + 1) * bs]))
            entry = self.entries.get(key)
            if entry is None:
                break
            if not self.valid(entry):  # its block was evicted: forget it (and its state)
                self._drop(key, entry)
                break
            path.append(entry)
            parent = entry.id
        return path

    def _drop(self, key, entry: Entry) -> None:
        del self.entries[key]
        self.with_state.pop(entry.id, None)
        entry.state = None

    def lookup(self, tokens: list[int], limit: int) -> Match:
        """Where a sequence feeding `tokens` can start: at most `limit` full blocks (at least one token must be left
        to feed). Does not adopt anything: the caller adopts Match.blocks into its table."""
        path = self._walk(tokens, limit)
        d = max((i + 1 for i, e in enumerate(path) if e.state is not None), default=0)
        return Match([e.block for e in path[:d]], path[d - 1] if d else None, [e.hidden for e in path[:d]], len(path))

    def save_points(self, n_tokens: int, start: int, matched: int) -> list[int]:
        """Token counts (block boundaries, past `start` blocks, before the last of n_tokens) where a sequence that
        starts at block `start` and finds `matched` blocks cached saves its state: its end, a branch point, every N."""
        bs, last = self.pool.block_size, (n_tokens - 1) // self.pool.block_size
        points = {last}
        if matched > start:
            points.add(matched)
        if self.state_every:
            points.update(range(self.state_every, last, self.state_every))
        return sorted(j * bs for j in points if start < j <= last)

    def register(self, tokens: list[int], blocks: list[int], n_blocks: int, hidden) -> None:
        """The first n_blocks full blocks of a sequence (tokens, its table's blocks, hidden [>= n_blocks*bs, D] or
        None) are written and will never change: make them findable. A block whose tokens are cached already
        (another copy) stays the sequence's own; later sequences find the first copy."""
        bs, parent = self.pool.block_size, 0
        for j in range(n_blocks):
            key = (parent, tuple(tokens[j * bs : (j + 1) * bs]))
            entry = self.entries.get(key)
            if entry is not None and not self.valid(entry):
                self._drop(key, entry)
                entry = None
            if entry is None and blocks[j] in self.pool.cached:
                # this sequence registered the block before, under a parent entry since evicted (another copy of
                # the same tokens) and now registered again from its own block: the same tokens, a new parent id
                entry = self.pool.cached[blocks[j]]
                if entry.depth != j + 1:
                    raise RuntimeError(f"block {blocks[j]} is cached under other tokens")
                if self.entries.get(entry.key) is entry:
                    del self.entries[entry.key]
                entry.key = key
                self.entries[key] = entry
            if entry is None:
                entry = Entry(self.next_id, blocks[j], j + 1, key,
                              None if hidden is None else hidden[j * bs : (j + 1) * bs].copy())
                self.next_id += 1
                self.entries[key] = entry
                self.pool.cached[blocks[j]] = entry
            parent = entry.id
        if len(self.entries) > 2 * self.pool.n_blocks:  # stale entries pile up: sweep them
            for key, entry in [(k, e) for k, e in self.entries.items() if not self.valid(e)]:
                self._drop(key, entry)

    def save_state(self, tokens: list[int], n_blocks: int, state: ModelState) -> None:
        """Keep a copy of `state` (its GDN layers; state.pos == n_blocks * bs) at the entry of tokens' block
        n_blocks - 1, which must be registered. The least recently used saved state goes past max_states."""
        if state.pos != n_blocks * self.pool.block_size:
            raise ValueError(f"a state saved after block {n_blocks} must hold {n_blocks * self.pool.block_size} "
                             f"tokens, it holds {state.pos}")
        path = self._walk(tokens, n_blocks)
        if len(path) < n_blocks or not self.max_states:
            return  # a block of the path was evicted meanwhile (or no states are kept): nothing to attach it to
        entry = path[-1]
        if entry.state is None:
            entry.state = state.gdn_copy()
            self.states_saved += 1
        self.with_state[entry.id] = entry
        self.with_state.move_to_end(entry.id)
        self._forget_stale_states()
        while len(self.with_state) > self.max_states:
            _, old = self.with_state.popitem(last=False)
            old.state = None

    def start(self, state: ModelState, match: Match) -> None:
        """A fresh paged state begins where `match` found a saved state: blocks adopted (shared), GDN layers
        copied into the state's own buffers (a saved state is never handed out, so never written)."""
        if match.entry is None:
            return
        self.hits += 1
        self.with_state.move_to_end(match.entry.id)  # recently used
        state.start_from(match.blocks, match.entry.state)
        self.tokens_reused += state.pos

    def _forget_stale_states(self) -> None:
        """Drop the states of entries whose block was evicted (a lookup could never reach them again)."""
        for entry_id, entry in [(i, e) for i, e in self.with_state.items() if not self.valid(e)]:
            del self.with_state[entry_id]
            entry.state = None

    def state_bytes(self) -> int:
        """Memory held by the saved GDN states now."""
        self._forget_stale_states()
        return sum(conv.nbytes + ssm.nbytes for e in self.with_state.values() for conv, ssm in e.state)

    def stats(self) -> dict:
        return {"prefix_hits": self.hits, "prefix_tokens_reused": self.tokens_reused,
                "prefix_states_saved": self.states_saved, "prefix_states_kept": len(self.with_state),
                "prefix_state_bytes": self.state_bytes(),
                "prefix_blocks_cached": sum(self.valid(e) for e in self.entries.values())}
