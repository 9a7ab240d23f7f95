"""convert: Hugging Face Qwen3.5 checkpoints -> qwen35 GGUF, checked against HF transformers and llama.cpp.

CI part (needs torch + transformers, skipped cleanly without them): tiny random Qwen3_5ForCausalLM
checkpoints are built in tmp_path with save_pretrained (safetensors), given an `mtp.*` block by hand as
the real checkpoints carry one, converted, and run by tinyspec.model. Per checkpoint:
    logits     64-token prompt, tinyspec vs HF float32 logits, max |diff| <= 1e-4
    decode     prefill 40 tokens, then one token at a time from the carried state == HF full-sequence logits
    mtp        tinyspec's MTP head vs a reference built from the checkpoint's own mtp.* weights
The checkpoints differ where the converter has choices to get right: n_k != n_v (the V-head reorder),
tied / untied embeddings, layer patterns (layer_types, full_attention_interval only, irregular),
partial rotary factors, f32 / bf16 storage, sharded files with an index, the multimodal layout.

llama.cpp part (@pytest.mark.llamacpp; skipped unless tools/make_llamacpp_fixtures.py has run): the same
checkpoint converted by tinyspec and by llama.cpp's convert_hf_to_gguf.py gives the same metadata (keys,
order, value types, values) and the same tensors (names, order, ggml types, shapes, bytes).
"""

from __future__ import annotations

import copy
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from tinyspec.__main__ import main
from tinyspec.convert import convert, read_safetensors, as_float
from tinyspec.gguf import GGUFValueType, read_gguf
from tinyspec.quants import GGMLType, dequantize, quantize

REPO = Path(__file__).resolve().parents[1]
LLAMACPP = Path(os.environ.get("TINYSPEC_LLAMACPP_FILES") or REPO / ".cache" / "llamacpp")
V = 384  # vocab_size of the tiny checkpoints; their tokenizer has 266 tokens, the rest is [PAD{i}]


@dataclass(frozen=True)
class Case:
    name: str
    n_k: int = 2
    n_v: int = 4
    tied: bool = False
    layers: tuple = ("linear_attention",) * 3 + ("full_attention",)
    interval_only: int = 0  # >0: config.json has full_attention_interval and no layer_types
    rotary: float = 0.25
    rope: dict = field(default_factory=lambda: {"mrope_section": [2, 1, 1], "mrope_interleaved": True})
    mtp: bool = True
    dtype: str = "float32"
    shard: bool = False
    multimodal: bool = False
    hidden: int = 64  # sizes: small, and (tests/test_convert_q4_k_m.py) rows that fill 256-value blocks or do not
    ffn: int = 96
    heads: int = 2
    head_dim: int = 32


CASES = [
    Case("reorder-untied-mtp"),
    Case("tied-interval2-bf16-sharded", n_k=2, n_v=2, tied=True, layers=("linear_attention", "full_attention") * 2,
         interval_only=2, rotary=0.5, rope={}, dtype="bfloat16", shard=True),
    Case("irregular-R3-multimodal", n_k=1, n_v=3, layers=("full_attention", "linear_attention", "linear_attention",
         "full_attention", "linear_attention"), rotary=1.0, rope={}, mtp=False, multimodal=True),
]


# ---------------------------------------------------------------------------------------------- checkpoints


def byte_chars() -> list[str]:
    """GPT-2's byte -> printable character map, in byte order."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("e", "r")]
ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<think>", False), ("<|fim_pad|>", False)]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"


def write_tokenizer(d: Path, pair_merges: bool = True) -> None:
    """A byte-level BPE tokenizer.json by hand: 256 bytes, 5 merges (ids 256-260), 5 added tokens (261-265)."""
    vocab = {c: i for i, c in enumerate(byte_chars())} | {a + b: 256 + i for i, (a, b) in enumerate(MERGES)}
    tok = {"version": "1.0", "normalizer": {"type": "NFC"},
           "added_tokens": [{"id": 261 + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": s} for i, (c, s) in enumerate(ADDED)],
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
           "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False},
           "model": {"type": "BPE", "vocab": vocab, "merges": [list(m) if pair_merges else " ".join(m) for m in MERGES]}}
    (d / "tokenizer.json").write_text(json.dumps(tok))
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None, "chat_template": TEMPLATE}))


def fill(torch, name: str, shape, gen):
    """Random values in each tensor's natural range, so logits are O(1) and every tensor matters."""
    if name.endswith("A_log"):
        return torch.empty(shape).uniform_(-1.0, 1.5, generator=gen)
    if name.endswith("dt_bias"):
        return torch.randn(shape, generator=gen)
    if "norm" in name:  # HF stores w - 1 for its (1 + w) RMSNorms, w itself for the gated GDN norm
        return 0.2 * torch.randn(shape, generator=gen) + (1.0 if "linear_attn.norm" in name else 0.0)
    if "conv1d" in name:
        return 0.5 * torch.randn(shape, generator=gen)
    if "embed" in name:  # also the tied LM head: logits stay ~10, so 1e-4 is float32 rounding headroom
        return 0.25 * torch.randn(shape, generator=gen)
    if "in_proj" in name:  # at full scale the GDN amplifies float32 rounding to ~1e-4 in HF and tinyspec
        return 0.5 * torch.randn(shape, generator=gen) / shape[-1] ** 0.5  # alike (both vs a float64 HF run)
    return torch.randn(shape, generator=gen) / shape[-1] ** 0.5


