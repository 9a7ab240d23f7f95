"""Numba delta-rule scan: tinyspec.gdn.gdn_scan's contract, bit for bit, without NumPy's temporaries.

    gdn_scan(q, k, v, log_decay, beta, state, states_out=None, out=None) -> (o [T, HV, V], state [HV, K, V])
    causal_conv(x, conv_state, weight, states_out=None, out=None) -> (y [T, C], conv_state [C, w-1])  (gdn.causal_conv)

The oracle (tinyspec/gdn.py delta_rule_step) builds four [HV, K, V] temporaries per token (decay,
S * k, the rank-1 update, S * q), 1 MB each at the Qwen3.5-0.8B shape (18 GDN layers, HV = 16,
K = V = 128): memory traffic that made the scan a large share of a decode step (docs/performance-log.md
old 19). Here each value head makes two passes over its K x V memory, one K row (V contiguous floats,
vectorized) at a time:

    pass 1, for each row kk:  S[kk] = decay * S[kk];  pred += S[kk] * k[kk]          (S^T k)
    delta = beta * (v - pred)
    pass 2, for each row kk:  S[kk] = S[kk] + k[kk] * delta;  o += S[kk] * q[kk]    (S^T q)

The same float32 operations in the same order as the oracle: a product rounded, then added (no fused
multiply-add, no fast-math), and the sums over K run kk = 0, 1, ... exactly as NumPy reduces a
non-contiguous axis. exp(log_decay) is taken by NumPy before the kernel. So the result is bitwise the
oracle's (tests/test_numba_gdn.py), and batch invariance needs no argument of its own: a T-token call
is T one-token steps.

Threads by size: a call's (sequence, value head) pairs are independent, each the same operations wherever it
runs. From SERIAL_BELOW state floats times rows up they are shared by the threads (prange); below it, one after
another on the calling thread, because a parallel region costs a wake-up of the sleeping workers (fast/threads.py:
OMP_WAIT_POLICY=PASSIVE) that a small model's decode token (8 heads of 32 x 32) does not repay. Both loops are in
one compiled kernel (one cache entry, compiled by one warm-up call), which has no parallel loop but the prange
(PRANGE_ONLY), so the other loop opens no region; tests/test_numba_serial.py checks they give the same bits.

The new state goes to `out` (the model passes the state itself: an update in place) or, without it, to
a fresh array, leaving the caller's state untouched; states_out[t] receives a copy of the state after
token t, by streaming stores when it is 64-byte aligned (SnapshotRing's buffers are): 72 MB of snapshots
in a 4-token pass at the 0.8B shape (18 layers x 4 tokens x 1 MB), which a normal store would first read
line by line before overwriting it (docs/performance-log.md old 24). Token 0's first pass reads the
caller's state and writes the new one, so no copy is made first. (A fresh 1 MB array per layer and call
paid its page faults on every call: LESSONS 14.)

The Python wrappers run once per layer and pass, so they stay cheap: checks on Python ints (bounds.tolist())
and array flags, no conversion of an array that already fits, and every sequence's arrays handed to the kernel
as one int64 record array (addresses, sizes, modes) built by one np.array call. A bad input still gets a
ValueError naming it before the kernel runs, which itself checks nothing.
"""

from __future__ import annotations

from ctypes import addressof, c_char

import numpy as np
from numba import carray, njit, prange, types
from numba.core.cpu import ParallelOptions
from numba.extending import intrinsic

from . import kernel_cache, simd

# R * HV * K * V (state floats times rows) below this, or a single (sequence, value head) pair: the scan on the
# calling thread, no parallel region. Measured, kernel only, on the 2-core Xeon VM (OMP_WAIT_POLICY=PASSIVE), quiet,
# calling thread / threaded: a tiny-model token (8 x 32 x 32 = 8192) 2.5 / 12.6 us, 4 tokens 8.8 / 17.0 us; about
# even near 2^17; threads ahead above (24 tiny-model tokens 40.1 / 31.2 us). Beside a busy process they lose longer.
SERIAL_BELOW = 1 << 17

