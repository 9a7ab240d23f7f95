"""Gated DeltaNet (tinyspec/gdn.py), each form checked against the one before it:

1. causal_conv against its definition, against torch conv1d, and split in time from the carried state;
2. delta_rule_step on hand-worked cases, gdn_scan against HF's per-token torch loop, gdn_chunked
   against gdn_scan (odd T, several chunk sizes), and scan/chunked split in time from the carried state;
3. gdn_layer against HF transformers' Qwen3_5GatedDeltaNet (float32 torch fallback) with HF weights
   mapped to GGUF layout the way llama.cpp's converter does, n_k != n_v so the head order matters;
4. batch invariance: a T-token call equals T one-token calls bit for bit (outputs and state), and a ragged
   call over several sequences equals each sequence's own call (the scan and the chunked form).
"""

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from tinyspec.config import ModelConfig
from tinyspec.gdn import causal_conv, delta_rule_step, gdn_chunked, gdn_layer, gdn_layer_ragged, gdn_scan
from tinyspec.kernels import NUMPY
from tinyspec.ops import l2_norm
from tinyspec.state import GDNState

# ---------------------------------------------------------------- helpers


def tiny_cfg(D=32, n_k=2, n_v=4, K=8, V=12, w=4, eps=1e-6) -> ModelConfig:
    """A config with one GDN layer; only the ssm_* fields and rms_eps matter here."""
    return ModelConfig(
        n_vocab=16, n_embd=D, n_ff=64, n_layer_all=1, n_nextn=0, n_ctx=256, rms_eps=eps,
        n_head=2, n_head_kv=1, head_dim=8, n_rot=8, rope_base=1e4, attn_scale=8**-0.5,
        ssm_conv_kernel=w, ssm_head_k_dim=K, ssm_n_k_heads=n_k, ssm_n_v_heads=n_v, ssm_head_v_dim=V,
        recurrent=(True,),
    )


def random_core_inputs(rng, T, HV=3, K=16, V=12):
    """Realistic scales: unit q and k (q then scaled by 1/sqrt(K)), g in [-2, 0], beta in (0, 1)."""
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    q = f32(l2_norm(f32(rng.standard_normal((T, HV, K))), 1e-6) / np.sqrt(K))
    k = l2_norm(f32(rng.standard_normal((T, HV, K))), 1e-6)
    v = f32(rng.standard_normal((T, HV, V)))
    log_decay = f32(rng.uniform(-2, 0, (T, HV)))
    beta = f32(rng.uniform(0, 1, (T, HV)))
    state = f32(rng.standard_normal((HV, K, V)) * 0.5)
    return q, k, v, log_decay, beta, state


def random_gguf_weights(rng, cfg: ModelConfig) -> dict:
    D, n_v, V, C, w = cfg.n_embd, cfg.ssm_n_v_heads, cfg.ssm_head_v_dim, cfg.ssm_conv_channels, cfg.ssm_conv_kernel
    r = lambda *shape, s=1.0: np.asarray(rng.standard_normal(shape) * s, np.float32)  # noqa: E731
    return {
        "attn_qkv.weight": r(C, D, s=D**-0.5), "attn_gate.weight": r(n_v * V, D, s=D**-0.5),
        "ssm_beta.weight": r(n_v, D, s=D**-0.5), "ssm_alpha.weight": r(n_v, D, s=D**-0.5),
        "ssm_conv1d.weight": r(C, w, s=0.5), "ssm_dt.bias": r(n_v), "ssm_a": -np.exp(r(n_v)),
        "ssm_norm.weight": 1 + r(V, s=0.1), "ssm_out.weight": r(D, n_v * V, s=(n_v * V) ** -0.5),
    }


def random_state(rng, cfg: ModelConfig) -> GDNState:
    st = GDNState.zeros(cfg)
    st.conv[:] = rng.standard_normal(st.conv.shape)
    st.ssm[:] = rng.standard_normal(st.ssm.shape) * 0.3
    return st


# ---------------------------------------------------------------- 1. causal conv


