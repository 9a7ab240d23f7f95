"""Synthetic qwen35 / qwen35moe GGUFs: random weights at the published Qwen3.5 shapes, typed as llama-quantize types them.

    synth_model(path, shape="27b", quant="q4_k_m", seed=0)        # python -m tinyspec synth ...

Speed work needs files of the real size (a 27B decode step reads ~16 GB), and a random model is as
good as a trained one for that: the engine does the same arithmetic on the same types. So no float
weight is ever made or quantized. Each quantized tensor is random BLOCK BYTES (its codes) with its
fp16 scale fields written back to chosen values, one pass of a fast RNG and a few table lookups, so
even the 27b q4_k_m file (16.8 GB) is written quickly, in memory a fraction of its size (LESSONS 13
times it):

    Q8_0  34 B / 32 values   x = d * q,                 q int8 random            d ~ std / 73.9
    Q4_K 144 B / 256 values  x = d*sc*q - dmin*m,       q 0..15 random, sc = 16..31 random,
                                                        dmin = 4d, m = round(sc * 7.5 / 4) -> mean ~0
                                                                                 d ~ std / 110.4
    Q6_K 210 B / 256 values  x = d * sc * (q - 32),     q 0..63 random, sc = +-(16..31) random
                                                                                 d ~ std / 442
(the divisors are the rms of sc * (q - mean q); each block's d is jittered by +-25%; Q8_0 codes
include -128, which llama.cpp's quantizer never writes but every dequantizer reads), with
std = 1 / sqrt(row length) so every projection keeps its input's scale and activations stay O(1)
through any depth. The F32 tensors follow Hugging Face's initialisation: norms 1 + 0.1 N(0,1)
(GGUF stores 1 + w), ssm_a = -A with A ~ U(1, 16) (A_log = log A), dt bias 1 + 0.1 N(0,1),
conv taps U(-0.5, 0.5) (nn.Conv1d's default for 4 taps), the MoE routers ffn_gate_inp and ffn_gate_inp_shexp
N(0, 0.02) (initializer_range: router logits of std ~0.9, so a random router spreads the tokens over the
experts far more evenly than a trained one does; expert unions measured on these files are an upper bound).
Decays exp(ssm_a * softplus(a + dt)) then lie in (0, 1) and the delta rule, with L2-normed keys and
beta = sigmoid(b) < 1, cannot blow up.

Per-tensor types, llama-quantize's choice for the ftype (llama.cpp src/llama-quant.cpp,
llama_tensor_get_type_impl, tensor_allows_quantization, init_quantize_state_counters):
    always F32   1-D tensors, *_norm.weight, ssm_conv1d, names not ending in "weight" (ssm_a)
    q8_0 (7)     every other 2-D weight Q8_0 (the output rule keeps Q8_0 as Q8_0)
    q4_k_m (15)  base Q4_K, except
                 output.weight Q6_K, and token_embd.weight Q6_K when there is no output.weight (tied
                     embeddings take the output's type); an untied token_embd stays Q4_K
                 attn_v.weight AND the GDN attn_qkv.weight (both "attention-v-like"): Q6_K when
                     use_more_bits(i, n), else Q4_K, where i counts those tensors in file order (= the
                     block index: each block has one) and n = their number = blocks including the MTP block;
                 every tensor whose name holds "ffn_down" (ffn_down, and on qwen35moe ffn_down_exps AND
                     ffn_down_shexp): Q6_K when use_more_bits(block index, n_layer_all) (a dense file counts
                     them in file order, an MoE file parses the block from the name: the same index here);
                     use_more_bits(i, n) = i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2  (integer /)
                 (the ATTENTION_QKV branch that would pick Q5_K is unreachable: attn_v-like wins first)
    qwen35moe    the routers (ffn_gate_inp, never quantized: tensor_allows_quantization; ffn_gate_inp_shexp,
                 [1, D], one dimension for ggml) stay F32; the 3-D experts take the 2-D rules above per
                 expert (gate / up: the base type); no rule for 8-expert models applies to 256 experts.
    No fallback types occur: every row length of these shapes is a multiple of 256.
Checked: llama-quantize --dry-run on synth files of all four shapes picks these types for every tensor
(measured; tests/test_synth.py pins the 27b result to llama.cpp's snapshot tests/snapshots/qwen3.6-27b.schema
and its llamacpp-marked test reruns llama-quantize). llama.cpp loads and runs the files (llama-imatrix:
finite perplexity), and on an F32 copy of a synth file its logits equal tinyspec's to 6e-6 relative.

Tensor order is llama-quantize's output order (its loader's weights_map): the non-block tensors by
name, then blk.0, blk.1, ... with each block's names sorted. Metadata keys and types are those of
tinyspec.convert.model_metadata (llama.cpp's converter), with general.file_type of the ftype.
The vocabulary is byte-level BPE with no merges: the 256 byte tokens, <|endoftext|>, <|im_start|>,
<|im_end|> (control; eos = <|im_end|>), then "[PAD{i}]" fillers up to the vocab size.

Glossary: D hidden, F ffn, N vocab, H / H_kv attention heads, d head dim, n_k / n_v GDN key / value
heads, K / V their dims, C = 2 n_k K + n_v V conv channels, w conv taps.
Does NOT include: trained weights (logits are noise: use tinyspec.fast.synthetic for acceptance; routing is
near-uniform), imatrix types, the 4B shape, the 122B / 397B MoE shapes.
"""