# parallel=True with only prange on: the kernels' other array statements (a slice filled, a row copied) stay
# plain loops instead of becoming parallel loops of their own, so the branch that runs on the calling thread
# opens no parallel region. (An instance, not a dict: Numba pops a dict's keys, so a second compile would get
# every option back.)
PRANGE_ONLY = ParallelOptions({"comprehension": False, "reduction": False, "inplace_binop": False, "setitem": False,
                               "numpy": False, "stencil": False, "fusion": False, "prange": True})


@intrinsic
def _f32_at(typingctx, address):
    """The float32 pointer at an integer address (an array's .ctypes.data), for numba.carray to view.

    Why addresses: a batch hands each kernel B per-sequence arrays, and a tuple of B arrays is a type of its own
    for every B, so each new batch size compiled the kernel again (seconds, mid-run on a cold cache:
    docs/performance-log.md, 2026-11-27). An int64 array of addresses is one type for every B. The Python
    functions below pass only C-contiguous float32 arrays that they keep alive through the call."""
    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.float32)))

    return types.CPointer(types.float32)(types.int64), codegen


def _address(a: np.ndarray) -> int:
    """The data address of a C-contiguous array the caller keeps alive through the kernel call. ctypes' view of
    its buffer costs a third of a.ctypes.data (which builds a helper object every time: ~0.8 us, several times
    per layer and pass); that view needs a writeable, non-empty buffer, so any other array takes a.ctypes.data."""
    try:
        return addressof(c_char.from_buffer(a))
    except (TypeError, ValueError, BufferError):
        return a.ctypes.data


def _f32(a) -> np.ndarray:  # a itself when it is already a C-contiguous float32 array
    return np.ascontiguousarray(a, dtype=np.float32)


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _head_step(S0, S, q, k, v, decay, beta, pred, o):  # S0 -> S [K, V] (S0 may be S); q, k [K]; v, pred, o [V]
    K, V = S.shape
    pred[:] = np.float32(0)
    wide = V % 16 == 0  # 16 lanes at a time (simd.py); the same operations per element either way
    for kk in range(K):
        kv = k[kk]
        if wide:
            for j in range(0, V, 16):
                simd.decay_predict16(S0, kk * V + j, S, kk * V + j, pred, j, decay, kv)
        else:
            for j in range(V):
                s = decay * S0[kk, j]
                S[kk, j] = s
                pred[j] = pred[j] + s * kv
    for j in range(V):
        pred[j] = beta * (v[j] - pred[j])  # pred now holds delta
    o[:] = np.float32(0)
    for kk in range(K):
        kv, qv = k[kk], q[kk]
        if wide:
            for j in range(0, V, 16):
                simd.write_read16(S, kk * V + j, pred, j, kv, o, qv)
        else:
            for j in range(V):
                s = S[kk, j] + kv * pred[j]
                S[kk, j] = s
                o[j] = o[j] + s * qv


# seqs, the per-sequence int64 record the Python side hands the scan (one array for any B: numba_gdn._f32_at):
# the address of the state read, of the state written (the same one for an update in place), of the snapshots
# (_NO_SNAPS' when the sequence keeps none), how many snapshot rows that holds, and how they are written
# (0: not at all, 1: plain stores, 2: streaming stores).
_S0, _S, _SNAPS, _SNAP_ROWS, _MODE = range(5)
_SCAN_FIELDS = 5