def assert_prompt_and_decode_match(ours, tokens: np.ndarray, ref: np.ndarray, split: int, name: str) -> np.ndarray:
    """ours' logits equal the reference's to 1e-4 as one prompt pass and as a prefill of `split` tokens then
    one-token decode steps; returns the prompt pass's hidden rows (for the MTP head)."""
    assert np.abs(ref).max() > 1.0  # logits of size O(1): the tolerance below means something
    logits, hidden = ours.forward(tokens, ours.new_state())
    assert np.abs(logits - ref).max() <= 1e-4, f"{name}: prompt logits differ by {np.abs(logits - ref).max():.2e}"
    state = ours.new_state()
    rows = [ours.forward(tokens[:split], state)[0]] + [ours.forward(tokens[t:t + 1], state)[0]
                                                       for t in range(split, len(tokens))]
    decode = np.concatenate(rows)
    assert np.abs(decode - ref).max() <= 1e-4, f"{name}: decode logits differ by {np.abs(decode - ref).max():.2e}"
    return hidden


def make_checkpoint(tmp_path: Path, case: Case):
    """(HF model in float32, its checkpoint folder, the mtp.* weights as HF tensors) for one case."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from safetensors.torch import load_file, save_file
    from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    extra = {"full_attention_interval": case.interval_only} if case.interval_only else {"layer_types": list(case.layers)}
    cfg = Qwen3_5TextConfig(
        vocab_size=V, hidden_size=case.hidden, intermediate_size=case.ffn, num_hidden_layers=len(case.layers),
        num_attention_heads=case.heads, num_key_value_heads=1, head_dim=case.head_dim, linear_num_key_heads=case.n_k, linear_num_value_heads=case.n_v,
        linear_key_head_dim=16, linear_value_head_dim=16, max_position_embeddings=512, tie_word_embeddings=case.tied,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": case.rotary, **case.rope},
        eos_token_id=263, pad_token_id=261, **extra)
    assert list(cfg.layer_types) == list(case.layers)
    model = Qwen3_5ForCausalLM._from_config(cfg, attn_implementation="eager").eval()
    gen = torch.Generator().manual_seed(0)
    dtype = getattr(torch, case.dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(fill(torch, name, p.shape, gen).to(dtype).float())  # values the stored dtype holds exactly
    hf_dir = tmp_path / case.name
    # a copy: .to(bfloat16) would also round the rotary inv_freq buffer of the reference model
    copy.deepcopy(model).to(dtype).save_pretrained(hf_dir, max_shard_size="40KB" if case.shard else "1GB")
    write_tokenizer(hf_dir)

    mtp = {}
    if case.mtp:  # as in the real checkpoints: fc, three norms, and one full-attention layer under mtp.*
        full = case.layers.index("full_attention")
        D = case.hidden
        mtp = {"mtp.fc.weight": (D, 2 * D), "mtp.pre_fc_norm_embedding.weight": (D,),
               "mtp.pre_fc_norm_hidden.weight": (D,), "mtp.norm.weight": (D,)}
        mtp |= {f"mtp.layers.0.{n.split('.', 3)[3]}": tuple(p.shape) for n, p in model.state_dict().items()
                if n.startswith(f"model.layers.{full}.")}
        mtp = {n: fill(torch, n, shape, gen).to(dtype) for n, shape in sorted(mtp.items())}
        last = sorted(hf_dir.glob("model*.safetensors"))[-1]
        save_file(load_file(last) | mtp, last, metadata={"format": "pt"})
    config = json.loads((hf_dir / "config.json").read_text())
    config["mtp_num_hidden_layers"] = 1 if case.mtp else 0
    if case.interval_only:
        del config["layer_types"]
        config["full_attention_interval"] = case.interval_only
    if case.shard:
        index = json.loads((hf_dir / "model.safetensors.index.json").read_text())
        index["weight_map"] |= {n: last.name for n in mtp}
        (hf_dir / "model.safetensors.index.json").write_text(json.dumps(index))
        assert len(set(index["weight_map"].values())) > 2
    if case.multimodal:
        to_multimodal(hf_dir, config, torch)
    (hf_dir / "config.json").write_text(json.dumps(config))
    return model, hf_dir, {n: t.float() for n, t in mtp.items()}


def to_multimodal(hf_dir: Path, config: dict, torch) -> None:
    """Rewrite a CausalLM folder in Qwen3_5ForConditionalGeneration's layout: config under text_config,
    weights under model.language_model., plus a vision tensor the converter must drop."""
    from safetensors.torch import load_file, save_file

    (path,) = hf_dir.glob("model*.safetensors")
    weights = {n.replace("model.", "model.language_model.", 1): t for n, t in load_file(path).items()}
    weights["model.visual.patch_embed.proj.weight"] = torch.zeros(8, 3)
    save_file(weights, path, metadata={"format": "pt"})
    text = dict(config)
    config.clear()
    config |= {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "text_config": text,
               "vision_config": {"depth": 1}, "tie_word_embeddings": text["tie_word_embeddings"]}


def mtp_reference(torch, model, mtp: dict, tokens):
    """The MTP head computed the way HF-format MTP code does, from the checkpoint's mtp.* weights:
    logits = lm_head(norm(layer(fc([pre_fc_norm_embedding(e_p) | pre_fc_norm_hidden(h_{p-1})]))))."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    cfg = model.config
    layer = hf.Qwen3_5DecoderLayer(cfg, cfg.layer_types.index("full_attention")).eval()
    layer.load_state_dict({n.removeprefix("mtp.layers.0."): t for n, t in mtp.items() if n.startswith("mtp.layers.0.")})

    def norm(name):
        rms = hf.Qwen3_5RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        rms.weight.data = mtp[name]
        return rms

    with torch.no_grad():
        ids = torch.from_numpy(tokens)[None]
        hidden = model.model(ids).last_hidden_state  # after the final norm
        h_prev = torch.cat([torch.zeros_like(hidden[:, :1]), hidden[:, :-1]], dim=1)
        e = norm("mtp.pre_fc_norm_embedding.weight")(model.model.embed_tokens(ids))
        y = torch.cat([e, norm("mtp.pre_fc_norm_hidden.weight")(h_prev)], dim=-1) @ mtp["mtp.fc.weight"].T
        T = ids.shape[1]
        pos = torch.arange(T)[None]
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        y = layer(y, position_embeddings=model.model.rotary_emb(y, pos), attention_mask=mask, position_ids=pos)
        y = y[0] if isinstance(y, tuple) else y
        return model.lm_head(norm("mtp.norm.weight")(y))[0].numpy()


