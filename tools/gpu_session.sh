#!/usr/bin/env bash
# What a TRAINING session does with a lent GPU, in one command that ends inside a 10-minute device call (its device
# time is short: start it once, run this, read the files). A session that only checks the cuda backend runs
# `python tools/gpu_check.py "$OUT"` instead: versions, graph capture, ties, the greedy rule for k = 0..8, parity
# (one sequence and a batch of 4), the cuda tests and bench on the 0.8B shape, in under 7 minutes, one JSON and one
# log (its docstring). From the repository root on the GPU machine:
#
#     bash tools/gpu_session.sh                                   # results in $OUT (the device tool's folder)
#     STEPS="check bench" bash tools/gpu_session.sh               # a part of it
#
# Timeline (each step writes its file into $OUT; a failed step is noted and the others still run):
#   t = 0    train   in the background, side by side: tools/train_tiny.py target and draft --device cuda
#                    --minutes $TRAIN_MIN from $TRAIN_DIR (the tokenizer and encoded corpus made on the CPU by
#                    `train_tiny.py corpus --preset gpu`; the GPU machine has no network and other sources)
#                    -> tiny-target.gguf, tiny-draft.gguf and their tiny-NAME.residual.gguf (the Q8_0 rounding,
#                    what a next run needs to go on from the float weights), train-NAME.log
#            check   tools/gpu_check.py's in-process steps: versions, raw graph capture, argmax ties, the greedy
#                    rule for k = 0..8, greedy parity of every drafter, one sequence and a batch of 4, graphs on
#                    and off (correct while training runs; no timings) -> gpu_check.json, gpu_check.log
#            tests   the CUDA tests against the oracles (tests/test_cuda_ops.py, the cuda cases of
#                    tests/test_backends.py)                                                  -> tests.txt
#            synth   the 0.8B-shape Q4_K_M random-weight file, on the CPU, for the bench step
#   then     speed   (after training: the GPU to itself) tools/gpu_check.py --steps speed -> gpu_speed.json
#            bench   `bench --backend cuda` on the 0.8B file: decode, verify T = 1..9, MTP at --synth-len 2.95,
#                    --slots 1,4,8                                                           -> bench-0.8b.json
# What comes back: the device tool returns at most 8 files from $OUT (each <= 16 MiB, 64 MiB together), so every
# log joins $OUT/session.log as its step ends (keep_log) and $OUT never holds more than these 8: tiny-target.gguf,
# tiny-target.residual.gguf, tiny-draft.gguf, tiny-draft.residual.gguf (gpu preset: 11.4, 11.0, 3.6, 3.2 MB),
# session.log, gpu_check.json, gpu_speed.json, bench-0.8b.json (about 30 MB in all). The training logs wait in
# $LOGS, outside $OUT, until training ends.
# TRAIN_MODELS="target" trains one model; TARGET_ARGS / DRAFT_ARGS add train_tiny flags to its run. To go on from
# the last run: keep its files on the CPU machine, the GGUFs where they ship (tinyspec/assets) and the residuals in
# $TRAIN_DIR (.cache/gpu, ignored by git, carried with the corpus; what travels must stay under 64 MiB: the tree
# is 19.3 MB, so carry the corpus files and only the residuals the run uses), then e.g.
# TARGET_ARGS="--init tinyspec/assets/tiny-target.gguf --init-residual .cache/gpu/tiny-target.residual.gguf
# --steps 41 --copy-steps 300 --edit-steps 600" trains the shipped target further (its copy and edit phases) from
# its float weights. AdamW's moments do not travel: they start over (measured to cost a few steps' progress once).
# A residual of other weights than the --init file's is refused (it pairs by a digest of the file's tensors).
# The machine needs CuPy, NumPy, Numba, regex, pytest, torch, transformers, tokenizers and safetensors (the lent
# H100/H200 image has them; TRANSFORMERS_WHEEL_DIR, if set, installs the pinned transformers from wheels first).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT="${OUT:-gpu_results}"
STEPS="${STEPS:-train check tests synth speed bench}"
TRAIN_DIR="${TRAIN_DIR:-.cache/gpu}"
TRAIN_MIN="${TRAIN_MIN:-5.5}"
PY="${PYTHON:-python3}"
LOGS="${LOGS:-/tmp/tinyspec-gpu-logs}"
SYNTH="${SYNTH:-/tmp/tinyspec-synth-0.8b-q4_k_m.gguf}"
mkdir -p "$OUT" "$LOGS"
failed=()
has() { [[ " $STEPS " == *" $1 "* ]]; }

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
if has train; then
    for model in ${TRAIN_MODELS:-target draft}; do
        extra=TARGET_ARGS; [[ $model == draft ]] && extra=DRAFT_ARGS
        ( timeout -k 10 $(( ${TRAIN_MIN%.*} * 60 + 150 )) $PY tools/train_tiny.py "$model" --preset gpu --device cuda \
            --minutes "$TRAIN_MIN" --out "$TRAIN_DIR" --ckpt-every 100000 ${!extra:-} > "$LOGS/train-$model.log" 2>&1
          cp "$TRAIN_DIR/tiny-$model.gguf" "$TRAIN_DIR/tiny-$model.residual.gguf" "$OUT/" ) &
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
