"""Train the tiny qwen35 models tinyspec ships: a target with an MTP (nextn) head, and a draft model.

    python tools/train_tiny.py all --out .cache/train            # tokenizer, target, draft, GGUFs (<= 90 min, 2 cores)
    python tools/train_tiny.py target --out .cache/train --steps 100 --preset smoke   # a quick look
    python tools/train_tiny.py corpus --preset gpu                # here: tokenizer + encoded corpus in .cache/gpu, then
    python tools/train_tiny.py target --preset gpu --device cuda --minutes 4.3   # on a lent GPU (tools/gpu_session.sh)

Needs the `train` extra (torch, transformers, tokenizers, safetensors): pip install -e ".[train]".

What it does, step by step (every step is deterministic given --seed and --steps):
  1. corpus      the pure-Python standard library of the running interpreter (Lib/**/*.py without tests and
                 site-packages), files sorted by path; every 50th file (by CRC32 of its relative path) is held out.
                 The gpu preset adds the sources of torch and transformers (pinned by the train extra; their
                 held-out 50th left unused) and draws `stdlib_frac` of its rows from the standard library's part.
                 With --dedup (the gpu preset's default) the training files are cleaned first by
                 tools/corpus_dedup.py (license headers, generated and data files, copies, repeated blocks).
                 The ids are cached in <out>/tokens.npz with the corpus's description: a machine with other
                 sources (a GPU machine) trains from the folder, not from its own files.
  2. tokenizer   a byte-level BPE trained on the training files with the HF `tokenizers` library, split by the
                 qwen35 pre-tokenizer regex, so llama.cpp (tokenizer.ggml.pre = "qwen35") tokenizes as it does.
                 One special token, <|endoftext|>, separates files and is the end-of-generation token.
  3. target      HF `Qwen3_5ForCausalLM` (Gated DeltaNet layers, full attention every 4th layer) plus an MTP block
                 in the layout of the real checkpoints (`mtp.fc`, `mtp.pre_fc_norm_embedding`,
                 `mtp.pre_fc_norm_hidden`, `mtp.layers.0.*`, `mtp.norm`), trained with the joint loss

                     L = CE(lm_head(h_p), x_{p+1}) + w1 CE(mtp_1(x_p, h_{p-1}), x_{p+1}) + w2 CE(mtp_2, x_{p+2})

                 where mtp_1 is the head at depth 1 exactly as tinyspec.mtp computes it (row p pairs token x_p with
                 the trunk's post-norm hidden h_{p-1}, zeros at p = 0, and predicts x_{p+1}), and mtp_2 chains the
                 head once more on its own output h_mtp with the next token, as MTPDrafter drafts at depth 2.
                 Some rows get a planted copy (a span repeated a little later, sometimes with an edit;
                 plant_copies), a quarter of them in the main phase and three quarters in a copy phase, so
                 the model learns to copy by content (induction); then an edit phase plants copies of whole
                 lines after an edited first line (plant_edits), the shape of an "edit this code" answer.
  4. draft       a smaller Qwen3_5ForCausalLM with the same tokenizer (plain next-token loss) for --spec draft.
  5. export      save_pretrained + the mtp.* tensors -> tinyspec.convert (llama.cpp's layout) -> GGUF with the
                 training record in `training.*` metadata keys (corpus, seconds, tokens, final losses, and
                 `training.token_ranking`: token ids by training-corpus frequency, for --draft-vocab); beside
                 it tiny-NAME.residual.gguf, its Q8_0 rounding (tools/gguf_residual.py), which --init adds back.

Checkpoints (`<out>/<model>/ckpt.pt`) are written every --ckpt-every steps and a run resumes from them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import sysconfig
import time
import zlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))  # corpus_dedup and gguf_residual, when loaded as a module rather than run

QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
EOT = "<|endoftext|>"


@dataclass(frozen=True)
class Arch:
    hidden: int
    ffn: int
    layers: int
    heads: int = 4
    kv_heads: int = 1
    head_dim: int = 64
    gdn_k_heads: int = 2
    gdn_v_heads: int = 4
    gdn_dim: int = 32
    interval: int = 4
    mtp: bool = True


@dataclass(frozen=True)
class Recipe:
    arch: Arch
    steps: int
    batch: int
    seq: int
    lr: float
    warmup: int = 50
    mtp_w1: float = 0.5
    mtp_w2: float = 0.25
    copy_frac_main: float = 0.0  # share of rows with a planted copy (plant_copies) during the main steps
    copy_steps: int = 0  # a second phase after `steps`, at a constant learning rate, that teaches copying
    copy_frac: float = 0.5  # share of rows with a planted copy in that phase
    copy_lr: float = 6e-4  # its constant learning rate (constant, so a longer copy phase resumes exactly)
    edit_steps: int = 0  # a third phase, same rate: rows that copy lines of code after an edited first line
    edit_frac: float = 0.75  # share of rows with a planted edit in that phase
    stdlib_frac: float = 0.0  # share of rows drawn from the standard library's tokens (the head of the stream)

    @property
    def total_steps(self) -> int:
        return self.steps + self.copy_steps + self.edit_steps


PRESETS = {
    # what ships: a ~3.7 M-parameter target (~4 MB at Q8_0) and a ~1.1 M-parameter draft, 4096-token vocabulary,
    # 2.0 M + 1.2 M training tokens: sized for well under 90 minutes on 2 busy CPU cores (~3 s per target step
    # when the machine is quiet; smaller models learn more per FLOP at this budget).
    "ship": {"vocab": 4096,
             "target": Recipe(Arch(hidden=192, ffn=512, layers=6, heads=3, interval=3), steps=500, batch=16, seq=256,
                              lr=2e-3, copy_frac_main=0.25, copy_steps=600, copy_frac=0.75, edit_steps=400),
             "draft": Recipe(Arch(hidden=128, ffn=320, layers=3, heads=2, interval=3, mtp=False), steps=300, batch=16,
                             seq=256, lr=3e-3)},
    # a lent GPU's run (--device cuda --minutes M, target and draft side by side): more Python (the standard
    # library plus the sources of the two packages the train extra pins), an 8192-token vocabulary, a ~9 M-parameter
    # target and a ~3 M-parameter draft (~13 MB at Q8_0 together). Step counts here are placeholders in the
    # phases' proportions: --minutes scales them to the budget and the log prints what reproduces the run.
    # dedup: the training texts cleaned by tools/corpus_dedup.py (license headers, generated and data files, copies,
    # repeated 6-line blocks; held-out files untouched), a corpus that repeats itself less (issue 49, item 1).
    "gpu": {"vocab": 8192, "packages": ("torch", "transformers"), "dedup": True,
            "target": Recipe(Arch(hidden=320, ffn=768, layers=6, heads=5, kv_heads=1, gdn_k_heads=4, gdn_v_heads=8,
                                  gdn_dim=32, interval=3), steps=3000, batch=64, seq=512, lr=1.5e-3, warmup=100,
                             copy_frac_main=0.1, copy_steps=175, copy_frac=0.5, copy_lr=1.5e-4, edit_steps=350,
                             edit_frac=0.5, stdlib_frac=0.25),
            "draft": Recipe(Arch(hidden=192, ffn=448, layers=4, heads=3, kv_heads=1, gdn_k_heads=2, gdn_v_heads=4,
                                 gdn_dim=32, interval=4, mtp=False), steps=3000, batch=64, seq=512, lr=2e-3,
                            warmup=100, copy_frac_main=0.2)},
    # a minute-long end-to-end run of every step, for tests and for trying the tool
    "smoke": {"vocab": 512,
              "target": Recipe(Arch(hidden=64, ffn=96, layers=4, heads=2, head_dim=32, gdn_dim=16), steps=20,
                               batch=4, seq=64, lr=3e-3, warmup=5),
              "draft": Recipe(Arch(hidden=32, ffn=64, layers=2, heads=2, head_dim=16, gdn_dim=16, interval=2,
                                   mtp=False), steps=10, batch=4, seq=64, lr=3e-3, warmup=5)},
}
# "gpu" with a wider target shipped in Q4_K_M (the preset's "outtype"; q8_0 when a preset names none): hidden 320 ->
# 512 and 4 attention heads, so that every weight row is a multiple of 256 and llama-quantize's Q4_K_M rules give
# Q4_K / Q6_K everywhere (at hidden 320 they fall back to Q5_0 / Q8_0). 16.50 M parameters, 11.06 MB at Q4_K_M
# against gpu's 10.38 M at 11.38 MB (Q8_0); with gpu's 3.55 MB draft 14.6 MB ship. Sizes: tools/preset_size.py;
# the choice among shapes of that size: docs/performance-log.md, 2026-11-28 "Q4_K_M or Q8_0 for the shipped target".
# Vocabulary, corpus, draft and recipe are gpu's (its step counts are placeholders that --minutes scales).
PRESETS["gpu-q4k"] = PRESETS["gpu"] | {"outtype": "q4_k_m", "target": replace(
    PRESETS["gpu"]["target"], arch=replace(PRESETS["gpu"]["target"].arch, hidden=512, heads=4))}
# the next lent GPU's run goes on from what ships (--init tinyspec/assets/tiny-*.gguf, tools/gpu_session.sh): gpu's
# shapes on its deduplicated corpus, encoded with the shipped tokenizer (`corpus --tokenizer-from`). The target warms
# up again to a third of the first run's rate and plants copies in 30% of its rows while the rate decays, then ends
# in an edit phase at gpu's rate. Why not a copy phase at the end: on two cores (docs/performance-log.md 2026-11-28)
# a constant 3e-4 for 400 steps of 16 x 512 lifted lookup on edit prompts 2.20 -> 3.28 tokens a pass but cost 3.2%
# held-out nats/byte, and 1e-4 for 200 steps neither lifted lookup nor kept MTP (3.20 -> 3.00 a pass): copying has to
# be learnt while the rate is high and settle as it decays. Steps are proportions that --minutes scales.
PRESETS["gpu-continue"] = PRESETS["gpu"] | {
    "target": replace(PRESETS["gpu"]["target"], steps=1500, warmup=50, lr=5e-4, copy_frac_main=0.3, copy_steps=0,
                      edit_steps=500, copy_lr=1.5e-4),
    "draft": replace(PRESETS["gpu"]["draft"], steps=1000, warmup=50, lr=7e-4)}


def keep_freed_memory() -> None:
    """Ask glibc malloc to keep freed memory instead of returning every large activation buffer to the
    kernel (mmap/munmap + page faults on each step): measured here 274 -> 1388 tokens/s, with top showing 50%
    system time before. Same as MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ in the environment."""
    import ctypes
    import ctypes.util

    if sys.platform.startswith("linux") and (name := ctypes.util.find_library("c")):
        libc = ctypes.CDLL(name)
        libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD: allocations below 1 GiB come from the heap
        libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD: keep up to 2 GiB of free heap top


def say(msg: str) -> None:
    print(f"[train_tiny {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------- 1. corpus


def corpus_files(root: Path | None = None, max_files: int | None = None) -> tuple[Path, list[Path], list[Path]]:
    """(root, train files, held-out files) of the interpreter's pure-Python standard library, sorted by path."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if not {"test", "tests", "site-packages", "idle_test"}
                   & set(p.relative_to(root).parts))
    files = files[:max_files] if max_files else files
    held = [p for p in files if zlib.crc32(str(p.relative_to(root)).encode()) % 50 == 0] or files[-1:]
    return root, [p for p in files if p not in held], held


