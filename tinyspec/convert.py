"""Convert a Hugging Face Qwen3.5 checkpoint into a qwen35 (or qwen35moe) GGUF, as llama.cpp's converter writes it.

    convert(hf_dir, out_path, outtype="f32" | "f16" | "q8_0" | "q4_k_m", progress=None,
            mtp="include" | "exclude" | "only")

What llama.cpp's convert_hf_to_gguf.py does to a Qwen3.5 checkpoint, and so what this does
(docs/qwen35.md sections 1-2):
    names     HF module names -> GGUF names (LAYER_NAMES); `language_model.` dropped; vision tensors
              dropped; mtp.layers.K.* -> blk.{n_trunk+K}.*; mtp.fc / pre_fc_norm_embedding /
              pre_fc_norm_hidden / norm -> blk.{n_trunk}.nextn.eh_proj / enorm / hnorm / shared_head_norm
    values    every *norm.weight + 1 (HF's RMSNorm multiplies by 1 + w) except the GDN gated norm;
              ssm_a = -exp(A_log); conv1d (C, 1, w) -> (C, w); when n_k != n_v the value heads go from
              HF's grouped order (head h = g*R + r, g = key head) to ggml's tiled order (j = r*n_k + g)
    storage   1-D tensors, *_norm.weight, ssm_conv1d and names not ending in .weight stay F32; other
              weights in the outtype; Q8_0 falls back to F16 when a row is not a multiple of 32.
              q4_k_m is no outtype of llama.cpp's converter: it is what llama-quantize Q4_K_M without an
              importance matrix makes of the f32 file. Types by its per-tensor rules (quant_mix.py: Q4_K; Q6_K
              for output and some layers' attn_v / attn_qkv / ffn_down; Q5_0 / Q8_0 / F16 where a row is not a
              multiple of 256), bytes by ggml's reference quantizers (quantize_row_*_ref), which tinyspec.quants
              reproduces; tensors stay in the converter's order (llama-quantize sorts them by layer)
    metadata  qwen35.* keys with llama.cpp's exact value types (UINT32, FLOAT32, INT32 / BOOL arrays)
              and in its order; the byte-level BPE vocabulary (gpt2 model, qwen35 pre-tokenizer)
    MoE       Qwen3_5MoeForCausalLM / ...ForConditionalGeneration -> arch qwen35moe (docs/qwen35.md section 8):
              the same steps under the qwen35moe.* prefix, plus expert_count, expert_used_count (after the rms
              epsilon), expert_feed_forward_length, expert_shared_feed_forward_length (after file_type). Per
              layer (MTP block too), NumPy shapes: mlp.gate -> ffn_gate_inp [E, D]; the experts become 3-D
              ffn_gate_exps, ffn_up_exps [E, F, D] and ffn_down_exps [E, D, F], from either checkpoint layout:
              per expert (mlp.experts.{e}.{gate,up,down}_proj.weight, what transformers' save_pretrained writes),
              stacked in expert order and written, as llama.cpp does, where the layer's last expert tensor was,
              down / gate / up; or fused (mlp.experts.gate_up_proj [E, 2F, D] split in two, down_proj as is).
              llama.cpp writes the fused ffn_gate_up_exps only with --fuse-gate-up-exps, tinyspec never.
              mlp.shared_expert.{gate,up,down}_proj -> ffn_{gate,up,down}_shexp;
              mlp.shared_expert_gate [1, D] -> ffn_gate_inp_shexp [1, D] (kept 2-D, as llama.cpp does). Both
              routers stay F32 whatever the outtype; size_label is "{E}x{shared + one expert's params}".
Safetensors are read without torch: u64 header length, JSON header, raw little-endian data.

Glossary: n_k / n_v GDN key / value heads, R = n_v / n_k, dv value head dim, n_trunk trunk layers.
Official implementation: llama.cpp convert_hf_to_gguf.py with conversion/qwen.py (Qwen3_5TextModel,
_LinearAttentionVReorderBase, Qwen3NextModel, _QwenMtpMixin), conversion/base.py (TextModel
set_gguf_parameters / prepare_tensors / get_vocab_base) and gguf-py vocab.py (SpecialVocab).
Departs from it: ssm_a's exp is taken in float64 and rounded once (llama.cpp uses torch's float32 exp,
1 ulp off in ~1% of values); pre is always "qwen35" (llama.cpp hashes a probe tokenization).
Does NOT include: qwen3_next, --fuse-gate-up-exps, rope scaling (yarn / linear), outtypes other than
f32 / f16 / q8_0 / q4_k_m, pytorch .bin checkpoints, named extra chat templates, normalizer flags, general.*
provenance beyond name and size_label, SpecialVocab's cls/sep fallbacks and TemplateProcessing parsing
(BERT-style tokenizers), split output files.
"""

