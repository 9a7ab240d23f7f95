"""qwen35moe: Hugging Face Qwen3.5-MoE checkpoints -> GGUF (convert.py), run by tinyspec, checked against HF.

HF part (needs torch + transformers, skipped cleanly without them): tiny random Qwen3_5MoeForCausalLM
checkpoints are built in tmp_path, in either expert layout: per expert (mlp.experts.{e}.gate_proj ..., what
transformers 5's save_pretrained writes) or fused (mlp.experts.gate_up_proj [E, 2F, D] / down_proj, the
in-memory parameters), given an `mtp.*` block by hand where the case asks for one (its layer a MoE layer
too, as in the real checkpoints), and converted to f32:
    layout     the GGUF's names, NumPy shapes, ggml types and qwen35moe.* keys (read back by gguf-py too);
               the expert tensors are the HF values, gate / up split out of gate_up_proj
    logits     32-token prompt, tinyspec vs HF logits, max |diff| <= 1e-4; HF is run in float64 (eager
               experts): with 12 experts HF's own float32 run is 2e-4 off its float64 one, tinyspec 3e-5
    decode     prefill 20 tokens, then one token at a time from the carried state, vs the same HF logits
    mtp        tinyspec's MTP head vs a reference built from the checkpoint's mtp.* weights
Hostile files (no torch needed; written with tinyspec's GGUF writer from tests/tiny_models.py): bad expert
counts, a router or expert tensor of the wrong shape, the fused gate/up layout; each must fail to load with a
ValueError subclass (ConfigError / ModelError) whose message names the problem.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from test_convert import V, assert_prompt_and_decode_match, fill, write_tokenizer
from tiny_models import tiny_qwen35_tensors

from tinyspec.convert import convert
from tinyspec.gguf import GGUFValue, GGUFValueType, read_gguf, write_gguf
from tinyspec.quants import GGMLType

D = 64  # hidden size of the HF checkpoints


@dataclass(frozen=True)
class Case:
    name: str
    n_expert: int
    n_used: int
    n_ff_exp: int = 32
    n_ff_shexp: int = 48
    n_k: int = 2
    n_v: int = 4
    layers: tuple = ("linear_attention", "linear_attention", "full_attention", "linear_attention")
    rotary: float = 0.25
    mtp: bool = True
    tied: bool = False
    fused: bool = False  # the checkpoint's expert layout


CASES = [
    Case("E4-top2-mtp", 4, 2),
    Case("E8-top3-R1-nomtp-fused", 8, 3, n_ff_exp=24, n_ff_shexp=40, n_k=2, n_v=2, rotary=0.5, mtp=False, tied=True,
         layers=("full_attention", "linear_attention", "linear_attention"), fused=True),
    Case("E6-top1-R3-mtp-fused", 6, 1, n_ff_exp=16, n_ff_shexp=32, n_k=1, n_v=3, rotary=1.0, fused=True),
    Case("E12-top4-mtp", 12, 4, n_ff_exp=16, n_ff_shexp=16),  # experts.10 sorts before experts.2
]


def fuse(weights: dict, torch) -> dict:
    """Per-expert checkpoint tensors -> the fused [E, 2F, D] gate_up_proj and [E, D, F] down_proj."""
    out, experts = {}, {}
    for name, t in weights.items():
        if m := re.fullmatch(r"(.+\.mlp\.experts)\.(\d+)\.(\w+)\.weight", name):
            experts.setdefault(m[1], {}).setdefault(m[3], {})[int(m[2])] = t
        else:
            out[name] = t
    for prefix, p in experts.items():
        stack = {k: torch.stack([v[e] for e in range(len(v))]) for k, v in p.items()}
        out[f"{prefix}.gate_up_proj"] = torch.cat([stack["gate_proj"], stack["up_proj"]], dim=1).contiguous()
        out[f"{prefix}.down_proj"] = stack["down_proj"].contiguous()
    return out


def unfuse(weights: dict) -> dict:
    """The fused expert parameters (a state_dict's) -> per-expert checkpoint tensors."""
    out = {}
    for name, t in weights.items():
        if name.endswith(".mlp.experts.gate_up_proj"):
            F = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[name.replace("gate_up_proj", f"{e}.gate_proj.weight")] = t[e, :F].contiguous()
                out[name.replace("gate_up_proj", f"{e}.up_proj.weight")] = t[e, F:].contiguous()
        elif name.endswith(".mlp.experts.down_proj"):
            out |= {name.replace("down_proj", f"{e}.down_proj.weight"): t[e].contiguous() for e in range(t.shape[0])}
        else:
            out[name] = t
    return out


def make_checkpoint(tmp_path: Path, case: Case):
    """(HF model in float32, its checkpoint folder, the mtp.* weights as HF tensors) for one case."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from safetensors.torch import load_file, save_file
    from transformers.models.qwen3_5_moe import (
        Qwen3_5MoeForCausalLM,
        Qwen3_5MoeTextConfig,
    )

    cfg = Qwen3_5MoeTextConfig(
        vocab_size=V, hidden_size=D, num_hidden_layers=len(case.layers), num_attention_heads=2, num_key_value_heads=1,
        head_dim=32, linear_num_key_heads=case.n_k, linear_num_value_heads=case.n_v, linear_key_head_dim=16,
        linear_value_head_dim=16, max_position_embeddings=512, tie_word_embeddings=case.tied,
        num_experts=case.n_expert, num_experts_per_tok=case.n_used, moe_intermediate_size=case.n_ff_exp,
        shared_expert_intermediate_size=case.n_ff_shexp, layer_types=list(case.layers),
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": case.rotary,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True},
        eos_token_id=263, pad_token_id=261)
    model = Qwen3_5MoeForCausalLM._from_config(cfg, attn_implementation="eager", experts_implementation="eager").eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(fill(torch, name, p.shape, gen))
    hf_dir = tmp_path / case.name
    model.save_pretrained(hf_dir)
    write_tokenizer(hf_dir)
    (path,) = hf_dir.glob("model*.safetensors")
    weights = load_file(path)
    assert "model.layers.0.mlp.experts.0.gate_proj.weight" in weights  # save_pretrained's per-expert layout

    mtp = {}
    if case.mtp:  # fc, three norms, and one full-attention MoE layer under mtp.*
        full = case.layers.index("full_attention")
        mtp = {"mtp.fc.weight": (D, 2 * D), "mtp.pre_fc_norm_embedding.weight": (D,),
               "mtp.pre_fc_norm_hidden.weight": (D,), "mtp.norm.weight": (D,)}
        mtp |= {f"mtp.layers.0.{n.split('.', 3)[3]}": tuple(p.shape) for n, p in model.state_dict().items()
                if n.startswith(f"model.layers.{full}.")}
        mtp = {n: fill(torch, n, shape, gen) for n, shape in sorted(mtp.items())}  # fused, as a state_dict
        config = json.loads((hf_dir / "config.json").read_text())
        (hf_dir / "config.json").write_text(json.dumps(config | {"mtp_num_hidden_layers": 1}))
    weights |= unfuse(mtp)
    save_file(fuse(weights, torch) if case.fused else weights, path, metadata={"format": "pt"})
    return model, hf_dir, mtp


def mtp_reference(torch, model, mtp: dict, tokens):
    """The MTP head from the checkpoint's mtp.* weights (as tests/test_convert.py's, with a MoE decoder layer)."""
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as hf

    cfg = model.config
    layer = hf.Qwen3_5MoeDecoderLayer(cfg, cfg.layer_types.index("full_attention")).eval().to(model.dtype)
    layer.load_state_dict({n.removeprefix("mtp.layers.0."): t for n, t in mtp.items() if n.startswith("mtp.layers.0.")})

    def norm(name):
        rms = hf.Qwen3_5MoeRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        rms.weight.data = mtp[name]
        return rms

    with torch.no_grad():
        ids = torch.from_numpy(tokens)[None]
        hidden = model.model(ids).last_hidden_state
        h_prev = torch.cat([torch.zeros_like(hidden[:, :1]), hidden[:, :-1]], dim=1)
        e = norm("mtp.pre_fc_norm_embedding.weight")(model.model.embed_tokens(ids))
        y = torch.cat([e, norm("mtp.pre_fc_norm_hidden.weight")(h_prev)], dim=-1) @ mtp["mtp.fc.weight"].T
        T = ids.shape[1]
        pos = torch.arange(T)[None]
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        y = layer(y, position_embeddings=model.model.rotary_emb(y, pos), attention_mask=mask, position_ids=pos)
        y = y[0] if isinstance(y, tuple) else y
        return model.lm_head(norm("mtp.norm.weight")(y))[0].numpy()


def expected_layout(case: Case) -> dict[str, tuple[tuple[int, ...], GGMLType]]:
    """Every FFN tensor of every block: NumPy shape and storage type in an f32 file."""
    E, Fe, Fs, F32 = case.n_expert, case.n_ff_exp, case.n_ff_shexp, GGMLType.F32
    per_layer = {"ffn_gate_inp.weight": (E, D), "ffn_gate_exps.weight": (E, Fe, D), "ffn_up_exps.weight": (E, Fe, D),
                 "ffn_down_exps.weight": (E, D, Fe), "ffn_gate_inp_shexp.weight": (1, D),
                 "ffn_gate_shexp.weight": (Fs, D), "ffn_up_shexp.weight": (Fs, D), "ffn_down_shexp.weight": (D, Fs)}
    return {f"blk.{i}.{n}": (s, F32) for i in range(len(case.layers) + case.mtp) for n, s in per_layer.items()}


# ---------------------------------------------------------------------------------------------- layout


@pytest.mark.parametrize("case", CASES[:2] + CASES[3:], ids=lambda c: c.name)
def test_converted_layout(tmp_path, case):
    """Names, NumPy shapes, types and values of the MoE tensors; the qwen35moe.* keys with their value types;
    gguf-py reads the file and names every tensor of it as a QWEN35MOE tensor."""
    model, hf_dir, _ = make_checkpoint(tmp_path, case)
    out = tmp_path / "m.gguf"
    convert(hf_dir, out, "f32")
    g = read_gguf(out)
    m, arch = g.metadata, "qwen35moe"
    assert m["general.architecture"] == arch and not [k for k in m if k.startswith("qwen35.")]
    n_blocks = len(case.layers) + case.mtp
    want = {"block_count": n_blocks, "expert_count": case.n_expert, "expert_used_count": case.n_used,
            "expert_feed_forward_length": case.n_ff_exp, "expert_shared_feed_forward_length": case.n_ff_shexp,
            "embedding_length": D, "ssm.group_count": case.n_k, "ssm.time_step_rank": case.n_v,
            "rope.dimension_count": int(32 * case.rotary)}
    for key, value in want.items():
        assert m[f"{arch}.{key}"] == value and g.fields[f"{arch}.{key}"].type == GGUFValueType.UINT32, key
    assert f"{arch}.feed_forward_length" not in m  # the MoE config has no intermediate_size
    assert (f"{arch}.nextn_predict_layers" in m) == case.mtp
    keys = list(m)  # llama.cpp's order: expert counts after the rms epsilon, expert widths after file_type
    assert keys.index(f"{arch}.attention.layer_norm_rms_epsilon") < keys.index(f"{arch}.expert_count") \
        < keys.index(f"{arch}.expert_used_count") < keys.index(f"{arch}.attention.key_length")
    assert keys.index("general.file_type") < keys.index(f"{arch}.expert_feed_forward_length") \
        < keys.index(f"{arch}.expert_shared_feed_forward_length") < keys.index(f"{arch}.ssm.conv_kernel")
    assert m["general.size_label"].startswith(f"{case.n_expert}x")

    for name, (shape, qtype) in expected_layout(case).items():
        assert g.tensors[name].shape == shape and g.tensors[name].ggml_type == qtype, name
    assert not [n for n in g.tensors if "ffn_gate.weight" in n or "gate_up" in n or ".ffn_up.weight" in n]
    hf = {n: t.numpy() for n, t in model.state_dict().items()}  # fused, whatever the checkpoint's layout
    gate_up, down = hf["model.layers.1.mlp.experts.gate_up_proj"], hf["model.layers.1.mlp.experts.down_proj"]
    Fe = case.n_ff_exp
    for name, value in (("ffn_gate_exps", gate_up[:, :Fe]), ("ffn_up_exps", gate_up[:, Fe:]), ("ffn_down_exps", down),
                        ("ffn_gate_inp", hf["model.layers.1.mlp.gate.weight"]),
                        ("ffn_gate_inp_shexp", hf["model.layers.1.mlp.shared_expert_gate.weight"]),
                        ("ffn_down_shexp", hf["model.layers.1.mlp.shared_expert.down_proj.weight"])):
        got = g.raw(f"blk.1.{name}.weight").view(np.float32).reshape(value.shape)
        assert np.array_equal(got, value), name
    block = [n.split(".", 2)[2] for n in g.tensors if n.startswith("blk.1.")]  # the checkpoint's sorted order
    assert block[block.index("ffn_down_exps.weight"):][:4] == ["ffn_down_exps.weight", "ffn_gate_exps.weight",
                                                               "ffn_up_exps.weight", "ffn_gate_inp.weight"]

    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(out)
    known = {gguf.TENSOR_NAMES[t].format(bid=i) for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.QWEN35MOE]
             for i in range(n_blocks)}
    for t in reader.tensors:  # every name is one of llama.cpp's qwen35moe tensors (gguf 0.19 lacks the nextn ones)
        assert ".nextn." in t.name or t.name.removesuffix(".weight").removesuffix(".bias") in known, t.name
    exps = next(t for t in reader.tensors if t.name == "blk.0.ffn_gate_exps.weight")
    assert list(exps.shape) == [D, case.n_ff_exp, case.n_expert]  # ggml order {D, F_e, E}
    shexp_gate = next(t for t in reader.tensors if t.name == "blk.0.ffn_gate_inp_shexp.weight")
    assert list(shexp_gate.shape) == [D, 1]


def test_q8_0_keeps_routers_f32(tmp_path):
    """q8_0: the 3-D expert tensors are quantized (rows of D = 64), ffn_down_exps (rows of F_e = 32) too,
    both routers stay F32 as llama.cpp's converter keeps them."""
    _, hf_dir, _ = make_checkpoint(tmp_path, CASES[0])
    convert(hf_dir, tmp_path / "q.gguf", "q8_0")
    t = read_gguf(tmp_path / "q.gguf").tensors
    assert t["blk.0.ffn_gate_inp.weight"].ggml_type == GGMLType.F32
    assert t["blk.0.ffn_gate_inp_shexp.weight"].ggml_type == GGMLType.F32
    for name in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_shexp"):
        assert t[f"blk.0.{name}.weight"].ggml_type == GGMLType.Q8_0, name
    assert t["blk.0.ffn_gate_exps.weight"].shape == (4, 32, D)


