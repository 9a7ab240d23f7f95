"""ModelConfig.from_gguf: derivations from qwen35 metadata and one clear error per bad key."""

import numpy as np
import pytest
from tiny_models import tiny_qwen35_tensors

from tinyspec.config import ConfigError, ModelConfig
from tinyspec.gguf import GGUFValue


def plain_meta(**kw) -> dict:
    meta, _ = tiny_qwen35_tensors(np.random.default_rng(0), **kw)
    return {k: v.to_python() if isinstance(v, GGUFValue) else v for k, v in meta.items()}


def test_derived_sizes():
    cfg = ModelConfig.from_gguf(plain_meta(n_trunk=8, n_k=2, n_v=4, K=8, V=8))
    assert cfg.n_trunk == 8 and cfg.n_layer_all == 9 and cfg.n_nextn == 1
    assert cfg.recurrent == (True, True, True, False, True, True, True, False)  # layers 3, 7 attention
    assert cfg.ssm_conv_channels == 2 * 2 * 8 + 4 * 8 and cfg.ssm_head_v_dim == 8
    assert cfg.attn_scale == pytest.approx(1 / 4) and cfg.n_rot == 4


def test_recurrent_layers_array_wins_over_interval():
    meta = plain_meta(n_trunk=4)
    meta["qwen35.attention.recurrent_layers"] = [False, True, True, True, False]
    assert ModelConfig.from_gguf(meta).recurrent == (False, True, True, True)


@pytest.mark.parametrize("change, message", [
    ({"general.architecture": "qwen35moe"}, "missing metadata key qwen35moe.block_count"),
    ({"general.architecture": "qwen3next"}, "'qwen3next' .* not supported yet"),
    ({"general.architecture": "llama"}, "'llama' is not supported"),
    ({"qwen35.embedding_length": None}, "missing metadata key qwen35.embedding_length"),
    ({"qwen35.ssm.time_step_rank": 3}, "time_step_rank = 3 .* not a multiple of ssm.group_count = 2"),
    ({"qwen35.ssm.inner_size": 30}, "inner_size = 30 does not divide into 4 value heads"),
    ({"qwen35.attention.head_count": 3, "qwen35.attention.head_count_kv": 2}, "head_count = 3 is not a multiple"),
    ({"qwen35.rope.dimension_count": 17}, "dimension_count = 17 must be even"),
    ({"qwen35.block_count": 0}, "block_count must be a positive integer"),
    ({"qwen35.nextn_predict_layers": 2}, "at most one MTP block"),
    ({"qwen35.attention.recurrent_layers": [True, True]}, "has 2 entries, block_count is 5"),
    ({"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens"),
])
def test_bad_metadata_is_named(change, message):
    meta = plain_meta()
    for k, v in change.items():
        if v is None:
            del meta[k]
        else:
            meta[k] = v
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_gguf(meta)


def moe_meta(**changes):
    """plain_meta's model as qwen35moe: every key under the qwen35moe prefix, plus the expert keys."""
    meta = {k.replace("qwen35.", "qwen35moe.", 1): v for k, v in plain_meta().items()}
    meta["general.architecture"] = "qwen35moe"
    meta.update({"qwen35moe.expert_count": 8, "qwen35moe.expert_used_count": 2,
                 "qwen35moe.expert_feed_forward_length": 16, "qwen35moe.expert_shared_feed_forward_length": 24})
    meta.update(changes)
    return {k: v for k, v in meta.items() if v is not None}


def test_moe_keys():
    cfg = ModelConfig.from_gguf(moe_meta())
    assert (cfg.arch, cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp, cfg.n_ff_shexp) == ("qwen35moe", 8, 2, 16, 24)
    assert ModelConfig.from_gguf(moe_meta(**{"qwen35moe.feed_forward_length": None})).n_ff == 0
    assert ModelConfig.from_gguf(moe_meta(**{"qwen35moe.expert_shared_feed_forward_length": None})).n_ff_shexp == 0
    assert ModelConfig.from_gguf(plain_meta()).n_expert == 0


@pytest.mark.parametrize("change, message", [
    ({"qwen35moe.expert_count": 0}, "expert_count must be a positive integer"),
    ({"qwen35moe.expert_used_count": 9}, "expert_used_count = 9 exceeds expert_count = 8"),
    ({"qwen35moe.expert_feed_forward_length": None}, "missing metadata key qwen35moe.expert_feed_forward_length"),
    ({"qwen35moe.expert_shared_feed_forward_length": -1}, "expert_shared_feed_forward_length must be"),
])
def test_bad_moe_keys(change, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_gguf(moe_meta(**change))
