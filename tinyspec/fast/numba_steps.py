"""Fused layer steps for the cpu backend: a step of a layer that is several matmuls and row functions, as one
compiled call.

A decode step of a small model is hundreds of Python-level calls around kernels that each take microseconds
(issue 46: the shipped model's ~21 MFLOP a token ran at 2.0 ms, llama.cpp's at 0.43). Each function here is the
oracle's step of the same name computed in one Numba call, with every matmul the kernel its weight is bound to
(numba_ops.Bound: the same compiled serial kernel a separate call runs) and every row function numba_rows'
operations, in the same order: so each is bitwise the step composed of the cpu backend's separate calls
(tests/test_numba_steps.py), and batch-invariant as they are.

    ffn_residual(x, w, cfg, kern)         ffn.ffn_residual    x + swiglu(rms_norm(x, post_attention_norm)), a dense
                                                              layer's second half (ops.swiglu: down(silu(gate x) *
                                                              (up x)))
    gdn_project(x, w, kern)               gdn.gdn_project     the qkv, gate, beta and alpha projections; beta's
                                                              sigmoid, ssm_a * softplus(alpha + dt_bias)
    gdn_recurrent(mixed, log_decay, beta, gdn.gdn_recurrent  the conv and its SiLU, q/k norms, the memory's scan:
                  bounds, w, states, cfg,                    each window and memory in place (a decode step, a
                  kern, rings, chunked)                      prefill), or where a verify pass's rings say, each
                                                              ring recording what its rollback needs
    gdn_output(o, z, w, cfg, kern)        gdn.gdn_output      rms_norm(o, ssm_norm) * silu(z), then ssm_out
    attention_project(x, w, cfg, kern)    attention.project   q (with its gate), k and v projections
    norm_rope(q, k, positions, w, cfg,    attention.norm_rope each head's RMSNorm, then rope at its row's position
              kern)                                          (the angles NumPy's, ops.rope_angles)
    attention_output(o, gate, w, kern)    attention.output    o * sigmoid(gate), then attn_output

Only a step whose matmuls are all small (numba_ops.Bound.serial: one thread) is fused, and gdn_recurrent only
where numba_gdn would scan on the calling thread (not a chunked prefill). A larger matrix is split across
threads by its own kernel, where a parallel region per matmul pays for itself, and its step takes the separate
calls: the oracle's step with the cpu backend's kernels. So does a step whose weights are not all numba_ops-bound
(a float32 tensor) or whose input is not float32. The threads a call uses are chosen from its size.
"""

from __future__ import annotations

import math

import numpy as np
from numba import carray, njit

from .. import attention, ffn, gdn, ops
from ..backends import PackedWeight
from . import numba_gdn, numba_ops
from .numba_gdn import (
    _CONV_FIELDS,
    _KEEP,
    _NO_CONV_STATES_AT,
    _NO_SNAPS_AT,
    _OUT,
    _SCAN_FIELDS,
    _WINDOW,
    _WINDOW_ROWS,
    _WINDOWS,
    _address,
    _causal_conv,
    _f32_at,
    _scan_pair,
)
from .numba_ops import FAMILY_Q8_0, FAMILY_Q8_K
from .numba_rows import _NO_W, _norm_row, _norm_rows, sigmoid1, silu1, softplus1


@njit(cache=True, error_model="numpy", boundscheck=False)
def _linear(x, w, y):  # x [T, in] -> y [T, out]; w: a Bound's plan (flat, row_bytes, kind, n_in, family)
    flat, row_bytes, kind, n_in, family = w
    if n_in == 0:
        y[:] = np.float32(0)
    elif family == FAMILY_Q8_0:
        numba_ops._quant_linear_q8_0_serial(x, flat, row_bytes, kind, n_in, y)
    elif family == FAMILY_Q8_K:
        numba_ops._quant_linear_q8_serial(x, flat, row_bytes, kind, n_in, y)
    else:
        numba_ops._quant_linear_serial(x, flat, row_bytes, kind, n_in, y)