from __future__ import annotations

import json
import re
import struct
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .gguf import GGUFValue, GGUFValueType, RawTensor, write_gguf
from .model import ATTN_TENSORS, FFN_TENSORS, GDN_TENSORS  # what the model loads is what must be there
from .mtp import NEXTN_TENSORS
from .quant_mix import q4_k_m_types
from .quants import GGMLType, quantize

U32, F32, I32, BOOL = GGUFValueType.UINT32, GGUFValueType.FLOAT32, GGUFValueType.INT32, GGUFValueType.BOOL
SUPPORTED = {"Qwen3_5ForCausalLM": "qwen35", "Qwen3_5ForConditionalGeneration": "qwen35",  # -> GGUF architecture
             "Qwen3_5MoeForCausalLM": "qwen35moe", "Qwen3_5MoeForConditionalGeneration": "qwen35moe"}
NOT_YET = ("Qwen3Next",)  # architecture name prefixes
REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "linear_conv_kernel_dim", "linear_key_head_dim",
            "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads")  # config.json keys
MOE_REQUIRED = ("num_experts", "num_experts_per_tok", "moe_intermediate_size")
# a qwen35moe layer's FFN tensors (replacing FFN_TENSORS' ffn_gate / ffn_up / ffn_down), and the shared expert's
MOE_TENSORS = ("attn_norm.weight", "post_attention_norm.weight", "ffn_gate_inp.weight", "ffn_gate_exps.weight",
               "ffn_up_exps.weight", "ffn_down_exps.weight")
SHEXP_TENSORS = ("ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight")
ROUTERS = ("ffn_gate_inp", "ffn_gate_inp_shexp")  # always stored F32 (llama.cpp base.py prepare_tensors)
# outtype -> (type, general.file_type = llama_ftype: ALL_F32, MOSTLY_F16, MOSTLY_Q8_0, MOSTLY_Q4_K_M)
OUTTYPES = {"f32": (GGMLType.F32, 0), "f16": (GGMLType.F16, 1), "q8_0": (GGMLType.Q8_0, 7),
            "q4_k_m": (GGMLType.Q4_K, 15)}
ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}  # BF16 read as bits
TOP_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
LAYER_NAMES = {  # HF module inside model.layers.{i} -> GGUF name inside blk.{i}
    "input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "linear_attn.in_proj_qkv": "attn_qkv", "linear_attn.in_proj_z": "attn_gate", "linear_attn.in_proj_b": "ssm_beta",
    "linear_attn.in_proj_a": "ssm_alpha", "linear_attn.conv1d": "ssm_conv1d", "linear_attn.norm": "ssm_norm",
    "linear_attn.out_proj": "ssm_out", "eh_proj": "nextn.eh_proj", "enorm": "nextn.enorm", "hnorm": "nextn.hnorm",
    "shared_head.norm": "nextn.shared_head_norm",
    "mlp.gate": "ffn_gate_inp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp", "mlp.shared_expert.gate_proj":
    "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp", "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.experts.gate_up_proj": "ffn_gate_up_exps", "mlp.experts.down_proj": "ffn_down_exps"}  # (.weight spellings)
PARAM_NAMES = {"linear_attn.A_log": "ssm_a", "linear_attn.dt_bias": "ssm_dt.bias",  # parameters, not modules
               "mlp.experts.gate_up_proj": "ffn_gate_up_exps.weight", "mlp.experts.down_proj": "ffn_down_exps.weight",
               "mlp.experts.gate_proj": "ffn_gate_exps.weight", "mlp.experts.up_proj": "ffn_up_exps.weight"}
MTP_TOP = {"fc": "eh_proj", "pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm", "norm": "shared_head.norm"}
SPECIAL_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id",  # llama.cpp's spellings
                "sep": "seperator_token_id", "pad": "padding_token_id", "mask": "mask_token_id"}
UNUSED, NORMAL, CONTROL, USER_DEFINED = 5, 1, 3, 4  # llama.cpp token types