from __future__ import annotations

import os
import shutil
import zlib
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

from ..convert import model_metadata, size_label
from ..gguf import GGUFValue, GGUFValueType, RawTensor, write_gguf
from ..quants import GGMLType
from ..tokenizer import BYTE_TO_CHAR

# The published text-model configs. Sources, cited per value:
#   [LC]  llama.cpp src/models/qwen35.cpp:25-30 (24 layers -> 0.8B if n_embd 1024 else 2B; 32 -> 9B;
#         64 -> 27B) and tests/snapshots/qwen3.6-27b.schema:1-2 ("Qwen3.5-27B": n_embd 5120, n_ff 17408,
#         n_layer 64, n_head 24, n_head_kv 4, n_vocab 248320)
#   [TF]  transformers qwen3_5/configuration_qwen3_5.py Qwen3_5TextConfig defaults, documented as the
#         "Qwen3.5-9B style configuration": hidden 4096, ffn 12288, 32 layers, 16 heads, 4 kv heads,
#         head_dim 256, GDN 16 key / 32 value heads of 128, conv 4, untied, partial_rotary 0.25,
#         vocab 248320, rms eps 1e-6, interval 4
#   [HF]  config.json of Qwen/Qwen3.5-0.8B, -2B, -27B as quoted by public code (0.8B: 1024 / 3584 / 24 /
#         8 / 2, GDN 16 / 16, tied; 2B: 2048 / 6144 / 24 / 8 / 2, GDN 16 / 16; 27B: GDN 16 / 48, untied,
#         rope_theta 1e7, mrope_section [11, 11, 10], max_position_embeddings 262144)
#   [2B]  tied embeddings for 2B, inferred from size: unsloth's Qwen3.5-2B-Q4_K_M.gguf is 1,280,835,840 bytes
#         (as pinned by public code); the synth 2b q4_k_m file is 1.31 GB tied, it would be 1.59 GB untied
#
#   shape  D     F      layers  H   H_kv  n_k  n_v  tied   sources
#   0.8b   1024  3584   24      8   2     16   16   yes    [LC] [HF]
#   2b     2048  6144   24      8   2     16   16   yes    [LC] [HF] [2B]
#   9b     4096  12288  32      16  4     16   32   no     [LC] [TF]
#   27b    5120  17408  64      24  4     16   48   no     [LC] [HF]
#   35b-a3b 2048 -      40      16  2     16   32   no     [MO]  qwen35moe: E 256 experts, 8 routed + 1 shared,
#                                                                expert and shared FFN 512 (no dense FFN)
#   all: d 256, K = V = 128, w 4, full attention every 4th layer, rope_theta 1e7 on 64 of 256 dims,
#        eps 1e-6, context 262144, N 248320 [TF] [HF]; one MTP block (nextn_predict_layers 1) [HF]
#   [MO]  transformers qwen3_5_moe/configuration_qwen3_5_moe.py Qwen3_5MoeTextConfig defaults (the 35B-A3B
#         shape); its rope_theta 1e4 / context 32768 defaults are not the published checkpoint's, COMMON's are
SHAPES = {
    "0.8b": dict(hidden_size=1024, intermediate_size=3584, num_hidden_layers=24, num_attention_heads=8,
                 num_key_value_heads=2, linear_num_key_heads=16, linear_num_value_heads=16, tie_word_embeddings=True),
    "2b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=24, num_attention_heads=8,
               num_key_value_heads=2, linear_num_key_heads=16, linear_num_value_heads=16, tie_word_embeddings=True),
    "9b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=32, num_attention_heads=16,
               num_key_value_heads=4, linear_num_key_heads=16, linear_num_value_heads=32, tie_word_embeddings=False),
    "27b": dict(hidden_size=5120, intermediate_size=17408, num_hidden_layers=64, num_attention_heads=24,
                num_key_value_heads=4, linear_num_key_heads=16, linear_num_value_heads=48, tie_word_embeddings=False),
    "35b-a3b": dict(gguf_arch="qwen35moe", hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
                    num_key_value_heads=2, linear_num_key_heads=16, linear_num_value_heads=32, tie_word_embeddings=False,
                    num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512),
}
COMMON = dict(vocab_size=248320, head_dim=256, linear_key_head_dim=128, linear_value_head_dim=128,
              linear_conv_kernel_dim=4, full_attention_interval=4, rms_norm_eps=1e-6, max_position_embeddings=262144,
              rope_parameters={"rope_theta": 10000000.0, "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10]})
QUANTS = {"q8_0": 7, "q4_k_m": 15}  # -> general.file_type (llama.h LLAMA_FTYPE_MOSTLY_Q8_0, _Q4_K_M)
CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 256, 257, 258
Q4_K_MIN_OF_SCALE = np.rint(np.arange(64) * (7.5 / 4)).clip(0, 63).astype(np.uint8)  # sc -> m, see random_blocks
ROUTER_STD = 0.02  # HF's initializer_range, the routers' init
DISK_MARGIN = 64 << 20  # bytes kept free beyond the file (header estimate slack, filesystem metadata)


class TensorSpec(NamedTuple):
    name: str
    shape: tuple[int, ...]  # NumPy order: (rows, row length) for weights
    ggml_type: GGMLType
    init: str  # "weight" (random blocks), "norm", "ssm_norm", "dt_bias", "ssm_a", "conv", "router"

    @property
    def nbytes(self) -> int:
        n = int(np.prod(self.shape, dtype=np.int64))
        return n // self.ggml_type.block_size * self.ggml_type.type_size


def model_config(shape: str, n_layers: int | None = None, n_vocab: int | None = None,
                 n_expert: int | None = None) -> dict:
    """The HF-style text config of a shape (SHAPES + COMMON), trunk depth and vocab optionally overridden
    (n_vocab and n_expert are for tests: the vocab must hold the 256 byte tokens and the control tokens, the
    experts at least the 8 a token routes to)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    cfg = {**COMMON, **SHAPES[shape]}
    if n_layers is not None:
        if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
            raise ValueError(f"the layer count must be a positive integer, got {n_layers!r}")
        cfg["num_hidden_layers"] = n_layers
    if n_vocab is not None:
        if n_vocab < 256 + len(CONTROL_TOKENS):
            raise ValueError(f"n_vocab must be at least {256 + len(CONTROL_TOKENS)} (bytes + control tokens), got {n_vocab}")
        cfg["vocab_size"] = n_vocab
    if n_expert is not None:
        if "num_experts" not in cfg or not cfg["num_experts_per_tok"] <= n_expert:
            raise ValueError(f"n_expert applies to a MoE shape and must be at least its experts per token, got {n_expert}")
        cfg["num_experts"] = n_expert
    interval = cfg["full_attention_interval"]  # HF's default pattern: layers 3, 7, 11, ... are full attention
    cfg["layer_types"] = ["linear_attention" if (i + 1) % interval else "full_attention"
                          for i in range(cfg["num_hidden_layers"])]
    cfg["mtp_num_hidden_layers"] = 1
    return cfg


def tensor_shapes(cfg: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (NumPy shape, init kind) of every tensor the trunk, the head and the MTP block need."""
    D, N = cfg["hidden_size"], cfg["vocab_size"]
    H, H_kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    n_k, n_v = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    K, V, w = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    C, n_trunk = 2 * n_k * K + n_v * V, cfg["num_hidden_layers"]
    out = {"token_embd.weight": ((N, D), "weight"), "output_norm.weight": ((D,), "norm")}
    if not cfg["tie_word_embeddings"]:
        out["output.weight"] = ((N, D), "weight")

    def block(i: int, kind: str) -> None:
        p = f"blk.{i}."
        out.update({p + "attn_norm.weight": ((D,), "norm"), p + "post_attention_norm.weight": ((D,), "norm")})
        if "num_experts" in cfg:  # qwen35moe: router, 3-D experts [E, out, in], shared expert and its gate
            E, Fe, Fs = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
            out.update({p + "ffn_gate_inp.weight": ((E, D), "router"), p + "ffn_gate_exps.weight": ((E, Fe, D), "weight"),
                        p + "ffn_up_exps.weight": ((E, Fe, D), "weight"), p + "ffn_down_exps.weight": ((E, D, Fe), "weight"),
                        p + "ffn_gate_inp_shexp.weight": ((1, D), "router"), p + "ffn_gate_shexp.weight": ((Fs, D), "weight"),
                        p + "ffn_up_shexp.weight": ((Fs, D), "weight"), p + "ffn_down_shexp.weight": ((D, Fs), "weight")})
        else:
            F = cfg["intermediate_size"]
            out.update({p + "ffn_gate.weight": ((F, D), "weight"), p + "ffn_up.weight": ((F, D), "weight"),
                        p + "ffn_down.weight": ((D, F), "weight")})
        if kind == "linear_attention":
            out.update({p + "attn_qkv.weight": ((C, D), "weight"), p + "attn_gate.weight": ((n_v * V, D), "weight"),
                        p + "ssm_beta.weight": ((n_v, D), "weight"), p + "ssm_alpha.weight": ((n_v, D), "weight"),
                        p + "ssm_conv1d.weight": ((C, w), "conv"), p + "ssm_dt.bias": ((n_v,), "dt_bias"),
                        p + "ssm_a": ((n_v,), "ssm_a"), p + "ssm_norm.weight": ((V,), "ssm_norm"),
                        p + "ssm_out.weight": ((D, n_v * V), "weight")})
        else:  # full attention; attn_q holds q and its gate, interleaved per head
            out.update({p + "attn_q.weight": ((2 * H * d, D), "weight"), p + "attn_k.weight": ((H_kv * d, D), "weight"),
                        p + "attn_v.weight": ((H_kv * d, D), "weight"), p + "attn_output.weight": ((D, H * d), "weight"),
                        p + "attn_q_norm.weight": ((d,), "norm"), p + "attn_k_norm.weight": ((d,), "norm")})

    for i, kind in enumerate(cfg["layer_types"]):
        block(i, kind)
    block(n_trunk, "full_attention")  # the MTP (nextn) block
    out.update({f"blk.{n_trunk}.nextn.eh_proj.weight": ((D, 2 * D), "weight"),
                f"blk.{n_trunk}.nextn.enorm.weight": ((D,), "norm"), f"blk.{n_trunk}.nextn.hnorm.weight": ((D,), "norm"),
                f"blk.{n_trunk}.nextn.shared_head_norm.weight": ((D,), "norm")})
    return out


def file_order(names) -> list[str]:
    """llama.cpp's weights_map order (llama-model-loader.h weight_name_comparer): block -1 (no blk.
    prefix) first, then by block number; names compared as strings inside a block."""
    def key(name: str):
        return (int(name.split(".")[1]) if name.startswith("blk.") else -1, name)
    return sorted(names, key=key)


def use_more_bits(i: int, n: int) -> bool:
    """llama-quant.cpp's layer schedule for the Q6_K bumps of Q4_K_M (integer division as in C)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def quant_types(names: list[str], shapes: dict[str, tuple[int, ...]], quant: str) -> dict[str, GGMLType]:
    """The type llama-quantize picks for each tensor, names in file order (the counters depend on it)."""
    if quant not in QUANTS:
        raise ValueError(f"unknown quant {quant!r}; choose one of {', '.join(QUANTS)}")
    tied = "output.weight" not in names
    n_attn_v = sum(n.endswith(("attn_v.weight", "attn_qkv.weight")) for n in names)
    n_layer_all = len({n.split(".")[1] for n in names if n.startswith("blk.")})  # hparams.n_layer_all
    i_attn_v = 0
    out = {}
    for name in names:
        if (len(shapes[name]) < 2 or shapes[name][0] == 1 or name.endswith("_norm.weight") or "ssm_conv1d" in name
                or "ffn_gate_inp" in name or not name.endswith("weight")):  # [1, D]: one dimension to ggml
            out[name] = GGMLType.F32
        elif quant == "q8_0":
            out[name] = GGMLType.Q8_0
        elif name == "output.weight" or (tied and name == "token_embd.weight"):
            out[name] = GGMLType.Q6_K
        elif name.endswith(("attn_v.weight", "attn_qkv.weight")):
            out[name] = GGMLType.Q6_K if use_more_bits(i_attn_v, n_attn_v) else GGMLType.Q4_K
            i_attn_v += 1
        elif "ffn_down" in name:
            out[name] = GGMLType.Q6_K if use_more_bits(int(name.split(".")[1]), n_layer_all) else GGMLType.Q4_K
        else:
            out[name] = GGMLType.Q4_K
    return out


def plan(shape: str, quant: str, n_layers: int | None = None, n_vocab: int | None = None,
         n_expert: int | None = None) -> list[TensorSpec]:
    """Every tensor of the synthetic file, in file order, with its type (nothing is generated)."""
    cfg = model_config(shape, n_layers, n_vocab, n_expert)
    shapes = tensor_shapes(cfg)
    names = file_order(shapes)
    types = quant_types(names, {n: s for n, (s, _) in shapes.items()}, quant)
    return [TensorSpec(n, shapes[n][0], types[n], shapes[n][1]) for n in names]


# ----------------------------------------------------------------------------------------- generation


def tensor_rng(seed: int, name: str) -> np.random.Generator:
    """One stream per tensor, from (seed, name): a tensor's bytes do not depend on the others or the depth."""
    return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(name.encode())]))