@njit(cache=True, inline="always", error_model="numpy", boundscheck=False)
def _scan_pair(item, q, k, v, decay, beta, bounds, seqs, o):
    # One (sequence b, value head h) pair, item = b * HV + h, over the sequence's rows: it reads and writes only
    # its own head of its own sequence's state, so pairs run in any order, on any thread, with the same bits.
    # q, k [R, HV, K], v [R, HV, V], decay, beta [R, HV], bounds [B+1], seqs [B, _SCAN_FIELDS]; o [R, HV, V]
    HV, K = q.shape[1], q.shape[2]
    V = v.shape[2]
    b, h = item // HV, item % HV
    lo, hi = bounds[b], bounds[b + 1]
    S0, S = carray(_f32_at(seqs[b, _S0]), (HV, K, V)), carray(_f32_at(seqs[b, _S]), (HV, K, V))
    sn, mode = carray(_f32_at(seqs[b, _SNAPS]), (seqs[b, _SNAP_ROWS], HV, K, V)), seqs[b, _MODE]
    kp, st = mode > 0, mode == 2
    pred = np.empty(V, np.float32)
    if V == 128:  # whole rows a step, pred and o in registers (simd.decay_predict_rows8 / write_read_rows8)
        Sf = S[h].reshape(-1)
        for t in range(lo, hi):  # token lo reads the caller's state, the rest update S in place
            simd.decay_predict_rows8(S0[h].reshape(-1) if t == lo else Sf, Sf, K, decay[t, h], k[t, h], pred)
            for j in range(V):
                pred[j] = beta[t, h] * (v[t, h, j] - pred[j])  # pred now holds delta
            snap = sn[t - lo, h].reshape(-1) if kp else Sf
            simd.write_read_rows8(Sf, K, pred, k[t, h], q[t, h], o[t, h], snap, mode)
    else:
        for t in range(lo, hi):
            _head_step(S0[h] if t == lo else S[h], S[h], q[t, h], k[t, h], v[t, h], decay[t, h], beta[t, h],
                       pred, o[t, h])
            if kp and st:  # streaming stores: 64-byte aligned, whole vectors (checked by the caller)
                dst, src = sn[t - lo, h].reshape(-1), S[h].reshape(-1)
                for j in range(0, src.size, 16):
                    simd.stream16(dst, j, src, j)
            elif kp:
                sn[t - lo, h] = S[h]
    if kp and st:
        simd.store_fence()


@njit(cache=True, parallel=PRANGE_ONLY, error_model="numpy", boundscheck=False)
def _scan_ragged(q, k, v, decay, beta, bounds, seqs, o, threaded):
    # Every (sequence, value head) pair (_scan_pair): threaded, the pairs shared by the threads (prange); else
    # one after another on the calling thread. One compiled kernel holds both loops, so fast/warm.py's one call
    # compiles both, and the second loop costs no parallel region (PRANGE_ONLY).
    B, HV = bounds.shape[0] - 1, q.shape[1]
    per = seqs.reshape((B, _SCAN_FIELDS))
    if threaded:
        for item in prange(B * HV):
            _scan_pair(item, q, k, v, decay, beta, bounds, per, o)
    else:
        for item in range(B * HV):
            _scan_pair(item, q, k, v, decay, beta, bounds, per, o)


@njit(cache=True, error_model="numpy", boundscheck=False)
def _scan_ragged_serial(q, k, v, decay, beta, bounds, seqs, o):
    # _scan_ragged's loop on the calling thread, entered through a kernel of its own so that a profiler
    # (fast/step_profile.py) tells a call that opens no parallel region from one that does
    _scan_ragged(q, k, v, decay, beta, bounds, seqs, o, False)


_NO_SNAPS = np.empty((0, 1, 1, 1), np.float32)  # stands in for a sequence's states_out when it keeps none
_NO_SNAPS_AT = _NO_SNAPS.ctypes.data


def gdn_scan(q, k, v, log_decay, beta, state, states_out=None, out=None):
    # [T, HV, K] x2, [T, HV, V], [T, HV] x2, [HV, K, V] -> [T, HV, V], [HV, K, V]
    """The gated delta rule over T tokens, bitwise equal to tinyspec.gdn.gdn_scan (out: the same contract,
    `state` itself or an array that does not overlap it). gdn_scan_ragged with one sequence."""
    T = q.shape[0]
    o, (S,) = gdn_scan_ragged(q, k, v, log_decay, beta, np.array([0, T], np.int64), [state],
                              None if states_out is None else [states_out], None if out is None else [out])
    return o, S


