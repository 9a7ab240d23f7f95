"""Gated DeltaNet (GDN), the recurrent mixer of qwen35: causal conv, delta-rule memory, gated norm.

For each new token (x is the input after attn_norm; value head j reads key head j % n_k):

    m, z, b, a = attn_qkv @ x, attn_gate @ x, ssm_beta @ x, ssm_alpha @ x
    beta  = sigmoid(b)                                  write strength, in (0, 1)
    g     = ssm_a * softplus(a + ssm_dt.bias)           log decay, <= 0 (ssm_a is already -exp(A_log))
    c     = silu(causal_conv(m))  = [q | k | v]         q, k: n_k heads of K;  v: HV heads of V
    q, k  = l2_norm(q), l2_norm(k);  q = q / sqrt(K)
    S_j   = exp(g_j) S_j                                decay the memory
    S_j  += outer(k_j, beta_j (v_j - S_j^T k_j))        delta rule: write only what the memory mispredicts
    o_j   = S_j^T q_j                                   read
    out   = ssm_out @ concat_j(rms_norm(o_j, ssm_norm) * silu(z_j))

Axes: T tokens, D model dim, C = 2 n_k K + HV V conv channels, w conv width, n_k key heads,
HV value heads (= n_v), K key head dim, V value head dim, L chunk length.
State layout: conv [C, w-1] (raw projections of the last w-1 tokens, oldest first), ssm [HV, K, V]
(fla's and HF's layout; llama.cpp stores the transpose [HV, V, K]). "S^T k" sums over the K axis.

Three forms of the same recurrence, each tested against the one before it (tests/test_gdn.py):
delta_rule_step (one token), gdn_scan (a loop of steps) and gdn_chunked (the WY / UT-transform form
that turns a chunk of steps into matrix products, used for long prefills).

Batch invariance: with chunked=False, row t of a T-token call is bitwise identical to a one-token
call from the state before token t. Projections use ops.linear (a matvec per row), the conv adds its
taps one at a time, the scan is a per-token loop, and every other op is elementwise or reduces the
last axis of one row. The chunked form reorders sums (matrix products over a chunk), so it agrees
only to rounding (~1e-6); speculative verification therefore always uses the scan.

Official implementation: llama.cpp src/models/qwen35.cpp (the linear-attention layer) and
src/models/delta-net-base.cpp; HF transformers Qwen3_5GatedDeltaNet, torch_recurrent_gated_delta_rule
and torch_chunk_gated_delta_rule (models/qwen3_5/modeling_qwen3_5.py); fla ops/gated_delta_rule/naive.py.
Papers: Yang, Kautz, Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with Delta Rule" (ICLR 2025);
Yang et al., "Parallelizing Linear Transformers with the Delta Rule over Sequence Length" (NeurIPS 2024),
for the WY / UT chunk form. Math reference: docs/qwen35.md section 3.1.
Several sequences in one pass (gdn_layer_ragged, batch.py): the projections run once over every sequence's
rows packed together, the conv and the scan of each sequence from its own state (causal_conv_ragged,
gdn_scan_ragged: here a loop over the sequences, in fast/numba_gdn.py one kernel call), so each sequence's rows
are bitwise those it computes alone. One sequence (gdn_layer) is the case of one: the steps are written once.
Does NOT include: qwen3next's fused qkvz / ba layouts, backward pass.
"""

from __future__ import annotations

from functools import partial
from typing import Mapping

import numpy as np

from .config import ModelConfig
from .ops import asarray_like, join_rows, rows_of
from .state import GDNState, ReplayLog, SnapshotEntries
from .tree import levels