# ---------------------------------------------------------------------------------------------- vs HF


def load_model(path):
    """tinyspec's Model for a qwen35moe file; a skip while the MoE loader is not there."""
    from tinyspec.model import Model

    try:
        return Model.from_gguf(path)
    except ValueError as e:  # ConfigError / ModelError of a loader without qwen35moe
        if "qwen35moe" in str(e) and "not supported" in str(e):
            pytest.skip(f"tinyspec's loader does not run qwen35moe yet: {e}")
        raise


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_logits_match_hf(tmp_path, case):
    """Converted and run by tinyspec: HF's logits to 1e-4 as one 32-token prompt and as prefill 20 + decode
    steps; the MTP head to 1e-4 as well."""
    model, hf_dir, mtp = make_checkpoint(tmp_path, case)
    import torch

    out = tmp_path / "m.gguf"
    convert(hf_dir, out, "f32")
    ours = load_model(out)
    tokens = np.random.default_rng(1).integers(0, V, 32)
    model, mtp = model.double(), {n: t.double() for n, t in mtp.items()}  # the float32 weights, exactly
    with torch.no_grad():
        ref = model(torch.from_numpy(tokens)[None]).logits[0].numpy()

    hidden = assert_prompt_and_decode_match(ours, tokens, ref, 20, case.name)
    assert ours.cfg.n_nextn == int(case.mtp) and ("output.weight" in ours.tensors) == (not case.tied)

    if case.mtp:
        from tinyspec.mtp import MTPHead, shift_hidden

        head = MTPHead(ours)
        mtp_logits, _ = head.forward(tokens, shift_hidden(hidden), head.new_cache())
        mtp_ref = mtp_reference(torch, model, mtp, tokens)
        assert np.abs(mtp_logits - mtp_ref).max() <= 1e-4, \
            f"{case.name}: MTP logits differ by {np.abs(mtp_logits - mtp_ref).max():.2e}"