def gdn_scan_ragged(q, k, v, log_decay, beta, bounds, states, states_outs=None, outs=None):
    # [R, HV, K] x2, [R, HV, V], [R, HV] x2, [B+1], B x [HV, K, V] -> [R, HV, V], B x [HV, K, V]
    """tinyspec.gdn.gdn_scan_ragged bit for bit: the scan of each sequence b over its rows bounds[b] ..
    bounds[b+1]-1 from states[b], all in one kernel call. Threads take (sequence, value head) pairs, so two
    cores stay busy however the work is split, once it is worth a parallel region: below SERIAL_BELOW state
    floats times rows (a decode token of a small model) the pairs run on the calling thread, the same bits.
    states_outs[b] / outs[b] as gdn_scan's states_out / out (None, or a list with None for a sequence that
    keeps no per-token states / takes a fresh array).
    The checks run on Python ints and flags, not NumPy calls: this runs once per GDN layer and pass, and on a
    small model NumPy's per-call cost on tiny arrays was several times the kernel's."""
    q, k, v, beta = _f32(q), _f32(k), _f32(v), _f32(beta)
    decay = np.exp(_f32(log_decay))  # NumPy's exp, as the oracle's (of a C-contiguous float32 array: one too)
    bounds = np.ascontiguousarray(bounds, dtype=np.int64)
    S0s = [_f32(s) for s in states]  # read by each first step
    R, HV, K = q.shape
    B = len(S0s)
    V = v.shape[2]
    if k.shape != q.shape or v.shape[:2] != (R, HV) or decay.shape != (R, HV) or beta.shape != (R, HV) \
            or any(s.shape != (HV, K, V) for s in S0s):
        raise ValueError(f"numba_gdn: shapes q {q.shape}, k {k.shape}, v {v.shape}, log_decay {decay.shape}, "
                         f"beta {beta.shape}, states {[s.shape for s in S0s]} do not fit [T, HV, K] / [HV, K, V]")
    cuts = bounds.tolist()
    if bounds.shape != (B + 1,) or cuts[0] != 0 or cuts[-1] != R or cuts != sorted(cuts):
        raise ValueError(f"numba_gdn: bounds {cuts} do not cut {R} rows into {B} sequences")
    Ss = []
    for S0, out in zip(S0s, outs or [None] * B):
        if out is None:
            Ss.append(np.empty_like(S0))  # a fresh array (it pays page faults: LESSONS 14; the model passes out)
        elif out.shape != S0.shape or out.dtype != np.float32 or not out.flags.c_contiguous \
                or not out.flags.writeable:
            raise ValueError(f"numba_gdn: out must be a writeable C-contiguous float32 {S0.shape}, got {out.dtype} "
                             f"{out.shape}")
        else:
            Ss.append(out)
    seqs = []  # [B, _SCAN_FIELDS], flat
    for b, so in enumerate(states_outs or [None] * B):
        T = cuts[b + 1] - cuts[b]
        at = _address(S0s[b])
        seqs += (at, at if Ss[b] is S0s[b] else _address(Ss[b]))
        if so is None:
            seqs += (_NO_SNAPS_AT, 0, 0)
            continue
        if so.ndim != 4 or so.shape[0] < T or so.shape[1:] != (HV, K, V) or so.dtype != np.float32 \
                or not so.flags.c_contiguous:
            raise ValueError(f"numba_gdn: states_out must be C-contiguous float32 [>= {T}, {HV}, {K}, {V}], "
                             f"got {so.dtype} {so.shape}")
        # snapshots by streaming stores when every head's slot starts on a 64-byte line (SnapshotRing allocates so)
        at = _address(so)
        seqs += (at, so.shape[0], 2 if at % 64 == 0 and (K * V) % 16 == 0 else 1)
    for b in range(B):
        if cuts[b + 1] == cuts[b] and Ss[b] is not S0s[b]:  # no tokens: the state passes through
            Ss[b][...] = S0s[b]
    o = np.empty((R, HV, V), np.float32)
    if R:
        threaded = B * HV > 1 and R * HV * K * V >= SERIAL_BELOW
        if threaded:
            _scan_ragged(q, k, v, decay, beta, bounds, np.array(seqs, np.int64), o, True)
        else:
            _scan_ragged_serial(q, k, v, decay, beta, bounds, np.array(seqs, np.int64), o)
    return o, Ss