def read_json(path: Path, text: str | bytes | None = None):
    """json.loads of a file (or of `text` read from it), a bad file named in the error."""
    try:
        return json.loads(path.read_text(encoding="utf-8") if text is None else text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def read_safetensors(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    """name -> (dtype name, memory-mapped array in its stored dtype; BF16 as uint16 bits), sorted by name."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        (n,) = struct.unpack("<Q", head) if len(head) == 8 else (size,)
        if n > size - 8:
            raise ValueError(f"{path}: not a safetensors file (header length {n} of a {size}-byte file)")
        header = read_json(path, f.read(n))
    if not isinstance(header, dict) or not all(isinstance(v, dict) for k, v in header.items() if k != "__metadata__"):
        raise ValueError(f"{path}: the safetensors header is not a table of tensors")
    data = np.memmap(path, np.uint8, "r")
    out = {}
    for name, info in sorted(header.items()):
        if name == "__metadata__":
            continue
        if info["dtype"] not in ST_DTYPES:
            raise ValueError(f"{path}: tensor {name} has dtype {info['dtype']}; tinyspec reads {', '.join(ST_DTYPES)}")
        dtype, (begin, end) = np.dtype(ST_DTYPES[info["dtype"]]), info["data_offsets"]
        if end - begin != int(np.prod(info["shape"], dtype=np.int64)) * dtype.itemsize or 8 + n + end > data.size:
            raise ValueError(f"{path}: tensor {name}: data_offsets {begin}..{end} do not fit shape {info['shape']}")
        out[name] = (info["dtype"], data[8 + n + begin:8 + n + end].view(dtype).reshape(info["shape"]))
    return out


class Stacked:
    """E per-expert arrays [*shape] seen as one [E, *shape] array, stacked only when read (np.asarray)."""

    def __init__(self, parts: list[np.ndarray]):
        self.parts, self.shape = parts, (len(parts), *parts[0].shape)
        self.ndim = len(self.shape)

    def __array__(self, dtype=None, copy=None):
        return np.stack(self.parts) if dtype is None else np.stack(self.parts).astype(dtype)


def as_float(dtype: str, x: np.ndarray) -> np.ndarray:
    """F16 stays F16 (llama.cpp edits F16 sources in F16); BF16 -> F32 by a 16-bit shift; others -> F32."""
    x = np.asarray(x)  # a memory map stays one; a Stacked is stacked here
    if dtype == "BF16":
        return (x.astype(np.uint32) << 16).view(np.float32)
    return np.array(x) if dtype in ("F16", "F32") else x.astype(np.float32)


def load_config(hf_dir: Path) -> dict:
    path = hf_dir / "config.json"
    if not path.is_file():
        raise ValueError(f"{hf_dir}: no config.json (expected a Hugging Face checkpoint folder)")
    cfg = read_json(path)
    arch = (cfg.get("architectures") or ["?"])[0]
    if arch.startswith(NOT_YET):
        raise ValueError(f"{path}: architecture {arch} is not supported yet (tinyspec converts Qwen3.5 and Qwen3.5-MoE)")
    if arch not in SUPPORTED:
        raise ValueError(f"{path}: architecture {arch} is not supported; tinyspec converts {', '.join(SUPPORTED)}")
    cfg = {**cfg, **cfg.get("text_config", {}), "gguf_arch": SUPPORTED[arch]}  # multimodal: text config nested
    moe = cfg["gguf_arch"] == "qwen35moe"
    if missing := [k for k in REQUIRED + MOE_REQUIRED * moe if k not in cfg]:
        raise ValueError(f"{path}: missing {', '.join(missing)}")
    if moe and not 0 < cfg["num_experts_per_tok"] <= cfg["num_experts"]:
        raise ValueError(f"{path}: num_experts_per_tok = {cfg['num_experts_per_tok']} must be in 1..num_experts "
                         f"= {cfg['num_experts']}")
    if cfg["linear_num_value_heads"] % cfg["linear_num_key_heads"]:
        raise ValueError(f"{path}: linear_num_value_heads is not a multiple of linear_num_key_heads")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", "mrope"):  # llama.cpp: linear, yarn, ...
        raise ValueError(f"{path}: rope type {rope.get('rope_type', rope.get('type'))!r} is not supported yet")
    return cfg


def hf_tensors(hf_dir: Path) -> list[tuple[str, tuple[str, np.ndarray]]]:
    """Every tensor of the checkpoint in llama.cpp's order: files sorted, names sorted inside each file."""
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index)["weight_map"]
        parts = sorted(set(weight_map.values()))
    else:
        weight_map, parts = {}, sorted(p.name for p in hf_dir.glob("model*.safetensors"))
    if not parts:
        raise ValueError(f"{hf_dir}: no model*.safetensors files (tinyspec reads safetensors checkpoints only)")
    out = []
    for part in parts:
        if not (hf_dir / part).is_file():
            raise ValueError(f"{hf_dir}: {part}, named in {index.name}, is missing")
        out += list(read_safetensors(hf_dir / part).items())
    if weight_map and set(weight_map) != {name for name, _ in out}:
        missing, extra = sorted(set(weight_map) - dict(out).keys()), sorted(dict(out).keys() - set(weight_map))
        raise ValueError(f"{index}: weight map and files disagree; missing {missing[:5]}, not in the map {extra[:5]}")
    return out


def gguf_name(name: str, n_trunk: int) -> str | None:
    """HF checkpoint name -> GGUF name; None for tensors the GGUF does not keep (vision, audio)."""
    name = name.replace("language_model.", "").replace("model.mtp.", "mtp.")
    if re.search(r"visual\.|vision|audio|rotary_emb\.inv_freq", name):
        return None
    if m := re.fullmatch(r"mtp\.(\w+)\.(weight|bias)", name):
        name = f"model.layers.{n_trunk}.{MTP_TOP.get(m[1], m[1])}.{m[2]}"
    elif m := re.fullmatch(r"mtp\.layers\.(\d+)\.(.+)", name):
        name = f"model.layers.{n_trunk + int(m[1])}.{m[2]}"
    if m := re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name):
        module, _, suffix = m[2].rpartition(".")
        if m[2] in PARAM_NAMES:
            return f"blk.{m[1]}.{PARAM_NAMES[m[2]]}"
        if module in LAYER_NAMES and suffix in ("weight", "bias"):
            return f"blk.{m[1]}.{LAYER_NAMES[module]}.{suffix}"
    module, _, suffix = name.rpartition(".")
    if module in TOP_NAMES and suffix in ("weight", "bias"):
        return f"{TOP_NAMES[module]}.{suffix}"
    if re.search(r"\.experts\.\d+\.", name):
        raise ValueError(f"checkpoint tensor {name!r}: per-expert MoE weights are not supported yet "
                         "(tinyspec converts the fused mlp.experts.gate_up_proj / down_proj layout)")
    raise ValueError(f"cannot map checkpoint tensor {name!r} to a qwen35 GGUF name")