def random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:  # -> [n] uint8, writable
    return rng.bit_generator.random_raw(-(-n // 8)).view(np.uint8)[:n]


def scale_table(d_mean: float, factor: float = 1.0) -> np.ndarray:  # -> [256, 2] uint8
    """fp16 bytes of factor * d_j, d_j = fp16(d_mean * (0.75 + 0.5 j / 255)): a random byte j picks a block's
    scale (a +-25% jitter), so setting every scale field is one table lookup."""
    d = (d_mean * (0.75 + 0.5 * np.arange(256) / 255)).astype("<f2").astype(np.float32)
    return (factor * d).astype("<f2").view(np.uint8).reshape(256, 2)


SIGNED_SCALE = np.where(np.arange(256) & 128, -1, 1) * (16 + (np.arange(256) & 15))  # byte -> +-(16..31)
Q6_K_SCALE = SIGNED_SCALE.astype(np.int8).view(np.uint8)


def random_blocks(qtype: GGMLType, rows: int, cols: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """[rows, cols] weights as random blocks of `qtype` whose values have mean ~0 and rms ~std.
    Codes are the random bytes as they come; every scale field is a lookup indexed by a random byte."""
    n_blocks = rows * cols // qtype.block_size
    blocks = random_bytes(rng, n_blocks * qtype.type_size).reshape(n_blocks, qtype.type_size)
    if qtype == GGMLType.Q8_0:  # d(2) qs(32 int8): x = d * q
        blocks[:, 0:2] = scale_table(std / 73.9)[blocks[:, 0]]  # rms of uniform int8 = 73.9
    elif qtype == GGMLType.Q4_K:  # d(2) dmin(2) scales(12) qs(128): x = d*sc*q - dmin*m
        sc = 16 + (blocks[:, 4:12] & 15)  # [B, 8] in 16..31
        m = Q4_K_MIN_OF_SCALE[sc]  # dmin = 4d: dmin*m = d*sc*7.5 = d*sc*mean(q)
        blocks[:, 4:8] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)  # the 6-bit packing of _unpack_scale_min
        blocks[:, 8:12] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
        blocks[:, 12:16] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
        pick = blocks[:, 0].copy()
        blocks[:, 0:2] = scale_table(std / 110.4)[pick]  # rms(sc) 23.95 * rms(q - 7.5) 4.61
        blocks[:, 2:4] = scale_table(std / 110.4, factor=4)[pick]
    elif qtype == GGMLType.Q6_K:  # ql(128) qh(64) scales(16 int8) d(2): x = d*sc*(q - 32)
        blocks[:, 192:208] = Q6_K_SCALE[blocks[:, 192:208]]  # +-(16..31)
        blocks[:, 208:210] = scale_table(std / 442.0)[blocks[:, 208]]  # rms(sc) 23.95 * rms(q - 32) 18.47
    else:
        raise ValueError(f"no random block generator for {qtype.name}")
    return blocks.reshape(rows, -1)


def init_f32(kind: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if kind in ("norm", "ssm_norm", "dt_bias"):
        return (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if kind == "ssm_a":  # = -exp(A_log), A ~ U(1, 16)
        return (-rng.uniform(1, 16, shape)).astype(np.float32)
    if kind == "conv":
        return rng.uniform(-0.5, 0.5, shape).astype(np.float32)
    if kind == "router":
        return (ROUTER_STD * rng.standard_normal(shape)).astype(np.float32)
    raise ValueError(f"unknown init {kind!r}")


def tensor_data(spec: TensorSpec, seed: int) -> np.ndarray:
    """The bytes (or F32 values) of one tensor, deterministic in (seed, name)."""
    rng = tensor_rng(seed, spec.name)
    if spec.ggml_type == GGMLType.F32:
        return init_f32(spec.init, spec.shape, rng)
    *outer, cols = spec.shape  # [rows, cols], or [E, rows, cols] for experts (each expert's rows whole blocks)
    rows = int(np.prod(outer))
    return random_blocks(spec.ggml_type, rows, cols, 1 / np.sqrt(cols), rng).reshape(*outer, -1)


def vocab_metadata(n_vocab: int) -> dict:
    """tokenizer.* keys: byte-level BPE, 256 byte tokens, 3 control tokens, [PAD{i}] up to n_vocab, no merges."""
    n_named = 256 + len(CONTROL_TOKENS)
    tokens = [BYTE_TO_CHAR[b] for b in range(256)] + list(CONTROL_TOKENS) + [f"[PAD{i}]" for i in range(n_named, n_vocab)]
    types = [1] * 256 + [3] * len(CONTROL_TOKENS) + [5] * (n_vocab - n_named)  # normal, control, unused
    I32, U32 = GGUFValueType.INT32, GGUFValueType.UINT32
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen35",
            "tokenizer.ggml.tokens": GGUFValue(GGUFValueType.ARRAY, tokens, GGUFValueType.STRING),
            "tokenizer.ggml.token_type": GGUFValue(GGUFValueType.ARRAY, types, I32),
            "tokenizer.ggml.merges": GGUFValue(GGUFValueType.ARRAY, [], GGUFValueType.STRING),
            "tokenizer.ggml.eos_token_id": GGUFValue(U32, 256 + CONTROL_TOKENS.index("<|im_end|>")),
            "tokenizer.ggml.padding_token_id": GGUFValue(U32, 256 + CONTROL_TOKENS.index("<|endoftext|>")),
            "tokenizer.ggml.add_bos_token": GGUFValue(GGUFValueType.BOOL, False)}


def synth_model(path, shape: str, quant: str, seed: int = 0, n_layers: int | None = None,
                progress: Callable[[str], None] | None = None, *, n_vocab: int | None = None,
                n_expert: int | None = None) -> int:
    """Write a random-weight GGUF of `shape` ("0.8b" | "2b" | "9b" | "27b": qwen35; "35b-a3b": qwen35moe) typed
    as llama-quantize's `quant` ("q8_0" | "q4_k_m"), with the MTP block. n_layers: trunk depth (default the shape's; the
    attention every 4th layer is kept). n_vocab, n_expert: tests only. Tensors are made one at a time as the writer
    reaches them; progress(msg) gets one line per tensor. Returns the file size in bytes.
    Raises ValueError before writing anything if the disk lacks the space."""
    say = progress or (lambda msg: None)
    cfg = model_config(shape, n_layers, n_vocab, n_expert)
    specs = plan(shape, quant, n_layers, n_vocab, n_expert)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"the seed must be an integer >= 0, got {seed!r}")
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir() or path.is_dir():
        raise ValueError(f"cannot write {path}: " + ("it is a folder" if path.is_dir() else f"folder {folder} does not exist"))
    data_bytes = sum(-(-s.nbytes // 32) * 32 for s in specs)
    need = data_bytes + 24 * cfg["vocab_size"] + DISK_MARGIN  # the token list dominates the header
    free = shutil.disk_usage(folder).free + (path.stat().st_size if path.is_file() else 0)
    if need > free:
        raise ValueError(f"not enough disk space for {path}: the {shape} {quant} file needs {need / 1e9:.2f} GB, "
                         f"{free / 1e9:.2f} GB are free in {folder.resolve()}")

    n_params = sum(int(np.prod(s.shape)) for s in specs)
    n_expert = cfg.get("num_experts", 0)  # a MoE label counts the shared part plus one expert (convert.size_label)
    label = size_label(sum(int(np.prod(s.shape)) // (n_expert if "_exps." in s.name else 1) for s in specs), n_expert)
    meta = model_metadata(cfg, 1, QUANTS[quant], f"{cfg.get('gguf_arch', 'qwen35')}-{shape}-synth-{quant}-seed{seed}", label)
    meta |= vocab_metadata(cfg["vocab_size"])
    written = 0

    def produce(i: int, spec: TensorSpec):
        def make():
            nonlocal written
            say(f"[{i + 1}/{len(specs)}] {spec.name:<40} {spec.ggml_type.name:<5} {'x'.join(map(str, spec.shape)):<13} "
                f"{written / 1e6:9.1f} MB written")
            written += -(-spec.nbytes // 32) * 32
            return tensor_data(spec, int(seed))
        return make

    say(f"writing {path}: {shape} {quant}, {cfg['num_hidden_layers']} layers + MTP, {len(specs)} tensors, "
        f"{n_params / 1e9:.2f} B parameters, {data_bytes / 1e9:.2f} GB")
    try:
        write_gguf(path, meta, {s.name: RawTensor(s.ggml_type, s.shape, produce(i, s)) for i, s in enumerate(specs)})
    except BaseException:  # interrupted or out of space: leave no truncated file behind
        path.unlink(missing_ok=True)
        raise
    size = os.path.getsize(path)
    say(f"wrote {path}: {size / 1e6:.1f} MB")
    return size
