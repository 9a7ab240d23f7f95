"""quant_mix: llama-quantize's Q4_K_M per-tensor types, against llama.cpp's own snapshots and by hand.

llama.cpp pins its rules in tests/snapshots/*.schema (written by tests/test-quant-type-selection.cpp from real
files' tensor lists): for each ftype, the tensors whose type is not the ftype's base type. Two are qwen35:
    qwen3.6-27b.schema        "Qwen3.5-27B", dense, 64 layers, no MTP block, untied output
    qwen3.5-397b-a17b.schema  qwen35moe, 60 layers, 512 experts and a shared expert
Their [Q4_K_M] sections list output.weight and, per layer, attn_qkv / attn_v and ffn_down (ffn_down_exps and
ffn_down_shexp) as q6_K, nothing else: every row of those models fills 256-value blocks. The hand-made shapes
below cover what the snapshots cannot: fallbacks, tied embeddings, the MTP block, 8 experts.
"""

from __future__ import annotations

from tinyspec.quant_mix import allows_quantization, fallback, q4_k_m_types, use_more_bits
from tinyspec.quants import GGMLType

Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, F16 = (GGMLType.Q4_K, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q5_K, GGMLType.Q6_K,
                                           GGMLType.Q8_0, GGMLType.F16)
# the layers the snapshots' [Q4_K_M] sections list (qwen3.6-27b.schema lines 482-546, qwen3.5-397b-a17b.schema
# lines 641-731), for attn_qkv / attn_v and for ffn_down alike
BUMPED_27B = [*range(8), *range(10, 56, 3), *range(56, 64)]
BUMPED_397B = [*range(7), *range(9, 52, 3), *range(52, 60)]