def stack_experts(tensors: list, n_expert: int) -> list:
    """Per-expert checkpoint tensors `<layer>.mlp.experts.{e}.{proj}.weight` -> one [E, ...] tensor per layer and
    proj, named `<layer>.mlp.experts.{proj}` (the fused layout's spelling), in llama.cpp's place and order: where
    the layer's last expert tensor was, down_proj, gate_proj, up_proj (qwen.py Qwen2MoeModel.modify_tensors)."""
    groups: dict[str, dict[str, dict[int, tuple[str, np.ndarray]]]] = {}  # layer -> proj -> expert -> tensor
    last: dict[str, int] = {}
    for i, (name, st) in enumerate(tensors):
        if m := re.fullmatch(r"(.+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight", name):
            groups.setdefault(m[1], {}).setdefault(m[3], {})[int(m[2])] = st
            last[m[1]] = i
    if not groups:
        return tensors
    merged: dict[int, list] = {}
    for layer, projs in groups.items():
        for proj in ("down_proj", "gate_proj", "up_proj"):
            found = projs.get(proj, {})
            if sorted(found) != list(range(n_expert)):
                missing = sorted(set(range(n_expert)) - set(found)) or sorted(set(found) - set(range(n_expert)))
                raise ValueError(f"{layer}.*.{proj}: the checkpoint has {len(found)} experts, config.json num_experts "
                                 f"is {n_expert} (expert {missing[0] if missing else '?'} missing or extra)")
            dtypes, parts = {st[0] for st in found.values()}, [found[e][1] for e in range(n_expert)]
            if len(dtypes) > 1 or len({p.shape for p in parts}) > 1:
                raise ValueError(f"{layer}.*.{proj}: the experts differ in dtype or shape")
            merged.setdefault(last[layer], []).append((f"{layer}.{proj}", (dtypes.pop(), Stacked(parts))))
    out = []
    for i, (name, st) in enumerate(tensors):
        if not re.fullmatch(r".+\.mlp\.experts\.\d+\..+", name):
            out.append((name, st))
        out += merged.get(i, [])
    return out


def split_gate_up(tensors: list) -> list:
    """ffn_gate_up_exps [E, 2F, D] (HF's fused gate_up_proj) -> ffn_gate_exps, ffn_up_exps [E, F, D] each, in
    that order and in its place, as lazy views (qwen.py Qwen2MoeModel.modify_tensors)."""
    out = []
    for name, (dtype, data) in tensors:
        if name is None or not name.endswith(".ffn_gate_up_exps.weight"):
            out.append((name, (dtype, data)))
            continue
        if data.ndim != 3 or data.shape[1] % 2:
            raise ValueError(f"{name}: expected a [E, 2F, D] gate_up_proj, got shape {tuple(data.shape)}")
        n_ff, data = data.shape[1] // 2, np.asarray(data)
        out += [(name.replace("gate_up", "gate"), (dtype, data[:, :n_ff])),
                (name.replace("gate_up", "up"), (dtype, data[:, n_ff:]))]
    return out