@pytest.mark.parametrize("T, w", [(1, 4), (7, 4), (20, 2), (5, 1)])
def test_causal_conv_matches_definition_and_torch(rng, T, w):
    torch = pytest.importorskip("torch")
    C = 6
    x = rng.standard_normal((T, C)).astype(np.float32)
    weight = rng.standard_normal((C, w)).astype(np.float32)
    state = rng.standard_normal((C, w - 1)).astype(np.float32)
    y, new_state = causal_conv(x, state, weight)

    window = np.concatenate([state, x.T], axis=1)  # [C, w-1+T] oldest first
    expect = np.array([[sum(weight[c, j] * window[c, t + j] for j in range(w)) for c in range(C)] for t in range(T)])
    assert_allclose(y, expect, atol=1e-5)
    assert_array_equal(new_state, window[:, T:])  # the last w-1 raw inputs

    zero = np.zeros_like(state)
    ref = torch.nn.functional.conv1d(
        torch.from_numpy(x.T[None]), torch.from_numpy(weight[:, None, :]), padding=w - 1, groups=C
    )[0, :, :T].numpy().T
    assert_allclose(causal_conv(x, zero, weight)[0], ref, atol=1e-5)


def test_causal_conv_split_in_time_is_exact(rng):
    C, w = 10, 4
    x = rng.standard_normal((23, C)).astype(np.float32)
    weight = rng.standard_normal((C, w)).astype(np.float32)
    state = np.zeros((C, w - 1), np.float32)
    y_all, s_all = causal_conv(x, state, weight)
    y1, s1 = causal_conv(x[:2], state, weight)  # T1 < w-1: part of the old state survives
    y2, s2 = causal_conv(x[2:9], s1, weight)
    y3, s3 = causal_conv(x[9:], s2, weight)
    assert_array_equal(np.concatenate([y1, y2, y3]), y_all)
    assert_array_equal(s3, s_all)
    snaps = np.full((24, C, w - 1), np.nan, np.float32)  # the state after each token, as one-token steps give it
    causal_conv(x, state, weight, states_out=snaps)
    s = state
    for t in range(23):
        _, s = causal_conv(x[t : t + 1], s, weight)
        assert_array_equal(snaps[t], s)
    assert np.isnan(snaps[23]).all()  # slots past T untouched


@pytest.mark.parametrize("T", [1, 2, 5])  # w = 4: T < w-1 (part of the old window survives), T > w-1 (none does)
def test_causal_conv_out_and_in_place_are_bitwise_the_fresh_window(rng, T):
    """out receives the new window and is returned as it; out = conv_state itself (the layer's update in
    place, so the window keeps its address for a CUDA graph) must read the old window before writing it."""
    C, w = 6, 4
    x = rng.standard_normal((T, C)).astype(np.float32)
    weight = rng.standard_normal((C, w)).astype(np.float32)
    state = rng.standard_normal((C, w - 1)).astype(np.float32)
    before = state.copy()
    snaps = [np.full((T, C, w - 1), np.nan, np.float32) for _ in range(3)]
    y_ref, s_ref = causal_conv(x, state, weight, states_out=snaps[0])  # a new array, state untouched
    other = np.full_like(state, np.nan)
    y_out, s_out = causal_conv(x, state, weight, states_out=snaps[1], out=other)
    assert_array_equal(state, before)  # only an out that is conv_state changes it
    live = state.copy()
    y_live, s_live = causal_conv(x, live, weight, states_out=snaps[2], out=live)
    assert s_out is other and s_live is live and s_ref is not state
    for y, s, so in ((y_out, s_out, snaps[1]), (y_live, s_live, snaps[2])):
        assert_array_equal(y.view(np.uint32), y_ref.view(np.uint32))
        assert_array_equal(s.view(np.uint32), s_ref.view(np.uint32))
        assert_array_equal(so.view(np.uint32), snaps[0].view(np.uint32))
    assert_array_equal(s_ref, np.concatenate([before, x.T], axis=1)[:, T:])  # the last w-1 raw inputs


# ---------------------------------------------------------------- 2. delta rule, scan, chunked form


def test_delta_rule_step_hand_worked():
    f32 = lambda a: np.array(a, np.float32)  # noqa: E731
    # One head, K = V = 1: S = 2 decays by exp(g) = 0.5 to 1; k = 1 predicts S^T k = 1; v = 3, beta = 0.5,
    # so delta = 0.5 * (3 - 1) = 1 and S = 1 + 1 * 1 = 2; the read with q = 0.5 gives o = 1.
    o, S = delta_rule_step(
        f32([[[2.0]]]), q=f32([[0.5]]), k=f32([[1.0]]), v=f32([[3.0]]), log_decay=f32([np.log(0.5)]), beta=f32([0.5])
    )
    assert_allclose(S, [[[2.0]]], rtol=1e-6)
    assert_allclose(o, [[1.0]], rtol=1e-6)

    # One head, K = 2, V = 1, no decay, beta = 1: S = [[1], [0]] (rows = key dims, column = the value).
    # k = (0.6, 0.8) predicts S^T k = 0.6; delta = 2 - 0.6 = 1.4; S += outer(k, delta) = [[0.84], [1.12]],
    # so S = [[1.84], [1.12]]; q = (1, 0) reads 1.84. With beta = 1 and a unit key the memory now
    # returns v exactly: 1.84 * 0.6 + 1.12 * 0.8 = 2.
    o, S = delta_rule_step(
        f32([[[1.0], [0.0]]]), q=f32([[1.0, 0.0]]), k=f32([[0.6, 0.8]]), v=f32([[2.0]]),
        log_decay=f32([0.0]), beta=f32([1.0]),
    )
    assert_allclose(S, [[[1.84], [1.12]]], rtol=1e-6)
    assert_allclose(o, [[1.84]], rtol=1e-6)
    assert_allclose(S[0].T @ f32([0.6, 0.8]), [2.0], rtol=1e-6)


