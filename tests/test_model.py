"""The qwen35 trunk and MTP head on the NumPy oracle: batch invariance, state, chunked prefill, errors,
and the MTP block against a reference built from HF transformers' own decoder layer.

(Trunk logits vs HF Qwen3_5ForCausalLM through a converted checkpoint: tests/test_convert.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
from tiny_models import tiny_qwen35_tensors, write_tiny_qwen35

from tinyspec.config import ModelConfig
from tinyspec.gguf import GGUFValue, read_gguf
from tinyspec.model import Model, ModelError
from tinyspec.mtp import MTPHead, shift_hidden


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Model:
    path = tmp_path_factory.mktemp("m") / "tiny.gguf"
    write_tiny_qwen35(path, seed=1, n_trunk=6, interval=3)  # layers: GDN GDN attn GDN GDN attn
    return Model.from_gguf(path)


def tokens(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 272, n)


def test_layer_pattern_from_metadata(model):
    assert model.cfg.recurrent == (True, True, False, True, True, False)
    assert model.cfg.n_trunk == 6 and model.cfg.n_nextn == 1


def test_verify_rows_equal_decode_steps_bitwise(model):
    """Batch invariance, the property lossless speculation rests on: a T-token pass (verify) gives row i
    bitwise equal to the one-token pass (decode) at that position, and leaves the same state. A float32
    BLAS gemm over all rows would break this (its reduction order depends on the row count)."""
    seq = tokens(23)
    prefix, rest = seq[:11], seq[11:]
    decode_state = model.new_state()
    model.forward(prefix, decode_state)
    verify_state = decode_state.copy()
    one = [model.forward(np.array([t]), decode_state) for t in rest]
    parts = [(0, 4), (4, 5), (5, 12)]  # uneven verify passes: k+1 = 4, 1, 7
    for a, b in parts:
        logits, hidden = model.forward(rest[a:b], verify_state)
        np.testing.assert_array_equal(logits, np.concatenate([one[i][0] for i in range(a, b)]))
        np.testing.assert_array_equal(hidden, np.concatenate([one[i][1] for i in range(a, b)]))
    assert verify_state.max_abs_diff(decode_state) == 0.0


def test_chunked_prefill_matches_scan(model):
    seq = tokens(150, seed=3)
    scan_logits, _ = model.forward(seq, scan_state := model.new_state())
    chunk_logits, _ = model.forward(seq, chunk_state := model.new_state(), chunked=True)
    assert np.abs(scan_logits - chunk_logits).max() <= 1e-4
    assert scan_state.max_abs_diff(chunk_state) <= 1e-4


def test_state_copy_restores_exactly(model):
    """Copy the state at a token boundary, run on, restore: the next logits are as if nothing ran."""
    seq = tokens(12, seed=4)
    state = model.new_state()
    model.forward(seq, state)
    saved = state.copy()
    expect, _ = model.forward(np.array([5, 6]), state)
    model.forward(np.array([7, 8, 9]), saved.copy())  # a side branch must not touch `saved`
    again, _ = model.forward(np.array([5, 6]), saved)
    np.testing.assert_array_equal(expect, again)
    assert saved.max_abs_diff(state) == 0.0


def test_truncate_kv_rejects_bad_ranges(model):
    state = model.new_state()
    model.forward(tokens(5), state)
    for bad in (-1, 6):
        with pytest.raises(ValueError, match="truncate_kv"):
            state.truncate_kv(bad)


def test_bad_tokens_are_clear_errors(model):
    with pytest.raises(ValueError, match="token id 272 is outside the vocabulary"):
        model.forward(np.array([1, 272]), model.new_state())
    with pytest.raises(ValueError, match="non-empty"):
        model.forward(np.array([], dtype=np.int64), model.new_state())


def test_tied_output_uses_token_embd(tmp_path):
    write_tiny_qwen35(tmp_path / "tied.gguf", tied=True, mtp=False)
    m = Model.from_gguf(tmp_path / "tied.gguf")
    assert m.output is m.token_embd
    with pytest.raises(ModelError, match="no MTP block"):
        MTPHead(m)


def test_missing_tensor_named(tmp_path):
    meta, tensors = tiny_qwen35_tensors(np.random.default_rng(0), mtp=False)
    del tensors["blk.1.ssm_a"]
    with pytest.raises(ModelError, match="missing tensor blk.1.ssm_a"):
        Model(ModelConfig.from_gguf({k: v.to_python() if isinstance(v, GGUFValue) else v for k, v in meta.items()}), tensors)


def test_mtp_chain_kv_covers_every_position(model):
    """Feeding the head the whole prefix in one pass or row by row gives the same logits (its KV cache
    must see every position; rows are batch-invariant like the trunk's)."""
    seq = tokens(9, seed=5)
    _, hidden = model.forward(seq, model.new_state())
    head = MTPHead(model)
    full, _ = head.forward(seq, shift_hidden(hidden), head.new_cache())
    cache, rows = head.new_cache(), []
    h_prev = shift_hidden(hidden)
    for p in range(seq.size):
        rows.append(head.forward(seq[p : p + 1], h_prev[p : p + 1], cache)[0])
    np.testing.assert_array_equal(full, np.concatenate(rows))


def test_mtp_matches_hf_decoder_layer_reference(model, tmp_path):
    """The nextn block = rms(e) | rms(h) -> eh_proj -> one HF Qwen3_5DecoderLayer (full attention) ->
    head norm -> LM head. Built here from transformers' own layer and rotary embedding with the GGUF's
    MTP weights (norms minus the +1 the converter folds in), it must give tinyspec's MTP logits."""
    torch = pytest.importorskip("torch")
    hf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    from transformers import Qwen3_5TextConfig

    cfg = model.cfg
    w = MTPHead(model).w
    conf = Qwen3_5TextConfig(
        vocab_size=cfg.n_vocab, hidden_size=cfg.n_embd, intermediate_size=cfg.n_ff, num_hidden_layers=1,
        num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_head_kv, head_dim=cfg.head_dim,
        rms_norm_eps=cfg.rms_eps, layer_types=["full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_base,
                         "partial_rotary_factor": cfg.n_rot / cfg.head_dim})
    conf._attn_implementation = "eager"
    layer = hf.Qwen3_5DecoderLayer(conf, 0).float().eval()
    rope = hf.Qwen3_5TextRotaryEmbedding(conf)

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a))

    def hf_norm(gguf_weight):
        norm = hf.Qwen3_5RMSNorm(cfg.n_embd, eps=cfg.rms_eps)
        norm.weight.data = t(gguf_weight - 1)  # HF multiplies by (1 + w)
        return norm

    sd = {"self_attn.q_proj.weight": w["attn_q.weight"], "self_attn.k_proj.weight": w["attn_k.weight"],
          "self_attn.v_proj.weight": w["attn_v.weight"], "self_attn.o_proj.weight": w["attn_output.weight"],
          "self_attn.q_norm.weight": w["attn_q_norm.weight"] - 1, "self_attn.k_norm.weight": w["attn_k_norm.weight"] - 1,
          "mlp.gate_proj.weight": w["ffn_gate.weight"], "mlp.up_proj.weight": w["ffn_up.weight"],
          "mlp.down_proj.weight": w["ffn_down.weight"], "input_layernorm.weight": w["attn_norm.weight"] - 1,
          "post_attention_layernorm.weight": w["post_attention_norm.weight"] - 1}
    layer.load_state_dict({k: t(v) for k, v in sd.items()})

    seq = tokens(40, seed=6)
    _, hidden = model.forward(seq, model.new_state())
    h_prev = shift_hidden(hidden)
    ours, ours_h = MTPHead(model).forward(seq, h_prev, MTPHead(model).new_cache())

    with torch.no_grad():
        e = hf_norm(w["nextn.enorm.weight"])(t(model.token_embd[seq]))
        h = hf_norm(w["nextn.hnorm.weight"])(t(h_prev))
        y = torch.cat([e, h], dim=-1) @ t(w["nextn.eh_proj.weight"]).T
        T = seq.size
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        pos = torch.arange(T)[None]
        y = layer(y[None], position_embeddings=rope(y[None], pos), attention_mask=mask, position_ids=pos)[0]
        h_mtp = hf_norm(w["nextn.shared_head_norm.weight"])(y)
        ref = (h_mtp @ t(model.output).T).numpy()
    assert np.abs(ours - ref).max() <= 1e-4, np.abs(ours - ref).max()
    assert np.abs(ours_h - h_mtp.numpy()).max() <= 1e-4


def test_model_reads_through_open_file(tmp_path):
    write_tiny_qwen35(tmp_path / "m.gguf", mtp=False)
    with read_gguf(tmp_path / "m.gguf") as g:
        m = Model.from_gguf(g)
    assert m.cfg.n_nextn == 0 and m.cfg.n_vocab == 272
