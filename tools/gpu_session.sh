#!/usr/bin/env bash
# The shipped models trained further on a lent GPU, in one command that ends inside one device call. A lent GPU
# goes first to `python tools/gpu_check.py "$OUT"` (its own call, <= 7 minutes); this is the second call, in what
# is left of the 15 minutes (a warm machine: about 5 minutes with TRAIN_MIN=3). Prepare on the CPU, then carry
# .cache/gpu (the device tool's `carry`):
#
#     python tools/train_tiny.py corpus --preset gpu --tokenizer-from tinyspec/assets/tiny-target.gguf --out .cache/gpu
#     bash tools/gpu_session.sh                                   # on the GPU machine: results in $OUT
#
# What it trains, side by side on the one GPU, each for TRAIN_MIN minutes (train_tiny --minutes sizes the steps):
#   target      the shipped target, going on from its weights (--init tinyspec/assets/tiny-target.gguf, and the
#               float weights back if the last run's residual .cache/gpu/tiny-target.residual.gguf was carried),
#               preset gpu-continue: the deduplicated corpus with planted copies, then an edit phase (lookup)
#   draft       the shipped draft model, going on the same way (preset gpu-continue)
#   target-q4k  a wider target from scratch (preset gpu-q4k: 16.5 M parameters, Q4_K_M, the same bytes as the
#               Q8_0 target): the other answer to "which target fits in 15 MB", trained in the same minutes
# tools/eval_tiny.py then decides on the CPU: ship a target only if it beats tinyspec/assets' on held-out loss per
# byte and loses on no goal of issue 49.
# Each run writes tiny-MODEL.gguf and its residual tiny-MODEL.residual.gguf (the rounding: with it a next run goes
# on from the float weights; AdamW's moments do not travel: they start over, measured to cost a few steps once).
# What comes back: the device tool returns at most 8 files from $OUT (each <= 16 MiB, 64 MiB together). Training:
# 6 model files (11.4 + 11.0, 3.6 + 3.2, 11.1 + ~9 MB) and session.log (every log joins it as its step ends: keep_log;
# the training logs wait in $LOGS, outside $OUT). To go on from this run: the GGUFs chosen go to tinyspec/assets,
# their residuals to .cache/gpu (ignored by git; what travels must stay under 64 MiB: the tree is ~20 MB, the
# corpus 17 MB, so carry the corpus files and only the residuals the run uses). A residual of other weights than
# the --init file's is refused (it pairs by a digest of the file's tensors).
# TRAIN_MODELS="target" trains one model; TARGET_ARGS / DRAFT_ARGS / Q4K_ARGS add train_tiny flags to its run.
# The older one-call plan is still here, by STEPS (each step writes into $OUT; a failed step is noted and the
# others still run):
#     STEPS="train check tests synth speed bench" TRAIN_MIN=5.5 bash tools/gpu_session.sh
#            check   tools/gpu_check.py's in-process steps: versions, raw graph capture, argmax ties, the greedy
#                    rule for k = 0..8, greedy parity of every drafter, one sequence and a batch of 4, graphs on
#                    and off (correct while training runs; no timings) -> gpu_check.json
#            tests   the CUDA tests against the oracles (tests/test_cuda_ops.py, the cuda cases of
#                    tests/test_backends.py)
#            synth   the 0.8B-shape Q4_K_M random-weight file, on the CPU, for the bench step
#   then     speed   (after training: the GPU to itself) tools/gpu_check.py --steps speed -> gpu_speed.json
#            bench   `bench --backend cuda` on the 0.8B file: decode, verify T = 1..9, MTP at --synth-len 2.95,
#                    --slots 1,4,8                                                           -> bench-0.8b.json
#   (with the three training runs that is 10 files: TRAIN_MODELS="target draft" keeps it to 8)
# The machine needs CuPy, NumPy, Numba, regex, pytest, torch, transformers, tokenizers and safetensors (the lent
# H100/H200 image has them; TRANSFORMERS_WHEEL_DIR, if set, installs the pinned transformers from wheels first).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT="${OUT:-gpu_results}"
STEPS="${STEPS:-train}"
TRAIN_DIR="${TRAIN_DIR:-.cache/gpu}"
TRAIN_MIN="${TRAIN_MIN:-3}"
TRAIN_MODELS="${TRAIN_MODELS:-target draft target-q4k}"
PY="${PYTHON:-python3}"
LOGS="${LOGS:-/tmp/tinyspec-gpu-logs}"
SYNTH="${SYNTH:-/tmp/tinyspec-synth-0.8b-q4_k_m.gguf}"
mkdir -p "$OUT" "$LOGS"
failed=()
has() { [[ " $STEPS " == *" $1 "* ]]; }
if has train; then
    [[ -f $TRAIN_DIR/tokens.npz && -f $TRAIN_DIR/tokenizer/tokenizer.json ]] || { echo "gpu_session: no corpus in \
$TRAIN_DIR: run 'python tools/train_tiny.py corpus --preset gpu --tokenizer-from tinyspec/assets/tiny-target.gguf \
--out $TRAIN_DIR' on the CPU and carry it" >&2; exit 2; }
fi