def causal_conv(x: np.ndarray, conv_state: np.ndarray, weight: np.ndarray,
                states_out: np.ndarray | None = None, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    # [T, C], [C, w-1], [C, w] -> [T, C], [C, w-1]
    """Depthwise causal convolution over time, no bias, no activation.

    With the window [conv_state | x] (oldest first), y[t, c] = sum_k weight[c, k] * window[t + k, c]:
    the last tap (k = w-1) multiplies the current token. This is a cross-correlation, the same as
    torch conv1d(groups=C, padding=w-1)[:T] when the state is zero. The new state is the last w-1
    raw inputs; states_out [>= T, C, w-1], if given, receives the state after each token (the
    snapshot ring of a verify pass): the w-1 raw inputs up to and including token t.
    out [C, w-1], if given, receives the new state and is returned as it (it may be `conv_state` itself:
    an update in place, safe because the window is a copy of conv_state made before anything is written).
    """
    T, C = x.shape
    w = weight.shape[1]
    window = np.concatenate([conv_state.T, x], axis=0)  # [w-1+T, C], a new array: conv_state is read here, once
    y = np.zeros_like(x, dtype=np.float32)  # [T, C], on x's device
    for tap in range(w):  # one tap at a time: every output sums its w products in the same order, whatever T is
        y += weight[:, tap] * window[tap : tap + T]  # [C] * [T, C]
    if states_out is not None:
        for t in range(T):
            states_out[t] = window[t + 1 : t + w].T  # [C, w-1]
    if out is None:
        return y, np.copy(window[T:].T, order="C")  # [C, w-1]
    np.copyto(out, window[T:].T)  # [C, w-1]
    return y, out


def delta_rule_step(
    state: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, log_decay: np.ndarray, beta: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:  # [HV, K, V], [HV, K], [HV, K], [HV, V], [HV], [HV] -> [HV, V], [HV, K, V]
    """One token of the gated delta rule for every value head. q, k are normalised and expanded to HV heads."""
    S = np.exp(log_decay)[:, None, None] * state  # 1. decay (forget)
    predicted = (S * k[:, :, None]).sum(axis=1)  # 2. predict: what the memory returns for k, S^T k  [HV, V]
    delta = beta[:, None] * (v - predicted)  # 3. correct: the error, scaled by the write strength  [HV, V]
    S = S + k[:, :, None] * delta[:, None, :]  # 4. write: rank-1 update outer(k, delta)
    o = (S * q[:, :, None]).sum(axis=1)  # 5. read the updated memory with q, S^T q  [HV, V]
    return o, S


def gdn_scan(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, log_decay: np.ndarray, beta: np.ndarray, state: np.ndarray,
    states_out: np.ndarray | None = None, out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # [T, HV, K] x2, [T, HV, V], [T, HV] x2, [HV, K, V] -> [T, HV, V], [HV, K, V]
    """The recurrence token by token: the definition every faster form is checked against.

    states_out [>= T, HV, K, V], if given, receives the state after each token (the snapshot ring of
    speculative verification: rolling back to token t is a copy from states_out[t], no recompute).
    out [HV, K, V], if given, receives the new state and is returned as it (it may be `state` itself:
    an update in place, which spares a backend a fresh state-sized array per call).
    """
    T, HV, _ = q.shape
    o = np.empty((T, HV, v.shape[2]), np.float32)
    for t in range(T):
        o[t], state = delta_rule_step(state, q[t], k[t], v[t], log_decay[t], beta[t])
        if states_out is not None:
            states_out[t] = state
    if out is not None:
        np.copyto(out, state)
        state = out
    return o, state


def causal_conv_ragged(x: np.ndarray, bounds: np.ndarray, conv_states: list, weight: np.ndarray,
                       states_outs: list | None = None, outs: list | None = None,
                       conv=causal_conv) -> tuple[np.ndarray, list]:
    # [R, C], [B+1], B x [C, w-1], [C, w] -> [R, C], B x [C, w-1]
    """causal_conv of several sequences packed in one [R, C] (sequence b: rows bounds[b] .. bounds[b+1]-1), each
    from its own window conv_states[b]; states_outs[b] and outs[b] (or None) as causal_conv's states_out and out.
    Returns the rows [R, C] and each sequence's new window. The loop a fast backend fuses into one call
    (fast/numba_gdn.py); conv: the one-sequence conv it loops over (a backend's own, with causal_conv's contract)."""
    B = len(conv_states)
    states_outs, outs = states_outs or [None] * B, outs or [None] * B
    parts = [conv(x[lo:hi], cs, weight, states_out=so, out=out)
             for lo, hi, cs, so, out in zip(bounds[:-1], bounds[1:], conv_states, states_outs, outs)]
    return join_rows([y for y, _ in parts]), [new for _, new in parts]


def gdn_scan_ragged(q: np.ndarray, k: np.ndarray, v: np.ndarray, log_decay: np.ndarray, beta: np.ndarray,
                    bounds: np.ndarray, states: list, states_outs: list | None = None, outs: list | None = None,
                    scan=gdn_scan) -> tuple[np.ndarray, list]:
    # [R, HV, K] x2, [R, HV, V], [R, HV] x2, [B+1], B x [HV, K, V] -> [R, HV, V], B x [HV, K, V]
    """gdn_scan of several sequences packed in one pass (sequence b: rows bounds[b] .. bounds[b+1]-1), each from
    its own memory states[b]; states_outs[b] and outs[b] (or None) as gdn_scan's states_out and out. Returns the
    rows o [R, HV, V] and each sequence's new memory. The loop a fast backend fuses into one call
    (fast/numba_gdn.py); scan: the one-sequence scan it loops over (a backend's own, or gdn_chunked)."""
    B = len(states)
    states_outs, outs = states_outs or [None] * B, outs or [None] * B
    parts = [scan(q[r], k[r], v[r], log_decay[r], beta[r], state, states_out=so, out=out)
             for r, state, so, out in zip([slice(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])], states,
                                          states_outs, outs)]
    return join_rows([o for o, _ in parts]), [new for _, new in parts]


def _solve_unit_lower(A: np.ndarray, B: np.ndarray) -> np.ndarray:  # [HV, L, L], [HV, L, V] -> [HV, L, V]
    """X with (I + A) X = B, A strictly lower triangular: forward substitution, row r uses rows < r."""
    X = B.copy()
    for r in range(1, B.shape[1]):
        X[:, r] -= (A[:, r : r + 1, :r] @ X[:, :r])[:, 0]  # [HV, 1, r] @ [HV, r, V]
    return X


def gdn_chunked(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    log_decay: np.ndarray,
    beta: np.ndarray,
    state: np.ndarray,
    states_out: None = None,
    out: np.ndarray | None = None,
    chunk: int = 64,
) -> tuple[np.ndarray, np.ndarray]:  # same shapes as gdn_scan
    """The same recurrence, a chunk of L tokens at a time with matrix products (the WY / UT form).

    gdn_scan's signature, so gdn_layer calls either the same way: out as there; no per-token states
    (states_out must be None: inside a chunk the states are never formed).

    Inside a chunk, number the tokens r = 1..L, let S0 be the state before the chunk and
    G_r = g_1 + ... + g_r the cumulative log decay, so the decay from token i to token r is
    exp(G_r - G_i). Call u_r = beta_r (v_r - S_{r-1}'^T k_r) the value token r writes (S' = decayed).
    Unrolling the step, every state is the decayed S0 plus the decayed writes so far:

        S_r = exp(G_r) S0 + sum_{i<=r} exp(G_r - G_i) outer(k_i, u_i)

    Putting S_{r-1}' = exp(g_r) S_{r-1} (the same sum over i < r) into the definition of u_r gives
    one linear equation per token:

        u_r + beta_r sum_{i<r} exp(G_r - G_i) (k_r . k_i) u_i = beta_r (v_r - exp(G_r) S0^T k_r)

    that is (I + A) U = B with A strictly lower triangular: the UT transform. A unit lower-triangular
    system is solved row by row (forward substitution). With U known, outputs and the next state are
    plain products:

        o_r   = exp(G_r) S0^T q_r + sum_{i<=r} exp(G_r - G_i) (q_r . k_i) u_i
        S_L   = exp(G_L) S0 + sum_i exp(G_L - G_i) outer(k_i, u_i)

    The first term of o is the old memory read through the decay, the second a causal, decayed
    attention over the chunk's own writes. Only the chunk loop stays sequential.
    Differences from HF's torch_chunk_gated_delta_rule: HF solves (I + A) for all chunks before the
    loop, once for beta V and once for beta exp(G) K, then subtracts the S0 part inside the loop
    (k_cumdecay @ state); here S0 is known when the chunk is solved, so B includes it. HF and
    llama.cpp zero-pad T to a multiple of the chunk; here the last chunk is simply shorter, which is
    the same thing (a padded token has k = 0, beta = 0, g = 0 and changes nothing).
    """
    if states_out is not None:
        raise ValueError("gdn_chunked computes no per-token states: use gdn_scan for states_out")
    T, HV, K = q.shape
    o = np.empty_like(v, shape=(T, HV, v.shape[2]))  # float32, on v's device
    S = state  # [HV, K, V]
    for start in range(0, T, chunk):
        span = slice(start, min(start + chunk, T))
        Q, Kc, Vc = (a[span].transpose(1, 0, 2) for a in (q, k, v))  # [HV, L, K], [HV, L, K], [HV, L, V]
        G = np.cumsum(log_decay[span].T, axis=1)  # [HV, L]  log of the decay from chunk start to token r
        b = beta[span].T[:, :, None]  # [HV, L, 1]
        L = G.shape[1]
        causal = asarray_like(np.tril(np.ones((L, L), dtype=bool)), q)  # i <= r
        log_gap = np.where(causal, G[:, :, None] - G[:, None, :], -np.inf)  # [HV, L, L]  G_r - G_i
        decay_pair = np.exp(log_gap).astype(np.float32)  # exp(G_r - G_i) for i <= r, else 0
        decay_in = np.exp(G)[:, :, None]  # [HV, L, 1]  exp(G_r): decay of S0 by token r

        # 1. solve the UT system for the values each token writes
        A = np.tril(b * (Kc @ Kc.transpose(0, 2, 1)) * decay_pair, -1)  # [HV, L, L]  strictly lower
        B = b * (Vc - decay_in * (Kc @ S))  # [HV, L, V]
        U = _solve_unit_lower(A, B)  # [HV, L, V]
        # 2. outputs: old memory, decayed, plus causal attention over this chunk's writes
        O = decay_in * (Q @ S) + ((Q @ Kc.transpose(0, 2, 1)) * decay_pair) @ U  # [HV, L, V]
        o[span] = O.transpose(1, 0, 2)  # [L, HV, V]
        # 3. state after the chunk
        decay_out = np.exp(G[:, -1:] - G)[:, :, None]  # [HV, L, 1]  exp(G_L - G_i)
        S = np.exp(G[:, -1])[:, None, None] * S + (Kc * decay_out).transpose(0, 2, 1) @ U  # [HV, K, V]
    S = S.astype(np.float32)
    if out is not None:
        np.copyto(out, S)
        S = out
    return o, S


def gdn_layer(
    x: np.ndarray, w: Mapping[str, np.ndarray], state: GDNState, cfg: ModelConfig, kern,
    chunked: bool = False, ring: SnapshotEntries | ReplayLog | None = None,
) -> np.ndarray:  # [T, D] -> [T, D]
    """The GDN mixer of one layer on one sequence's T new tokens: gdn_layer_ragged with one sequence."""
    return gdn_layer_ragged(x, w, [state], np.array([0, x.shape[0]]), cfg, kern, [ring], chunked)


def gdn_layer_ragged(
    x: np.ndarray, w: Mapping[str, np.ndarray], states: list[GDNState], bounds: np.ndarray, cfg: ModelConfig,
    kern, rings: list | None = None, chunked: bool = False, trees: list | None = None,
) -> np.ndarray:  # [R, D] -> [R, D]
    """The GDN mixer of one layer on several sequences' new tokens, packed in one [R, D] (sequence b: rows
    bounds[b] .. bounds[b+1]-1, like cu_seqlens). Updates each states[b].conv and states[b].ssm.

    w holds the layer's GGUF tensors without the `blk.{i}.` prefix, as NumPy arrays (rows = outputs).
    kern: the functions to compute with (a kernels.Kernels, which this module never imports: it imports this
    one for its defaults; matmul, row functions, causal_conv and gdn_scan, each the oracle's above or one with
    its contract and bits, e.g. fast/numba_gdn.py's).
    Steps 1, 3 and 5 (projections, per-row functions, out projection) run once over all R rows, so each
    weight is read once; the conv and the scan (2, 4) run each sequence over its own rows from its own state
    (kern.causal_conv_ragged and kern.gdn_scan_ragged: one call for all sequences, which the oracle makes a
    loop of per-sequence calls), so each sequence's rows are bitwise those it computes alone. One sequence
    is the case bounds = [0, T].
    chunked=True scans with gdn_chunked (faster for a long prefill, not bitwise batch-invariant; no ring).
    rings[b]: sequence b's per-layer view of its verify pass's ring (state.py RollbackRing.layer), or None. It says
    where the conv and the scan write the state after each token (a SnapshotRing's entries: entry t is what a
    rollback to "t + 1 tokens kept" restores) and where the new memory goes, and it records what it keeps
    (a ReplayRing's log: the pre-pass memory and window, and the inputs to rerun).
    trees[b]: sequence b's draft tree (tree.py: its drafts' parent rows), or None (its rows follow one another):
    a tree's rows run gdn_recurrent_tree, each from its parent's state, into its ring (a SnapshotRing's).
    """
    rings = rings or [None] * len(states)
    trees = trees or [None] * len(states)
    for b, ring in enumerate(rings):  # checked before any state changes
        if ring is not None and (chunked or any(len(s) < bounds[b + 1] - bounds[b]
                                                for s in (ring.conv_states, ring.ssm_states) if s is not None)):
            raise ValueError(f"a ring needs the scan and room for {bounds[b + 1] - bounds[b]} tokens "
                             f"(chunked={chunked})")
        if trees[b] is not None and (ring is None or ring.ssm_states is None or chunked):
            raise ValueError("a tree's rows need a SnapshotRing (the state after every row) and the scan")
    mixed, z, beta, log_decay = kern.gdn_project(x, w, kern)  # 1. projections (gdn_project, or a fused one)
    if all(t is None for t in trees):  # 2-4.
        o = kern.gdn_recurrent(mixed, log_decay, beta, bounds, w, states, cfg, kern, rings, chunked)
    else:
        o = gdn_recurrent_mixed(mixed, log_decay, beta, bounds, w, states, cfg, kern, rings, trees)
    return kern.gdn_output(o, z, w, cfg, kern)  # 5. gated norm, out projection (gdn_output, or a fused one)


def gdn_recurrent_mixed(mixed, log_decay, beta, bounds: np.ndarray, w: Mapping[str, np.ndarray],
                        states: list[GDNState], cfg: ModelConfig, kern, rings: list, trees: list) -> np.ndarray:
    """Steps 2-4 of a pass whose sequences are chains and trees: the chains' rows in one kern.gdn_recurrent
    call (as without trees), each tree's by gdn_recurrent_tree -> o [R, HV, V] in the pass's row order."""
    o = np.empty_like(mixed, shape=(mixed.shape[0], cfg.ssm_n_v_heads, cfg.ssm_head_v_dim))  # where mixed is
    chain = [b for b, t in enumerate(trees) if t is None]
    if chain:
        rows, sizes = rows_of(bounds, chain)
        o[rows] = kern.gdn_recurrent(mixed[rows], log_decay[rows], beta[rows], sizes, w, [states[b] for b in chain],
                                     cfg, kern, [rings[b] for b in chain], False)
    for b, parents in enumerate(trees):
        if parents is not None:
            span = slice(int(bounds[b]), int(bounds[b + 1]))
            o[span] = kern.gdn_recurrent_tree(mixed[span], log_decay[span], beta[span], parents, w, states[b], cfg,
                                              kern, rings[b])
    return o


def gdn_recurrent_tree(mixed: np.ndarray, log_decay: np.ndarray, beta: np.ndarray, parents, w: Mapping[str, np.ndarray],
                       state: GDNState, cfg: ModelConfig, kern, ring: SnapshotEntries) -> np.ndarray:
    # [T, C], [T, HV] x2, T - 1 parents -> o [T, HV, V]
    """Steps 2-4 over one sequence's draft tree (tree.py): row 0 (the pending token) from the sequence's state,
    row t from its parent's: the conv window and the memory the ring's entry parents[t-1] holds (the state after
    the parent's path), and row t's own state goes to entry t.

        window_t = [window_parent[1:] | m_t]      S_t = step(S_parent, q_t, k_t, v_t, g_t, beta_t)

    So row t computes what a one-token decode after its path computes, bit for bit: the same one-token calls
    (kern.causal_conv_ragged, kern.gdn_scan_ragged with one row a sequence) from the same state. The rows of one
    depth (tree.levels) have their parents in the depth before, so they run as one ragged call. The sequence's
    own state is not written: after acceptance SnapshotRing.restore_path copies the kept row's entry into it."""
    o = np.empty_like(mixed, shape=(mixed.shape[0], cfg.ssm_n_v_heads, cfg.ssm_head_v_dim))
    conv_w = w["ssm_conv1d.weight"]
    for rows in levels(parents):
        before = [0 if t == 0 else parents[t - 1] for t in rows]  # the parent row (row 0: the sequence's state)
        windows = [state.conv if t == 0 else ring.conv_states[p] for t, p in zip(rows, before)]
        memories = [state.ssm if t == 0 else ring.ssm_states[p] for t, p in zip(rows, before)]
        one = np.arange(len(rows) + 1)  # bounds: every row a sequence of one token
        c, _ = kern.causal_conv_ragged(mixed[rows], one, windows, conv_w, None, [ring.conv_states[t] for t in rows])
        q, k, v = gdn_qkv(kern.silu(c), cfg, kern)
        o[rows], _ = kern.gdn_scan_ragged(q, k, v, log_decay[rows], beta[rows], one, memories, None,
                                          [ring.ssm_states[t] for t in rows])
    return o


def gdn_recurrent(mixed: np.ndarray, log_decay: np.ndarray, beta: np.ndarray, bounds: np.ndarray,
                  w: Mapping[str, np.ndarray], states: list[GDNState], cfg: ModelConfig, kern,
                  rings: list | None = None, chunked: bool = False) -> np.ndarray:  # [R, C] -> o [R, HV, V]
    """Steps 2-4, the part that reads and writes each sequence's state (or a fused one: kern.gdn_recurrent)."""
    rings = rings or [None] * len(states)
    c, conv_after = gdn_conv(mixed, bounds, w, states, kern, rings)  # 2. conv, every sequence from its window
    q, k, v = gdn_qkv(c, cfg, kern)  # 3. q, k, v per row
    return gdn_memory(q, k, v, log_decay, beta, bounds, mixed, conv_after, w, states, kern, chunked, rings)  # 4.


def gdn_project(x: np.ndarray, w: Mapping[str, np.ndarray], kern) -> tuple:
    """Step 1, every row on its own: mixed [T, C] (into the conv), z [T, HV*V] (the output gate), beta [T, HV]
    and log_decay [T, HV] (z, b, a bypass the conv)."""
    mixed = kern.linear(x, w["attn_qkv.weight"])  # [T, C]
    z = kern.linear(x, w["attn_gate.weight"])  # [T, HV*V]
    beta = kern.sigmoid(kern.linear(x, w["ssm_beta.weight"]))  # [T, HV]
    alpha = kern.linear(x, w["ssm_alpha.weight"])  # [T, HV]
    log_decay = w["ssm_a"] * kern.softplus(alpha + w["ssm_dt.bias"])  # [T, HV]  dt_bias inside the softplus
    return mixed, z, beta, log_decay


def gdn_conv(mixed: np.ndarray, bounds: np.ndarray, w: Mapping[str, np.ndarray], states: list[GDNState],
             kern, rings: list) -> tuple[np.ndarray, list]:
    """Step 2: causal conv of each sequence's raw projections over its own window (one kern.causal_conv_ragged
    call for all), then SiLU -> c [R, C] and each sequence's window after them [C, w-1] (the state takes it in
    gdn_memory). Without a ring the new window overwrites the old in place; with one, the ring says where it
    goes (ring.conv_out: state.conv for a SnapshotRing; None, a fresh array, for a ReplayRing, which records
    the old one)."""
    conv_states = [None if ring is None else ring.conv_states for ring in rings]  # [>= T_b, C, w-1] or None
    # In place is safe where nothing reads the pre-pass window after the conv: with no ring or a SnapshotRing
    # nothing does (SnapshotEntries.record keeps nothing; a rollback copies from the entries). A ReplayLog's
    # record, in gdn_memory after the scan, keeps state.conv as the base a replay starts from: so its
    # conv_out is None, and state.conv still holds the pre-pass window when record runs.
    outs = [s.conv if ring is None else ring.conv_out(s) for s, ring in zip(states, rings)]  # [C, w-1] or None
    c, conv_after = kern.causal_conv_ragged(mixed, bounds, [s.conv for s in states], w["ssm_conv1d.weight"],
                                            conv_states, outs)  # [R, C], B x [C, w-1]
    return kern.silu(c), conv_after


def gdn_qkv(c: np.ndarray, cfg: ModelConfig, kern) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step 3, every row on its own: split [q | k | v], normalise q and k per head, give each value head its key
    head. c [T, C] -> q, k [T, HV, K], v [T, HV, V]."""
    T = c.shape[0]
    n_k, HV, K, V = cfg.ssm_n_k_heads, cfg.ssm_n_v_heads, cfg.ssm_head_k_dim, cfg.ssm_head_v_dim
    qk = kern.l2_norm(c[:, :2 * n_k * K].reshape(T, 2 * n_k, K), cfg.rms_eps)  # [T, 2 n_k, K]: q heads, k heads
    v = c[:, 2 * n_k * K:].reshape(T, HV, V)  # [T, HV, V]
    # GGUF tiles value heads: value head j uses key head j % n_k (HF groups them, j // (HV / n_k))
    q = np.concatenate((qk[:, :n_k],) * (HV // n_k), axis=1) * np.float32(1.0 / np.sqrt(K))  # [T, HV, K], scaled
    k = np.concatenate((qk[:, n_k:],) * (HV // n_k), axis=1)  # [T, HV, K]
    return q, k, v


def gdn_memory(q, k, v, log_decay, beta, bounds, mixed, conv_after: list, w: Mapping[str, np.ndarray],
               states: list[GDNState], kern, chunked: bool = False, rings: list | None = None) -> np.ndarray:
    """Step 4: the delta-rule memory of each sequence from its own state, one kern.gdn_scan_ragged call for all
    (gdn_chunked per sequence for a long prefill) -> o [R, HV, V]; then each state takes its new window
    (conv_after[b]: state.conv itself already, unless its ring is a ReplayRing's) and memory. Without a ring the
    new memory overwrites the old in place; with one, the ring says where the per-token states and the new
    memory go, and records what a rollback needs (mixed: the conv's input, for a replay)."""
    rings = rings or [None] * len(states)
    scan = partial(gdn_scan_ragged, scan=gdn_chunked) if chunked else kern.gdn_scan_ragged
    states_outs = [None if ring is None else ring.ssm_states for ring in rings]
    memory_outs = [state.ssm if ring is None else ring.memory_out(state) for state, ring in zip(states, rings)]
    o, ssm_after = scan(q, k, v, log_decay, beta, bounds, [s.ssm for s in states], states_outs, memory_outs)
    for lo, hi, state, ring, conv, ssm in zip(bounds[:-1], bounds[1:], states, rings, conv_after, ssm_after):
        if ring is not None:  # state holds the pre-pass window and memory, unless they were written in place
            ring.record(state, (mixed[lo:hi], w["ssm_conv1d.weight"]),
                        tuple(a[lo:hi] for a in (q, k, v, log_decay, beta)))
        state.conv, state.ssm = conv, ssm
    return o  # [R, HV, V]


def gdn_output(o: np.ndarray, z: np.ndarray, w: Mapping[str, np.ndarray], cfg: ModelConfig,
               kern) -> np.ndarray:
    """Step 5: gated RMSNorm per value head (ssm_norm is a plain weight, no +1), then the out projection.
    o [T, HV, V], z [T, HV*V] -> [T, D]."""
    T, HV, V = o.shape
    y = kern.rms_norm(o, w["ssm_norm.weight"], cfg.rms_eps) * kern.silu(z.reshape(T, HV, V))  # [T, HV, V]
    return kern.linear(y.reshape(T, HV * V), w["ssm_out.weight"])  # [T, D]