# ---------------------------------------------------------------------------------------------- hostile files

E, K_USED, FE, FS = 4, 2, 16, 24  # the hostile files' valid baseline (D = 32 in tiny_models)


def hostile(meta_edit=None, tensor_edit=None):
    """A valid tiny qwen35moe (metadata, tensors) with one thing broken by the edit functions."""
    meta, t = tiny_qwen35_tensors(np.random.default_rng(0), experts=(E, K_USED, FE, FS))
    if meta_edit:
        meta_edit(meta)
    if tensor_edit:
        tensor_edit(t)
    return meta, t


def set_key(key, value):
    return lambda m: m.__setitem__(f"qwen35moe.{key}", GGUFValue(GGUFValueType.UINT32, value))


def set_tensor(name, shape):
    return lambda t: t.__setitem__(name, np.zeros(shape, np.float32))


def fuse_gate_up(t):
    for i in range(5):
        p = f"blk.{i}."
        t[p + "ffn_gate_up_exps.weight"] = np.concatenate([t.pop(p + "ffn_gate_exps.weight"),
                                                           t.pop(p + "ffn_up_exps.weight")], axis=1)


HOSTILE = {  # id -> (metadata edit, tensor edit, what the message must name)
    "expert-count-0": (set_key("expert_count", 0), None, r"expert_count"),
    "top-k-over-count": (set_key("expert_used_count", E + 1), None, r"expert_used_count = 5 exceeds expert_count = 4"),
    "top-k-0": (set_key("expert_used_count", 0), None, r"expert_used_count"),
    "no-expert-width": (lambda m: m.pop("qwen35moe.expert_feed_forward_length"), None,
                        r"expert_feed_forward_length"),
    "router-wrong-shape": (None, set_tensor("blk.1.ffn_gate_inp.weight", (E + 1, 32)), r"blk\.1\.ffn_gate_inp\.weight"),
    "router-transposed": (None, set_tensor("blk.0.ffn_gate_inp.weight", (32, E)), r"blk\.0\.ffn_gate_inp\.weight"),
    "experts-count-disagrees": (None, set_tensor("blk.2.ffn_up_exps.weight", (E - 1, FE, 32)),
                                r"blk\.2\.ffn_up_exps\.weight"),
    "down-experts-count-disagrees": (None, set_tensor("blk.3.ffn_down_exps.weight", (E + 2, 32, FE)),
                                     r"blk\.3\.ffn_down_exps\.weight"),
    "expert-width-disagrees": (None, set_tensor("blk.0.ffn_gate_exps.weight", (E, FE + 1, 32)),
                               r"blk\.0\.ffn_gate_exps\.weight"),
    "mtp-experts-disagree": (None, set_tensor("blk.4.ffn_down_exps.weight", (E, 32, FE * 2)),
                             r"blk\.4\.ffn_down_exps\.weight"),
    "dense-ffn-in-moe-file": (None, lambda t: [t.pop(f"blk.1.{n}.weight") for n in ("ffn_gate_exps", "ffn_up_exps")]
                              + [t.update({"blk.1.ffn_gate.weight": np.zeros((48, 32), np.float32)})],
                              r"blk\.1\.ffn_gate_exps\.weight"),
    "missing-shared-expert": (None, lambda t: t.pop("blk.2.ffn_up_shexp.weight"), r"blk\.2\.ffn_up_shexp\.weight"),
    "shared-gate-wrong-shape": (None, set_tensor("blk.0.ffn_gate_inp_shexp.weight", (2, 32)),
                                r"blk\.0\.ffn_gate_inp_shexp\.weight"),
    "fused-gate-up": (None, fuse_gate_up, r"ffn_gate_up_exps"),
}


