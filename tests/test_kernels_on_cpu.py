"""The real CUDA kernels, compiled for the CPU (tests/cuda_on_cpu.py), against the NumPy oracle; small shapes.

fake_cupy.install(monkeypatch, kernels="cpu"): the real cuda_ops, cuda_moe, cuda_rows and cuda_attention run on the
fake CuPy, and every RawKernel launch runs the kernel's own CUDA source (not the oracle stand-in), so these are the
kernels' numbers, as a GPU would compute them up to what the emulation does not model (cuda_on_cpu.h: C's expf
for CUDA's, the tensor core's internal summation). What each test checks:

1. get_rows, every type: bit-exact with ops.get_rows, quantized and random blocks, negative and repeated ids,
   partial chunks and quads; and rows of a 248,320-row table (Qwen3.5's vocabulary) by host and by device ids;
2. quant_linear, every type, the float kernel (all NT/RPW tiles: T = 1, 3, 16 and 19 = a tile of 16 and one of 3;
   the splits S = 1, 2, 8) and the tensor-core kernel (Q8_0, K-quants on "sm_90"): within the float32 summation
   bound of ops.quant_linear (the bound tests/test_cuda_ops.py states), random blocks too;
3. batch invariance, both kernels: row t of a T-row call bitwise the one-row call, T = 1..16 and 19;
   and the tensor-core kernel passes a float32 x through exactly (a Q8_0 row with one code +-1);
4. the grouped (MoE experts) kernel, every type: bitwise each expert's own float-kernel call, within the bound;
5. the MoE router and grouping (route_k, group_k): bitwise moe.route + group_by_expert, ties included;
6. the norm kernel: ops.rms_norm / l2_norm to float rounding, batch-invariant; the elementwise kernels
   (sigmoid, silu, softplus: CuPy ElementwiseKernel operations) within a few ulps of ops';
7. attention: T not a multiple of the 32-key tile, head dims 7..256, a 1100-position context, paged bitwise
   contiguous, a row bitwise alone or in a T-row pass, within 1e-5 of tinyspec.attention;
8. the delta-rule scan with its snapshot ring: bitwise the oracle where float32 np.exp equals the kernel's
   exp (float64, rounded once), within 2e-5 otherwise; T tokens in one call bitwise T one-token steps; in place;
9. the whole model: the shipped target's greedy MTP speculation on the cuda backend, every launch compiled, graphs
   on: the oracle's plain greedy tokens.
The GPU file itself runs through the same emulation in tests/test_cuda_ops_on_cpu.py (slower: marked slow).
Not here: greedy acceptance (fast/cuda_accept.py is CuPy functions, no RawKernel: tests/test_cuda_syncs.py),
performance.
"""

import types

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal
from quant_helpers import magnitude, with_finite_f16_fields

import cuda_on_cpu
import fake_cupy
from tinyspec import attention, gdn, moe, ops
from tinyspec.quants import GGMLType, quantize

if cuda_on_cpu.compiler() is None:
    pytest.skip("no C++ compiler ($CXX, g++ or clang++): the CUDA kernels cannot be built for the CPU",
                allow_module_level=True)

F32, F16, BF16, Q8_0 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0
Q4_K, Q5_K, Q6_K = GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K
TYPES = [F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K]
MMA_TYPES = [Q8_0, Q4_K, Q5_K, Q6_K]
SCALE_FIELDS = {Q8_0: [0], Q4_K: [0, 2], Q5_K: [0, 2], Q6_K: [208]}  # fp16 byte offsets in a block
# (out, in): 1 chunk of 256 (S = 1), 3 chunks (S = 2), 8 chunks (S = 8); partial chunks and quads for Q8_0 and plain
SHAPES = {"k": [(20, 256), (12, 768), (10, 2048)], "q8": [(20, 96), (12, 736), (10, 2048)],
          "plain": [(20, 3), (12, 257), (10, 2048)]}