def tile_v_heads(x: np.ndarray, axis: int, cfg: dict, head_dim: int, skip: int = 0) -> np.ndarray:
    """Value heads from HF's grouped order [n_k, R, head_dim] to ggml's tiled order [R, n_k, head_dim]
    along `axis`; the first `skip` entries (the q and k rows of in_proj_qkv) stay where they are."""
    n_k, n_v = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    order = np.arange(n_v * head_dim).reshape(n_k, n_v // n_k, head_dim).transpose(1, 0, 2).ravel()
    return np.take(x, np.concatenate([np.arange(skip), skip + order]), axis=axis)


def transform(name: str, x: np.ndarray, cfg: dict) -> np.ndarray:
    """The value edits of qwen.py's modify_tensors on one tensor, by its GGUF name (docs/qwen35.md section 2)."""
    kind = name.split(".")[2] if name.startswith("blk.") else name  # attn_qkv, ssm_a, ...
    if cfg["linear_num_key_heads"] != cfg["linear_num_value_heads"]:
        dv, qk = cfg["linear_value_head_dim"], 2 * cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"]
        if kind in ("attn_qkv", "ssm_conv1d"):  # attn_qkv is a GDN tensor: attention layers have attn_q/k/v
            x = tile_v_heads(x, 0, cfg, dv, skip=qk)
        elif kind == "attn_gate":
            x = tile_v_heads(x, 0, cfg, dv)
        elif kind in ("ssm_alpha", "ssm_beta", "ssm_a", "ssm_dt"):
            x = tile_v_heads(x, 0, cfg, 1)
        elif kind == "ssm_out":
            x = tile_v_heads(x, 1, cfg, dv)
    if kind == "ssm_a":
        return (-np.exp(x.astype(np.float64))).astype(x.dtype)
    if kind == "ssm_conv1d":
        return x.squeeze()
    if name.endswith("norm.weight") and kind != "ssm_norm":
        return x + x.dtype.type(1)  # in the tensor's own dtype, as llama.cpp does (F16 rounds 1 + w)
    return x


def storage_type(name: str, shape: tuple[int, ...], outtype: GGMLType) -> GGMLType:
    """llama.cpp's type choice for one converted tensor (base.py prepare_tensors)."""
    if len(shape) <= 1 or name.endswith("_norm.weight") or ".ssm_conv1d." in name or not name.endswith(".weight"):
        return GGMLType.F32
    if name.startswith("blk.") and name.split(".")[2] in ROUTERS:
        return GGMLType.F32
    if outtype == GGMLType.Q8_0 and shape[-1] % 32 == 0:
        return GGMLType.Q8_0
    return GGMLType.F32 if outtype == GGMLType.F32 else GGMLType.F16  # Q8_0 falls back to F16


def tensor_types(shapes: Mapping[str, tuple[int, ...]], outtype: str, n_layer: int, n_expert: int = 0) -> dict:
    """name -> storage type of every converted tensor (NumPy shapes, a file's worth). f32 / f16 / q8_0: the
    converter's storage_type. q4_k_m: what llama-quantize Q4_K_M does to the f32 file, which keeps the F32
    tensors (the same ones: norms, ssm_conv1d, 1-D, non-.weight, routers) and picks a type for the rest.
    n_layer: block_count (MTP blocks included), n_expert: expert_count (0 dense); q4_k_m's rules read them."""
    if outtype != "q4_k_m":
        return {name: storage_type(name, shape, OUTTYPES[outtype][0]) for name, shape in shapes.items()}
    return {name: GGMLType.F32 for name in shapes} | q4_k_m_types(shapes, n_layer, n_expert)


def encode(x: np.ndarray, qtype: GGMLType) -> np.ndarray:
    """A converted tensor's bytes in its storage type."""
    if qtype in (GGMLType.F32, GGMLType.F16):
        return x.astype(np.float32 if qtype == GGMLType.F32 else np.float16, copy=False)
    return quantize(x, qtype)  # ggml's reference quantizers: the bytes llama.cpp's tools write (no imatrix)


def converted_shape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """transform() keeps every shape but the conv weight's, squeezed from (C, 1, w) to (C, w)."""
    return tuple(d for d in shape if d != 1) if ".ssm_conv1d." in name else tuple(shape)


def size_label(n: int, n_expert: int = 0) -> str:
    """gguf-py's model_weight_count_rounded_notation with min_digits=2: 67M, 1.5B, ...; a MoE model passes the
    parameters of its shared part plus one expert, and gets "{n_expert}x..." (gguf-py utility.size_label)."""
    if n_expert:
        return f"{n_expert}x{size_label(n)}"
    scale, suffix = next((s, c) for s, c in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (0, "K")) if n > s)
    value = n * (1e-3 if suffix == "K" else 1 / scale)
    return f"{value:.{max(2 - len(str(round(value)).lstrip('0')), 0)}f}{suffix}"


def looks_special(token: str) -> bool:
    return (token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (token[:2], token[-2:]) == ("<|", "|>")
            or (token[:2], token[-2:]) == ("<｜", "｜>") or (token.startswith("<unused") and token.endswith(">")))