def test_hostile_baseline_loads(tmp_path):
    """The unbroken file of the hostile cases loads (so each failure below is its one edit's)."""
    meta, t = hostile()
    write_gguf(tmp_path / "ok.gguf", meta, t)
    model = load_model(tmp_path / "ok.gguf")
    assert model.cfg.n_expert == E and model.cfg.n_expert_used == K_USED
    logits, _ = model.forward(np.arange(5), model.new_state())
    assert logits.shape[0] == 5 and np.isfinite(logits).all()
    from tinyspec.mtp import MTPHead

    MTPHead(model)  # the MTP block (blk.4) is a MoE block too, and builds


@pytest.mark.parametrize("case", list(HOSTILE), ids=str)
def test_hostile_files_refused(tmp_path, case):
    """Refused by Model.from_gguf, or for the MTP block's tensors by MTPHead (which checks them, as for qwen35)."""
    from tinyspec.model import Model
    from tinyspec.mtp import MTPHead

    meta_edit, tensor_edit, message = HOSTILE[case]
    meta, t = hostile(meta_edit, tensor_edit)
    path = tmp_path / f"{case}.gguf"
    write_gguf(path, meta, t)
    try:
        MTPHead(Model.from_gguf(path))
    except ValueError as e:
        if "qwen35moe" in str(e) and "not supported" in str(e):
            pytest.skip(f"tinyspec's loader does not run qwen35moe yet: {e}")
        assert type(e) is not ValueError, f"a bare ValueError, not ConfigError / ModelError: {e}"
        assert re.search(message, str(e)), f"{case}: message {str(e)!r} does not name {message!r}"
    else:
        pytest.fail(f"{case}: the file loaded")