VOCAB = 248_320  # Qwen3.5's vocabulary: the embedding table's rows


@pytest.fixture
def dev(monkeypatch):
    """The cuda modules on the fake CuPy, every kernel launch the CUDA source compiled for the CPU (the oracle
    stand-ins replaced by a function that fails: none may run)."""
    fake_cupy.install(monkeypatch, kernels="cpu")
    for table in (fake_cupy.RAW_KERNELS, fake_cupy.TEMPLATE_KERNELS):
        for name in list(table):
            monkeypatch.setitem(table, name, _no_stand_in)
    import cupy

    from tinyspec.fast import cuda_moe, cuda_ops, cuda_rows
    from tinyspec.fast.cuda_attention import DeviceAttention

    return types.SimpleNamespace(cp=cupy, ops=cuda_ops, moe=cuda_moe, rows=cuda_rows, attn=DeviceAttention(cupy))


def _no_stand_in(*args, **kwargs):
    raise AssertionError("an oracle stand-in ran where the compiled kernel should have")


def shapes(qtype):
    return SHAPES["k" if qtype in (Q4_K, Q5_K, Q6_K) else "q8" if qtype == Q8_0 else "plain"]


def quantized(rng, qtype, shape):  # -> [out, row bytes] uint8
    return quantize(rng.standard_normal(shape).astype(np.float32), qtype)


def random_raw(rng, qtype, shape):  # -> [out, row bytes] uint8: random bytes, every value finite
    raw = rng.integers(0, 256, (shape[0], qtype.row_nbytes(shape[1])), dtype=np.uint8)
    if qtype in SCALE_FIELDS:
        return with_finite_f16_fields(raw.reshape(-1, qtype.type_size), SCALE_FIELDS[qtype]).reshape(raw.shape)
    bits, exp_mask, top = {F32: ("<u4", 0x7F800000, 0x40000000), F16: ("<u2", 0x7C00, 0x4000),
                           BF16: ("<u2", 0x7F80, 0x4000)}[qtype]
    v = raw.view(bits)
    v[(v & exp_mask) == exp_mask] &= ~np.array(top, dtype=bits)
    return raw


def host(dev, a):
    return dev.cp.asnumpy(a)


def assert_bits_equal(ours, ref, msg=""):
    ours, ref = np.asarray(ours), np.asarray(ref, np.float32)
    assert ours.dtype == np.float32 and ours.shape == ref.shape, (ours.shape, ref.shape, msg)
    assert_array_equal(ours.view(np.uint32), ref.view(np.uint32), err_msg=msg)


def assert_within_sum_bound(y, raw, qtype, shape, x, msg=""):
    """|y - oracle| <= 2 * 1.01 * in * 2^-24 * (M @ |x|): two float32 sums of the same exact products in other
    orders (Higham eq. 3.5), the bound tests/test_cuda_ops.py checks on a GPU."""
    ref = ops.quant_linear(x, raw, qtype, shape)
    bound = 2.02 * shape[1] * 2.0**-24 * (np.abs(x.astype(np.float64)) @ magnitude(raw, qtype, shape).T)
    err = np.abs(y.astype(np.float64) - ref)
    assert y.shape == ref.shape and np.isfinite(y).all(), msg
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), f"{qtype.name} {shape} {msg}: |diff| {err[worst]:.3g} > {bound[worst]:.3g} at {worst}"


# ---------------------------------------------------------------- 1. get_rows


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_get_rows_is_bit_exact(dev, rng, qtype):
    for make in (quantized, random_raw):
        for shape in shapes(qtype)[:2]:
            raw = make(rng, qtype, shape)
            n = shape[0]
            ids = np.array([0, n - 1, -1, 3 % n, 3 % n, -n], dtype=np.int64)
            want = ops.get_rows(raw, qtype, shape, ids)
            assert_bits_equal(host(dev, dev.ops.get_rows(dev.cp.asarray(raw), qtype, shape, ids)), want, make.__name__)
            got = dev.ops.get_rows(dev.cp.asarray(raw), qtype, shape, dev.cp.asarray(ids))
            assert_bits_equal(host(dev, got), want, f"{make.__name__}, device ids")