# ---------------------------------------------------------------------------------------------- vs HF


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_logits_match_hf(tmp_path, case):
    """Converted with tinyspec, run by tinyspec.model: the HF model's logits to 1e-4, as one 64-token
    prompt and as prefill 40 + one-token decode steps; the MTP head to 1e-4 as well."""
    from tinyspec.model import Model
    from tinyspec.mtp import MTPHead, shift_hidden

    model, hf_dir, mtp = make_checkpoint(tmp_path, case)
    import torch

    out = tmp_path / "m.gguf"
    convert(hf_dir, out, "f32")
    ours = Model.from_gguf(out)
    tokens = np.random.default_rng(1).integers(0, V, 64)
    with torch.no_grad():
        ref = model(torch.from_numpy(tokens)[None]).logits[0].numpy()
    hidden = assert_prompt_and_decode_match(ours, tokens, ref, 40, case.name)

    assert ours.cfg.n_nextn == int(case.mtp) and ("output.weight" in ours.tensors) == (not case.tied)
    if case.mtp:
        head = MTPHead(ours)
        mtp_logits, _ = head.forward(tokens, shift_hidden(hidden), head.new_cache())
        mtp_ref = mtp_reference(torch, model, mtp, tokens)
        assert np.abs(mtp_logits - mtp_ref).max() <= 1e-4, f"{case.name}: MTP logits differ"


