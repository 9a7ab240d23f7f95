#!/usr/bin/env bash
# Everything the fast-paths issue asks of a GPU, in one command, for a session that is lent one (its device
# time is short: start it once, run this, read the files). From the repository root on the GPU machine:
#
#     bash tools/gpu_session.sh                      # results in $OUT (the device tool's folder) or gpu_results/
#     SHAPES="0.8b" STEPS="tests bench" bash tools/gpu_session.sh     # a part of it
#
# Steps, each writing one file (a failed step is noted and the next one runs):
#   tests   the CUDA tests against the oracles and the whole cuda backend    tests.txt
#   kernel  tools/bench_cuda.py: dequant-matmul time and share of the card's read bandwidth per type,
#           shape (0.8B / 9B / 27B matrices) and T = 1, 2, 4, 8                  bench_cuda.json
#   bench   `synth` then `bench --backend cuda` at each of $SHAPES (q4_k_m): decode tok/s, verify cost
#           ratio, synthetic-drafter speedup at acceptance 0.8, k = 3            bench-<shape>.json
# The machine needs CuPy, NumPy, Numba, regex and pytest (the lent H100/H200 image has them); no downloads.
# BACKEND=cpu runs the bench step on the cpu backend instead (how this script is checked without a GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-gpu_results}"
SHAPES="${SHAPES:-0.8b 9b 27b}"
STEPS="${STEPS:-tests kernel bench}"
BACKEND="${BACKEND:-cuda}"
PY="${PYTHON:-python3}"
SYNTH_DIR="${SYNTH_DIR:-/tmp}"  # the 27B file is 16.8 GB
mkdir -p "$OUT"
failed=()

step() {  # step NAME COMMAND...: run, log its time, remember a failure
    local name=$1; shift
    echo "== $name: $*" >&2
    local t0=$SECONDS
    "$@" || failed+=("$name")
    echo "== $name: $((SECONDS - t0)) s" >&2
}

if [[ " $STEPS " == *" tests "* ]]; then
    step tests bash -c "$PY -m pytest -q -p no:cacheprovider tests/test_cuda_ops.py tests/test_backends.py \
        tests/test_cuda_compile.py 2>&1 | tee '$OUT/tests.txt'; exit \${PIPESTATUS[0]}"
fi
if [[ " $STEPS " == *" kernel "* ]]; then
    step kernel bash -c "$PY tools/bench_cuda.py --types Q4_K,Q5_K,Q6_K,Q8_0,BF16 --ts 1,2,4,8 \
        --shapes 1024x3584,248320x1024,4096x12288,12288x4096,17408x5120,5120x17408 --json > '$OUT/bench_cuda.json'"
fi
if [[ " $STEPS " == *" bench "* ]]; then
    for shape in $SHAPES; do
        file="$SYNTH_DIR/tinyspec-synth-$shape-q4_k_m.gguf"
        step "synth-$shape" "$PY" -m tinyspec synth --shape "$shape" --quant q4_k_m -o "$file"
        step "bench-$shape" bash -c "$PY -m tinyspec bench --model '$file' --backend $BACKEND --drafters synthetic \
            --spec-repeats 3 --json > '$OUT/bench-$shape.json'"
        rm -f "$file"
    done
fi
if ((${#failed[@]})); then
    echo "gpu_session: failed: ${failed[*]} (see the output above; results so far in $OUT)" >&2
    exit 1
fi
echo "gpu_session: every step passed; results in $OUT" >&2