@njit(cache=True, error_model="numpy", boundscheck=False)
def _causal_conv(x, conv_state, weight, y, new_state, states_out, keep):  # [T, C], [C, w-1], [C, w] -> y, [C, w-1]
    T, C = x.shape
    w = weight.shape[1]
    if w == 4 and C % 16 == 0:  # Qwen3.5's width: 16 channels a vector, the same operations (simd.conv4_16)
        for c0 in range(0, C, 16):
            simd.conv4_16(x, conv_state, weight, y, new_state, states_out, c0, C, T, keep)
        return
    taps = np.empty((w, C), np.float32)  # weight transposed: tap k of every channel, contiguous
    old = np.empty((max(w - 1, 1), C), np.float32)  # the carried state, time-major
    for c in range(C):
        for k in range(w):
            taps[k, c] = weight[c, k]
        for j in range(w - 1):
            old[j, c] = conv_state[c, j]
    y[:] = np.float32(0)  # the oracle's y starts at +0.0 and adds tap k = 0, 1, ... (0 + -0.0 = +0.0)
    for t in range(T):
        for k in range(w):  # per output the same w products in the same order; channels innermost (vectorized)
            j = t + k  # window row: j < w - 1 is the carried state, the rest x
            if j < w - 1:
                for c in range(C):
                    y[t, c] = y[t, c] + taps[k, c] * old[j, c]
            else:
                for c in range(C):
                    y[t, c] = y[t, c] + taps[k, c] * x[j - (w - 1), c]
    for c in range(C):  # the last w - 1 window rows
        for j in range(w - 1):
            jj = T + j
            new_state[c, j] = conv_state[c, jj] if jj < w - 1 else x[jj - (w - 1), c]
    if keep:  # the state after token t: window rows t + 1 .. t + w - 1
        for t in range(T):
            for c in range(C):
                for j in range(w - 1):
                    jj = t + 1 + j
                    states_out[t, c, j] = conv_state[c, jj] if jj < w - 1 else x[jj - (w - 1), c]


# The conv's per-sequence record (seqs, int64, one array for any B): the address of its window [C, w-1], of its
# states_out [rows, C, w-1] (_NO_CONV_STATES' when it keeps none), those rows, whether it keeps them (0 / 1), and
# the address of its out (0: none; the new window stays in the fresh array).
_WINDOW, _WINDOWS, _WINDOW_ROWS, _KEEP, _OUT = range(5)
_CONV_FIELDS = 5


@njit(cache=True, error_model="numpy", boundscheck=False)
def _causal_conv_ragged(x, bounds, seqs, weight, y, new_states):
    # x [R, C], bounds [B+1], seqs [B, _CONV_FIELDS], weight [C, w] -> y [R, C], new_states [B, C, w-1], outs
    C, w = weight.shape
    B = bounds.shape[0] - 1
    per = seqs.reshape((B, _CONV_FIELDS))
    for b in range(B):  # one thread: a sequence's conv is a few microseconds at the 0.8B shape
        lo, hi = bounds[b], bounds[b + 1]
        _causal_conv(x[lo:hi], carray(_f32_at(per[b, _WINDOW]), (C, w - 1)), weight, y[lo:hi], new_states[b],
                     carray(_f32_at(per[b, _WINDOWS]), (per[b, _WINDOW_ROWS], C, w - 1)), per[b, _KEEP] != 0)
    for b in range(B):  # only now, every old window read, the new ones go to the outs (an out may be its window)
        if per[b, _OUT] != 0:
            carray(_f32_at(per[b, _OUT]), (C * (w - 1),))[:] = new_states[b].reshape(-1)


_NO_CONV_STATES = np.empty((0, 1, 1), np.float32)  # stands in for a sequence's states_out when it keeps none
_NO_CONV_STATES_AT = _NO_CONV_STATES.ctypes.data