@njit(cache=True, error_model="numpy", boundscheck=False)
def _swiglu(x, gate, up, down, g, u, y):  # x [T, D]; g, u [T, F] scratch; y [T, D]
    _linear(x, gate, g)
    _linear(x, up, u)
    for t in range(g.shape[0]):
        for j in range(g.shape[1]):
            v = g[t, j]
            g[t, j] = silu1(v) * u[t, j]  # silu(gate) * up, as kern.silu(g) * u
    _linear(g, down, y)


@njit(cache=True, error_model="numpy", boundscheck=False)
def _ffn_residual(x, norm_w, eps, gate, up, down, u, g, h, y):  # x [T, D] -> y [T, D]; u [T, D], g, h [T, F] scratch
    _norm_rows(x, norm_w, u, eps, True, True)  # numba_rows.rms_norm's
    _swiglu(u, gate, up, down, g, h, y)
    for t in range(x.shape[0]):
        for j in range(x.shape[1]):
            y[t, j] = x[t, j] + y[t, j]  # the residual, as x + ffn(...)


@njit(cache=True, error_model="numpy", boundscheck=False)
def _gdn_project(x, qkv, gate, beta_w, alpha_w, ssm_a, dt_bias, mixed, z, beta, log_decay):
    _linear(x, qkv, mixed)  # [T, C]
    _linear(x, gate, z)  # [T, HV*V]
    _linear(x, beta_w, beta)  # [T, HV], then its sigmoid in place
    _linear(x, alpha_w, log_decay)  # [T, HV] alpha, then ssm_a * softplus(alpha + dt_bias) in place
    for t in range(beta.shape[0]):
        for h in range(beta.shape[1]):
            beta[t, h] = sigmoid1(beta[t, h])
            log_decay[t, h] = ssm_a[h] * softplus1(np.float32(log_decay[t, h] + dt_bias[h]))


@njit(cache=True, error_model="numpy", boundscheck=False)
def _gated_out(o, z, norm_w, eps, out_w, y):  # o [T*HV, V] rows, z [T, HV*V], norm_w [V] -> y [T, D]
    T = z.shape[0]
    n = np.empty_like(o)
    _norm_rows(o, norm_w, n, eps, True, True)
    g = n.reshape(T, z.shape[1])
    for t in range(T):
        for j in range(z.shape[1]):
            v = z[t, j]
            g[t, j] = g[t, j] * silu1(v)  # rms_norm(o) * silu(z)
    _linear(g, out_w, y)


@njit(cache=True, error_model="numpy", boundscheck=False)
def _attention_project(x, q_w, k_w, v_w, qg, k, v):
    _linear(x, q_w, qg)
    _linear(x, k_w, k)
    _linear(x, v_w, v)


@njit(cache=True, error_model="numpy", boundscheck=False)
def _gated_attention_out(o, gate, out_w, y):  # o, gate [T, H*d] -> y [T, D]
    g = np.empty_like(o)
    for t in range(o.shape[0]):
        for j in range(o.shape[1]):
            g[t, j] = o[t, j] * sigmoid1(gate[t, j])  # o * sigmoid(gate)
    _linear(g, out_w, y)