def package_files(names: tuple[str, ...]) -> tuple[list[Path], list[Path]]:
    """(train files, held-out files) of installed packages' Python sources (without their tests), sorted by
    path; every 50th file by CRC32 of "package/relative/path" held out, as corpus_files does. The packages are
    the ones the `train` extra pins (torch, transformers), so every machine that installs it reads the same files.
    find_spec locates a package without importing it."""
    import importlib.util

    train, held = [], []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(f"--packages: {name} is not installed (pip install -e \".[train]\")")
        root = Path(next(iter(spec.submodule_search_locations)))
        for p in sorted(root.rglob("*.py")):
            rel = p.relative_to(root.parent)
            if {"test", "tests", "testing"} & set(rel.parts):
                continue
            (held if zlib.crc32(str(rel).encode()) % 50 == 0 else train).append(p)
    return train, held


def read_texts(files: list[Path]) -> list[str]:
    out = []
    for p in files:
        try:
            out.append(p.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            pass
    return out


# -------------------------------------------------------------------------------------------- 2. tokenizer


def train_tokenizer(texts: list[str], vocab: int, out: Path):
    """A byte-level BPE with the qwen35 split regex, `vocab` ids in all (the last one is <|endoftext|>)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab - 1, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False, special_tokens=[])
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens([EOT])
    assert tok.get_vocab_size() == vocab and tok.token_to_id(EOT) == vocab - 1, tok.get_vocab_size()
    save_tokenizer(tok, out)
    return tok


def save_tokenizer(tok, out: Path) -> None:
    """tokenizer.json and the tokenizer_config.json that export_hf copies beside the HF checkpoint."""
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOT, "pad_token": EOT, "bos_token": None}))


def tokenizer_from_gguf(path: Path):
    """The byte-level BPE a qwen35 GGUF carries (tokenizer.ggml.tokens / merges / token_type), rebuilt as an HF
    `tokenizers` BPE with train_tokenizer's pre-tokenizer and decoder: continuing a shipped model needs its token
    ids, and the folder its BPE was trained into stayed on the machine that trained it. The normal tokens (type 1)
    are the BPE's vocabulary; <|endoftext|> (the last id) is added as the special token, as train_tokenizer adds it.
    Checked id for id against tinyspec.tokenizer (tests/test_train_tiny.py)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    from tinyspec.gguf import read_gguf

    with read_gguf(path) as g:
        meta = g.metadata
    if meta.get("tokenizer.ggml.model") != "gpt2" or meta.get("tokenizer.ggml.pre") != "qwen35":
        raise SystemExit(f"{path}: not a qwen35 byte-level BPE (tokenizer.ggml.model "
                         f"{meta.get('tokenizer.ggml.model')!r}, pre {meta.get('tokenizer.ggml.pre')!r})")
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    if tokens[-1] != EOT or sum(int(t) != 1 for t in types) != 1:
        raise SystemExit(f"{path}: its vocabulary does not end in the one special token {EOT} train_tiny writes")
    vocab = {t: i for i, t in enumerate(tokens[:-1])}
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOT])
    assert tok.get_vocab_size() == len(tokens) and tok.token_to_id(EOT) == len(tokens) - 1
    return tok