def tokenizer_metadata(hf_dir: Path, cfg: dict) -> dict:
    """tokenizer.* keys as get_vocab_base + gguf-py SpecialVocab write them; {} (and a warning) without tokenizer.json."""
    if not (hf_dir / "tokenizer.json").is_file():
        warnings.warn(f"{hf_dir}: no tokenizer.json, so the GGUF gets no tokenizer.* keys "
                      "(tinyspec and llama.cpp need them to run it)", stacklevel=3)
        return {}
    tok = read_json(hf_dir / "tokenizer.json")
    tc_path = hf_dir / "tokenizer_config.json"
    tc = read_json(tc_path) if tc_path.is_file() else {}
    if tok["model"].get("type") != "BPE":
        raise ValueError(f"{hf_dir / 'tokenizer.json'}: model type {tok['model'].get('type')}, expected BPE")
    added = {a["id"]: a for a in tok.get("added_tokens", [])}
    by_id = {i: t for t, i in tok["model"]["vocab"].items()} | {i: a["content"] for i, a in added.items()}
    n_vocab = cfg.get("vocab_size", len(by_id))
    if max(by_id) >= n_vocab:
        raise ValueError(f"{hf_dir}: token id {max(by_id)} does not fit vocab_size {n_vocab} of config.json")
    tokens, types = [], []
    for i in range(n_vocab):  # ids the tokenizer lacks become [PAD{i}] (the embedding is padded)
        token, kind = by_id.get(i, f"[PAD{i}]"), NORMAL if i in by_id else UNUSED
        if i in added:
            kind = CONTROL if added[i].get("special") or looks_special(token) else USER_DEFINED
            token = token if kind == CONTROL else token.replace("\u2581", " ")
        tokens.append(token)
        types.append(kind)
    merges = tok["model"].get("merges", [])
    if merges and not isinstance(merges[0], str):  # [a, b] pairs (transformers >= 4.45); a space inside -> U+0120
        merges = [" ".join(part.replace(" ", "\u0120") for part in pair) for pair in merges]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen35", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": GGUFValue(GGUFValueType.ARRAY, types, I32)}
    if merges:
        meta["tokenizer.ggml.merges"] = merges
    # gguf-py SpecialVocab: ids of tokenizer_config.json's special tokens first, then config.json's *_token_id
    ids = {}
    for typ in SPECIAL_KEYS:
        content = tc.get(f"{typ}_token")
        content = content.get("content") if isinstance(content, dict) else content
        if found := [i for i, a in added.items() if isinstance(content, str) and a["content"] == content]:
            ids[typ] = found[0]
    ids |= {t: cfg[f"{t}_token_id"] for t in SPECIAL_KEYS if t not in ids and type(cfg.get(f"{t}_token_id")) is int}
    meta.update({f"tokenizer.ggml.{SPECIAL_KEYS[t]}": GGUFValue(U32, i) for t, i in ids.items()})
    processors = (tok.get("post_processor") or {}).get("processors", [tok.get("post_processor") or {}])
    add = {"bos": False, "eos": False} if any(p.get("type") == "ByteLevel" for p in processors) else {}
    add |= {t: tc[f"add_{t}_token"] for t in ("bos", "eos", "sep")
            if isinstance(tc.get(f"add_{t}_token"), bool) and t not in add}
    meta.update({f"tokenizer.ggml.add_{t}_token": GGUFValue(BOOL, v) for t, v in add.items()})
    template = tc.get("chat_template")  # SpecialVocab reads it only next to a tokenizer_config.json
    if tc and template is None and (hf_dir / "chat_template.jinja").is_file():
        template = (hf_dir / "chat_template.jinja").read_text(encoding="utf-8")
    elif tc and template is None and (hf_dir / "chat_template.json").is_file():
        template = read_json(hf_dir / "chat_template.json").get("chat_template")
    if isinstance(template, str):
        meta["tokenizer.chat_template"] = template
    return meta