def test_gdn_scan_matches_hf_recurrent_loop(rng):
    """Same state layout [HV, K, V] as HF; HF gets unscaled q and scales it itself."""
    torch = pytest.importorskip("torch")
    hf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    q, k, v, g, beta, s0 = random_core_inputs(rng, T=40)
    K = q.shape[2]
    o, s = gdn_scan(q, k, v, g, beta, s0)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))[None]  # noqa: E731
    o_hf, s_hf = hf.torch_recurrent_gated_delta_rule(
        t(q * np.sqrt(K)), t(k), t(v), t(g), t(beta), initial_state=t(s0), output_final_state=True
    )
    assert_allclose(o, o_hf[0].numpy(), atol=1e-5)
    assert_allclose(s, s_hf[0].numpy(), atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 16, 64, 100, 512])
def test_chunked_matches_scan(rng, chunk):
    """T = 300 is not a multiple of any chunk here; 512 > T is a single short chunk."""
    q, k, v, g, beta, s0 = random_core_inputs(rng, T=300)
    o_scan, s_scan = gdn_scan(q, k, v, g, beta, s0)
    o_chunk, s_chunk = gdn_chunked(q, k, v, g, beta, s0, chunk=chunk)
    assert o_chunk.dtype == np.float32 and s_chunk.dtype == np.float32
    assert np.abs(o_chunk - o_scan).max() <= 1e-4
    assert np.abs(s_chunk - s_scan).max() <= 1e-4


def test_chunked_with_strong_decay_and_zero_state(rng):
    """g = -20 per token underflows exp(G) to 0 within a chunk; the masked pairwise decays must stay finite."""
    q, k, v, g, beta, _ = random_core_inputs(rng, T=70)
    g[:] = -20.0
    s0 = np.zeros((3, 16, 12), np.float32)
    o_scan, s_scan = gdn_scan(q, k, v, g, beta, s0)
    o_chunk, s_chunk = gdn_chunked(q, k, v, g, beta, s0, chunk=32)
    assert np.isfinite(o_chunk).all()
    assert np.abs(o_chunk - o_scan).max() <= 1e-5 and np.abs(s_chunk - s_scan).max() <= 1e-5


def test_scan_and_chunked_split_in_time(rng):
    q, k, v, g, beta, s0 = random_core_inputs(rng, T=150)
    cut = 37
    parts1 = [a[:cut] for a in (q, k, v, g, beta)]
    parts2 = [a[cut:] for a in (q, k, v, g, beta)]

    o_all, s_all = gdn_scan(q, k, v, g, beta, s0)
    o1, s1 = gdn_scan(*parts1, s0)
    o2, s2 = gdn_scan(*parts2, s1)
    assert_array_equal(np.concatenate([o1, o2]), o_all)
    assert_array_equal(s2, s_all)

    o_all, s_all = gdn_chunked(q, k, v, g, beta, s0, chunk=32)
    o1, s1 = gdn_chunked(*parts1, s0, chunk=32)
    o2, s2 = gdn_chunked(*parts2, s1, chunk=32)
    assert np.abs(np.concatenate([o1, o2]) - o_all).max() <= 1e-5
    assert np.abs(s2 - s_all).max() <= 1e-5


# ---------------------------------------------------------------- 3. the whole layer against HF transformers