def qwen35_shapes(n_layer: int, D: int, F: int, V: int, Hq: int, d: int, Vd: int, C: int, n_v: int,
                  n_expert: int = 0, untied: bool = True, mtp: bool = False) -> dict[str, tuple[int, ...]]:
    """Every tensor of a qwen35 (qwen35moe when n_expert) file, NumPy shapes, in the converter's order; full
    attention every 4th layer; the MTP block (a full-attention layer + nextn tensors) after the trunk."""
    out = {"token_embd.weight": (V, D), "output_norm.weight": (D,)} | ({"output.weight": (V, D)} if untied else {})
    for i in range(n_layer + mtp):
        b = f"blk.{i}."
        out |= {b + "attn_norm.weight": (D,), b + "post_attention_norm.weight": (D,)}
        if (i + 1) % 4 and i < n_layer:
            out |= {b + "attn_qkv.weight": (C, D), b + "attn_gate.weight": (Vd, D), b + "ssm_alpha.weight": (n_v, D),
                    b + "ssm_beta.weight": (n_v, D), b + "ssm_conv1d.weight": (C, 4), b + "ssm_a": (n_v,),
                    b + "ssm_dt.bias": (n_v,), b + "ssm_norm.weight": (Vd // n_v,), b + "ssm_out.weight": (D, Vd)}
        else:
            out |= {b + "attn_q.weight": (2 * Hq * d, D), b + "attn_k.weight": (d, D), b + "attn_v.weight": (d, D),
                    b + "attn_output.weight": (D, Hq * d), b + "attn_q_norm.weight": (d,), b + "attn_k_norm.weight": (d,)}
        if n_expert:
            out |= {b + "ffn_gate_inp.weight": (n_expert, D), b + "ffn_gate_exps.weight": (n_expert, F, D),
                    b + "ffn_up_exps.weight": (n_expert, F, D), b + "ffn_down_exps.weight": (n_expert, D, F),
                    b + "ffn_gate_inp_shexp.weight": (1, D), b + "ffn_gate_shexp.weight": (F, D),
                    b + "ffn_up_shexp.weight": (F, D), b + "ffn_down_shexp.weight": (D, F)}
        else:
            out |= {b + "ffn_gate.weight": (F, D), b + "ffn_up.weight": (F, D), b + "ffn_down.weight": (D, F)}
    if mtp:
        out |= {f"blk.{n_layer}.nextn.eh_proj.weight": (D, 2 * D), f"blk.{n_layer}.nextn.enorm.weight": (D,)}
    return out


def not_base(types: dict) -> dict[str, list[int]]:
    """What a snapshot section lists: the tensors that are not Q4_K, as {kind and type: [layers]}."""
    out: dict[str, list[int]] = {}
    for name, qtype in types.items():
        if qtype != Q4_K:
            kind = name.split(".")[2] if name.startswith("blk.") else name
            out.setdefault(f"{kind} {qtype.name}", []).append(int(name.split(".")[1]) if name.startswith("blk.") else -1)
    return out


def test_27b_matches_llama_cpp_snapshot():
    shapes = qwen35_shapes(64, D=5120, F=17408, V=248320, Hq=24, d=256, Vd=6144, C=10240, n_v=48)
    types = q4_k_m_types(shapes, n_layer=64)
    assert not_base(types) == {"output.weight Q6_K": [-1], "ffn_down Q6_K": BUMPED_27B,
                               "attn_qkv Q6_K": [i for i in BUMPED_27B if i % 4 != 3],
                               "attn_v Q6_K": [i for i in BUMPED_27B if i % 4 == 3]}
    # quantized = every 2-D weight; norms, ssm_conv1d, ssm_a, ssm_dt.bias are left alone (absent)
    assert set(types) == {n for n, s in shapes.items() if len(s) == 2 and "norm" not in n and "conv1d" not in n}


def test_397b_moe_matches_llama_cpp_snapshot():
    shapes = qwen35_shapes(60, D=4096, F=1024, V=248320, Hq=32, d=256, Vd=8192, C=12288, n_v=64, n_expert=512)
    types = q4_k_m_types(shapes, n_layer=60, n_expert=512)
    assert not_base(types) == {"output.weight Q6_K": [-1], "ffn_down_exps Q6_K": BUMPED_397B,
                               "ffn_down_shexp Q6_K": BUMPED_397B,
                               "attn_qkv Q6_K": [i for i in BUMPED_397B if i % 4 != 3],
                               "attn_v Q6_K": [i for i in BUMPED_397B if i % 4 == 3]}
    assert "blk.0.ffn_gate_inp.weight" not in types  # the router: never quantized
    assert "blk.0.ffn_gate_inp_shexp.weight" not in types  # [1, D] is one-dimensional to ggml


def test_fallbacks_tied_embeddings_and_the_mtp_block():
    """The shipped target's shape (hidden 320, ffn 768, tied, MTP): rows of 320 are no multiple of 256, so the Q4_K
    tensors reading the hidden state fall back to Q5_0 and the tied embedding takes the output rule's Q8_0; rows of
    768 (ffn_down) and 256 (ssm_out) stay K-quants; the MTP block counts as a 7th layer."""
    shapes = qwen35_shapes(6, D=320, F=768, V=8192, Hq=5, d=64, Vd=256, C=512, n_v=8, untied=False, mtp=True)
    types = q4_k_m_types(shapes, n_layer=7)
    bumped = [i for i in range(7) if use_more_bits(i, 7)]
    assert bumped == [2, 5, 6]  # 7 // 8 = 0 layers at the start, 49 // 8 = 6 onwards, and i % 3 == 2
    assert types["token_embd.weight"] == Q8_0 and "output.weight" not in types
    for i in range(7):
        assert types[f"blk.{i}.ffn_down.weight"] == (Q6_K if i in bumped else Q4_K)  # 768 = 3 x 256
        assert types[f"blk.{i}.ffn_gate.weight"] == Q5_0  # 320: Q4_K's fallback
        mixer = "attn_v" if (i + 1) % 4 == 0 or i == 6 else "attn_qkv"
        assert types[f"blk.{i}.{mixer}.weight"] == (Q8_0 if i in bumped else Q5_0)  # Q6_K's, Q4_K's fallback
    assert types["blk.0.ssm_out.weight"] == Q4_K and types["blk.3.attn_output.weight"] == Q5_0  # 256, 320
    assert types["blk.6.nextn.eh_proj.weight"] == Q5_0  # 640 = 2.5 x 256
    untied = qwen35_shapes(6, D=512, F=768, V=8192, Hq=8, d=64, Vd=512, C=1024, n_v=8, untied=False)
    assert q4_k_m_types(untied, n_layer=6)["token_embd.weight"] == Q6_K  # tied, rows of 512: the output's Q6_K


def test_fallback_chain():
    assert [fallback(t, 256) for t in (Q4_K, Q5_K, Q6_K, Q8_0)] == [Q4_K, Q5_K, Q6_K, Q8_0]
    assert [fallback(t, 96) for t in (Q4_K, Q5_K, Q6_K, Q8_0)] == [Q5_0, Q5_1, Q8_0, Q8_0]
    assert [fallback(t, 80) for t in (Q4_K, Q5_K, Q6_K, Q8_0)] == [F16] * 4  # not even 32-value blocks fit


def test_eight_experts_get_llama_cpp_s_extra_bits():
    """llama-quant.cpp's rules for exactly 8 experts (Mixtral-sized): attn_v-like and attn_k Q8_0, attn_output Q5_K."""
    shapes = qwen35_shapes(4, D=256, F=256, V=512, Hq=4, d=64, Vd=256, C=512, n_v=4, n_expert=8)
    types = q4_k_m_types(shapes, n_layer=4, n_expert=8)
    assert types["blk.0.attn_qkv.weight"] == types["blk.3.attn_v.weight"] == types["blk.3.attn_k.weight"] == Q8_0
    assert types["blk.3.attn_output.weight"] == Q5_K and types["blk.3.attn_q.weight"] == Q4_K
    assert q4_k_m_types(shapes, n_layer=4, n_expert=16)["blk.3.attn_k.weight"] == Q4_K


def test_allows_quantization():
    assert allows_quantization("blk.0.attn_qkv.weight", (512, 320))
    assert allows_quantization("blk.0.ffn_down_exps.weight", (8, 320, 768))
    for name, shape in [("blk.0.attn_norm.weight", (320,)), ("blk.0.ssm_conv1d.weight", (512, 4)),
                        ("blk.0.ssm_a", (8,)), ("blk.0.ffn_gate_inp.weight", (8, 320)),
                        ("blk.0.ffn_gate_inp_shexp.weight", (1, 320)), ("blk.0.attn_q_norm.weight", (64,))]:
        assert not allows_quantization(name, shape), name


def test_counters_follow_layer_order_not_file_order():
    """llama counts attn_v-like tensors in its loader's order (layer number, then name): blk.10 after blk.9, even
    where a file lists blk.10 first, as a converter sorting names as strings does."""
    shapes = qwen35_shapes(16, D=256, F=256, V=512, Hq=4, d=64, Vd=256, C=512, n_v=4)
    shuffled = dict(sorted(shapes.items()))  # blk.1, blk.10, ..., blk.15, blk.2, ...
    assert q4_k_m_types(shuffled, n_layer=16) == q4_k_m_types(shapes, n_layer=16)
    assert [i for i in range(16) if q4_k_m_types(shuffled, 16)[f"blk.{i}.ffn_down.weight"] == Q6_K] == \
        [0, 1, 4, 7, 10, 13, 14, 15]