def model_metadata(cfg: dict, n_mtp: int, file_type: int, name: str, label: str) -> dict:
    """general.* and qwen35.* (qwen35moe.*) keys in the order and with the value types llama.cpp's converter
    writes them (TextModel.set_gguf_parameters, then Qwen2MoeModel's expert widths, _QwenMtpMixin's nextn,
    Qwen3NextModel's, then _Qwen35MRopeMixin's default sections)."""
    arch = cfg.get("gguf_arch", "qwen35")  # a synth config (fast/synth.py) is the dense model
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    for key in ("rope_theta", "partial_rotary_factor"):  # TextModel mirrors top-level rope keys into rope_parameters
        if key not in rope and key in cfg:
            rope[key] = cfg[key]

    def u32(key: str) -> GGUFValue:
        return GGUFValue(U32, int(cfg[key]))

    meta = {"general.architecture": arch, "general.type": "model", "general.name": name,
            "general.size_label": label, f"{arch}.block_count": GGUFValue(U32, cfg["num_hidden_layers"] + n_mtp)}
    for key, hf_key in (("context_length", "max_position_embeddings"), ("embedding_length", "hidden_size"),
                        ("feed_forward_length", "intermediate_size"), ("attention.head_count", "num_attention_heads"),
                        ("attention.head_count_kv", "num_key_value_heads")):
        if hf_key in cfg:
            meta[f"{arch}.{key}"] = u32(hf_key)
    if sections := list(rope.get("mrope_section", [])):
        meta[f"{arch}.rope.dimension_sections"] = GGUFValue(GGUFValueType.ARRAY, (sections + [0] * 4)[:4], I32)
    if "rope_theta" in rope:
        meta[f"{arch}.rope.freq_base"] = GGUFValue(F32, float(rope["rope_theta"]))
    if "rms_norm_eps" in cfg:
        meta[f"{arch}.attention.layer_norm_rms_epsilon"] = GGUFValue(F32, float(cfg["rms_norm_eps"]))
    for key, hf_key in (("expert_count", "num_experts"), ("expert_used_count", "num_experts_per_tok")):
        if hf_key in cfg:  # TextModel writes them for any config that has them
            meta[f"{arch}.{key}"] = u32(hf_key)
    if "head_dim" in cfg:
        meta[f"{arch}.attention.key_length"] = meta[f"{arch}.attention.value_length"] = u32("head_dim")
    meta["general.file_type"] = GGUFValue(U32, file_type)
    for key, hf_key in (("expert_feed_forward_length", "moe_intermediate_size"),  # Qwen2MoeModel
                        ("expert_shared_feed_forward_length", "shared_expert_intermediate_size")):
        if hf_key in cfg:
            meta[f"{arch}.{key}"] = u32(hf_key)
    if n_mtp:
        meta[f"{arch}.nextn_predict_layers"] = GGUFValue(U32, n_mtp)
    meta |= {f"{arch}.ssm.conv_kernel": u32("linear_conv_kernel_dim"), f"{arch}.ssm.state_size": u32("linear_key_head_dim"),
             f"{arch}.ssm.group_count": u32("linear_num_key_heads"), f"{arch}.ssm.time_step_rank": u32("linear_num_value_heads"),
             f"{arch}.ssm.inner_size": GGUFValue(U32, cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"])}
    if cfg.get("layer_types"):  # one entry per block, MTP blocks included (full attention)
        recurrent = [t == "linear_attention" for t in cfg["layer_types"]] + [False] * n_mtp
        meta[f"{arch}.attention.recurrent_layers"] = GGUFValue(GGUFValueType.ARRAY, recurrent, BOOL)
    meta[f"{arch}.full_attention_interval"] = GGUFValue(U32, cfg.get("full_attention_interval", 4))
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    meta[f"{arch}.rope.dimension_count"] = GGUFValue(U32, int(head_dim * rope.get("partial_rotary_factor", 0.25)))
    if not sections:  # llama.cpp's loader requires the key: Qwen3.5's default sections
        meta[f"{arch}.rope.dimension_sections"] = GGUFValue(GGUFValueType.ARRAY, [11, 11, 10, 0], I32)
    meta["general.quantization_version"] = GGUFValue(U32, 2)
    return meta


def convert(hf_dir, out_path, outtype: str = "f32", progress: Callable[[str], None] | None = None,
            mtp: str = "include", metadata: Mapping[str, Any] | None = None) -> None:
    """Write `out_path`, a qwen35 (qwen35moe) GGUF of the checkpoint in `hf_dir`. mtp: "include" the MTP block (llama.cpp's
    default), "exclude" it (--no-mtp), or write "only" it with token_embd / output_norm / output (--mtp sidecar).
    metadata: extra keys written after the converter's own (e.g. the `training.*` record of tools/train_tiny.py).
    Tensors are converted one at a time as the writer reaches them (the checkpoint is memory-mapped)."""
    hf_dir, say = Path(hf_dir), progress or (lambda msg: None)
    dest = Path(out_path)
    if dest.is_file() and dest.resolve().parent == hf_dir.resolve() and dest.suffix != ".gguf":
        raise ValueError(f"{out_path} is a file of the checkpoint being converted: writing it would destroy the "
                         "input; choose another output name (e.g. model.gguf)")
    if outtype not in OUTTYPES or mtp not in ("include", "exclude", "only"):
        raise ValueError(f"outtype must be one of {', '.join(OUTTYPES)} and mtp include / exclude / only, "
                         f"got {outtype!r}, {mtp!r}")
    cfg = load_config(hf_dir)
    n_trunk = cfg["num_hidden_layers"]
    layer_types = cfg.get("layer_types") or [  # HF's default pattern: every interval-th layer is full attention
        "linear_attention" if (i + 1) % cfg.get("full_attention_interval", 4) else "full_attention" for i in range(n_trunk)]
    if len(layer_types) != n_trunk:
        raise ValueError(f"{hf_dir / 'config.json'}: layer_types has {len(layer_types)} entries, num_hidden_layers is {n_trunk}")

    say(f"reading {hf_dir}")
    checkpoint = hf_tensors(hf_dir)
    if cfg["gguf_arch"] == "qwen35moe":
        checkpoint = stack_experts(checkpoint, cfg["num_experts"])
    tensors = split_gate_up([(gguf_name(hf, n_trunk), st) for hf, st in checkpoint])

    def in_mtp(name: str) -> bool:
        return name.startswith("blk.") and int(name.split(".")[1]) >= n_trunk

    n_mtp = len({name.split(".")[1] for name, _ in tensors if name and in_mtp(name)})
    if cfg.get("mtp_num_hidden_layers", 0) and not n_mtp:
        warnings.warn(f"{hf_dir}: config.json has mtp_num_hidden_layers = {cfg['mtp_num_hidden_layers']} but the "
                      "checkpoint has no mtp.* tensors; writing the trunk only", stacklevel=2)
    if mtp == "only" and not n_mtp:
        raise ValueError(f"{hf_dir}: mtp='only' needs mtp.* tensors, and the checkpoint has none")
    n_mtp *= mtp != "exclude"
    top = ("token_embd.weight", "output_norm.weight", "output.weight")
    tensors = [(name, st) for name, st in tensors if name and (
        not in_mtp(name) if mtp == "exclude" else in_mtp(name) or name in top if mtp == "only" else True)]

    mixer = {"linear_attention": GDN_TENSORS, "full_attention": ATTN_TENSORS}
    moe = cfg["gguf_arch"] == "qwen35moe"
    ffn = (MOE_TENSORS + SHEXP_TENSORS * (cfg.get("shared_expert_intermediate_size", 0) > 0)) if moe else FFN_TENSORS
    need = ["token_embd.weight", "output_norm.weight"] + ([] if mtp == "only" else [
        f"blk.{i}.{n}" for i, kind in enumerate(layer_types) for n in ffn + mixer.get(kind, ATTN_TENSORS)])
    if n_mtp:  # the first MTP layer also holds the nextn projection and norms
        need += [f"blk.{i}.{n}" for i in range(n_trunk, n_trunk + n_mtp) for n in ffn + ATTN_TENSORS]
        need += [f"blk.{n_trunk}.{n}" for n in NEXTN_TENSORS]
    if missing := [n for n in need if n not in {name for name, _ in tensors}]:
        raise ValueError(f"{hf_dir}: the checkpoint lacks tensors for {', '.join(missing[:6])}"
                         + (f" and {len(missing) - 6} more" if len(missing) > 6 else ""))

    shapes = {name: converted_shape(name, data.shape) for name, (_, data) in tensors}
    kinds = tensor_types(shapes, outtype, n_trunk + n_mtp, cfg["num_experts"] if moe else 0)
    out = {}
    for i, (name, (dtype, data)) in enumerate(tensors):
        shape, kind = shapes[name], kinds[name]

        def produce(i=i, name=name, dtype=dtype, data=data, kind=kind, shape=shape):
            # called by write_gguf when it reaches this tensor: one converted tensor in memory at a time
            say(f"[{i + 1}/{len(tensors)}] {name:<40} {dtype} -> {kind.name} {list(reversed(shape))}")
            return encode(transform(name, as_float(dtype, data), cfg), kind)

        out[name] = RawTensor(kind, shape, produce)

    if moe:  # gguf-py get_total_parameter_count: the shared part plus one expert's share of each _exps tensor
        n_expert = cfg["num_experts"]
        if bad := [n for n, t in out.items() if "_exps." in n and t.shape[0] != n_expert]:
            raise ValueError(f"{hf_dir}: {bad[0]} has {out[bad[0]].shape[0]} experts, config.json num_experts is {n_expert}")
        n_params = sum(int(np.prod(t.shape)) // (n_expert if "_exps." in n else 1) for n, t in out.items())
        label = size_label(n_params, n_expert)
    else:
        label = size_label(sum(int(np.prod(t.shape)) for t in out.values()))
    meta = model_metadata(cfg, n_mtp, OUTTYPES[outtype][1], hf_dir.resolve().name, label)
    meta |= tokenizer_metadata(hf_dir, cfg)
    if clash := sorted(set(metadata or {}) & set(meta)):
        raise ValueError(f"extra metadata would overwrite the converter's keys: {', '.join(clash)}")
    meta |= dict(metadata or {})
    say(f"writing {out_path}")
    write_gguf(out_path, meta, out)