def test_storage_types_f16_q8_0(tmp_path):
    """llama.cpp's storage rules: norms, ssm_conv1d, ssm_a, ssm_dt.bias stay F32; 2-D weights take the
    outtype; a Q8_0 row that is not a multiple of 32 (ffn_down, 80 wide here) falls back to F16. The
    values are the F32 file's, rounded to F16 or quantized to Q8_0 from it."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(vocab_size=V, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=2,
                            linear_key_head_dim=16, linear_value_head_dim=16, layer_types=["linear_attention", "full_attention"])
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(cfg)
    model.save_pretrained(tmp_path / "hf")
    write_tokenizer(tmp_path / "hf", pair_merges=False)
    model.half().save_pretrained(tmp_path / "hf16")  # llama.cpp edits F16 tensors in F16: 1 + w is rounded to F16
    write_tokenizer(tmp_path / "hf16")
    convert(tmp_path / "hf16", tmp_path / "from16.gguf", "f32")
    from16, sd = read_gguf(tmp_path / "from16.gguf"), model.state_dict()
    w = sd["model.norm.weight"].numpy()
    assert from16.raw("output_norm.weight").view(np.float32).tolist() == (w + np.float16(1)).astype(np.float32).tolist()
    a_log = sd["model.layers.0.linear_attn.A_log"].numpy()
    ssm_a = (-np.exp(a_log.astype(np.float64))).astype(np.float16)
    assert from16.raw("blk.0.ssm_a").view(np.float32).tolist() == ssm_a.astype(np.float32).tolist()
    files = {t: tmp_path / f"{t}.gguf" for t in ("f32", "f16", "q8_0")}
    for outtype, path in files.items():
        convert(tmp_path / "hf", path, outtype)
    f32, f16, q8 = (read_gguf(p) for p in files.values())
    assert [f.metadata["general.file_type"] for f in (f32, f16, q8)] == [0, 1, 7]
    for name, info in f32.tensors.items():
        x = dequantize(f32.raw(name), GGMLType.F32, info.shape)
        keep_f32 = len(info.shape) == 1 or name.endswith(("_norm.weight", "ssm_conv1d.weight", "ssm_a", ".bias"))
        assert info.ggml_type == GGMLType.F32, name
        assert f16.tensors[name].ggml_type == (GGMLType.F32 if keep_f32 else GGMLType.F16), name
        want = GGMLType.F32 if keep_f32 else GGMLType.F16 if info.shape[-1] % 32 else GGMLType.Q8_0
        assert q8.tensors[name].ggml_type == want, name
        expect = {GGMLType.F32: lambda: x, GGMLType.F16: lambda: x.astype(np.float16),
                  GGMLType.Q8_0: lambda: quantize(x, GGMLType.Q8_0)}
        assert f16.raw(name).tobytes() == expect[f16.tensors[name].ggml_type]().tobytes(), name
        assert q8.raw(name).tobytes() == expect[want]().tobytes(), name
    assert q8.tensors["blk.0.ffn_down.weight"].ggml_type == GGMLType.F16  # the fallback happened
    assert f32.metadata["tokenizer.ggml.merges"] == [" ".join(m) for m in MERGES]  # "a b" strings read as they are


# ---------------------------------------------------------------------------------------------- metadata


def test_metadata_types_and_tokenizer(tmp_path):
    """Exact GGUF value types (llama.cpp rejects a key of the wrong type), read back by gguf-py too, and
    the tokenizer keys: tokens padded to vocab_size with [PAD{i}], token types, merges, ids, template."""
    gguf = pytest.importorskip("gguf")
    model, hf_dir, _ = make_checkpoint(tmp_path, CASES[0])
    out = tmp_path / "m.gguf"
    convert(hf_dir, out, "f32")
    g = read_gguf(out)
    u32 = ["block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
           "attention.head_count_kv", "attention.key_length", "attention.value_length", "nextn_predict_layers",
           "ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank", "ssm.inner_size",
           "full_attention_interval", "rope.dimension_count"]
    for key in u32:
        assert g.fields[f"qwen35.{key}"].type == GGUFValueType.UINT32, key
    for key in ("rope.freq_base", "attention.layer_norm_rms_epsilon"):
        assert g.fields[f"qwen35.{key}"].type == GGUFValueType.FLOAT32, key
    m = g.metadata
    assert m["general.architecture"] == "qwen35" and m["general.file_type"] == 0 and m["general.quantization_version"] == 2
    assert [m[f"qwen35.{k}"] for k in ("block_count", "nextn_predict_layers", "ssm.group_count", "ssm.time_step_rank",
                                       "ssm.inner_size", "rope.dimension_count")] == [5, 1, 2, 4, 64, 8]
    assert g.fields["qwen35.attention.recurrent_layers"].item_type == GGUFValueType.BOOL
    assert m["qwen35.attention.recurrent_layers"].tolist() == [True, True, True, False, False]  # MTP entry: False
    assert g.fields["qwen35.rope.dimension_sections"].item_type == GGUFValueType.INT32
    assert m["qwen35.rope.dimension_sections"].tolist() == [2, 1, 1, 0]

    tokens, types = m["tokenizer.ggml.tokens"], m["tokenizer.ggml.token_type"]
    assert g.fields["tokenizer.ggml.token_type"].item_type == GGUFValueType.INT32
    assert len(tokens) == V and tokens[:256] == byte_chars() and tokens[256] == "Ġt"
    assert tokens[261:266] == [t for t, _ in ADDED] and tokens[266] == "[PAD266]" and tokens[-1] == f"[PAD{V - 1}]"
    # normal, CONTROL for special or <|...|>-looking added tokens, USER_DEFINED otherwise, UNUSED padding
    assert types[:261].tolist() == [1] * 261 and types[261:266].tolist() == [3, 3, 3, 4, 3] and set(types[266:]) == {5}
    assert m["tokenizer.ggml.model"] == "gpt2" and m["tokenizer.ggml.pre"] == "qwen35"
    assert m["tokenizer.ggml.merges"] == [" ".join(p) for p in MERGES]
    assert m["tokenizer.ggml.eos_token_id"] == 263 and m["tokenizer.ggml.padding_token_id"] == 261
    assert "tokenizer.ggml.bos_token_id" not in m
    assert m["tokenizer.ggml.add_bos_token"] is False and m["tokenizer.ggml.add_eos_token"] is False  # ByteLevel
    assert m["tokenizer.chat_template"] == TEMPLATE

    reader = gguf.GGUFReader(out)  # round trip through llama.cpp's own reader
    assert [k for k in reader.fields if not k.startswith("GGUF.")] == list(g.fields)
    for key, f in g.fields.items():
        assert reader.fields[key].types[0] == f.type, key
        if f.item_type is not None:
            assert reader.fields[key].types[-1] == f.item_type, key
    assert reader.fields["qwen35.block_count"].contents() == 5
    assert reader.fields["tokenizer.ggml.tokens"].contents()[-1] == f"[PAD{V - 1}]"
    for t in reader.tensors:
        info = g.tensors[t.name]
        assert int(t.tensor_type) == info.ggml_type and tuple(reversed(t.shape.tolist())) == info.shape
        assert np.array_equal(np.asarray(t.data).reshape(info.shape), g.raw(t.name).view(np.float32).reshape(info.shape))


def test_mtp_modes_and_no_tokenizer(tmp_path):
    """mtp="exclude" (llama.cpp --no-mtp) drops the block and its keys; mtp="only" (--mtp) keeps the block
    with token_embd / output_norm / output; a folder without tokenizer.json converts with a warning."""
    _, hf_dir, _ = make_checkpoint(tmp_path, CASES[0])
    convert(hf_dir, tmp_path / "trunk.gguf", "f16", mtp="exclude")
    convert(hf_dir, tmp_path / "mtp.gguf", "f16", mtp="only")
    trunk, side = read_gguf(tmp_path / "trunk.gguf"), read_gguf(tmp_path / "mtp.gguf")
    assert trunk.metadata["qwen35.block_count"] == 4 and "qwen35.nextn_predict_layers" not in trunk.metadata
    assert len(trunk.metadata["qwen35.attention.recurrent_layers"]) == 4
    assert not any(n.startswith("blk.4.") for n in trunk.tensors)
    assert side.metadata["qwen35.block_count"] == 5 and side.metadata["qwen35.nextn_predict_layers"] == 1
    assert {n for n in side.tensors if not n.startswith("blk.4.")} == {"token_embd.weight", "output_norm.weight", "output.weight"}
    assert len(side.tensors) == 3 + 11 + 4

    (hf_dir / "tokenizer.json").unlink()
    with pytest.warns(UserWarning, match="no tokenizer.json"):
        convert(hf_dir, tmp_path / "bare.gguf", "f32")
    assert not any(k.startswith("tokenizer.") for k in read_gguf(tmp_path / "bare.gguf").metadata)


# ---------------------------------------------------------------------------------------------- safetensors, errors


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """The format by hand: u64 header length, JSON header, then each tensor's little-endian bytes."""
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name, (dtype, x) in tensors.items():
        blobs.append(x.tobytes())
        header[name] = {"dtype": dtype, "shape": list(x.shape), "data_offsets": [at, at + len(blobs[-1])]}
        at += len(blobs[-1])
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_safetensors_reader_dtypes(tmp_path):
    """BF16 is the top half of an F32: 0x3F80 -> 1.0, 0xC020 -> -2.5, 0x3E20 -> 0.15625. F16 stays F16."""
    bits = np.array([[0x3F80, 0xC020], [0x3E20, 0x0000]], np.uint16)
    write_safetensors(tmp_path / "model.safetensors", {
        "b": ("BF16", bits), "a": ("F16", np.array([1.5, -0.25], np.float16)),
        "c": ("F32", np.arange(6, dtype=np.float32).reshape(2, 3))})
    got = read_safetensors(tmp_path / "model.safetensors")
    assert list(got) == ["a", "b", "c"]  # sorted by name, as llama.cpp reads them
    assert as_float(*got["b"]).tolist() == [[1.0, -2.5], [0.15625, 0.0]]
    assert as_float(*got["a"]).dtype == np.float16 and as_float(*got["a"]).tolist() == [1.5, -0.25]
    assert as_float(*got["c"]).tolist() == [[0, 1, 2], [3, 4, 5]]