def hf_gdn(cfg: ModelConfig, seed: int):
    """A float32 Qwen3_5GatedDeltaNet with every parameter random (norm weight and dt_bias included)."""
    torch = pytest.importorskip("torch")
    hf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig

    hf_cfg = Qwen3_5TextConfig(
        hidden_size=cfg.n_embd, num_hidden_layers=1, layer_types=["linear_attention"], rms_norm_eps=cfg.rms_eps,
        linear_num_key_heads=cfg.ssm_n_k_heads, linear_num_value_heads=cfg.ssm_n_v_heads,
        linear_key_head_dim=cfg.ssm_head_k_dim, linear_value_head_dim=cfg.ssm_head_v_dim,
        linear_conv_kernel_dim=cfg.ssm_conv_kernel,
    )
    torch.manual_seed(seed)
    module = hf.Qwen3_5GatedDeltaNet(hf_cfg, layer_idx=0).float().eval()
    with torch.no_grad():
        module.dt_bias.normal_()
        module.A_log.normal_()
        module.norm.weight.normal_(1.0, 0.2)
        module.conv1d.weight.normal_(0.0, 0.5)
    return module


def gguf_from_hf(module, cfg: ModelConfig) -> dict:
    """HF parameters -> GGUF tensors, as llama.cpp's converter does it (docs/qwen35.md section 2).

    HF groups value heads by key head (HF head h = g*R + r uses key head g = h // R); GGUF tiles them
    (GGUF head j = r*n_k + g uses key head j % n_k). So GGUF head j is HF head (j % n_k)*R + j // n_k,
    applied to every per-value-head tensor. ssm_a = -exp(A_log); conv weight squeezed; norm unchanged.
    """
    n_k, n_v, K, V = cfg.ssm_n_k_heads, cfg.ssm_n_v_heads, cfg.ssm_head_k_dim, cfg.ssm_head_v_dim
    R = n_v // n_k
    perm = np.array([(j % n_k) * R + j // n_k for j in range(n_v)])
    p = {name: t.detach().numpy().astype(np.float32) for name, t in module.named_parameters()}

    def heads(rows: np.ndarray, d: int) -> np.ndarray:  # [n_v*d, ...] -> same, heads reordered
        return rows.reshape(n_v, d, *rows.shape[1:])[perm].reshape(rows.shape)

    qkv, conv = p["in_proj_qkv.weight"], p["conv1d.weight"][:, 0, :]  # [C, D], [C, w]
    out = p["out_proj.weight"]  # [D, n_v*V]
    return {
        "attn_qkv.weight": np.concatenate([qkv[: 2 * n_k * K], heads(qkv[2 * n_k * K :], V)]),
        "attn_gate.weight": heads(p["in_proj_z.weight"], V),
        "ssm_beta.weight": heads(p["in_proj_b.weight"], 1),
        "ssm_alpha.weight": heads(p["in_proj_a.weight"], 1),
        "ssm_conv1d.weight": np.concatenate([conv[: 2 * n_k * K], heads(conv[2 * n_k * K :], V)]),
        "ssm_dt.bias": heads(p["dt_bias"], 1),
        "ssm_a": -np.exp(heads(p["A_log"], 1)),
        "ssm_norm.weight": p["norm.weight"],
        "ssm_out.weight": heads(out.T, V).T.copy(),
    }


@pytest.mark.parametrize("chunked", [False, True])
def test_gdn_layer_matches_hf(rng, chunked):
    torch = pytest.importorskip("torch")
    cfg = tiny_cfg()  # 2 key heads, 4 value heads, K = 8, V = 12
    module = hf_gdn(cfg, seed=0)
    w = gguf_from_hf(module, cfg)
    T = 64
    x = rng.standard_normal((T, cfg.n_embd)).astype(np.float32)
    with torch.no_grad():
        ref = module(torch.from_numpy(x)[None])[0].numpy()

    state = GDNState.zeros(cfg)
    out = gdn_layer(x, w, state, cfg, NUMPY, chunked=chunked)
    assert out.dtype == np.float32 and out.shape == (T, cfg.n_embd)
    assert np.abs(out - ref).max() <= 1e-4

    # prefill T1 tokens, then decode the rest one by one from the carried state
    T1 = 23
    state = GDNState.zeros(cfg)
    rows = [gdn_layer(x[:T1], w, state, cfg, NUMPY, chunked=chunked)]
    rows += [gdn_layer(x[t : t + 1], w, state, cfg, NUMPY) for t in range(T1, T)]
    assert np.abs(np.concatenate(rows) - ref).max() <= 1e-4


def test_hf_head_order_matters(rng):
    """Guard on the test itself: without the tiling reorder the mapped layer must NOT match HF."""
    torch = pytest.importorskip("torch")
    cfg = tiny_cfg()
    module = hf_gdn(cfg, seed=1)
    w = gguf_from_hf(module, cfg)
    p = {name: t.detach().numpy() for name, t in module.named_parameters()}
    w_grouped = dict(w, **{"ssm_a": -np.exp(p["A_log"]), "ssm_dt.bias": p["dt_bias"]})  # HF order for two tensors
    x = rng.standard_normal((16, cfg.n_embd)).astype(np.float32)
    with torch.no_grad():
        ref = module(torch.from_numpy(x)[None])[0].numpy()
    assert np.abs(gdn_layer(x, w, GDNState.zeros(cfg), cfg, NUMPY) - ref).max() <= 1e-4
    assert np.abs(gdn_layer(x, w_grouped, GDNState.zeros(cfg), cfg, NUMPY) - ref).max() > 1e-3


# ---------------------------------------------------------------- 4. batch invariance


@pytest.mark.parametrize("cfg", [tiny_cfg(), tiny_cfg(D=48, n_k=2, n_v=6, K=16, V=16, w=4)], ids=["small", "wide"])
def test_gdn_layer_is_batch_invariant(rng, cfg):
    """A T-token call (prefill, or a speculative verify pass) must give row t bit for bit equal to a
    one-token decode from the state before token t: otherwise greedy speculative decoding could pick a
    different token than plain greedy decoding."""
    w = random_gguf_weights(rng, cfg)
    x = rng.standard_normal((19, cfg.n_embd)).astype(np.float32)
    start = random_state(rng, cfg)

    state_block = start.copy()
    out_block = gdn_layer(x, w, state_block, cfg, NUMPY)

    state_tok = start.copy()
    out_tok = np.concatenate([gdn_layer(x[t : t + 1], w, state_tok, cfg, NUMPY) for t in range(len(x))])
    assert_array_equal(out_block, out_tok)
    assert_array_equal(state_block.conv, state_tok.conv)
    assert_array_equal(state_block.ssm, state_tok.ssm)

    state_mixed = start.copy()  # uneven blocks, like verify passes of different draft lengths
    blocks = [(0, 5), (5, 6), (6, 14), (14, 19)]
    out_mixed = np.concatenate([gdn_layer(x[a:b], w, state_mixed, cfg, NUMPY) for a, b in blocks])
    assert_array_equal(out_mixed, out_block)
    assert_array_equal(state_mixed.ssm, state_block.ssm)


@pytest.mark.parametrize("chunked", [False, True])
def test_ragged_layer_is_each_sequence_alone(rng, chunked):
    """Several sequences packed in one call (fla's varlen = concatenation of per-sequence runs): each sequence's
    rows and state are bitwise those of its own call, for the scan and for the chunked prefill form."""
    cfg = tiny_cfg()
    w = random_gguf_weights(rng, cfg)
    sizes = [7, 1, 12]
    bounds = np.cumsum([0] + sizes)
    x = rng.standard_normal((bounds[-1], cfg.n_embd)).astype(np.float32)
    starts = [random_state(rng, cfg) for _ in sizes]

    alone = [s.copy() for s in starts]
    out_alone = np.concatenate([gdn_layer(x[a:b], w, s, cfg, NUMPY, chunked=chunked)
                                for a, b, s in zip(bounds[:-1], bounds[1:], alone)])
    packed = [s.copy() for s in starts]
    out_packed = gdn_layer_ragged(x, w, packed, bounds, cfg, NUMPY, chunked=chunked)
    assert_array_equal(out_packed, out_alone)
    for a, b in zip(packed, alone):
        assert_array_equal(a.conv, b.conv)
        assert_array_equal(a.ssm, b.ssm)


def test_a_ring_refuses_the_chunked_form_before_any_state_changes(rng):
    """The chunked form never forms the per-token states a ring keeps: asked for both, the layer raises, and
    no sequence's state has moved (the check runs before the first sequence is scanned)."""
    from tinyspec.state import SnapshotRing

    cfg = tiny_cfg()
    w = random_gguf_weights(rng, cfg)
    states = [random_state(rng, cfg) for _ in range(2)]
    before = [s.copy() for s in states]
    x = rng.standard_normal((6, cfg.n_embd)).astype(np.float32)
    rings = [None, SnapshotRing(cfg, 4).layer(0)]
    with pytest.raises(ValueError, match="a ring needs the scan"):
        gdn_layer_ragged(x, w, states, np.array([0, 3, 6]), cfg, NUMPY, rings, chunked=True)
    with pytest.raises(ValueError, match="room for 6 tokens"):
        gdn_layer(x, w, states[0], cfg, NUMPY, ring=SnapshotRing(cfg, 4).layer(0))
    for s, b in zip(states, before):
        assert_array_equal(s.conv, b.conv)
        assert_array_equal(s.ssm, b.ssm)
