#!/usr/bin/env bash
# One call on a lent GPU machine: the GPU tests, then the speed runs, from binaries built
# elsewhere (the GPU machine has no Rust). Usage, from the repository root:
#   tools/gpu_check.sh CARRY OUT
# CARRY holds `<name>.xz` executables (quantscope, and test binaries named after their test
# file: cuda_backend, cuda_conv_choice, cuda_ops, cuda_zoo) and any `*.onnx` to time (inputs in [-1, 1]), with
# `calib/` images for them. ZOO_MODELS (names of tools/zoo.py) are exported there for the zoo
# test. Writes OUT/tests.txt, OUT/bench.txt and the reports (packed into OUT/reports.tar.xz). GPU_TESTS / GPU_BENCH=0 skip a
# part; BENCH_MODELS (tools/bench_gpu.sh's torchvision models, none by default) and
# BENCH_BATCHES (carried models; default "1 8") and BENCH_PRECISIONS (default
# fp32,fp16,int8) choose what is timed.
set -uo pipefail
CARRY=${1:?carry dir}; OUT=${2:?out dir}
BIN=$(mktemp -d)
for f in "$CARRY"/*.xz; do
  xz -dc "$f" >"$BIN/$(basename "$f" .xz)" && chmod +x "$BIN/$(basename "$f" .xz)"
done
# The test binaries look for the repository at the path they were built in.
export CARGO_MANIFEST_DIR=$PWD
export QUANTSCOPE_CUDA_CACHE=off
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
PY=${PYTHON:-/opt/torch/.venv/bin/python}
if [ -n "${ZOO_MODELS:-}" ]; then
  "$PY" tools/zoo.py export /tmp/zoo ${ZOO_MODELS//,/ } >"$OUT/zoo_export.txt" 2>&1 &&
    export QUANTSCOPE_ZOO=/tmp/zoo
fi
# The zoo test's per-model, per-precision records (bench/results/ keeps them).
export QUANTSCOPE_ZOO_JSON="$OUT/zoo.json"
if [ "${GPU_TESTS:-1}" != 0 ]; then
  for t in cuda_backend cuda_conv_choice cuda_ops cuda_zoo; do
    [ -x "$BIN/$t" ] || continue
    echo "== $t" >>"$OUT/tests.txt"
    "$BIN/$t" --test-threads=1 >>"$OUT/tests.txt" 2>&1
    echo "== $t exit $?" | tee -a "$OUT/tests.txt"
  done
  grep -E "^test |test result|panicked|forced on" "$OUT/tests.txt" | tail -n 60
fi
if [ "${GPU_BENCH:-1}" != 0 ]; then
  for m in "$CARRY"/*.onnx; do
    [ -f "$m" ] || continue
    name=$(basename "$m" .onnx)
    for bs in ${BENCH_BATCHES:-1 8}; do
      "$BIN/quantscope" eval --model "$m" --calib "$CARRY/calib" --calib-count 8 \
        --precisions "${BENCH_PRECISIONS:-fp32,fp16,int8}" --methods max --backend cuda --batch "$bs" \
        --min-runs 20 --min-time-ms 300 --scale 0.0078431373 --offset -1 \
        --report "$OUT/${name}_b$bs.json" >"$OUT/${name}_b$bs.log" 2>&1
      echo "$name batch $bs exit $?"
    done
  done
  if [ -n "${BENCH_MODELS:-}" ]; then
    tools/bench_gpu.sh "$BIN/quantscope" "$OUT/bench" >"$OUT/bench.txt" 2>&1
    tail -n 20 "$OUT/bench.txt"
  fi
fi
# The device tool brings back at most 8 files: the reports travel as one archive.
(cd "$OUT" && shopt -s nullglob && reports=(*.json *.log) && { [ ! -d bench ] || reports+=(bench); } &&
  [ ${#reports[@]} -gt 0 ] && tar -cJf reports.tar.xz "${reports[@]}" && rm -rf "${reports[@]}")
ls "$OUT"
