"""CuPy kernels (tinyspec/fast/cuda_ops.py) against the NumPy oracle; the whole file skips without a GPU.

1. get_rows is bit-exact with tinyspec.ops.get_rows: quantized weights and random blocks (finite fp16
   scale fields), negative and repeated ids, rows that end in a partial chunk, unaligned plain rows;
2. quant_linear is within the float summation bound of tinyspec.ops.quant_linear, for every type,
   shapes that exercise every split S (1, 2, 4, 8), partial chunks and partial quads, T up to 37;
3. batch invariance: row t of a T-row call is bitwise equal to a one-row call, T = 1..16 and tiles of 16;
4. the GDN scan against tinyspec.gdn (delta_rule_step, gdn_scan, its snapshot ring), and bitwise
   against itself: T tokens in one call = T one-token steps; the ring holds the state after each token;
5. MoE: the device routing (fast/cuda_moe.py) bitwise moe.route + group_by_expert, ties included; the grouped
   matmul (cuda_ops.bind_experts) bitwise each expert's own float-kernel call, and batch-invariant.
   (Written without a GPU, 2026-11-27: these MoE cases have not run yet.)
6. attention (fast/cuda_attention.py) against tinyspec.attention: contiguous, paged (bitwise the contiguous
   call), ragged with mixed lengths in one launch; bitwise batch invariance (a row alone, in any T, in a ragged
   call); a CUDA graph replaying it with new lengths read from device memory. (Written without a GPU,
   2026-11-27: these attention cases have not run yet.)
"""

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

cp = pytest.importorskip("cupy")
try:
    _gpus = cp.cuda.runtime.getDeviceCount()
except Exception:  # no driver, no device or a broken CUDA install: nothing here can run
    _gpus = 0
if not _gpus:
    pytest.skip("no CUDA device", allow_module_level=True)

from quant_helpers import magnitude, with_finite_f16_fields  # noqa: E402

from tinyspec import gdn, ops  # noqa: E402
from tinyspec.fast import cuda_ops  # noqa: E402
from tinyspec.quants import GGMLType, quantize  # noqa: E402

F32, F16, BF16, Q8_0 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0
Q4_K, Q5_K, Q6_K = GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K
TYPES = [F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K]
SCALE_FIELDS = {Q8_0: [0], Q4_K: [0, 2], Q5_K: [0, 2], Q6_K: [208]}  # fp16 byte offsets in a block

# (out, in) per type family. S = split warps per row follows from the shape (cuda_ops._split): 1 chunk
# -> S = 1; 3 chunks -> 2; 8 chunks and few rows -> 8; MANY_ROWS rows -> 1 with many blocks, the last partial.
MANY_ROWS = 8200
SHAPES = {
    "k": [(37, 256), (50, 768), (300, 2048), (MANY_ROWS, 256)],
    "q8": [(37, 96), (50, 736), (300, 2048)],  # 736 = 2 chunks + 7 blocks: a partial last chunk
    "plain": [(37, 1), (37, 3), (50, 257), (50, 300), (300, 2048)],  # in % 4 != 0: partial quads
}


def shapes(qtype):
    return SHAPES["k" if qtype in (Q4_K, Q5_K, Q6_K) else "q8" if qtype == Q8_0 else "plain"]


def quantized(rng, qtype, shape) -> np.ndarray:  # -> [out, row bytes] uint8
    return quantize(rng.standard_normal(shape).astype(np.float32), qtype)


def random_raw(rng, qtype, shape) -> np.ndarray:  # -> [out, row bytes] uint8, every value finite
    """Random bytes; inf/nan fp16 scale fields (and plain values) get their top exponent bit cleared."""
    raw = rng.integers(0, 256, (shape[0], qtype.row_nbytes(shape[1])), dtype=np.uint8)
    if qtype in SCALE_FIELDS:
        blocks = with_finite_f16_fields(raw.reshape(-1, qtype.type_size), SCALE_FIELDS[qtype])
        return blocks.reshape(raw.shape)
    bits, exp_mask, top = {F32: ("<u4", 0x7F800000, 0x40000000), F16: ("<u2", 0x7C00, 0x4000),
                           BF16: ("<u2", 0x7F80, 0x4000)}[qtype]
    v = raw.view(bits)
    v[(v & exp_mask) == exp_mask] &= ~np.array(top, dtype=bits)
    return raw


def assert_bits_equal(ours, ref) -> None:
    ours = cp.asnumpy(ours)
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    assert_array_equal(ours.view(np.uint32), np.asarray(ref, np.float32).view(np.uint32))


def assert_within_sum_bound(y, raw, qtype, shape, x) -> None:
    """|y - oracle| <= 2 * 1.01 * in * 2^-24 * (M @ |x|), M = magnitude(): both are float32 sums of the same
    exact products in different orders, each within gamma_in of the exact sum (Higham eq. 3.5). The tensor-core
    kernel (exact codes times an exact 3-way bf16 split of x, float32 accumulation) adds in two levels, 32
    values then n_in / 32 scaled group sums, so its own error is far below this bound."""
    y, ref = cp.asnumpy(y), ops.quant_linear(x, raw, qtype, shape)
    bound = 2.02 * shape[1] * 2.0**-24 * (np.abs(x.astype(np.float64)) @ magnitude(raw, qtype, shape).T)  # [T, out]
    err = np.abs(y.astype(np.float64) - ref)
    assert y.shape == ref.shape and np.isfinite(y).all()
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), f"{qtype.name} {shape}: |diff| {err[worst]:.3g} > bound {bound[worst]:.3g} at {worst}"


