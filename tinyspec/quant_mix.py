"""Which ggml type each tensor gets in a Q4_K_M file: llama-quantize's per-tensor rules, for qwen35 / qwen35moe.

    q4_k_m_types(shapes, n_layer, n_expert=0) -> {name: GGMLType}   (only the tensors llama-quantize quantizes)

A "Q4_K_M" file is not all Q4_K. llama-quantize starts every quantizable tensor at Q4_K, spends more bits where
errors hurt most, and falls back to a 32-value block type where a row does not fill 256-value super-blocks:

    quantizable   2-D or 3-D (trailing ggml dims of 1 do not count), name ends in "weight", and not *_norm.weight,
                  ffn_gate_inp.weight (the MoE router) or ssm_conv1d; the rest keeps its type (F32 from tinyspec)
    output        output.weight -> Q6_K; token_embd.weight too when there is no output.weight (tied embeddings),
                  both -> Q8_0 when the row is not a multiple of 256
    attn_v        attn_v and the GDN attn_qkv (one category) -> Q6_K when use_more_bits(i, n), else Q4_K, where
                  i counts these tensors in llama's order and n is how many there are (MTP block included)
    ffn_down      ffn_down (and ffn_down_exps / ffn_down_shexp) -> Q6_K when use_more_bits(layer, n_layer), where
                  layer counts ffn_down tensors in order (a dense model) or is read from the name (a MoE model)
    8 experts     a MoE model with exactly 8 experts: attn_v / attn_qkv and attn_k -> Q8_0, attn_output -> Q5_K
    everything    else: Q4_K (token_embd with an output.weight, attn_q, attn_k, attn_output, attn_gate, ssm_alpha,
                  ssm_beta, ssm_out, ffn_gate, ffn_up, the experts' gate / up, nextn.eh_proj)
    fallback      a row (ggml ne0, NumPy's last axis) that is not a multiple of the type's block:
                  Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0; then anything whose row is not a multiple of 32 -> F16

    use_more_bits(i, n) = i < n/8  or  i >= 7n/8  or  (i - n/8) % 3 == 2      (integer division)
    i.e. the first and last eighth of the layers, and every third layer between them.

llama's order is its loader's: tensors sorted by layer number (non-layer tensors first), then by name.

Official implementation: llama.cpp src/llama-quant.cpp: tensor_allows_quantization, tensor_get_category,
llama_tensor_get_type_impl (the Q4_K_M branches), tensor_type_fallback, init_quantize_state_counters; the
loader's weight_name_comparer (src/llama-model-loader.h). Checked against llama.cpp's own snapshots for
Qwen3.5-27B and Qwen3.5-397B-A17B (tests/snapshots/*.schema, sections [Q4_K_M]) in tests/test_quant_mix.py, and
against llama.cpp's quantizer itself (types and bytes of whole files) in tests/test_convert_q4_k_m.py.
Does NOT include (rules that never fire for qwen35 / qwen35moe, or need options tinyspec does not take): the other
ftypes' branches (Q2_K ... IQ1_M, Q4_K_S, Q5_K_M), Falcon's and the 70B model's special cases, GLM5 / MXFP4_MOE
rules, the names other architectures exclude from quantization (altup, time_mix_*, pos_embd, ...), the
importance matrix, --pure, --output-tensor-type / --token-embedding-type / --tensor-type overrides, pruning.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .quants import GGMLType

QK_K = 256  # values per K-quant super-block
FALLBACK = {GGMLType.Q4_K: GGMLType.Q5_0, GGMLType.Q5_K: GGMLType.Q5_1, GGMLType.Q6_K: GGMLType.Q8_0}


def is_attn_v(name: str) -> bool:
    """llama's category_is_attn_v: attn_v and attn_qkv (attn_kv_b is no qwen35 tensor). Its own ATTENTION_QKV
    branch (Q5_K for Q4_K_M) comes after the attn_v one in llama_tensor_get_type_impl and is never reached."""
    return "attn_qkv.weight" in name or "attn_v.weight" in name


def allows_quantization(name: str, shape: tuple[int, ...]) -> bool:
    """llama.cpp tensor_allows_quantization, the parts that name qwen35 tensors. shape: NumPy order."""
    n_dims = len(shape) - next((i for i, d in enumerate(shape) if d != 1), len(shape))  # ggml_n_dims
    return (n_dims >= 2 and name.endswith("weight") and "_norm.weight" not in name
            and "ffn_gate_inp.weight" not in name and "ssm_conv1d" not in name)


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """The first and last eighth of the layers, and every third one between (Python's // and % are C's here,
    as long as i_layer >= n_layers // 8 where the % is reached)."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def llama_order(name: str) -> tuple[int, str]:
    """The loader's weight_name_comparer: layer number (-1 outside blk.N.), then the name."""
    m = re.match(r"blk\.(\d+)\.", name)
    return (int(m.group(1)) if m else -1, name)


def fallback(qtype: GGMLType, row: int) -> GGMLType:
    """tensor_type_fallback: a 32-value block type for a row that does not fill the type's blocks, F16 after that."""
    if row % qtype.block_size:
        qtype = FALLBACK.get(qtype, qtype)
    return GGMLType.F16 if row % qtype.block_size else qtype


def q4_k_m_types(shapes: Mapping[str, tuple[int, ...]], n_layer: int, n_expert: int = 0) -> dict[str, GGMLType]:
    """name -> type for every tensor of `shapes` (all of a file's tensors, NumPy shapes) that llama-quantize
    quantizes in LLAMA_FTYPE_MOSTLY_Q4_K_M, in `shapes`' order. n_layer: the file's block_count (MTP blocks
    included); n_expert: its expert_count (0 for a dense model)."""
    tied = "output.weight" not in shapes
    n_attn_v = sum(map(is_attn_v, shapes))
    i_attn_v = i_ffn_down = 0
    chosen = {}
    for name in sorted(shapes, key=llama_order):
        shape, qtype = shapes[name], GGMLType.Q4_K
        if not allows_quantization(name, shape):
            continue
        if name == "output.weight" or (tied and name == "token_embd.weight"):
            qtype = GGMLType.Q8_0 if shape[-1] % QK_K else GGMLType.Q6_K
        elif is_attn_v(name):
            qtype = GGMLType.Q6_K if use_more_bits(i_attn_v, n_attn_v) else GGMLType.Q4_K
            qtype = GGMLType.Q8_0 if n_expert == 8 else qtype
            i_attn_v += 1
        elif "attn_k.weight" in name:
            qtype = GGMLType.Q8_0 if n_expert == 8 else qtype
        elif "attn_output.weight" in name:
            qtype = GGMLType.Q5_K if n_expert == 8 else qtype
        elif "ffn_down" in name:
            layer = llama_order(name)[0] if n_expert > 1 else i_ffn_down  # experts: the layer from the name
            if n_expert > 1 and not 0 <= layer < n_layer:
                raise ValueError(f"{name}: layer {layer} is outside the file's {n_layer} blocks")
            qtype = GGMLType.Q6_K if use_more_bits(layer, n_layer) else qtype
            i_ffn_down += 1
        chosen[name] = fallback(qtype, shape[-1])
    return {name: chosen[name] for name in shapes if name in chosen}