def causal_conv(x, conv_state, weight, states_out=None, out=None):
    """tinyspec.gdn.causal_conv bit for bit (each output sums its w rounded products in tap order, from
    +0.0), without NumPy's per-tap temporaries. At the 0.8B shape (C = 6144, w = 4) those temporaries were
    most of a NumPy call, and scalar Numba spent its time on strided weight and state reads, so the channels
    go 16 at a time as vectors (simd.conv4_16; docs/performance-log.md old 24 times the three).
    out: the oracle's contract (it may be conv_state itself). causal_conv_ragged with one sequence."""
    y, (new_state,) = causal_conv_ragged(x, np.array([0, x.shape[0]], np.int64), [conv_state], weight,
                                         None if states_out is None else [states_out], None if out is None else [out])
    return y, new_state


def causal_conv_ragged(x, bounds, conv_states, weight, states_outs=None, outs=None):
    # [R, C], [B+1], B x [C, w-1], [C, w] -> [R, C], B x [C, w-1]
    """tinyspec.gdn.causal_conv_ragged bit for bit: the conv of each sequence b over its rows bounds[b] ..
    bounds[b+1]-1 from its own window conv_states[b], in one call; states_outs[b] / outs[b] as causal_conv's
    states_out / out (None, or a list with None for a sequence that keeps none / takes a fresh array).
    The kernel writes every new window into one fresh [B, C, w-1] array and only then copies sequence b's
    into outs[b]: so outs[b] may be conv_states[b] itself (in place), read by the kernel before the copy.
    Checked on Python ints and flags, as gdn_scan_ragged (one call per GDN layer and pass)."""
    x, weight = _f32(x), _f32(weight)
    conv_states = [_f32(s) for s in conv_states]
    bounds = np.ascontiguousarray(bounds, dtype=np.int64)
    R, C = x.shape
    B, w = len(conv_states), weight.shape[1]
    if weight.shape[0] != C or any(s.shape != (C, w - 1) for s in conv_states):
        raise ValueError(f"numba_gdn: causal_conv shapes x {x.shape}, conv_state {[s.shape for s in conv_states]}, "
                         f"weight {weight.shape} do not fit [T, C] / [C, w-1] / [C, w]")
    cuts = bounds.tolist()
    if bounds.shape != (B + 1,) or cuts[0] != 0 or cuts[-1] != R or cuts != sorted(cuts):
        raise ValueError(f"numba_gdn: bounds {cuts} do not cut {R} rows into {B} sequences")
    states_outs = states_outs or [None] * B
    for b, so in enumerate(states_outs):
        T = cuts[b + 1] - cuts[b]
        if so is not None and (so.ndim != 3 or so.shape[0] < T or so.shape[1:] != (C, w - 1)
                               or so.dtype != np.float32 or not so.flags.c_contiguous):
            raise ValueError(f"numba_gdn: causal_conv states_out must be C-contiguous float32 [>= {T}, {C}, {w - 1}], "
                             f"got {so.dtype} {so.shape}")
    outs = outs or [None] * B
    for out in outs:
        if out is not None and (out.shape != (C, w - 1) or out.dtype != np.float32 or not out.flags.c_contiguous
                                or not out.flags.writeable):
            raise ValueError(f"numba_gdn: causal_conv out must be a writeable C-contiguous float32 {(C, w - 1)}, "
                             f"got {out.dtype} {out.shape}")
    seqs = []  # [B, _CONV_FIELDS], flat
    for window, so, out in zip(conv_states, states_outs, outs):
        at = _address(window)
        seqs += (at, _NO_CONV_STATES_AT, 0, 0) if so is None else (at, _address(so), so.shape[0], 1)
        seqs.append(0 if out is None else at if out is window else _address(out))
    y = np.empty((R, C), np.float32)
    new_states = np.empty((B, C, w - 1), np.float32)  # sequence b's new window is new_states[b]
    _causal_conv_ragged(x, bounds, np.array(seqs, np.int64), weight, y, new_states)
    return y, [new_states[b] if out is None else out for b, out in enumerate(outs)]


kernel_cache.sync(_scan_ragged)  # cached kernels compiled from older sources (simd.py) are dropped