def test_errors_name_the_file_or_tensor(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        convert(d, tmp_path / "x.gguf")
    for arch in ("Qwen3NextForCausalLM",):  # Qwen3_5Moe: tests/test_moe.py
        (d / "config.json").write_text(json.dumps({"architectures": [arch]}))
        with pytest.raises(ValueError, match=f"{arch} is not supported yet"):
            convert(d, tmp_path / "x.gguf")
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ValueError, match="LlamaForCausalLM is not supported"):
        convert(d, tmp_path / "x.gguf")
    config = {"architectures": ["Qwen3_5ForCausalLM"], "num_hidden_layers": 1, "layer_types": ["full_attention"],
              "hidden_size": 8, "num_attention_heads": 1, "linear_num_key_heads": 1, "linear_key_head_dim": 4}
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="config.json: missing linear_conv_kernel_dim, linear_value_head_dim"):
        convert(d, tmp_path / "x.gguf")
    config |= {"linear_conv_kernel_dim": 4, "linear_value_head_dim": 4, "linear_num_value_heads": 1,
               "rope_parameters": {"rope_type": "yarn", "factor": 4.0}}
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="rope type 'yarn' is not supported yet"):
        convert(d, tmp_path / "x.gguf")
    del config["rope_parameters"]
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no model.*safetensors"):
        convert(d, tmp_path / "x.gguf")
    write_safetensors(d / "model.safetensors", {"model.embed_tokens.weight": ("F32", np.zeros((4, 8), np.float32)),
                                                "model.norm.weight": ("F32", np.zeros(8, np.float32))})
    with pytest.raises(ValueError, match="lacks tensors for blk.0.attn_norm.weight"):
        convert(d, tmp_path / "x.gguf")
    write_safetensors(d / "model.safetensors", {"model.layers.0.foo.weight": ("F32", np.zeros(8, np.float32))})
    with pytest.raises(ValueError, match="cannot map checkpoint tensor 'model.layers.0.foo.weight'"):
        convert(d, tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="outtype"):
        convert(d, tmp_path / "x.gguf", "q4_k")
    st = d / "model.safetensors"
    st.write_bytes(struct.pack("<Q", 2**60) + b"{}")  # a header length past the file: no giant read
    with pytest.raises(ValueError, match="model.safetensors: not a safetensors file"):
        convert(d, tmp_path / "x.gguf")
    st.write_bytes(struct.pack("<Q", 8) + b'{"a": 1,')  # a cut header: the file is named
    with pytest.raises(ValueError, match="model.safetensors: not valid JSON"):
        convert(d, tmp_path / "x.gguf")
    (d / "config.json").write_text("{\n 'single quotes': 1}")
    with pytest.raises(ValueError, match="config.json: not valid JSON"):
        convert(d, tmp_path / "x.gguf")