@njit(cache=True, error_model="numpy", boundscheck=False)
def _gdn_recurrent(mixed, bounds, convs, conv_w, decay, beta, seqs, n_k, eps, scale, q, k, vv, o):
    # mixed [R, C] -> q, k [R, HV, K], vv, o [R, HV, V]; sequence b: rows bounds[b] .. bounds[b+1]-1, its conv by
    # its record convs[b] (numba_gdn.causal_conv_ragged's: the window read, the per-token windows kept or not, the
    # new window's address, which may be the window's own: in place), its memory [HV, K, V] by its scan record
    # seqs[b] (numba_gdn's: read, written and snapshotted where it says). Sequences run in order, the conv of each
    # before the next, the scan of each before the next (a tree's row reads its parent's, gdn_recurrent_tree)
    R, C = mixed.shape
    w = conv_w.shape[1]
    B, HV, V = bounds.shape[0] - 1, o.shape[1], o.shape[2]
    K = q.shape[2]
    c = np.empty((R, C), np.float32)
    new = np.empty((C, w - 1), np.float32)
    per_conv = convs.reshape((B, _CONV_FIELDS))
    for b in range(B):  # 2. the conv of each sequence from its window (numba_gdn.causal_conv_ragged's)
        window = carray(_f32_at(per_conv[b, _WINDOW]), (C, w - 1))
        kept = carray(_f32_at(per_conv[b, _WINDOWS]), (per_conv[b, _WINDOW_ROWS], C, w - 1))
        _causal_conv(mixed[bounds[b]:bounds[b + 1]], window, conv_w, c[bounds[b]:bounds[b + 1]], new, kept,
                     per_conv[b, _KEEP] != 0)
        carray(_f32_at(per_conv[b, _OUT]), (C, w - 1))[:, :] = new
    for r in range(R):  # its SiLU (numba_rows.silu's operations)
        for j in range(C):
            v = c[r, j]
            c[r, j] = silu1(v)
    qk = np.empty((R, 2 * n_k, K), np.float32)  # 3. the q and k heads, each normalised (numba_rows.l2_norm's)
    for r in range(R):
        for j in range(2 * n_k * K):
            qk[r, j // K, j % K] = c[r, j]
    flat = qk.reshape(R * 2 * n_k, K)
    _norm_rows(flat, _NO_W, flat, eps, False, False)  # in place: a row is read whole before it is written
    for r in range(R):
        for h in range(HV):  # value head h takes key head h % n_k (gdn.gdn_qkv)
            for j in range(K):
                q[r, h, j] = qk[r, h % n_k, j] * scale
                k[r, h, j] = qk[r, n_k + h % n_k, j]
            for j in range(V):
                vv[r, h, j] = c[r, 2 * n_k * K + h * V + j]
    per = seqs.reshape((B, _SCAN_FIELDS))
    for item in range(B * HV):  # 4. the memory: numba_gdn's scan of each (sequence, value head) pair, in place
        _scan_pair(item, q, k, vv, decay, beta, bounds, per, o)


@njit(cache=True, error_model="numpy", boundscheck=False)
def _norm_rope(x, w, eps, cos, sin, n_rot, y):  # x [T, H, d] (a view), w [d], cos, sin [T, n_rot/2] -> y [T, H, d]
    half = n_rot // 2
    for t in range(x.shape[0]):
        for h in range(x.shape[1]):
            n = y[t, h]
            _norm_row(x[t, h], w, n, eps, True, True)  # numba_rows.rms_norm's, into y
            for i in range(half):  # ops.rope_rows' operations: pair (i, i + half) rotated
                x1, x2 = n[i], n[i + half]
                n[i] = np.float32(x1 * cos[t, i]) - np.float32(x2 * sin[t, i])
                n[i + half] = np.float32(x2 * cos[t, i]) + np.float32(x1 * sin[t, i])


def _plans(*weights) -> tuple | None:
    """The numba_ops plans of weights that are all small and numba-bound, else None (the step runs unfused)."""
    plans = ()
    for w in weights:  # (a plain loop: this runs about 20 times a decode step)
        if type(w) is not PackedWeight or type(w.linear) is not numba_ops.Bound or not w.linear.serial:
            return None
        plans += (w.linear.plan,)
    return plans


def _f32(*arrays) -> bool:  # every input float32 and C-contiguous (what the kernels read)
    for a in arrays:
        if a.dtype != np.float32 or not a.flags.c_contiguous:
            return False
    return True


def ffn_residual(x, w, cfg, kern):  # [T, D] -> [T, D]
    """ffn.ffn_residual in one call for a dense layer (a qwen35moe layer's experts take the composed block)."""
    norm = w["post_attention_norm.weight"]
    plans = None if "ffn_gate_inp.weight" in w else _plans(w["ffn_gate.weight"], w["ffn_up.weight"],
                                                              w["ffn_down.weight"])
    if plans is None or not _f32(x, norm) or x.ndim != 2 or norm.shape != (x.shape[1],) \
            or w["ffn_gate.weight"].shape[1] != x.shape[1]:
        return ffn.ffn_residual(x, w, cfg, kern)
    T, F = x.shape[0], w["ffn_gate.weight"].shape[0]
    u, y = np.empty_like(x), np.empty((T, w["ffn_down.weight"].shape[0]), np.float32)
    _ffn_residual(x, norm, np.float32(cfg.rms_eps), *plans, u, np.empty((T, F), np.float32),
                  np.empty((T, F), np.float32), y)
    return y


def gdn_project(x, w, kern) -> tuple:  # [T, D] -> mixed [T, C], z [T, HV*V], beta, log_decay [T, HV]
    """gdn.gdn_project in one call."""
    plans = _plans(w["attn_qkv.weight"], w["attn_gate.weight"], w["ssm_beta.weight"], w["ssm_alpha.weight"])
    a, dt = w["ssm_a"], w["ssm_dt.bias"]
    if plans is None or not _f32(x, a, dt) or x.ndim != 2 or a.shape != dt.shape or a.ndim != 1 \
            or a.shape[0] != w["ssm_beta.weight"].shape[0]:
        return gdn.gdn_project(x, w, kern)
    T = x.shape[0]
    mixed, z = (np.empty((T, w[n].shape[0]), np.float32) for n in ("attn_qkv.weight", "attn_gate.weight"))
    beta, log_decay = np.empty((T, a.shape[0]), np.float32), np.empty((T, a.shape[0]), np.float32)
    _gdn_project(x, *plans, a, dt, mixed, z, beta, log_decay)
    return mixed, z, beta, log_decay


def gdn_output(o, z, w, cfg, kern):  # o [T, HV, V], z [T, HV*V] -> [T, D]
    """gdn.gdn_output in one call."""
    plans, norm = _plans(w["ssm_out.weight"]), w["ssm_norm.weight"]
    if plans is None or not _f32(o, z, norm) or o.ndim != 3 or norm.shape != (o.shape[2],) \
            or z.shape != (o.shape[0], o.shape[1] * o.shape[2]):
        return gdn.gdn_output(o, z, w, cfg, kern)
    y = np.empty((o.shape[0], w["ssm_out.weight"].shape[0]), np.float32)
    _gated_out(o.reshape(-1, o.shape[2]), z, norm, np.float32(cfg.rms_eps), *plans, y)
    return y


def attention_project(x, w, cfg, kern):  # [T, D] -> q [T, H, d], gate [T, H*d], k, v [T, H_kv, d]
    """attention.project in one call."""
    plans = _plans(w["attn_q.weight"], w["attn_k.weight"], w["attn_v.weight"])
    if plans is None or not _f32(x) or x.ndim != 2:
        return attention.project(x, w, cfg, kern)
    T, H, H_kv, d = x.shape[0], cfg.n_head, cfg.n_head_kv, cfg.head_dim
    qg = np.empty((T, w["attn_q.weight"].shape[0]), np.float32)
    k, v = (np.empty((T, w[n].shape[0]), np.float32) for n in ("attn_k.weight", "attn_v.weight"))
    _attention_project(x, *plans, qg, k, v)
    qg = qg.reshape(T, H, 2 * d)
    return qg[..., :d], qg[..., d:].reshape(T, H * d), k.reshape(T, H_kv, d), v.reshape(T, H_kv, d)


def attention_output(o, gate, w, kern):  # [T, H*d] x2 -> [T, D]
    """attention.output in one call."""
    plans = _plans(w["attn_output.weight"])
    if plans is None or not _f32(o, gate) or o.ndim != 2 or gate.shape != o.shape:
        return attention.output(o, gate, w, kern)
    y = np.empty((o.shape[0], w["attn_output.weight"].shape[0]), np.float32)
    _gated_attention_out(o, gate, *plans, y)
    return y


def gdn_recurrent(mixed, log_decay, beta, bounds, w, states, cfg, kern, rings=None, chunked=False):
    """gdn.gdn_recurrent in one call: a decode step or a prefill (no ring: every window and memory updated in
    place) and a verify pass (each sequence's ring says where its per-token states, its new window and its new
    memory go, and records what a rollback needs, as gdn.gdn_conv and gdn.gdn_memory let it); a chunked prefill or
    a scan numba_gdn would thread takes the composed steps."""
    HV, K, V, n_k = cfg.ssm_n_v_heads, cfg.ssm_head_k_dim, cfg.ssm_head_v_dim, cfg.ssm_n_k_heads
    R = mixed.shape[0]
    conv_w = w["ssm_conv1d.weight"]
    rings = rings or [None] * len(states)
    composed = (mixed, log_decay, beta, bounds, w, states, cfg, kern, rings, chunked)
    if chunked or R * HV * K * V >= numba_gdn.SERIAL_BELOW or not _f32(mixed, log_decay, beta, conv_w) \
            or mixed.shape[1] != 2 * n_k * K + HV * V or conv_w.shape[0] != mixed.shape[1]:
        return gdn.gdn_recurrent(*composed)
    window, memory = (conv_w.shape[0], conv_w.shape[1] - 1), (HV, K, V)
    cuts = [int(b) for b in bounds]
    convs, seqs, outs = [], [], []
    for b, (s, ring) in enumerate(zip(states, rings)):  # each sequence's records, by address (numba_gdn's)
        T = cuts[b + 1] - cuts[b]
        conv_out = s.conv if ring is None else ring.conv_out(s)  # None: a fresh array (a replay keeps the old one)
        conv_out = np.empty(window, np.float32) if conv_out is None else conv_out
        memory_out = s.ssm if ring is None else ring.memory_out(s)
        conv_kept, ssm_kept = (None, None) if ring is None else (ring.conv_states, ring.ssm_states)
        if not (_f32(s.conv, s.ssm, conv_out, memory_out) and s.conv.shape == conv_out.shape == window
                and s.ssm.shape == memory_out.shape == memory and _kept(conv_kept, T, window)
                and _kept(ssm_kept, T, memory)):
            return gdn.gdn_recurrent(*composed)
        convs += (_address(s.conv), _NO_CONV_STATES_AT, 0, 0) if conv_kept is None else \
            (_address(s.conv), _address(conv_kept), conv_kept.shape[0], 1)
        convs.append(_address(conv_out))
        at = _address(s.ssm)
        seqs += (at, at if memory_out is s.ssm else _address(memory_out))
        if ssm_kept is None:
            seqs += (_NO_SNAPS_AT, 0, 0)
        else:  # streaming stores where every head's slot starts on a 64-byte line (numba_gdn.gdn_scan_ragged's rule)
            snaps = _address(ssm_kept)
            seqs += (snaps, ssm_kept.shape[0], 2 if snaps % 64 == 0 and (K * V) % 16 == 0 else 1)
        outs.append((conv_out, memory_out))
    q, k, v, o = _recurrent_call(mixed, log_decay, beta, np.array(cuts, np.int64), convs, conv_w, seqs, cfg)
    for lo, hi, s, ring, (conv_out, memory_out) in zip(cuts[:-1], cuts[1:], states, rings, outs):
        if ring is not None:  # as gdn.gdn_memory: s still holds the pre-pass window and memory unless written in place
            ring.record(s, (mixed[lo:hi], conv_w), (q[lo:hi], k[lo:hi], v[lo:hi], log_decay[lo:hi], beta[lo:hi]))
        s.conv, s.ssm = conv_out, memory_out
    return o


def _kept(a, T: int, shape: tuple) -> bool:  # a ring's per-token states, or None: room for T rows, what kernels read
    return a is None or (a.ndim == len(shape) + 1 and a.shape[0] >= T and a.shape[1:] == shape and _f32(a))


def _recurrent_call(mixed, log_decay, beta, bounds, convs: list, conv_w, seqs: list, cfg):
    # -> q, k [R, HV, K] (q scaled), v, o [R, HV, V]: q, k, v as gdn.gdn_qkv makes them, what a replay ring records
    R, HV, K, V = mixed.shape[0], cfg.ssm_n_v_heads, cfg.ssm_head_k_dim, cfg.ssm_head_v_dim
    q, k = np.empty((R, HV, K), np.float32), np.empty((R, HV, K), np.float32)
    v, o = np.empty((R, HV, V), np.float32), np.empty((R, HV, V), np.float32)
    _gdn_recurrent(mixed, bounds, np.array(convs, np.int64), conv_w, np.exp(log_decay), beta, np.array(seqs, np.int64),
                   cfg.ssm_n_k_heads, np.float32(cfg.rms_eps), np.float32(1.0 / math.sqrt(K)),
                   q, k, v, o)  # gdn_qkv's scale, np.float32(1 / np.sqrt(K)): the same bits
    return q, k, v, o


def gdn_recurrent_tree(mixed, log_decay, beta, parents, w, state, cfg, kern, ring):
    """gdn.gdn_recurrent_tree in one call: each row a sequence of one token whose window and memory are read from
    its parent's ring entry (row 0: the sequence's state) and written to its own entry, the rows in order (a parent
    before its children); a scan numba_gdn would thread takes the composed steps."""
    HV, K, V, n_k = cfg.ssm_n_v_heads, cfg.ssm_head_k_dim, cfg.ssm_head_v_dim, cfg.ssm_n_k_heads
    T, conv_w = mixed.shape[0], w["ssm_conv1d.weight"]
    conv_states, ssm_states = ring.conv_states, ring.ssm_states
    if HV * K * V >= numba_gdn.SERIAL_BELOW or not _f32(mixed, log_decay, beta, conv_w, state.conv, state.ssm) \
            or mixed.shape[1] != 2 * n_k * K + HV * V or conv_w.shape[0] != mixed.shape[1] \
            or not (conv_states.flags.c_contiguous and ssm_states.flags.c_contiguous):
        return gdn.gdn_recurrent_tree(mixed, log_decay, beta, parents, w, state, cfg, kern, ring)
    conv_at, ssm_at = _address(conv_states), _address(ssm_states)
    conv_row, ssm_row = conv_states[0].nbytes, ssm_states[0].nbytes
    before = [-1] + [int(p) for p in parents]  # each row's parent (-1: the sequence's state)
    convs, seqs = [], []
    for t, p in enumerate(before):  # row t: its parent's window and memory in, its own ring entry out
        convs += (_address(state.conv) if p < 0 else conv_at + p * conv_row, _NO_CONV_STATES_AT, 0, 0,
                  conv_at + t * conv_row)
        seqs += (_address(state.ssm) if p < 0 else ssm_at + p * ssm_row, ssm_at + t * ssm_row, _NO_SNAPS_AT, 0, 0)
    return _recurrent_call(mixed, log_decay, beta, np.arange(T + 1, dtype=np.int64), convs, conv_w, seqs, cfg)[3]


def norm_rope(q, k, positions, w, cfg, kern):  # q [T, H, d], k [T, H_kv, d] -> q, k
    """attention.norm_rope in two compiled calls (q's heads, k's), the angles NumPy's (ops.rope_angles)."""
    qw, kw = w["attn_q_norm.weight"], w["attn_k_norm.weight"]
    d, half = q.shape[-1], cfg.n_rot // 2
    if q.dtype != np.float32 or k.dtype != np.float32 or q.ndim != 3 or k.ndim != 3 or not _f32(qw, kw) \
            or qw.shape != (d,) or kw.shape != (k.shape[-1],) or not 0 < 2 * half <= min(d, k.shape[-1]):
        return attention.norm_rope(q, k, positions, w, cfg, kern)
    cos, sin = ops.rope_angles(positions, cfg.n_rot, cfg.rope_base)  # [T, half] each
    eps = np.float32(cfg.rms_eps)
    qo, ko = np.empty(q.shape, np.float32), np.empty(k.shape, np.float32)
    _norm_rope(q, qw, eps, cos, sin, cfg.n_rot, qo)
    _norm_rope(k, kw, eps, cos, sin, cfg.n_rot, ko)
    return qo, ko