keep_log() {  # keep_log FILE...: append each to $OUT/session.log under its name, then remove it (8 files come back)
    local f
    for f; do
        [[ -f $f ]] || continue
        { echo "==== $(basename "$f")"; cat "$f"; echo; } >> "$OUT/session.log" && rm -f "$f"
    done
}

step() {  # step NAME SECONDS COMMAND...: run under a time limit, log its time, remember a failure
    local name=$1 limit=$2; shift 2
    echo "== $name: $* (limit ${limit} s)" >&2
    local t0=$SECONDS
    timeout -k 10 "$limit" "$@" || failed+=("$name")
    echo "== $name: $((SECONDS - t0)) s" >&2
}

if [[ -n "${TRANSFORMERS_WHEEL_DIR:-}" ]]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$TRANSFORMERS_WHEEL_DIR"/*.whl \
        && export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
$PY -c "import torch, transformers, cupy; print('torch', torch.__version__, 'transformers', transformers.__version__, \
'cupy', cupy.__version__, 'gpu', torch.cuda.get_device_name())" >&2

train_pids=()
run_training() {  # run_training MODEL: one run of train_tiny beside the others; its GGUF and residual go to $OUT
    local model=$1 what=target preset=gpu-continue out=$TRAIN_DIR init="" extra=TARGET_ARGS
    case $model in
        target) init=tinyspec/assets/tiny-target.gguf ;;
        draft) what=draft init=tinyspec/assets/tiny-draft.gguf extra=DRAFT_ARGS ;;
        target-q4k) preset=gpu-q4k out=$TRAIN_DIR/q4k extra=Q4K_ARGS  # from scratch, beside it, in its own folder
            mkdir -p "$out" && ln -sfn "$(realpath "$TRAIN_DIR")/tokenizer" "$out/tokenizer" \
                && ln -sf "$(realpath "$TRAIN_DIR")/tokens.npz" "$out/tokens.npz" ;;
        *) echo "gpu_session: unknown model $model (target, draft, target-q4k)" >&2; return 1 ;;
    esac
    local args=(--preset "$preset" --device "${TRAIN_DEVICE:-cuda}" --minutes "$TRAIN_MIN" --out "$out"
                --ckpt-every 100000)
    if [[ -n $init ]]; then
        args+=(--init "$init")
        local residual="$TRAIN_DIR/tiny-$what.residual.gguf"  # the last run's, carried: its float weights back
        [[ -f $residual ]] && args+=(--init-residual "$residual")
    fi
    timeout -k 10 $(( ${TRAIN_MIN%.*} * 60 + 150 )) $PY tools/train_tiny.py "$what" "${args[@]}" ${!extra:-} \
        > "$LOGS/train-$model.log" 2>&1
    local rc=$?
    cp "$out/tiny-$what.gguf" "$OUT/tiny-$model.gguf" \
        && cp "$out/tiny-$what.residual.gguf" "$OUT/tiny-$model.residual.gguf"
    return $((rc || $?))
}
if has train; then
    for model in $TRAIN_MODELS; do
        run_training "$model" &
        train_pids+=($!)
    done
fi
has check && step check 150 $PY tools/gpu_check.py "$OUT" --quick --steps versions,capture,ties,rule,parity
keep_log "$OUT/gpu_check.log"
has tests && step tests 150 bash -c "$PY -m pytest -q -p no:cacheprovider -x tests/test_cuda_ops.py \
    tests/test_backends.py -k 'cuda' 2>&1 | tail -40 > '$OUT/tests.txt'; exit \${PIPESTATUS[0]}"
keep_log "$OUT/tests.txt"
has synth && step synth 90 $PY -m tinyspec synth --shape 0.8b --quant q4_k_m -o "$SYNTH"
for pid in "${train_pids[@]}"; do wait "$pid" || failed+=("train")
done
keep_log "$LOGS"/train-*.log
has speed && step speed 90 $PY tools/gpu_check.py "$OUT" --steps speed --json-name gpu_speed.json
keep_log "$OUT/gpu_speed.log"
has bench && step bench 150 bash -c "$PY -m tinyspec bench --model '$SYNTH' --backend cuda --drafters '' \
    --verify-sizes 1..9 --synth-len 2.95 --decode-n 16 --repeats 3 --spec-repeats 2 --max-new 64 --slots 1,4,8 --json \
    > '$OUT/bench-0.8b.json'"
if ((${#failed[@]})); then
    echo "gpu_session: failed: ${failed[*]} (see the output above; results so far in $OUT)" >&2
    exit 1
fi
echo "gpu_session: every step passed; results in $OUT" >&2