def test_get_rows_of_a_vocabulary_sized_table(dev, rng):
    """248,320 rows (a Q8_0 table of 32-wide rows, random blocks): the first, the last, negative and random ids."""
    shape = (VOCAB, 32)
    raw = random_raw(rng, Q8_0, shape)
    ids = np.concatenate([[0, VOCAB - 1, -1, -VOCAB, 131_072], rng.integers(0, VOCAB, 11)]).astype(np.int64)
    table = dev.cp.asarray(raw)
    want = ops.get_rows(raw, Q8_0, shape, ids)
    assert_bits_equal(host(dev, dev.ops.get_rows(table, Q8_0, shape, ids)), want)
    got = dev.ops.get_rows(table, Q8_0, shape, dev.cp.asarray(ids % VOCAB), checked=False)
    assert_bits_equal(host(dev, got), want)


# ---------------------------------------------------------------- 2. quant_linear against the oracle


def kernels_for(qtype):
    return ["fma", "mma"] if qtype in MMA_TYPES else ["fma"]


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_quant_linear_is_within_the_sum_bound(dev, rng, qtype, monkeypatch):
    for kernel in kernels_for(qtype):
        monkeypatch.setattr(dev.ops, "use_mma", kernel == "mma")
        for i, shape in enumerate(shapes(qtype)):
            if kernel == "mma" and shape[1] % 256:
                continue
            assert dev.ops._mma_ok(qtype, shape[1]) == (kernel == "mma")
            random = i == 0 and qtype not in (F32, BF16)  # random F32/BF16 bytes overflow a float32 sum
            raw = random_raw(rng, qtype, shape) if random else quantized(rng, qtype, shape)
            raw_dev = dev.cp.asarray(raw)
            for T in (1, 3, 16, 19):
                x = rng.standard_normal((T, shape[1])).astype(np.float32)
                y = host(dev, dev.ops.quant_linear(dev.cp.asarray(x), raw_dev, qtype, shape))
                assert_within_sum_bound(y, raw, qtype, shape, x, f"{kernel} T={T}")


# ---------------------------------------------------------------- 3. batch invariance


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_quant_linear_is_batch_invariant(dev, rng, qtype, monkeypatch):
    """Row t of a T-row call equals the one-row call on x[t] bit for bit, for T = 1..16 and 19 (a tile of 16
    and one of 3), and rows 5..15 as a call of their own: NT and RPW change with T, the sums must not."""
    shape = shapes(qtype)[1]
    raw = dev.cp.asarray(quantized(rng, qtype, shape))
    x = dev.cp.asarray(rng.standard_normal((19, shape[1])).astype(np.float32))
    for kernel in kernels_for(qtype):
        monkeypatch.setattr(dev.ops, "use_mma", kernel == "mma")
        one = np.concatenate([host(dev, dev.ops.quant_linear(x[t:t + 1], raw, qtype, shape)) for t in range(19)])
        for T in [*range(1, 17), 19]:
            assert_bits_equal(host(dev, dev.ops.quant_linear(x[:T], raw, qtype, shape)), one[:T], f"{kernel} T={T}")
        assert_bits_equal(host(dev, dev.ops.quant_linear(x[5:16], raw, qtype, shape)), one[5:16], kernel)