def encode_corpus(tok, texts: list[str]) -> np.ndarray:
    """All texts as one int32 stream, <|endoftext|> after each."""
    eot = tok.token_to_id(EOT)
    ids = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eot)
    return np.asarray(ids, dtype=np.int32)


# ------------------------------------------------------------------------------------------------ 3. models


def hf_config(arch: Arch, vocab: int, eot: int):
    from transformers.models.qwen3_5 import Qwen3_5TextConfig

    layer_types = ["full_attention" if (i + 1) % arch.interval == 0 else "linear_attention" for i in range(arch.layers)]
    return Qwen3_5TextConfig(
        vocab_size=vocab, hidden_size=arch.hidden, intermediate_size=arch.ffn, num_hidden_layers=arch.layers,
        num_attention_heads=arch.heads, num_key_value_heads=arch.kv_heads, head_dim=arch.head_dim,
        linear_num_key_heads=arch.gdn_k_heads, linear_num_value_heads=arch.gdn_v_heads,
        linear_key_head_dim=arch.gdn_dim, linear_value_head_dim=arch.gdn_dim, linear_conv_kernel_dim=4,
        max_position_embeddings=4096, tie_word_embeddings=True, layer_types=layer_types,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        eos_token_id=eot, pad_token_id=eot, bos_token_id=None)


def build(torch, arch: Arch, vocab: int, eot: int):
    """(HF Qwen3_5ForCausalLM, MTP block or None). The MTP block's layer is a full-attention decoder layer."""
    from transformers.models.qwen3_5 import Qwen3_5ForCausalLM
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    cfg = hf_config(arch, vocab, eot)
    model = Qwen3_5ForCausalLM._from_config(cfg, attn_implementation="sdpa")
    if not arch.mtp:
        return model, None
    mtp = torch.nn.Module()
    mtp.fc = torch.nn.Linear(2 * arch.hidden, arch.hidden, bias=False)
    mtp.pre_fc_norm_embedding = hf.Qwen3_5RMSNorm(arch.hidden, eps=cfg.rms_norm_eps)
    mtp.pre_fc_norm_hidden = hf.Qwen3_5RMSNorm(arch.hidden, eps=cfg.rms_norm_eps)
    mtp.layers = torch.nn.ModuleList([hf.Qwen3_5DecoderLayer(cfg, cfg.layer_types.index("full_attention"))])
    mtp.norm = hf.Qwen3_5RMSNorm(arch.hidden, eps=cfg.rms_norm_eps)
    with torch.no_grad():  # HF's _init_weights for the new block
        torch.nn.init.normal_(mtp.fc.weight, std=cfg.initializer_range)
        for name, p in mtp.layers.named_parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=cfg.initializer_range)
            elif "norm" in name:
                p.zero_()
    return model, mtp


def init_from_gguf(torch, model, mtp, path: Path, residual: Path | None = None) -> int:
    """Load a qwen35 GGUF's weights (dequantized: a Q8_0 file gives its rounded values) into a freshly built model
    of the same shape, undoing tinyspec.convert: each HF name maps to its GGUF name (convert.gguf_name), and
    convert.transform is inverted (norm weights stored as 1 + w, ssm_a = -exp(A_log), value heads tiled for ggml,
    the conv weight squeezed). Continues training from a shipped file whose float checkpoint is gone (a lent GPU
    keeps it). residual: the file's `.residual.gguf` (export writes it; tools/gguf_residual.py), added to the
    dequantized values, so the weights come back to ~2e-5 of each 32-block's largest value instead of ~4e-3; one
    written for other weights is an error. Returns the number of tensors loaded; a missing or misshapen tensor is
    an error."""
    from gguf_residual import read_residual

    from tinyspec.convert import gguf_name, tile_v_heads
    from tinyspec.gguf import read_gguf
    from tinyspec.quants import dequantize

    cfg = model.config.to_dict()
    n_trunk = cfg["num_hidden_layers"]
    params = dict(model.state_dict()) | ({f"mtp.{n}": t for n, t in mtp.state_dict().items()} if mtp else {})
    if cfg.get("tie_word_embeddings"):
        params.pop("lm_head.weight", None)  # the embedding's own tensor
    loaded = 0
    try:
        correction = read_residual(path, residual) if residual is not None else {}
    except ValueError as e:
        raise SystemExit(f"--init {path}: {e}") from None
    with read_gguf(path) as g:
        for hf, dest in params.items():
            name = gguf_name(hf, n_trunk)
            if name not in g.tensors:
                raise SystemExit(f"--init {path}: no tensor {name} for {hf}: not a file of this preset's shape")
            t = g.tensors[name]
            x = dequantize(g.raw(name), t.ggml_type, t.shape).astype(np.float64)
            if name in correction:
                x += correction[name]
            kind = name.split(".")[2] if name.startswith("blk.") else name
            if name.endswith("norm.weight") and kind != "ssm_norm":
                x = x - 1.0
            if kind == "ssm_a":
                x = np.log(-x)
            if cfg["linear_num_key_heads"] != cfg["linear_num_value_heads"]:  # undo tile_v_heads by its inverse order
                dv, qk = cfg["linear_value_head_dim"], 2 * cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"]
                how = {"attn_qkv": (0, dv, qk), "ssm_conv1d": (0, dv, qk), "attn_gate": (0, dv, 0),
                       "ssm_alpha": (0, 1, 0), "ssm_beta": (0, 1, 0), "ssm_a": (0, 1, 0), "ssm_dt": (0, 1, 0),
                       "ssm_out": (1, dv, 0)}.get(kind)
                if how:
                    axis, head_dim, skip = how
                    order = tile_v_heads(np.arange(x.shape[axis]), 0, cfg, head_dim, skip)
                    x = np.take(x, np.argsort(order), axis=axis)
            if x.size != dest.numel():
                raise SystemExit(f"--init {path}: {name} has {x.size} values, {hf} wants {tuple(dest.shape)}")
            with torch.no_grad():
                dest.copy_(torch.from_numpy(x.reshape(tuple(dest.shape))).to(dest.dtype))
            loaded += 1
    return loaded


