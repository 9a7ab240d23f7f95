"""Random tiny qwen35 GGUF files for tests (no HF, no downloads): every tensor the trunk and MTP need."""

from __future__ import annotations

import numpy as np

from tinyspec.gguf import GGUFValue, GGUFValueType, write_gguf

U32 = GGUFValueType.UINT32


def byte_level_chars() -> list[str]:
    """GPT-2's byte -> printable unicode map, in byte order (so token id b is byte b)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def byte_vocab(N: int) -> tuple[list[str], np.ndarray, list[str]]:
    """A byte-level BPE vocabulary of N >= 264 tokens: the 256 bytes, 3 control tokens, a few merges, padding."""
    chars = byte_level_chars()
    tokens = chars + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    merges = ["Ġ t", "h e", "Ġt he", "i n", "e r"][: max(0, N - 259)]
    tokens += [a + b for a, b in (m.split(" ") for m in merges)]
    tokens += [f"[PAD{i}]" for i in range(len(tokens), N)]
    token_type = np.ones(N, np.int32)
    token_type[256:259] = 3  # control
    token_type[259 + len(merges):] = 5  # unused padding
    return tokens, token_type, merges


def tiny_qwen35_tensors(rng, *, D=32, F=48, N=272, n_trunk=4, interval=4, H=2, H_kv=1, d=16, n_k=2, n_v=4,
                        K=8, V=8, w=4, mtp=True, tied=False, experts: tuple[int, int, int, int] | None = None
                        ) -> tuple[dict, dict]:
    """(metadata, tensors) of a random qwen35 model; tensors in NumPy shape, float32. experts = (E, k, F_e, F_s):
    a qwen35moe model instead, every FFN (the MTP block's too) routed over E experts, k a token, plus a shared
    expert of width F_s (0: none)."""
    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(n):
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    tokens, token_type, merges = byte_vocab(N)
    C = 2 * n_k * K + n_v * V
    n_all = n_trunk + (1 if mtp else 0)
    meta = {
        "general.architecture": "qwen35",
        "qwen35.block_count": GGUFValue(U32, n_all),
        "qwen35.context_length": GGUFValue(U32, 4096),
        "qwen35.embedding_length": GGUFValue(U32, D),
        "qwen35.feed_forward_length": GGUFValue(U32, F),
        "qwen35.attention.head_count": GGUFValue(U32, H),
        "qwen35.attention.head_count_kv": GGUFValue(U32, H_kv),
        "qwen35.attention.key_length": GGUFValue(U32, d),
        "qwen35.attention.value_length": GGUFValue(U32, d),
        "qwen35.attention.layer_norm_rms_epsilon": GGUFValue(GGUFValueType.FLOAT32, 1e-6),
        "qwen35.rope.dimension_count": GGUFValue(U32, d // 4),
        "qwen35.rope.freq_base": GGUFValue(GGUFValueType.FLOAT32, 10000.0),
        "qwen35.full_attention_interval": GGUFValue(U32, interval),
        "qwen35.ssm.conv_kernel": GGUFValue(U32, w),
        "qwen35.ssm.state_size": GGUFValue(U32, K),
        "qwen35.ssm.group_count": GGUFValue(U32, n_k),
        "qwen35.ssm.time_step_rank": GGUFValue(U32, n_v),
        "qwen35.ssm.inner_size": GGUFValue(U32, n_v * V),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen35",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": token_type,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.eos_token_id": GGUFValue(U32, 256),
    }
    if mtp:
        meta["qwen35.nextn_predict_layers"] = GGUFValue(U32, 1)
    if experts is not None:
        E, k_used, Fe, Fs = experts
        meta = {k.replace("qwen35.", "qwen35moe.", 1): v for k, v in meta.items() if k != "qwen35.feed_forward_length"}
        meta["general.architecture"] = "qwen35moe"
        meta.update({"qwen35moe.expert_count": GGUFValue(U32, E), "qwen35moe.expert_used_count": GGUFValue(U32, k_used),
                     "qwen35moe.expert_feed_forward_length": GGUFValue(U32, Fe),
                     "qwen35moe.expert_shared_feed_forward_length": GGUFValue(U32, Fs)})
    t = {"token_embd.weight": mat(N, D), "output_norm.weight": norm(D)}
    if not tied:
        t["output.weight"] = mat(N, D)

    def attention_block(p):
        t.update({p + "attn_q.weight": mat(2 * H * d, D), p + "attn_k.weight": mat(H_kv * d, D),
                  p + "attn_v.weight": mat(H_kv * d, D), p + "attn_output.weight": mat(D, H * d),
                  p + "attn_q_norm.weight": norm(d), p + "attn_k_norm.weight": norm(d)})

    def stack(n, rows, cols):  # n matrices [rows, cols]: a 3-D expert tensor
        return np.stack([mat(rows, cols) for _ in range(n)])

    def common(p):
        t.update({p + "attn_norm.weight": norm(D), p + "post_attention_norm.weight": norm(D)})
        if experts is None:
            t.update({p + "ffn_gate.weight": mat(F, D), p + "ffn_up.weight": mat(F, D), p + "ffn_down.weight": mat(D, F)})
            return
        E, _, Fe, Fs = experts
        t.update({p + "ffn_gate_inp.weight": mat(E, D), p + "ffn_gate_exps.weight": stack(E, Fe, D),
                  p + "ffn_up_exps.weight": stack(E, Fe, D), p + "ffn_down_exps.weight": stack(E, D, Fe)})
        if Fs:
            t.update({p + "ffn_gate_inp_shexp.weight": mat(1, D)[0], p + "ffn_gate_shexp.weight": mat(Fs, D),
                      p + "ffn_up_shexp.weight": mat(Fs, D), p + "ffn_down_shexp.weight": mat(D, Fs)})

    for i in range(n_trunk):
        p = f"blk.{i}."
        common(p)
        if (i + 1) % interval:
            t.update({p + "attn_qkv.weight": mat(C, D), p + "attn_gate.weight": mat(n_v * V, D),
                      p + "ssm_beta.weight": mat(n_v, D), p + "ssm_alpha.weight": mat(n_v, D),
                      p + "ssm_conv1d.weight": (0.5 * rng.standard_normal((C, w))).astype(np.float32),
                      p + "ssm_dt.bias": rng.standard_normal(n_v).astype(np.float32),
                      p + "ssm_a": (-np.exp(rng.uniform(-1, 1, n_v))).astype(np.float32),
                      p + "ssm_norm.weight": norm(V), p + "ssm_out.weight": mat(D, n_v * V)})
        else:
            attention_block(p)
    if mtp:
        p = f"blk.{n_trunk}."
        common(p)
        attention_block(p)
        t.update({p + "nextn.eh_proj.weight": mat(D, 2 * D), p + "nextn.enorm.weight": norm(D),
                  p + "nextn.hnorm.weight": norm(D), p + "nextn.shared_head_norm.weight": norm(D)})
    return meta, t


def write_tiny_qwen35(path, seed=0, **kw) -> None:
    meta, tensors = tiny_qwen35_tensors(np.random.default_rng(seed), **kw)
    write_gguf(path, meta, tensors)