def test_cli_convert(tmp_path, capsys):
    _, hf_dir, _ = make_checkpoint(tmp_path, CASES[0])
    assert main(["convert", str(hf_dir), "-o", str(tmp_path / "m.gguf"), "--outtype", "q8_0"]) == 0
    assert read_gguf(tmp_path / "m.gguf").metadata["general.file_type"] == 7
    assert "writing" in capsys.readouterr().err  # progress goes to stderr
    assert main(["convert", str(tmp_path / "nowhere"), "-o", str(tmp_path / "n.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no config.json" in err
    weights = next(hf_dir.glob("*.safetensors"))  # -o onto a file of the checkpoint: refused, input intact
    before = weights.read_bytes()
    assert main(["convert", str(hf_dir), "-o", str(weights)]) == 2
    assert "would destroy the input" in capsys.readouterr().err and weights.read_bytes() == before


def test_an_mtp_sidecar_is_named_as_such(tmp_path):
    """convert --mtp only (llama.cpp --mtp) writes the MTP block alone: loading it as a model says so."""
    from tinyspec.model import Model, ModelError

    _, hf_dir, _ = make_checkpoint(tmp_path, CASES[0])
    convert(hf_dir, tmp_path / "mtp.gguf", "f16", mtp="only")
    with pytest.raises(ModelError, match="only the MTP block"):
        Model.from_gguf(tmp_path / "mtp.gguf")


# ---------------------------------------------------------------------------------------------- vs llama.cpp

# Keys that legitimately differ between llama.cpp's file and ours, and why.
DIFFERENT_KEYS = {
    "general.name": "llama.cpp was given --model-name qwen35-tiny; tinyspec names the model after the folder",
}
PARITY = [("f32", "qwen35-tiny-F32.gguf", "include"), ("f16", "qwen35-tiny-F16.gguf", "include"),
          ("q8_0", "qwen35-tiny-Q8_0-py.gguf", "include"), ("f16", "mtp-qwen35-tiny-F16.gguf", "only")]


@pytest.mark.llamacpp
@pytest.mark.parametrize("outtype,reference,mtp", PARITY, ids=[p[1] for p in PARITY])
def test_same_file_as_llamacpp_converter(tmp_path, outtype, reference, mtp):
    """tinyspec's conversion of the fixture checkpoint == llama.cpp's convert_hf_to_gguf.py output: same
    metadata keys in the same order with the same value types and values (but DIFFERENT_KEYS), same tensor
    names in the same order, ggml types, shapes and bytes. ssm_a may differ by 1 ulp: llama.cpp takes
    torch's float32 exp, tinyspec rounds a float64 exp once."""
    hf_dir, ref_path = LLAMACPP / "work" / "hf", LLAMACPP / reference
    if not (hf_dir / "config.json").is_file() or not ref_path.is_file():
        pytest.skip(f"no {ref_path} / {hf_dir}: run tools/make_llamacpp_fixtures.py")
    convert(hf_dir, tmp_path / "ours.gguf", outtype, mtp=mtp)
    ours, ref = read_gguf(tmp_path / "ours.gguf"), read_gguf(ref_path)
    assert list(ours.fields) == list(ref.fields), "metadata keys or their order differ"
    for key, f in ref.fields.items():
        if key not in DIFFERENT_KEYS:
            assert ours.fields[key] == f, f"{key}: {ours.fields[key].type.name} {str(ours.fields[key].value)[:60]} " \
                                          f"vs llama.cpp {f.type.name} {str(f.value)[:60]}"
    assert list(ours.tensors) == list(ref.tensors), "tensor names or their order differ"
    for name, t in ref.tensors.items():
        mine = ours.tensors[name]
        assert (mine.ggml_type, mine.shape) == (t.ggml_type, t.shape), name
        a, b = ours.raw(name), ref.raw(name)
        if name.endswith("ssm_a"):
            ulps = np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32))
            assert ulps.max() <= 1, f"{name}: {ulps.max()} ulp"
        else:
            assert np.array_equal(a, b), f"{name}: {np.count_nonzero(a != b)} bytes differ"