def mtp_forward(torch, model, mtp, ids, e, h_prev):
    """One depth of the MTP head on every row: tokens' embeddings e [B, T, D] with the hidden rows that predicted
    them h_prev [B, T, D] -> (logits [B, T, V], h_mtp [B, T, D]); positions 0..T-1, causal attention."""
    y = mtp.fc(torch.cat([mtp.pre_fc_norm_embedding(e), mtp.pre_fc_norm_hidden(h_prev)], dim=-1))
    pos = torch.arange(ids.shape[1], device=ids.device)[None].expand(ids.shape[0], -1)
    y = mtp.layers[0](y, position_embeddings=model.model.rotary_emb(y, pos), attention_mask=None, position_ids=pos)
    y = y[0] if isinstance(y, tuple) else y
    h_mtp = mtp.norm(y)
    return model.lm_head(h_mtp), h_mtp


def losses(torch, model, mtp, ids, recipe: Recipe):
    """(total, main CE, MTP depth-1 CE, MTP depth-2 CE) on a batch ids [B, T+2]."""
    F = torch.nn.functional
    x = ids[:, :-2]  # [B, T] inputs; targets x_{p+1} = ids[:, 1:-1], x_{p+2} = ids[:, 2:]
    h = model.model(input_ids=x).last_hidden_state  # post final norm, [B, T, D]
    V = model.config.vocab_size
    main = F.cross_entropy(model.lm_head(h).reshape(-1, V), ids[:, 1:-1].reshape(-1))
    if mtp is None:
        return main, main, None, None
    emb = model.model.embed_tokens
    # depth 1, row p: token x_p with h_{p-1} (zeros at p = 0) -> x_{p+1}
    h_prev = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], dim=1)
    logits1, h1 = mtp_forward(torch, model, mtp, x, emb(x), h_prev)
    l1 = F.cross_entropy(logits1.reshape(-1, V), ids[:, 1:-1].reshape(-1))
    # depth 2, row p: token x_{p+1} with the depth-1 h_mtp of row p -> x_{p+2} (the drafter's chained step)
    logits2, _ = mtp_forward(torch, model, mtp, ids[:, 1:-1], emb(ids[:, 1:-1]), h1)
    l2 = F.cross_entropy(logits2.reshape(-1, V), ids[:, 2:].reshape(-1))
    return main + recipe.mtp_w1 * l1 + recipe.mtp_w2 * l2, main, l1, l2


# ---------------------------------------------------------------------------------------------- training


def windows(stream: np.ndarray, n: int, length: int, rng: np.random.Generator, head: int = 0,
            head_frac: float = 0.0) -> np.ndarray:
    """n windows of `length` tokens at random places of the stream; with head_frac, that share of them (in
    expectation) from its first `head` tokens: the standard library, which a corpus with packages would
    otherwise drown (it is ~12% of the gpu preset's characters, and the held-out files are stdlib files)."""
    if head_frac and head > length:
        from_head = rng.random(n) < head_frac
        start = np.where(from_head, rng.integers(0, head - length, size=n), rng.integers(0, stream.size - length, size=n))
    else:
        start = rng.integers(0, stream.size - length, size=n)
    return np.stack([stream[s:s + length] for s in start]).astype(np.int64)