# ---------------------------------------------------------------- 1. get_rows


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("make", [quantized, random_raw], ids=["quantized", "random"])
def test_get_rows_bit_exact(rng, qtype, make):
    for shape in shapes(qtype):
        raw = make(rng, qtype, shape)
        ids = np.array([0, shape[0] - 1, -1, 3 % shape[0], 3 % shape[0], -shape[0]], dtype=np.int64)
        ours = cuda_ops.get_rows(cp.asarray(raw), qtype, shape, ids)
        assert_bits_equal(ours, ops.get_rows(raw, qtype, shape, ids))
        ours_dev_ids = cuda_ops.get_rows(cp.asarray(raw), qtype, shape, cp.asarray(ids))
        assert_bits_equal(ours_dev_ids, ops.get_rows(raw, qtype, shape, ids))


def test_get_rows_all_rows_of_a_random_vocab(rng):
    """Every row of a bigger random Q6_K table (the LM head / embedding type of qwen35 q4_k_m files)."""
    shape = (2000, 1024)
    raw = random_raw(rng, Q6_K, shape)
    ids = rng.permutation(shape[0])
    assert_bits_equal(cuda_ops.get_rows(cp.asarray(raw), Q6_K, shape, ids), ops.get_rows(raw, Q6_K, shape, ids))


def test_get_rows_unaligned_plain_rows(rng):
    """F32 rows that start 4 bytes past a 16-byte boundary take the scalar path; same bits."""
    shape = (9, 64)
    raw = quantized(rng, F32, shape)
    buf = cp.zeros(raw.size + 4, dtype=cp.uint8)
    buf[4:] = cp.asarray(raw.reshape(-1))
    ids = np.arange(9)
    assert_bits_equal(cuda_ops.get_rows(buf[4:], F32, shape, ids), ops.get_rows(raw, F32, shape, ids))
    x = rng.standard_normal((3, 64)).astype(np.float32)
    assert_within_sum_bound(cuda_ops.quant_linear(cp.asarray(x), buf[4:], F32, shape), raw, F32, shape, x)


def test_get_rows_rejects_bad_ids_and_empty_ids(rng):
    raw = quantized(rng, Q8_0, (5, 64))
    with pytest.raises(IndexError):
        cuda_ops.get_rows(cp.asarray(raw), Q8_0, (5, 64), [5])
    with pytest.raises(IndexError):
        cuda_ops.get_rows(cp.asarray(raw), Q8_0, (5, 64), cp.asarray([-6]))
    assert cuda_ops.get_rows(cp.asarray(raw), Q8_0, (5, 64), np.zeros(0, np.int64)).shape == (0, 64)


# ---------------------------------------------------------------- 2. quant_linear against the oracle


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_quant_linear_matches_oracle(rng, qtype):
    for shape in shapes(qtype):
        raw = quantized(rng, qtype, shape)
        raw_dev = cp.asarray(raw)
        for T in (1, 3, 8, 16, 37):
            x = rng.standard_normal((T, shape[1])).astype(np.float32)
            assert_within_sum_bound(cuda_ops.quant_linear(cp.asarray(x), raw_dev, qtype, shape), raw, qtype, shape, x)


@pytest.mark.parametrize("qtype", [Q8_0, Q4_K, Q5_K, Q6_K, F16], ids=lambda t: t.name)
def test_quant_linear_random_blocks(rng, qtype):
    """Every code and scale bit pattern (finite fp16 fields): the decoders must match the oracle's unpacking."""
    for shape in shapes(qtype)[:3]:
        raw = random_raw(rng, qtype, shape)
        x = rng.standard_normal((4, shape[1])).astype(np.float32)
        y = cuda_ops.quant_linear(cp.asarray(x), cp.asarray(raw), qtype, shape)
        assert_within_sum_bound(y, raw, qtype, shape, x)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_quant_linear_at_a_real_shape(rng, qtype):
    """Qwen3.5-0.8B's ffn_down (1024 x 3584) from random blocks: several chunks per split warp."""
    shape = (1024, 3584)
    raw = random_raw(rng, qtype, shape) if qtype in SCALE_FIELDS else quantized(rng, qtype, shape)
    x = rng.standard_normal((3, shape[1])).astype(np.float32)
    assert_within_sum_bound(cuda_ops.quant_linear(cp.asarray(x), cp.asarray(raw), qtype, shape), raw, qtype, shape, x)