def test_tensor_core_kernel_passes_x_through_exactly(dev, rng):
    """A Q8_0 row with one code +-1 (d = 1) returns +-x[p] bit for bit for x with all 24 significant bits in
    use: the kernel's three-way bf16 split of x and the emulated mma.sync add nothing that rounds."""
    n_out, n_in = 24, 512
    assert dev.ops._mma_ok(Q8_0, n_in)
    pos = rng.choice(n_in, n_out, replace=False)
    sign = np.where(np.arange(n_out) % 2, -1, 1)
    blocks = np.zeros((n_out, n_in // 32, 34), dtype=np.uint8)
    blocks[:, :, :2] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    blocks[np.arange(n_out), pos // 32, 2 + pos % 32] = sign.astype(np.int8).view(np.uint8)
    x = (rng.standard_normal((11, n_in)) * np.exp2(rng.integers(-20, 20, (11, n_in)))).astype(np.float32)
    y = host(dev, dev.ops.quant_linear(dev.cp.asarray(x), dev.cp.asarray(blocks.reshape(n_out, -1)), Q8_0,
                                       (n_out, n_in)))
    assert_bits_equal(y, x[:, pos] * sign)


# ---------------------------------------------------------------- 4. the grouped (experts) kernel


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_grouped_experts_are_each_experts_float_kernel(dev, rng, qtype, monkeypatch):
    """bind_experts (one launch, device offsets from route_experts) against each expert's own float-kernel call:
    bitwise, expert by expert, for T = 1, 3, 7 and 19 routed rows (k = 2 of E = 5: empty experts among them),
    host groups the same bits, and within the sum bound of the oracle."""
    monkeypatch.setattr(dev.ops, "use_mma", False)  # the grouped kernel is the float kernel's tile
    E, k = 5, 2
    n_out, n_in = shapes(qtype)[1]
    raw = quantized(rng, qtype, (E * n_out, n_in))
    per = raw.size // E
    flat = dev.cp.asarray(raw.reshape(-1))
    grouped = dev.ops.bind_experts(flat, qtype, (E, n_out, n_in))
    own = [dev.ops.bind(flat[e * per:(e + 1) * per], qtype, (n_out, n_in)) for e in range(E)]
    for T in (1, 3, 7, 19):
        x = rng.standard_normal((T, n_in)).astype(np.float32)
        z = dev.cp.asarray(rng.standard_normal((T, E)).astype(np.float32))
        _, order, experts, offsets = dev.moe.route_experts(z, k)
        xs = dev.cp.asarray(x)[order // k]  # [T k, in] grouped by expert
        y = dev.ops.bind_experts(flat, qtype, (E, n_out, n_in))(xs, experts, offsets)
        offs, xs_host, y_host = host(dev, offsets), host(dev, xs), host(dev, y)
        for e in range(E):
            a, b = offs[e], offs[e + 1]
            if b > a:
                assert_bits_equal(y_host[a:b], host(dev, own[e](xs[a:b])), f"T={T} expert {e}")
                assert_within_sum_bound(y_host[a:b], raw.reshape(E, -1)[e], qtype, (n_out, n_in), xs_host[a:b])
        distinct = np.flatnonzero(np.diff(offs))
        starts = np.concatenate([[0], np.cumsum(np.diff(offs)[distinct])])
        assert_bits_equal(host(dev, grouped(xs, distinct, starts)), y_host, f"T={T} host groups")


# ---------------------------------------------------------------- 5. the MoE router and grouping


@pytest.mark.parametrize("E,k", [(6, 2), (40, 4), (300, 3)])  # 300 > 128: the split pairwise sum
@pytest.mark.parametrize("logits", ["normal", "ties"])
def test_route_experts_is_moe_route_bit_for_bit(dev, rng, E, k, logits):
    """route_k + group_k against moe.route + group_by_expert: weights bitwise, order and offsets exactly; "ties":
    small integer logits and a row all equal, where a tie must go to the lower index."""
    for T in (1, 5):
        z = (rng.standard_normal((T, E)) * 3 if logits == "normal" else rng.integers(-2, 3, (T, E))).astype(np.float32)
        if logits == "ties":
            z[0] = 1.0
        want_experts, want_weights = moe.route(z, k)
        weights, order, experts, offsets = dev.moe.route_experts(dev.cp.asarray(z), k)
        assert_bits_equal(host(dev, weights), want_weights)
        want_order, distinct, starts = moe.group_by_expert(want_experts)
        counts = np.zeros(E, np.int64)
        counts[distinct] = np.diff(starts)
        assert_array_equal(host(dev, order), want_order)
        assert_array_equal(host(dev, offsets), np.concatenate([[0], np.cumsum(counts)]))
        assert_array_equal(experts, np.arange(E))


# ---------------------------------------------------------------- 6. norms


@pytest.mark.parametrize("n", [128, 300])
def test_norm_rows_matches_the_oracle_and_is_batch_invariant(dev, rng, n):
    x = (rng.standard_normal((5, 3, 2 * n)) * 3).astype(np.float32)[..., :n]  # strided: a slice of each row
    w = rng.standard_normal(n).astype(np.float32)
    xd, wd = dev.cp.asarray(x), dev.cp.asarray(w)
    cases = [("rms_norm", lambda a: dev.rows.rms_norm(a, wd, 1e-6), ops.rms_norm(x, w, 1e-6)),
             ("l2_norm", lambda a: dev.rows.l2_norm(a, 1e-6), ops.l2_norm(x, 1e-6))]
    for name, fused, want in cases:
        y = host(dev, fused(xd))
        assert_allclose(y, want, rtol=2 * n * 2.0**-24 * 4, atol=1e-7, err_msg=name)
        one = np.concatenate([host(dev, fused(xd[t:t + 1])) for t in range(x.shape[0])])
        assert_bits_equal(y, one, name)


def test_elementwise_kernels_match_the_oracle(dev, rng):
    """cuda_rows' sigmoid, silu and softplus (ElementwiseKernel operations, run one thread an element): within a
    few float32 ulps of ops' (C's expf and log1pf here, NumPy's there; CUDA's own differ by an ulp or two), and
    where an intermediate falls below float32's normal range (silu(-88) = -88 * 6e-39) flushed to zero as CuPy's
    -ftz=true does: the atol."""
    x = np.concatenate([rng.standard_normal(300) * 4, [0.0, -0.0, 88.0, -88.0, 1e-30, -120.0]]).astype(np.float32)
    xd = dev.cp.asarray(x.reshape(2, -1))
    for name in ("sigmoid", "silu", "softplus"):
        got = host(dev, getattr(dev.rows, name)(xd)).reshape(-1)
        with np.errstate(over="ignore"):  # exp(120) in the oracle's sigmoid: inf, then 1 / inf = 0, as meant
            want = getattr(ops, name)(x)
        assert_allclose(got, want, rtol=4 * 2.0**-23, atol=1e-35, err_msg=name)


# ---------------------------------------------------------------- 7. attention

ATTN_ATOL = 1e-5  # cuda_attention's docstring: float32 rounding on unit-scale q, k, v, not bitwise
# (n_past, H_kv, G, d, Ts): odd d (partial lanes), d = 256 (Qwen3.5), a context of 1100 keys (35 tiles)
ATTN = [(5, 2, 3, 40, (1, 4, 37)), (0, 1, 2, 128, (33,)), (37, 2, 4, 256, (3,)), (300, 1, 1, 7, (2, 31)),
        (1100, 1, 2, 64, (2,))]


def attn_cache(rng, n, H_kv, d, spare=3):  # keys, values [n + spare, H_kv, d]; NaN where never to be read
    keys, values = rng.standard_normal((2, n + spare, H_kv, d)).astype(np.float32)
    keys[n:], values[n:] = np.nan, np.nan
    return keys, values


@pytest.mark.parametrize("n_past,H_kv,G,d,Ts", ATTN, ids=lambda v: str(v))
def test_attend_matches_the_oracle_and_paged_is_contiguous_bitwise(dev, rng, n_past, H_kv, G, d, Ts):
    scale = np.float32(d ** -0.5)
    for T in Ts:
        q = rng.standard_normal((T, H_kv, G, d)).astype(np.float32)
        keys, values = attn_cache(rng, n_past + T, H_kv, d)
        qd = dev.cp.asarray(q)
        got = host(dev, dev.attn.attend(qd, dev.cp.asarray(keys), dev.cp.asarray(values), n_past, scale))
        want = attention.attend(q, keys, values, n_past, scale)
        assert np.isfinite(got).all()
        assert_allclose(got, want, rtol=0, atol=ATTN_ATOL, err_msg=f"T={T}")
        # the same positions spread over a pool's blocks (size 16) in a random order
        n, bs = n_past + T, 16
        n_blocks = 2 * -(-n // bs)
        table = rng.permutation(n_blocks)[: -(-n // bs)]
        k_pool = np.full((n_blocks, bs, H_kv, d), np.nan, np.float32)
        v_pool = k_pool.copy()
        for j in range(n):
            k_pool[table[j // bs], j % bs], v_pool[table[j // bs], j % bs] = keys[j], values[j]
        paged = dev.attn.attend_paged(qd, dev.cp.asarray(k_pool), dev.cp.asarray(v_pool), table, n_past, scale)
        assert_bits_equal(host(dev, paged), got, f"T={T} paged")


def test_attend_is_batch_invariant(dev, rng):
    """A row's bits depend on its own position and keys only: alone or in a T-row pass, T = 1..5 and 37."""
    n_past, H_kv, G, d = 20, 2, 2, 48
    scale = np.float32(d ** -0.5)
    q = rng.standard_normal((37, H_kv, G, d)).astype(np.float32)
    keys, values = attn_cache(rng, n_past + 37, H_kv, d)
    qd, kd, vd = dev.cp.asarray(q), dev.cp.asarray(keys), dev.cp.asarray(values)
    alone = np.stack([host(dev, dev.attn.attend(qd[t:t + 1], kd, vd, n_past + t, scale))[0] for t in range(37)])
    for T in (1, 2, 3, 5, 37):
        assert_bits_equal(host(dev, dev.attn.attend(qd[:T], kd, vd, n_past, scale)), alone[:T], f"T={T}")


# ---------------------------------------------------------------- 8. the delta-rule scan


def core_inputs(rng, T, HV, K, V):
    """As tests/test_gdn.py: unit q and k (q scaled by 1/sqrt(K)), log decay in [-2, 0], beta in (0, 1); the
    decays drawn again until float32 np.exp (the oracle's) equals exp in float64 rounded once (the kernel's)."""
    f32 = lambda a: np.asarray(a, np.float32)
    q = f32(ops.l2_norm(f32(rng.standard_normal((T, HV, K))), 1e-6) / np.sqrt(K))
    k = ops.l2_norm(f32(rng.standard_normal((T, HV, K))), 1e-6)
    v = f32(rng.standard_normal((T, HV, V)))
    log_decay = f32(rng.uniform(-2, 0, (T, HV)))
    while (bad := np.exp(log_decay) != np.exp(log_decay.astype(np.float64)).astype(np.float32)).any():
        log_decay[bad] = f32(rng.uniform(-2, 0, bad.sum()))
    beta = f32(rng.uniform(0, 1, (T, HV)))
    state = f32(rng.standard_normal((HV, K, V)) * 0.5)
    return q, k, v, log_decay, beta, state


@pytest.mark.parametrize("HV,K,V", [(3, 16, 12), (2, 128, 128), (2, 64, 40)])  # V = 40: idle threads of a warp
def test_gdn_scan_and_its_ring_are_the_oracle_bit_for_bit(dev, rng, HV, K, V):
    T, slots = 5, 7
    q, k, v, log_decay, beta, state = core_inputs(rng, T, HV, K, V)
    ring_ref = np.full((slots, HV, K, V), 7.0, np.float32)
    o_ref, S_ref = gdn.gdn_scan(q, k, v, log_decay, beta, state, states_out=ring_ref)
    ring = dev.cp.full((slots, HV, K, V), 7.0, dtype=dev.cp.float32)
    o, S = dev.ops.gdn_scan(*(dev.cp.asarray(a) for a in (q, k, v, log_decay, beta, state)), states_out=ring)
    assert_bits_equal(host(dev, o), o_ref, "o")
    assert_bits_equal(host(dev, S), S_ref, "state")
    assert_bits_equal(host(dev, ring), ring_ref, "ring")  # slots >= T keep their 7.0
    # any decay (np.exp's float32 rounding may differ from the kernel's in the last bit): to float rounding
    log_decay = rng.uniform(-2, 0, (T, HV)).astype(np.float32)
    o_ref, S_ref = gdn.gdn_scan(q, k, v, log_decay, beta, state)
    o, S = dev.ops.gdn_scan(*(dev.cp.asarray(a) for a in (q, k, v, log_decay, beta, state)))
    assert_allclose(host(dev, o), o_ref, rtol=2e-5, atol=2e-6)
    assert_allclose(host(dev, S), S_ref, rtol=2e-5, atol=2e-6)


def test_gdn_scan_is_its_steps_and_updates_in_place(dev, rng):
    """T tokens in one call = T one-token steps, bitwise (outputs, ring slots, final state); out_state=state
    updates the state in place with the same bits."""
    T, HV, K, V = 6, 2, 32, 24
    q, k, v, log_decay, beta, state = (dev.cp.asarray(a) for a in core_inputs(rng, T, HV, K, V))
    ring = dev.cp.zeros((T, HV, K, V), dtype=dev.cp.float32)
    o_all, S_all = dev.ops.gdn_scan(q, k, v, log_decay, beta, state, states_out=ring)
    S = state
    for t in range(T):
        o_t, S = dev.ops.delta_rule_step(S, q[t], k[t], v[t], log_decay[t], beta[t])
        assert_bits_equal(host(dev, o_all[t]), host(dev, o_t), f"t={t}")
        assert_bits_equal(host(dev, ring[t]), host(dev, S), f"t={t}")
    assert_bits_equal(host(dev, S_all), host(dev, S))
    live = state.copy()
    _, S_in_place = dev.ops.gdn_scan(q, k, v, log_decay, beta, live, out_state=live)
    assert S_in_place is live
    assert_bits_equal(host(dev, live), host(dev, S_all))


# ------------------------------------------------------------------------------------------ 9. the whole model
def test_the_shipped_model_on_the_compiled_kernels_decodes_the_oracles_tokens(dev):
    """Every kernel of a forward pass at once: the shipped tiny target on the cuda backend, each launch its CUDA
    source compiled for the CPU, greedy MTP speculation (k = 3, verify rows padded, the head's maps in one upload)
    with the forward passes and the greedy rule replayed from CUDA graphs: the oracle's plain greedy tokens."""
    import warnings
    from pathlib import Path

    import tinyspec
    from tinyspec import backends
    from tinyspec.backends import load_model
    from tinyspec.generate import generate, speculative_generate
    from tinyspec.mtp import MTPDrafter

    target = Path(tinyspec.__file__).resolve().parent / "assets" / "tiny-target.gguf"
    prompt = list(range(3, 13))
    want = generate(load_model(target, "numpy"), prompt, 7).tokens
    model = load_model(target, "cuda").with_placement(backends.cuda_placement(graphs=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = speculative_generate(model, MTPDrafter(model), prompt, 7, draft_n=3).tokens
    assert got == want
    counts = model.placement.graph_counts()["by_use"]["forward"]
    assert counts["replays"] > 0 and counts["failed"] == 0, counts