def plant_copies(batch: np.ndarray, rng: np.random.Generator, frac: float) -> np.ndarray:
    """In a share `frac` of the rows, overwrite a later span with a copy of an earlier one, in place:

        row = [ ... A ... gap ... A' ... ]      A: n tokens at a random place, 16 <= n < len/2; gap: 0-8 tokens

    and in half of the copies one or two tokens of A' replaced by other tokens of the row (an edit).
    The distance between A and A' varies, so the model cannot learn "repeat what was 129 tokens back"
    (a fixed-offset head, which is what our first copy phase with [A, A] halves taught): it has to find
    where it is in A by content (an induction head) and pick the copy up again after an edit."""
    length = batch.shape[1]
    for row in np.flatnonzero(rng.random(len(batch)) < frac):
        n = int(rng.integers(16, length // 2 - 4))
        gap = int(rng.integers(0, 9))
        at = int(rng.integers(0, length - 2 * n - gap + 1))
        copy = batch[row, at:at + n].copy()
        if rng.random() < 0.5:
            for j in rng.integers(0, n, size=int(rng.integers(1, 3))):
                copy[j] = batch[row, rng.integers(0, length)]
        batch[row, at + n + gap:at + 2 * n + gap] = copy
    return batch


def plant_edits(batch: np.ndarray, rng: np.random.Generator, frac: float, line_end: np.ndarray) -> np.ndarray:
    """In a share `frac` of the rows, plant an edited copy of whole lines, in place:

        row = [ ... A ... gap ... A' ... ]     A: >= 24 tokens starting at a line start; gap: 0-3 tokens
        A'  = A's first line with 1-4 tokens inserted into it (a changed signature), then A's other lines

    line_end[token] says whether a token ends a line. This is what "edit this code" prompts look like:
    the model sees a function, then the start of its edited version, and should go on copying the rest."""
    length = batch.shape[1]
    for row in np.flatnonzero(rng.random(len(batch)) < frac):
        starts = np.flatnonzero(line_end[batch[row, :length // 2 - 24]]) + 1  # a line starts after a line end
        n, gap, k = int(rng.integers(24, length // 2 - 8)), int(rng.integers(0, 4)), int(rng.integers(1, 5))
        extra = batch[row, rng.integers(0, length, size=k)]  # the inserted tokens: any tokens of the row
        if starts.size == 0:
            continue
        at = int(starts[rng.integers(0, starts.size)])
        a = batch[row, at:at + n].copy()
        first = np.flatnonzero(line_end[a])
        cut = int(first[0]) if first.size else n  # the edit goes before the end of A's first line
        pos = int(rng.integers(0, cut + 1))
        edited = np.concatenate([a[:pos], extra, a[pos:]])[: length - (at + n + gap)]
        batch[row, at + n + gap:at + n + gap + edited.size] = edited
    return batch


def batch_at(step: int, recipe: Recipe, seed: int, train_ids: np.ndarray, stdlib_tokens: int,
             line_end: np.ndarray | None) -> np.ndarray:
    """The batch of one step, [B, T+2]: it depends on (seed, step) only, so a run resumes exactly."""
    rng = np.random.default_rng([seed, step])
    batch = windows(train_ids, recipe.batch, recipe.seq + 2, rng, stdlib_tokens, recipe.stdlib_frac)
    # rows that repeat a span of themselves teach copying, so that "edit this code" prompts get copied
    if step < recipe.steps + recipe.copy_steps:
        plant_copies(batch, rng, recipe.copy_frac if step >= recipe.steps else recipe.copy_frac_main)
    else:
        plant_edits(batch, rng, recipe.edit_frac, line_end)
    return batch


def autocast(torch, device: str):
    """bf16 autocast on a GPU (weights, optimizer state and the GDN recurrence stay float32: HF's torch path
    casts q, k, v, beta and the decay to float32 itself); a no-op on the CPU, where float32 is as fast."""
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda"))


SIZE_AT = 40  # --minutes: steps 10..40 time a step (after the first steps' allocations and kernel choices)


def sized(recipe: Recipe, seconds_left: float, step_s: float) -> Recipe:
    """recipe with its three phases scaled by one factor so its steps fill seconds_left at step_s a step (the
    warm-up stays as it is: it already ran)."""
    f = max(SIZE_AT, SIZE_AT + seconds_left / step_s) / recipe.total_steps
    main = max(SIZE_AT + 1, round(recipe.steps * f))
    return replace(recipe, steps=main, copy_steps=round(recipe.copy_steps * f), edit_steps=round(recipe.edit_steps * f))


def evaluate(torch, model, mtp, stream: np.ndarray, recipe: Recipe, n: int = 32, device: str = "cpu") -> dict:
    """Mean losses on n fixed windows of the held-out stream."""
    batch = windows(stream, n, recipe.seq + 2, np.random.default_rng(1234))
    model.eval()
    sums = np.zeros(3)
    with torch.no_grad():
        for i in range(0, n, recipe.batch):
            with autocast(torch, device):
                _, main, l1, l2 = losses(torch, model, mtp, torch.from_numpy(batch[i:i + recipe.batch]).to(device),
                                         recipe)
            sums += [main.item(), l1.item() if l1 is not None else 0, l2.item() if l2 is not None else 0]
    model.train()
    k = math.ceil(n / recipe.batch)
    out = {"loss": sums[0] / k}
    if mtp is not None:
        out |= {"mtp1_loss": sums[1] / k, "mtp2_loss": sums[2] / k}
    return out


def train(name: str, recipe: Recipe, vocab: int, eot: int, train_ids: np.ndarray, held_ids: np.ndarray, out: Path,
          seed: int, device: str, ckpt_every: int, stop_after: int | None = None, export_now: bool = False,
          line_end: np.ndarray | None = None, minutes: float | None = None, stdlib_tokens: int = 0,
          init: Path | None = None, init_residual: Path | None = None, moment_passes: int = 0) -> dict | None:
    """Train (or resume) one model; export its HF folder. None when stopped early by stop_after.
    export_now: export the last checkpoint as it is (the record says how many steps it had).
    minutes: size the run to a wall-clock budget (a lent GPU's minutes): after SIZE_AT steps at the warm-up rate,
    the three phases are scaled together so the steps fit the time left; the record keeps the step counts, and
    --steps/--copy-steps/--edit-steps with them reproduce the run. A run that still overruns by 15% stops and
    exports where it is (the record says planned vs done).
    init: start from a GGUF's weights (init_from_gguf); init_residual: its rounding residual, by default the one
    beside it. moment_passes: weights that come without AdamW's moments (--init, or a checkpoint without them) get
    them rebuilt first, from this many gradient passes at learning rate 0 on the batches the run is about to train
    on: m and v become running means of these weights' own (clipped) gradients and AdamW's step count moves on by
    as many, while no weight moves (lr 0: no update, no decay). Fresh moments make the first steps about lr per
    weight, whatever each gradient's history (AdamW's bias correction): a bump in loss at a high rate, gone in
    40-80 steps and worth 3-9 steps of progress; 20 passes remove the bump but cost more than it does, so the
    default is none (docs/performance-log.md, 2026-11-28)."""
    import torch
    from gguf_residual import residual_path

    torch.manual_seed(seed)
    model, mtp = build(torch, recipe.arch, vocab, eot)
    if init is not None and init_residual is None and residual_path(init).is_file():
        init_residual = residual_path(init)  # export writes it beside the file
    from_file = init is not None and not (out / name / "ckpt.pt").exists()
    if from_file:
        n = init_from_gguf(torch, model, mtp, init, init_residual)
        say(f"{name}: {n} tensors from {init} (--init) " + (f"+ its residual {init_residual}: the float weights"
            if init_residual else "without a residual file: the Q8_0-rounded weights"))
    params = list(model.parameters()) + (list(mtp.parameters()) if mtp is not None else [])
    model.to(device)
    if mtp is not None:
        mtp.to(device)
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=recipe.lr, betas=(0.9, 0.95))

    def lr_at(step: int) -> float:  # linear warm-up, cosine to 10%, then the copy and edit phases' constant rate
        if step >= recipe.steps:
            return recipe.copy_lr
        if step < recipe.warmup:
            return recipe.lr * (step + 1) / recipe.warmup
        t = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
        return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    ckpt = d / "ckpt.pt"
    step, seconds, seen, log, ema = 0, 0.0, 0, [], None
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        if state["recipe"] != asdict(recipe) or state["seed"] != seed:
            raise SystemExit(f"{ckpt} was written by a different recipe or seed; delete it to start over")
        model.load_state_dict(state["model"])
        if mtp is not None:
            mtp.load_state_dict(state["mtp"])
        opt.load_state_dict(state["opt"])
        step, seconds, seen, log = state["step"], state["seconds"], state["seen"], state["log"]
        ema = state.get("ema")
        say(f"{name}: resuming at step {step}")
    n_params = sum(p.numel() for p in params)
    say(f"{name}: {n_params / 1e6:.2f} M parameters, {recipe.total_steps} steps of {recipe.batch} x {recipe.seq} tokens")

    def save() -> None:
        torch.save({"model": model.state_dict(), "mtp": mtp.state_dict() if mtp is not None else None,
                    "opt": opt.state_dict(), "step": step, "seconds": seconds, "seen": seen, "log": log, "ema": ema,
                    "recipe": asdict(recipe), "seed": seed}, ckpt.with_suffix(".tmp"))
        os.replace(ckpt.with_suffix(".tmp"), ckpt)

    def update(batch: np.ndarray, lr: float):  # one AdamW step on one batch -> (main CE, MTP CEs)
        for g in opt.param_groups:
            g["lr"] = lr
        with autocast(torch, device):
            total, main, l1, l2 = losses(torch, model, mtp, torch.from_numpy(batch).to(device), recipe)
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return main, l1, l2

    model.train()
    first, wall0 = step, time.perf_counter()
    t_sized = wall0  # when step 10 began (--minutes times steps 10 .. SIZE_AT)
    if minutes is not None and step:
        raise SystemExit("--minutes sizes a fresh run; resume with --steps/--copy-steps/--edit-steps from its log")
    if export_now:
        say(f"{name}: exporting the checkpoint at step {step} of {recipe.total_steps} (--export-now)")
    elif (from_file or step) and not opt.state and moment_passes:  # weights without their moments
        t0 = time.perf_counter()
        for s in range(step, step + moment_passes):  # the batches it is about to train on
            update(batch_at(s, recipe, seed, train_ids, stdlib_tokens, line_end), lr=0.0)
        seconds += time.perf_counter() - t0
        say(f"{name}: AdamW's moments rebuilt from {moment_passes} gradient passes at learning rate 0")
    while step < recipe.total_steps and not export_now:
        if minutes is not None and step == SIZE_AT:
            recipe = sized(recipe, minutes * 60 - (time.perf_counter() - wall0), (time.perf_counter() - t_sized) / (SIZE_AT - 10))
            say(f"{name}: sized to {minutes} min: --steps {recipe.steps} --copy-steps {recipe.copy_steps} "
                f"--edit-steps {recipe.edit_steps}")
        if minutes is not None and step == 10:
            t_sized = time.perf_counter()
        if minutes is not None and time.perf_counter() - wall0 > 1.15 * minutes * 60:
            say(f"{name}: over the time budget at step {step} of {recipe.total_steps}: exporting as it is")
            break
        if stop_after is not None and step - first >= stop_after:
            save()
            say(f"{name}: stopped at step {step} (--stop-after); run again to resume")
            return None
        batch = batch_at(step, recipe, seed, train_ids, stdlib_tokens, line_end)
        t0 = time.perf_counter()
        main, l1, l2 = update(batch, lr_at(step))
        seconds += time.perf_counter() - t0
        seen += recipe.batch * recipe.seq
        step += 1
        ema = main.item() if ema is None else 0.95 * ema + 0.05 * main.item()
        if step % 25 == 0 or step == recipe.total_steps:
            rate = seen / seconds
            eta = (recipe.total_steps - step) * seconds / step if step else 0
            extra = f" mtp1 {l1.item():.3f} mtp2 {l2.item():.3f}" if l1 is not None else ""
            say(f"{name}: step {step}/{recipe.total_steps} loss {ema:.3f}{extra}  {rate:.0f} tok/s  eta {eta / 60:.1f} min")
            log.append({"step": step, "loss": round(ema, 4)})
        if step % ckpt_every == 0 or step == recipe.total_steps:
            save()
    held = evaluate(torch, model, mtp, held_ids, recipe, device=device)
    say(f"{name}: held-out {json.dumps({k: round(v, 4) for k, v in held.items()})}")
    record = {"steps": step, "planned_steps": recipe.total_steps, "seconds": round(seconds, 1), "tokens": seen,
              "train_loss": round(ema, 4),
              "heldout": {k: round(v, 4) for k, v in held.items()}, "params": n_params,
              "recipe": json.dumps(asdict(recipe) | {"device": device, "init": init.name if init else None,
                                                     "init_residual": init_residual.name if init_residual else None,
                                                     "moment_passes": moment_passes if init else 0})}
    export_hf(torch, model, mtp, d / "hf", out / "tokenizer")
    (d / "record.json").write_text(json.dumps(record, indent=1))
    return record


def export_hf(torch, model, mtp, hf_dir: Path, tok_dir: Path) -> None:
    """save_pretrained, then the mtp.* tensors appended as the real Qwen3.5 checkpoints carry them."""
    from safetensors.torch import load_file, save_file

    model.to("cpu").save_pretrained(hf_dir, safe_serialization=True)
    config = json.loads((hf_dir / "config.json").read_text())
    config["mtp_num_hidden_layers"] = 1 if mtp is not None else 0
    (hf_dir / "config.json").write_text(json.dumps(config, indent=1))
    if mtp is not None:
        (path,) = hf_dir.glob("model*.safetensors")
        extra = {f"mtp.{n}": t.detach().to("cpu").contiguous() for n, t in mtp.state_dict().items()}
        save_file(load_file(path) | extra, path, metadata={"format": "pt"})
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (hf_dir / f).write_bytes((tok_dir / f).read_bytes())


# ------------------------------------------------------------------------------------------------ 5. export


def to_gguf(hf_dir: Path, path: Path, outtype: str, training: dict) -> None:
    """The GGUF that ships, and beside a quantized one its rounding residual `tiny-NAME.residual.gguf`
    (tools/gguf_residual.py): with it, --init gives a next run the float weights back (to ~2e-5 of each block's
    largest value), and with fresh AdamW moments that is all the run needs to go on (docs/performance-log.md,
    2026-11-28). The residual is the difference between this file and an F32 conversion of the same folder."""
    from gguf_residual import residual_path, write_residual

    from tinyspec.convert import convert

    convert(hf_dir, path, outtype, metadata={f"training.{k}": v for k, v in training.items()})
    say(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")
    if outtype != "f32":
        exact = path.with_suffix(".f32.tmp")
        convert(hf_dir, exact, "f32")
        n = write_residual(path, exact, residual_path(path))
        exact.unlink()
        say(f"wrote {residual_path(path)} ({residual_path(path).stat().st_size / 1e6:.2f} MB, {n} tensors' rounding)")


# -------------------------------------------------------------------------------------------------- main


def prepare_corpus(args, preset: dict, tok_dir: Path, cache: Path):
    """(train ids, held-out ids, corpus description, tokenizer, tokens of the standard library at the head of
    the train ids): read the sources, train the tokenizer (unless tok_dir has one), encode, and cache all of it
    in `cache`."""
    from tokenizers import Tokenizer

    root, train_files, held_files = corpus_files(args.corpus, args.max_files)
    if len(train_files) < 2 or not held_files:
        raise SystemExit(f"{root}: too few .py files for a corpus ({len(train_files)} train, {len(held_files)} held out)")
    say(f"corpus: {root}: {len(train_files)} training files, {len(held_files)} held out")
    corpus = f"Python {sys.version.split()[0]} standard library ({len(train_files)} files, every 50th held out)"
    if args.corpus:
        corpus = f"{root.name} ({len(train_files)} files)"
    pkg_train = []
    packages = tuple(filter(None, (preset.get("packages", ()) if args.packages is None else args.packages.split(","))))
    if packages:  # their held-out files are left out of training; the held-out loss stays the stdlib's
        from importlib.metadata import version

        pkg_train, pkg_held = package_files(packages)
        packages = tuple(f"{p} {version(p)}" for p in packages)
        say(f"corpus: + {', '.join(packages)}: {len(pkg_train)} training files ({len(pkg_held)} held out, unused)")
        corpus = (f"Python {sys.version.split()[0]} standard library ({len(train_files)} files) and "
                  f"{', '.join(packages)} ({len(pkg_train)} files), every 50th file held out")
    stdlib_texts, pkg_texts, held_texts = read_texts(train_files), read_texts(pkg_train), read_texts(held_files)
    if args.dedup:  # the training texts only: the held-out loss stays comparable with earlier runs'
        from corpus_dedup import Seen, dedup, describe, merged

        seen = Seen()  # one stream: the packages lose their copies of the standard library's blocks, not the reverse
        stdlib_texts, stdlib_stats = dedup(stdlib_texts, seen=seen)
        pkg_texts, pkg_stats = dedup(pkg_texts, seen=seen)
        corpus += "; " + describe(merged(stdlib_stats, pkg_stats))
        say(f"corpus: {corpus}")
    train_texts = stdlib_texts + pkg_texts
    if (tok_dir / "tokenizer.json").exists():
        tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    else:
        say(f"training a {preset['vocab']}-token byte-level BPE on {sum(map(len, train_texts)) / 1e6:.1f} M characters")
        tok = train_tokenizer(train_texts, preset["vocab"], tok_dir)
    stdlib_ids = encode_corpus(tok, stdlib_texts)  # the head of the stream (windows' stdlib_frac draws from it)
    train_ids = np.concatenate([stdlib_ids, encode_corpus(tok, pkg_texts)])
    held_ids, stdlib_tokens = encode_corpus(tok, held_texts), int(stdlib_ids.size)
    dtype = np.uint16 if tok.get_vocab_size() <= 65536 else np.int32
    np.savez_compressed(cache, train=train_ids.astype(dtype), held=held_ids.astype(dtype), corpus=np.array(corpus),
                        stdlib_tokens=np.array(stdlib_tokens))
    say(f"corpus: {train_ids.size:,} training tokens, {held_ids.size:,} held out "
        f"({sum(map(len, train_texts)) / train_ids.size:.2f} characters per token)")
    return train_ids, held_ids, corpus, tok, stdlib_tokens


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("what", choices=["all", "target", "draft", "corpus"],
                    help="which model(s) to train and export; corpus: only the tokenizer and the encoded corpus "
                    "(<out>/tokenizer, <out>/tokens.npz: the folder a GPU machine without the sources trains from)")
    ap.add_argument("--out", type=Path, default=REPO / ".cache" / "train", help="work folder (checkpoints, HF dirs)")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="ship")
    ap.add_argument("--steps", type=int, help="override the preset's step count (target; the draft gets half)")
    ap.add_argument("--copy-steps", type=int, help="override the target's copy-phase step count")
    ap.add_argument("--edit-steps", type=int, help="override the target's edit-phase step count")
    ap.add_argument("--batch", type=int, help="override the target's rows per step (a CPU fine-tune: the gpu preset's "
                    "64 x 512 tokens take ~30 s a step on 2 cores)")
    ap.add_argument("--copy-lr", type=float, help="override the target's constant rate of the copy and edit phases")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="torch device: cpu, or cuda when a GPU is lent")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch CPU threads")
    ap.add_argument("--ckpt-every", type=int, default=100)
    ap.add_argument("--corpus", type=Path, help="a folder of .py files instead of the standard library")
    ap.add_argument("--packages", help="comma-separated installed packages whose sources join the corpus "
                    "(default: the preset's; '' for none)")
    ap.add_argument("--dedup", action=argparse.BooleanOptionalAction, help="clean the training texts with "
                    "tools/corpus_dedup.py before encoding (default: the preset's; gpu: on)")
    ap.add_argument("--minutes", type=float, help="size the run to this many minutes of training per model "
                    "(measured after a few steps; the log prints the step counts that reproduce it)")
    ap.add_argument("--max-files", type=int, help="use only the first N corpus files (quick runs)")
    ap.add_argument("--stop-after", type=int, help="stop after N steps of this invocation (resume by running again)")
    ap.add_argument("--export-now", action="store_true",
                    help="export the last checkpoint without training further (when time runs out)")
    ap.add_argument("--assets", type=Path, help="also copy the GGUFs here (tinyspec/assets to ship them)")
    ap.add_argument("--init", type=Path, help="start from this GGUF's weights (a file of the preset's shape, e.g. the "
                    "shipped one; Q8_0 gives its rounded values) instead of a random init: continue a run whose float "
                    "checkpoint is gone. Its tokenizer must be <out>/tokenizer's (--tokenizer-from writes it). With "
                    "its residual (beside it, tiny-NAME.residual.gguf, or --init-residual) the float weights come back")
    ap.add_argument("--tokenizer-from", type=Path, metavar="GGUF",
                    help="take the tokenizer from this GGUF (e.g. tinyspec/assets/tiny-target.gguf) instead of "
                    "training a BPE: a corpus for continuing a shipped model must be encoded with its ids")
    ap.add_argument("--init-residual", type=Path, help="the --init file's rounding residual, when it is not beside "
                    "it (e.g. .cache/gpu/tiny-target.residual.gguf for tinyspec/assets/tiny-target.gguf)")
    ap.add_argument("--moment-passes", type=int, default=0, help="--init: rebuild AdamW's moments from this many "
                    "gradient passes at learning rate 0 before training (default 0: they start from zero, which costs "
                    "a few steps' progress once; docs/performance-log.md, 2026-11-28)")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        raise SystemExit("train_tiny needs the train extra: pip install -e \".[train]\"") from None
    if args.init is not None and args.what not in ("target", "draft"):
        raise SystemExit("--init continues one model: name it (target or draft), with a file of its shape")
    for flag, path in (("--init", args.init), ("--tokenizer-from", args.tokenizer_from)):
        if path is not None and not path.is_file():
            raise SystemExit(f"{flag} {path}: no such file")
    if args.init_residual is not None and (args.init is None or not args.init_residual.is_file()):
        raise SystemExit(f"--init-residual {args.init_residual}: needs --init and an existing file")
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    preset = PRESETS[args.preset]
    args.dedup = preset.get("dedup", False) if args.dedup is None else args.dedup
    recipes = {"target": preset["target"], "draft": preset["draft"]}
    if args.steps:
        recipes = {"target": replace(recipes["target"], steps=args.steps),
                   "draft": replace(recipes["draft"], steps=max(1, args.steps // 2))}
    for key in ("copy_steps", "edit_steps", "batch", "copy_lr"):
        if getattr(args, key) is not None:
            recipes["target"] = replace(recipes["target"], **{key: getattr(args, key)})
    out = args.out
    out.mkdir(parents=True, exist_ok=True)

    t0 = time.time()
    tok_dir, cache = out / "tokenizer", out / "tokens.npz"
    from tokenizers import Tokenizer

    if args.tokenizer_from is not None:
        tok = tokenizer_from_gguf(args.tokenizer_from)
        if not (tok_dir / "tokenizer.json").exists():
            save_tokenizer(tok, tok_dir)
            say(f"tokenizer: {tok.get_vocab_size()} tokens from {args.tokenizer_from} -> {tok_dir}")
        elif Tokenizer.from_file(str(tok_dir / "tokenizer.json")).get_vocab() != tok.get_vocab():
            raise SystemExit(f"{tok_dir} holds another tokenizer than {args.tokenizer_from}'s: choose another --out")
    if cache.exists() and (tok_dir / "tokenizer.json").exists():
        # encoded before (here, or on another machine: a lent GPU gets the folder, not the sources)
        z = np.load(cache)
        train_ids, held_ids, corpus = z["train"], z["held"], str(z["corpus"])
        stdlib_tokens = int(z["stdlib_tokens"]) if "stdlib_tokens" in z else 0
        tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
        say(f"corpus: {corpus}: {train_ids.size:,} training tokens, {held_ids.size:,} held out (from {cache})")
        if args.dedup != ("deduplicated" in corpus):
            say(f"corpus: note: {cache} was encoded with{'out' if args.dedup else ''} --dedup; delete it to re-encode")
    else:
        train_ids, held_ids, corpus, tok, stdlib_tokens = prepare_corpus(args, preset, tok_dir, cache)
    if tok.get_vocab_size() != preset["vocab"]:
        raise SystemExit(f"{tok_dir} holds a {tok.get_vocab_size()}-token tokenizer, the preset wants {preset['vocab']}")
    eot = tok.token_to_id(EOT)
    line_end = np.array([tok.decode([i]).endswith("\n") for i in range(preset["vocab"])])  # for plant_edits
    if args.what == "corpus":
        return 0
    from tinyspec.fast.draft_vocab import rank_ids

    for name in (["target", "draft"] if args.what == "all" else [args.what]):
        rec = train(name, recipes[name], preset["vocab"], eot, train_ids, held_ids, out, args.seed, args.device,
                    args.ckpt_every, args.stop_after, args.export_now, line_end, args.minutes, stdlib_tokens,
                    args.init, args.init_residual, args.moment_passes)
        if rec is None:
            return 0
        training = {"corpus": corpus, "tokenizer": f"byte-level BPE, {preset['vocab']} tokens, qwen35 split",
                    "seed": args.seed, "steps": rec["steps"], "planned_steps": rec["planned_steps"],
                    "seconds": rec["seconds"], "tokens": rec["tokens"],
                    "loss.train": rec["train_loss"], "loss.heldout": rec["heldout"]["loss"],
                    "tool": "tools/train_tiny.py --preset " + args.preset,
                    "recipe": rec["recipe"],  # every field of the run's Recipe (JSON), the sized phases included
                    # token ids by descending count in the training tokens: the draft vocabulary's ranking
                    # (tinyspec/fast/draft_vocab.py, --draft-vocab N)
                    "token_ranking": rank_ids(train_ids, preset["vocab"]).astype(np.int32)}
        if "mtp1_loss" in rec["heldout"]:
            training |= {"loss.heldout_mtp1": rec["heldout"]["mtp1_loss"], "loss.heldout_mtp2": rec["heldout"]["mtp2_loss"]}
        path = out / f"tiny-{name}.gguf"
        to_gguf(out / name / "hf", path, preset.get("outtype", "q8_0"), training)
        if args.assets:
            args.assets.mkdir(parents=True, exist_ok=True)
            (args.assets / path.name).write_bytes(path.read_bytes())
            say(f"copied to {args.assets / path.name}")
    say(f"done in {(time.time() - t0) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