def test_quant_linear_hand_worked_q8_0():
    """One Q8_0 block, d = 0.5, codes -16..15: y = 0.5 * sum(q * x) exactly (small integers)."""
    d = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)
    codes = np.arange(-16, 16, dtype=np.int8)
    raw = np.concatenate([d, codes.view(np.uint8)])[None]  # [1, 34]
    x = np.stack([np.ones(32), np.arange(32) % 3]).astype(np.float32)  # [2, 32]
    y = cp.asnumpy(cuda_ops.quant_linear(cp.asarray(x), cp.asarray(raw), Q8_0, (1, 32)))
    assert_array_equal(y[:, 0], 0.5 * (codes.astype(np.float32) * x).sum(axis=1))


def test_tensor_core_path_is_taken_and_passes_x_through_exactly(rng):
    """The tensor-core kernel splits each float32 x into three bf16 pieces (hi + mid + lo = x exactly) and
    multiplies exact codes: a Q8_0 row with a single code +-1 (d = 1) must return +-x[p] bit for bit, for x
    with all 24 significant bits in use. A two-piece split (16 bits) or a rounding conversion would not."""
    n_out, n_in = 24, 512
    assert cuda_ops._mma_ok(Q8_0, n_in) == (int(cp.cuda.Device().compute_capability) >= 80)
    pos = rng.choice(n_in, n_out, replace=False)
    sign = np.where(np.arange(n_out) % 2, -1, 1)
    blocks = np.zeros((n_out, n_in // 32, 34), dtype=np.uint8)
    blocks[:, :, :2] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    blocks[np.arange(n_out), pos // 32, 2 + pos % 32] = (sign.astype(np.int8)).view(np.uint8)
    raw = blocks.reshape(n_out, -1)
    x = (rng.standard_normal((11, n_in)) * np.exp2(rng.integers(-20, 20, (11, n_in)))).astype(np.float32)
    y = cp.asnumpy(cuda_ops.quant_linear(cp.asarray(x), cp.asarray(raw), Q8_0, (n_out, n_in)))
    assert_array_equal(y.view(np.uint32), (x[:, pos] * sign).astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("qtype", [Q4_K, Q5_K, Q6_K, Q8_0], ids=lambda t: t.name)
def test_tensor_core_and_fma_kernels_agree(rng, qtype, monkeypatch):
    """Both kernels for the same weight: each within the bound of the oracle, and of each other."""
    shape = (300, 2048)
    raw = random_raw(rng, qtype, shape)
    x = rng.standard_normal((9, shape[1])).astype(np.float32)
    mma = cuda_ops.quant_linear(cp.asarray(x), cp.asarray(raw), qtype, shape)
    monkeypatch.setattr(cuda_ops, "use_mma", False)
    fma = cuda_ops.quant_linear(cp.asarray(x), cp.asarray(raw), qtype, shape)
    assert_within_sum_bound(mma, raw, qtype, shape, x)
    assert_within_sum_bound(fma, raw, qtype, shape, x)


def test_quant_linear_out_argument_and_empty_shapes(rng):
    shape = (20, 256)
    raw = cp.asarray(quantized(rng, Q4_K, shape))
    x = cp.asarray(rng.standard_normal((5, 256)).astype(np.float32))
    out = cp.full((5, 20), np.nan, dtype=cp.float32)
    assert cuda_ops.quant_linear(x, raw, Q4_K, shape, out=out) is out
    assert_bits_equal(out, cp.asnumpy(cuda_ops.quant_linear(x, raw, Q4_K, shape)))
    assert cuda_ops.quant_linear(x[:0], raw, Q4_K, shape).shape == (0, 20)
    empty = cuda_ops.quant_linear(cp.zeros((2, 0), cp.float32), cp.zeros(0, cp.uint8), F32, (3, 0))
    assert_array_equal(cp.asnumpy(empty), np.zeros((2, 3), np.float32))


def test_unsupported_types_and_bad_arguments_raise(rng):
    raw = cp.zeros(4 * 18, dtype=cp.uint8)
    x = cp.zeros((1, 32), cp.float32)
    for qtype in (GGMLType.Q4_0, GGMLType.Q2_K, GGMLType.IQ4_XS, 999):
        with pytest.raises(ValueError, match="cuda_ops"):
            cuda_ops.quant_linear(x, raw, qtype, (4, 32))
        with pytest.raises(ValueError, match="cuda_ops"):
            cuda_ops.get_rows(raw, qtype, (4, 32), [0])
    q8 = cp.asarray(quantized(rng, Q8_0, (4, 64)))
    with pytest.raises(ValueError, match="bytes"):
        cuda_ops.quant_linear(cp.zeros((1, 64), cp.float32), q8[:-1], Q8_0, (4, 64))
    with pytest.raises(ValueError, match="block size"):
        cuda_ops.quant_linear(cp.zeros((1, 60), cp.float32), q8, Q8_0, (4, 60))
    with pytest.raises(ValueError, match="x must be"):
        cuda_ops.quant_linear(cp.zeros((1, 32), cp.float32), q8, Q8_0, (4, 64))
    q4k = cp.zeros(144 + 1, dtype=cp.uint8)
    with pytest.raises(ValueError, match="boundary"):  # a uint4 header load needs 16-byte alignment
        cuda_ops.quant_linear(cp.zeros((1, 256), cp.float32), q4k[1:], Q4_K, (1, 256))


# ---------------------------------------------------------------- 3. batch invariance


@pytest.mark.parametrize("kernel", ["auto", "fma"])
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_quant_linear_is_batch_invariant(rng, qtype, kernel, monkeypatch):
    """Row t of a T-row call must equal a one-row call bit for bit, for every T: the speculative engine
    verifies k drafts in one (k+1)-row pass and keeps its greedy picks only if they are exactly the
    picks plain one-token decoding would make. NT and rows-per-warp change with T; the sums must not.
    kernel="auto": K-quants and Q8_0 take the tensor-core kernel (tokens in tiles of 8); "fma": the float kernel."""
    if kernel == "fma":
        monkeypatch.setattr(cuda_ops, "use_mma", False)
    for shape in (shapes(qtype)[0], shapes(qtype)[2], (MANY_ROWS, shapes(qtype)[0][1])):
        raw = cp.asarray(quantized(rng, qtype, shape))
        x = cp.asarray(rng.standard_normal((37, shape[1])).astype(np.float32))
        one = cp.concatenate([cuda_ops.quant_linear(x[t:t + 1], raw, qtype, shape) for t in range(37)])
        for T in list(range(1, 17)) + [37]:
            assert_bits_equal(cuda_ops.quant_linear(x[:T], raw, qtype, shape), cp.asnumpy(one[:T]))
        tail = cuda_ops.quant_linear(x[5:16], raw, qtype, shape)  # rows in a different position of the tile
        assert_bits_equal(tail, cp.asnumpy(one[5:16]))


# ---------------------------------------------------------------- 4. GDN delta rule


def core_inputs(rng, T, HV, K, V):
    """As tests/test_gdn.py: unit q and k (q scaled by 1/sqrt(K)), log decay in [-2, 0], beta in (0, 1)."""
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    q = f32(ops.l2_norm(f32(rng.standard_normal((T, HV, K))), 1e-6) / np.sqrt(K))
    k = ops.l2_norm(f32(rng.standard_normal((T, HV, K))), 1e-6)
    v = f32(rng.standard_normal((T, HV, V)))
    log_decay = f32(rng.uniform(-2, 0, (T, HV)))
    beta = f32(rng.uniform(0, 1, (T, HV)))
    state = f32(rng.standard_normal((HV, K, V)) * 0.5)
    return q, k, v, log_decay, beta, state


GDN_SIZES = [(3, 16, 12), (4, 128, 128), (2, 64, 40)]  # (HV, K, V); (4, 128, 128) is qwen35's head


@pytest.mark.parametrize("HV,K,V", GDN_SIZES)
def test_delta_rule_step_matches_oracle(rng, HV, K, V):
    q, k, v, log_decay, beta, state = core_inputs(rng, 1, HV, K, V)
    o_ref, S_ref = gdn.delta_rule_step(state, q[0], k[0], v[0], log_decay[0], beta[0])
    state_dev = cp.asarray(state)
    o, S = cuda_ops.delta_rule_step(state_dev, *(cp.asarray(a[0]) for a in (q, k, v, log_decay, beta)))
    # the same f32 operations in the same order; only exp may differ in its last bit
    assert_allclose(cp.asnumpy(o), o_ref, rtol=1e-5, atol=1e-6)
    assert_allclose(cp.asnumpy(S), S_ref, rtol=1e-5, atol=1e-6)
    assert_array_equal(cp.asnumpy(state_dev), state)  # the input state is not modified


@pytest.mark.parametrize("HV,K,V", GDN_SIZES)
@pytest.mark.parametrize("T", [1, 5, 16])
def test_gdn_scan_and_snapshot_ring_match_oracle(rng, HV, K, V, T):
    q, k, v, log_decay, beta, state = core_inputs(rng, T, HV, K, V)
    slots = T + 2
    ring_ref = np.full((slots, HV, K, V), 7.0, np.float32)
    o_ref, S_ref = gdn.gdn_scan(q, k, v, log_decay, beta, state, states_out=ring_ref)
    ring = cp.full((slots, HV, K, V), 7.0, dtype=cp.float32)  # preallocated on the device, like SnapshotRing
    o, S = cuda_ops.gdn_scan(*(cp.asarray(a) for a in (q, k, v, log_decay, beta, state)), states_out=ring)
    tol = dict(rtol=2e-5, atol=2e-6)
    assert_allclose(cp.asnumpy(o), o_ref, **tol)
    assert_allclose(cp.asnumpy(S), S_ref, **tol)
    assert_allclose(cp.asnumpy(ring), ring_ref, **tol)  # slots >= T keep their 7.0
    assert_bits_equal(ring[T - 1], cp.asnumpy(S))  # the last slot is the final state, bit for bit


@pytest.mark.parametrize("HV,K,V", GDN_SIZES[:2])
def test_gdn_scan_is_batch_invariant_and_ring_restores(rng, HV, K, V):
    """A T-token scan equals T one-token steps bit for bit (outputs, final state, every ring slot), so a
    verify pass followed by a rollback to j tokens leaves exactly the state of j plain decode steps."""
    T = 9
    q, k, v, log_decay, beta, state = (cp.asarray(a) for a in core_inputs(rng, T, HV, K, V))
    ring = cp.zeros((T, HV, K, V), dtype=cp.float32)
    o_all, S_all = cuda_ops.gdn_scan(q, k, v, log_decay, beta, state, states_out=ring)
    S = state
    for t in range(T):
        o_t, S = cuda_ops.delta_rule_step(S, q[t], k[t], v[t], log_decay[t], beta[t])
        assert_bits_equal(o_all[t], cp.asnumpy(o_t))
        assert_bits_equal(ring[t], cp.asnumpy(S))
    assert_bits_equal(S_all, cp.asnumpy(S))

    j = 4  # keep 4 tokens: restore slot 3 device to device, then continue from it
    restored = ring[j - 1].copy()
    o_rest, _ = cuda_ops.gdn_scan(q[j:], k[j:], v[j:], log_decay[j:], beta[j:], restored)
    assert_bits_equal(o_rest, cp.asnumpy(o_all[j:]))


def test_gdn_scan_in_place_and_errors(rng):
    q, k, v, log_decay, beta, state = (cp.asarray(a) for a in core_inputs(rng, 3, 2, 16, 8))
    o_ref, S_ref = cuda_ops.gdn_scan(q, k, v, log_decay, beta, state)
    live = state.copy()
    o, S = cuda_ops.gdn_scan(q, k, v, log_decay, beta, live, out_state=live)
    assert S is live
    assert_bits_equal(live, cp.asnumpy(S_ref))
    assert_bits_equal(o, cp.asnumpy(o_ref))
    with pytest.raises(ValueError, match="states_out"):
        cuda_ops.gdn_scan(q, k, v, log_decay, beta, state, states_out=cp.zeros((2, 2, 16, 8), cp.float32))
    with pytest.raises(ValueError, match="state"):
        cuda_ops.gdn_scan(q, k, v, log_decay, beta, state[:, :8])
    with pytest.raises(ValueError, match="K <="):
        big = cp.zeros((1, 1, 512), cp.float32)
        cuda_ops.gdn_scan(big, big, cp.zeros((1, 1, 4), cp.float32), cp.zeros((1, 1), cp.float32),
                          cp.zeros((1, 1), cp.float32), cp.zeros((1, 512, 4), cp.float32))


# ---------------------------------------------------------------- 5. fused row functions (fast/cuda_rows.py)


def test_fused_row_functions_match_the_oracle_and_are_batch_invariant(rng):
    """cuda_rows' one-launch versions of ops.rms_norm / l2_norm / sigmoid / silu / softplus: within float32
    rounding of the oracle (a sum of n squares in another order: 2 n 2^-24 relative), and row t of a T-row call
    is bitwise a one-row call. Non-contiguous inputs (a slice of heads) too."""
    from tinyspec.fast import cuda_rows

    x = (rng.standard_normal((9, 4, 2 * 128)) * 3).astype(np.float32)[..., :128]  # [9, 4, 128] strided
    w = rng.standard_normal(128).astype(np.float32)
    xd, wd = cp.asarray(x), cp.asarray(w)
    cases = [("rms_norm", lambda a: cuda_rows.rms_norm(a, wd, 1e-6), lambda a: ops.rms_norm(a, w, 1e-6)),
             ("l2_norm", lambda a: cuda_rows.l2_norm(a, 1e-6), lambda a: ops.l2_norm(a, 1e-6)),
             ("sigmoid", cuda_rows.sigmoid, ops.sigmoid), ("silu", cuda_rows.silu, ops.silu),
             ("softplus", cuda_rows.softplus, ops.softplus)]
    for name, fused, oracle in cases:
        y = cp.asnumpy(fused(xd))
        ref = oracle(x)
        assert y.shape == ref.shape and y.dtype == np.float32, name
        assert_allclose(y, ref, rtol=2 * 128 * 2.0**-24 * 4, atol=1e-7, err_msg=name)
        one = np.concatenate([cp.asnumpy(fused(xd[t:t + 1])) for t in range(x.shape[0])])
        assert_array_equal(y.view(np.uint32), one.view(np.uint32), err_msg=name)
    assert cuda_rows.rms_norm(xd, cp.asarray(w[:64]), 1e-6) is None  # a broadcast it declines


# ---------------------------------------------------------------- 5. MoE: routing, grouping, the grouped matmul
# (fast/cuda_moe.py and cuda_ops.bind_experts; the Python side also runs through tests/fake_cupy.py, the numbers
# only here)


def spread_groups(experts, E):
    """moe.group_by_expert of host choices [T, k] with its offsets over all E experts (the device's form)."""
    from tinyspec.moe import group_by_expert

    order, distinct, starts = group_by_expert(experts)
    counts = np.zeros(E, np.int64)
    counts[distinct] = np.diff(starts)
    return order, np.concatenate([[0], np.cumsum(counts)])


@pytest.mark.parametrize("E,k", [(6, 2), (8, 8), (128, 8), (256, 8), (300, 3)])  # 300 > 128: the split pairwise sum
@pytest.mark.parametrize("logits", ["normal", "ties"])
def test_route_experts_is_moe_route_bit_for_bit(rng, E, k, logits):
    """cuda_moe.route_experts against moe.route + group_by_expert on the same logits: the weights bit for bit,
    the order and the offsets exactly. "ties": small integer logits (many equal probabilities in a row, and a
    row all equal), where the stable rule (a tie to the lower index) decides which experts are chosen."""
    from tinyspec.fast import cuda_moe
    from tinyspec.moe import route

    for T in (1, 5, 37):
        z = (rng.standard_normal((T, E)) * 3 if logits == "normal" else rng.integers(-2, 3, (T, E))).astype(np.float32)
        if logits == "ties":
            z[0] = 1.0
        want_experts, want_weights = route(z, k)
        weights, order, experts, offsets = cuda_moe.route_experts(cp.asarray(z), k)
        assert_bits_equal(weights, want_weights)
        want_order, want_offsets = spread_groups(want_experts, E)
        assert_array_equal(cp.asnumpy(order), want_order)
        assert_array_equal(cp.asnumpy(offsets), want_offsets)
        assert_array_equal(experts, np.arange(E))


GROUPED_SHAPES = {"k": (40, 768), "q8": (40, 736), "plain": (40, 300)}  # (out, in) of one expert


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_grouped_experts_linear_is_each_experts_float_kernel(rng, qtype, monkeypatch):
    """cuda_ops.bind_experts (one launch for every expert, device offsets) against each expert's own float-kernel
    call (bind over its slice of the bytes, use_mma off): bitwise, group by group, for routings of T = 1..16 and 37
    rows (empty experts among them); host groups give the same bits; within the sum bound of the oracle."""
    monkeypatch.setattr(cuda_ops, "use_mma", False)  # the grouped kernel is the float kernel's tile
    from tinyspec.fast import cuda_moe

    E, k = 7, 3
    n_out, n_in = GROUPED_SHAPES["k" if qtype in (Q4_K, Q5_K, Q6_K) else "q8" if qtype == Q8_0 else "plain"]
    raw = quantized(rng, qtype, (E * n_out, n_in))
    per = raw.size // E
    dev = cp.asarray(raw.reshape(-1))
    grouped = cuda_ops.bind_experts(dev, qtype, (E, n_out, n_in))
    own = [cuda_ops.bind(dev[e * per:(e + 1) * per], qtype, (n_out, n_in)) for e in range(E)]
    x = rng.standard_normal((37, n_in)).astype(np.float32)
    for T in list(range(1, 17)) + [37]:
        _, order, experts, offsets = cuda_moe.route_experts(cp.asarray(rng.standard_normal((T, E)).astype(np.float32)), k)
        xs = cp.asarray(x[:T])[order // k]  # [T k, in] grouped by expert
        y = grouped(xs, experts, offsets)
        offs = cp.asnumpy(offsets)
        for e in range(E):
            a, b = offs[e], offs[e + 1]
            if b > a:
                assert_bits_equal(y[a:b], cp.asnumpy(own[e](xs[a:b])))
                assert_within_sum_bound(y[a:b], raw.reshape(E, -1)[e], qtype, (n_out, n_in), cp.asnumpy(xs[a:b]))
        distinct = np.flatnonzero(np.diff(offs))
        starts = np.concatenate([[0], np.cumsum(np.diff(offs)[distinct])])
        assert_bits_equal(grouped(xs, distinct, starts), cp.asnumpy(y))  # host groups, uploaded


@pytest.mark.parametrize("qtype", [Q4_K, Q8_0, F16], ids=lambda t: t.name)
def test_grouped_experts_linear_is_batch_invariant(rng, qtype):
    """A pair's row of a T-row pass equals the same pair's row of that token's one-row pass, bit for bit (with
    the tensor cores on: the grouped launch never takes them, so a row's bits never depend on T)."""
    from tinyspec.fast import cuda_moe

    E, k = 9, 4
    n_out, n_in = GROUPED_SHAPES["k" if qtype == Q4_K else "q8" if qtype == Q8_0 else "plain"]
    dev = cp.asarray(quantized(rng, qtype, (E * n_out, n_in)).reshape(-1))
    grouped = cuda_ops.bind_experts(dev, qtype, (E, n_out, n_in))
    x = rng.standard_normal((37, n_in)).astype(np.float32)
    z = rng.standard_normal((37, E)).astype(np.float32)

    def per_pair(xr, zr):  # [T, k, out]: row t's j-th choice's product, from a pass over these rows alone
        T = xr.shape[0]
        _, order, experts, offsets = cuda_moe.route_experts(cp.asarray(zr), k)
        y = cp.empty((T * k, n_out), cp.float32)
        y[order] = grouped(cp.asarray(xr)[order // k], experts, offsets)
        return cp.asnumpy(y).reshape(T, k, n_out)

    alone = np.concatenate([per_pair(x[t:t + 1], z[t:t + 1]) for t in range(37)])
    for T in list(range(2, 17)) + [37]:
        assert_array_equal(per_pair(x[:T], z[:T]).view(np.uint32), alone[:T].view(np.uint32))


# ---------------------------------------------------------------- 6. attention (fast/cuda_attention.py)

ATTN_ATOL = 1e-5  # on unit-scale q, k, v with scale d^-1/2 (the module docstring: float32 rounding, not bitwise)
# (n_past, H_kv, G, d): Qwen3.5's d = 256 (G = 4: 0.8B's 8 query heads over 2), the test model's 128, odd d
# (partial lanes and columns), one query head per kv head, a past longer than many 32-key tiles
ATTN_HEADS = [(37, 2, 4, 256), (0, 1, 2, 128), (5, 2, 3, 40), (300, 1, 1, 7), (64, 3, 2, 33)]
ATTN_T = [*range(1, 10), 37]


def attn_cache(rng, n, H_kv, d, spare=3):  # -> keys, values [n + spare, H_kv, d]; NaN where never to be read
    keys, values = rng.standard_normal((2, n + spare, H_kv, d)).astype(np.float32)
    keys[n:], values[n:] = np.nan, np.nan
    return keys, values


def scattered_pool(rng, keys, values, bs, n_blocks=None):
    """The positions of a contiguous cache spread over a pool's blocks in a random order (the rest NaN):
    -> k_pool, v_pool [n_blocks (default: twice the blocks needed), bs, H_kv, d], table."""
    n = keys.shape[0]
    n_blocks = n_blocks or 2 * -(-n // bs)
    table = rng.permutation(n_blocks)[: -(-n // bs)]
    k_pool = np.full((n_blocks, bs, *keys.shape[1:]), np.nan, np.float32)
    v_pool = k_pool.copy()
    for j in range(n):
        k_pool[table[j // bs], j % bs], v_pool[table[j // bs], j % bs] = keys[j], values[j]
    return k_pool, v_pool, table


@pytest.fixture(scope="module")
def device_attention():
    from tinyspec.fast.cuda_attention import DeviceAttention

    return DeviceAttention(cp)


@pytest.mark.parametrize("n_past,H_kv,G,d", ATTN_HEADS)
def test_attend_matches_the_oracle(rng, device_attention, n_past, H_kv, G, d):
    """Every T of a verify pass (1..9) and a prefill chunk (37), against tinyspec.attention.attend."""
    from tinyspec.attention import attend

    scale = np.float32(d ** -0.5)
    for T in ATTN_T:
        q = rng.standard_normal((T, H_kv, G, d)).astype(np.float32)
        keys, values = attn_cache(rng, n_past + T, H_kv, d)
        got = cp.asnumpy(device_attention.attend(cp.asarray(q), cp.asarray(keys), cp.asarray(values), n_past, scale))
        want = attend(q, keys, values, n_past, scale)
        assert got.shape == want.shape and got.dtype == np.float32 and np.isfinite(got).all()
        assert_allclose(got, want, rtol=0, atol=ATTN_ATOL, err_msg=f"T={T}")


@pytest.mark.parametrize("bs", [16, 5])
@pytest.mark.parametrize("n_past,H_kv,G,d", ATTN_HEADS)
def test_attend_paged_matches_the_oracle_and_is_attend_bit_for_bit(rng, device_attention, bs, n_past, H_kv, G, d):
    """A cache spread over random blocks of a pool: within the oracle's tolerance, and bitwise the contiguous
    attend over the same positions (which pool row is read is integer arithmetic; the floats are the same)."""
    from tinyspec.attention import attend_paged

    scale = np.float32(d ** -0.5)
    for T in (1, 4, 37):
        q = rng.standard_normal((T, H_kv, G, d)).astype(np.float32)
        keys, values = attn_cache(rng, n_past + T, H_kv, d, spare=0)
        k_pool, v_pool, table = scattered_pool(rng, keys, values, bs)
        qd = cp.asarray(q)
        got = device_attention.attend_paged(qd, cp.asarray(k_pool), cp.asarray(v_pool), table, n_past, scale)
        assert_allclose(cp.asnumpy(got), attend_paged(q, k_pool, v_pool, table, n_past, scale), rtol=0,
                        atol=ATTN_ATOL, err_msg=f"T={T}")
        flat = device_attention.attend(qd, cp.asarray(keys), cp.asarray(values), n_past, scale)
        assert_bits_equal(got, cp.asnumpy(flat))


def test_ragged_mixed_lengths_match_the_oracle_and_each_sequence_alone(rng, device_attention):
    """Sequences of one pool with mixed lengths in ONE launch (a decode row, a verify pass, one with no rows this
    call, a prefill chunk, a long past): within the oracle's tolerance, and each sequence bitwise its own call."""
    from tinyspec.attention import attend_paged_ragged

    H_kv, G, d, bs, n_blocks = 2, 4, 256, 16, 96
    scale = np.float32(d ** -0.5)
    Ts, n_pasts = [1, 4, 0, 37, 9], [100, 7, 12, 0, 300]
    bounds = np.cumsum([0, *Ts])
    k_pool, v_pool = rng.standard_normal((2, n_blocks, bs, H_kv, d)).astype(np.float32)
    order = rng.permutation(n_blocks)
    tables, used = [], 0
    for T, n_past in zip(Ts, n_pasts):
        need = -(-(n_past + T) // bs)
        tables.append(order[used:used + need])
        used += need
    q = rng.standard_normal((int(bounds[-1]), H_kv, G, d)).astype(np.float32)
    kd, vd = cp.asarray(k_pool), cp.asarray(v_pool)
    got = device_attention.attend_paged_ragged(cp.asarray(q), kd, vd, tables, n_pasts, bounds, scale)
    want = attend_paged_ragged(q, k_pool, v_pool, tables, n_pasts, bounds, scale)
    assert_allclose(cp.asnumpy(got), want, rtol=0, atol=ATTN_ATOL)
    for lo, hi, table, n_past in zip(bounds[:-1], bounds[1:], tables, n_pasts):
        alone = device_attention.attend_paged(cp.asarray(q[lo:hi]), kd, vd, table, n_past, scale)
        assert_bits_equal(got[lo:hi], cp.asnumpy(alone))


@pytest.mark.parametrize("n_past,H_kv,G,d", ATTN_HEADS)
def test_attend_is_batch_invariant(rng, device_attention, n_past, H_kv, G, d):
    """A row's bits depend on its own position and keys only: alone (T = 1 at its position), in a T-row pass for
    every T, and in a ragged call beside other sequences' rows, the same bits."""
    scale, T_max = np.float32(d ** -0.5), 37
    q = rng.standard_normal((T_max, H_kv, G, d)).astype(np.float32)
    keys, values = attn_cache(rng, n_past + T_max, H_kv, d)
    qd, kd, vd = cp.asarray(q), cp.asarray(keys), cp.asarray(values)
    alone = np.stack([cp.asnumpy(device_attention.attend(qd[t:t + 1], kd, vd, n_past + t, scale))[0]
                      for t in range(T_max)])
    for T in ATTN_T:
        assert_bits_equal(device_attention.attend(qd[:T], kd, vd, n_past, scale), alone[:T])
    # the same rows as sequence 1 of a ragged call over a pool, between two others
    bs = 8
    k_pool, v_pool, table = scattered_pool(rng, keys[: n_past + T_max], values[: n_past + T_max], bs, n_blocks=128)
    free = np.setdiff1d(np.arange(128), table)
    other = rng.standard_normal((6, H_kv, G, d)).astype(np.float32)
    rows = np.concatenate([other[:2], q, other[2:]])
    tables, n_pasts = [free[:3], table, free[3:5]], [20, n_past, 5]
    bounds = np.array([0, 2, 2 + T_max, 6 + T_max])
    k_pool[free[:5]] = rng.standard_normal((5, bs, H_kv, d))  # the other sequences' keys
    v_pool[free[:5]] = rng.standard_normal((5, bs, H_kv, d))
    got = device_attention.attend_paged_ragged(cp.asarray(rows), cp.asarray(k_pool), cp.asarray(v_pool), tables,
                                               n_pasts, bounds, scale)
    assert_bits_equal(got[2:2 + T_max], alone)


def test_a_captured_graph_reads_new_lengths_from_device_memory(rng, device_attention):
    """attend_rows reads every length and block id from device memory: captured once in a CUDA graph, it replays
    with the map copied into its buffer (the sequences one position further, a block changed), bitwise the
    eager call on the new map (issue 35 item 5's prerequisite)."""
    from tinyspec.fast.cuda_attention import row_map, split

    H_kv, G, d, bs, n_blocks = 2, 4, 256, 16, 16
    scale = np.float32(d ** -0.5)
    k_pool, v_pool = (cp.asarray(a) for a in rng.standard_normal((2, n_blocks, bs, H_kv, d)).astype(np.float32))
    q, out = cp.asarray(rng.standard_normal((4, H_kv, G, d)).astype(np.float32)), cp.empty((4, H_kv, G, d), cp.float32)
    bounds = np.array([0, 1, 4])
    steps = [([np.array([2, 3]), np.array([9, 4])], [20, 14]), ([np.array([2, 3]), np.array([9, 5])], [21, 15])]
    host, R, B = row_map(*steps[0], bounds, bs, n_blocks)
    buf = cp.asarray(host)
    device_attention.attend_rows(q, k_pool, v_pool, *split(buf, R, B), scale, out=out)  # compiled before capture
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        device_attention.attend_rows(q, k_pool, v_pool, *split(buf, R, B), scale, out=out)
        graph = stream.end_capture()
    for tables, n_pasts in steps:
        with stream:  # the copy into the graph's map, then the replay, in order on one stream
            buf[...] = cp.asarray(row_map(tables, n_pasts, bounds, bs, n_blocks)[0])
            graph.launch(stream)
        stream.synchronize()
        want = device_attention.attend_paged_ragged(q, k_pool, v_pool, tables, n_pasts, bounds, scale)
        assert_bits_equal(out, cp.asnumpy(want))
