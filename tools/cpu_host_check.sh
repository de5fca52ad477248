#!/usr/bin/env bash
# One call on the GPU machine's host CPU (16-core Intel Xeon with AVX-512 VNNI and AMX): the CPU
# benchmark (tools/bench_cpu.py: quantscope on ONNX Runtime and on tract, plain ONNX Runtime FP32
# and INT8), the calibration throughput on 500 ImageNet-size images, and the workbench soak
# (the DeepLab experiment run again and again through the workbench's own Run). Usage, from the
# repository root:
#   tools/cpu_host_check.sh CARRY OUT
# CARRY holds `quantscope.xz` (release, stripped) and `ui_flows.xz` (the test binary), the
# DeepLab model `deeplab.onnx` with ../shared's `coco/images` and `coco/masks`, and
# `deeplab.ron` (the soak experiment). Parts, each on unless set to 0: BENCH, COCO96 (DeepLab's
# coco96 mIoU on ONNX Runtime and on tract), CALIB500, ZOO (calibration on models tract cannot
# run), SOAK. Writes OUT/cpu.txt, OUT/bench_cpu.{txt,json}, OUT/coco96.txt, OUT/calib500.txt,
# OUT/zoo.txt, OUT/soak.txt.
set -uo pipefail
CARRY=${1:?carry dir}; OUT=${2:?out dir}
BIN=$(mktemp -d)
for f in "$CARRY"/*.xz; do
  xz -dc "$f" >"$BIN/$(basename "$f" .xz)" && chmod +x "$BIN/$(basename "$f" .xz)"
done
# The venv's python3 comes first: quantscope finds ONNX Runtime through its `onnxruntime` package.
PY=${PYTHON:-/opt/torch/.venv/bin/python}
export PATH="$(dirname "$PY"):$PATH"
{ lscpu | grep -E "Model name|^CPU\(s\)|Thread|Flags" | sed 's/Flags:.*\(avx512_vnni\|amx_int8\).*/Flags: (has avx512_vnni \/ amx_int8: see below)/';
  grep -o -w -E "avx512_vnni|avx_vnni|amx_int8|amx_tile|avx512f" /proc/cpuinfo | sort | uniq -c;
  "$PY" -c "import onnxruntime as o; print('onnxruntime', o.__version__)"; } >"$OUT/cpu.txt" 2>&1
cat "$OUT/cpu.txt"
want=()
for m in resnet50 mobilenet_v2 efficientnet_b0 timm_levit_128s ssdlite320_mobilenet_v3_large; do
  [ -f "/tmp/zoo/$m.onnx" ] || want+=("$m")
done
[ ${#want[@]} -eq 0 ] || "$PY" tools/zoo.py export /tmp/zoo "${want[@]}" >"$OUT/zoo_export.txt" 2>&1 ||
  echo "zoo export failed: see zoo_export.txt"
if [ "${BENCH:-1}" != 0 ]; then
  models=(--model "deeplab=$CARRY/deeplab.onnx:0.0078431373,-1")
  for m in resnet50 mobilenet_v2 efficientnet_b0; do
    [ -f "/tmp/zoo/$m.onnx" ] && models+=(--model "$m=/tmp/zoo/$m.onnx")
  done
  "$PY" tools/bench_cpu.py "$BIN/quantscope" "$CARRY/coco/images" "${models[@]}" \
    --threads "1,$(nproc)" --rounds "${ROUNDS:-1}" --runs "${RUNS:-10}" --out "$OUT/bench_cpu" \
    >"$OUT/bench_cpu.log" 2>&1
  echo "bench exit $?"; grep -E "^## |^### |ratio|speed-up|FAILED" "$OUT/bench_cpu.txt" | head -n 80
fi
if [ "${COCO96:-1}" != 0 ]; then
  # The coco96 split: calibration on the first 32 images (sorted), evaluation on the other 96.
  for engine in ort tract; do
    QUANTSCOPE_CACHE="/tmp/cache_coco96_$engine" "$BIN/quantscope" eval --model "$CARRY/deeplab.onnx" \
      --calib "$CARRY/coco/images" --calib-count 32 --data "$CARRY/coco" --eval-skip-calib \
      --scale 0.0078431373 --offset -1 --cpu-engine "$engine" --min-runs 10 --min-time-ms 300 \
      --report "/tmp/coco96_$engine.json" >"/tmp/coco96_$engine.log" 2>&1
    echo "coco96 $engine exit $?" | tee -a "$OUT/coco96.txt"
    grep -E "CPU engine|metric|calibration pass" "/tmp/coco96_$engine.log" | tee -a "$OUT/coco96.txt"
  done
fi
if [ "${CALIB500:-1}" != 0 ] && [ -f /tmp/zoo/resnet50.onnx ]; then
  # 500 ImageNet-size JPEGs (500x375, smooth random content), decoded by quantscope.
  "$PY" - <<'EOF'
import numpy as np, os
from PIL import Image
os.makedirs("/tmp/cal500", exist_ok=True)
rng = np.random.default_rng(0)
for i in range(500):
    small = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)
    Image.fromarray(small).resize((500, 375), Image.BILINEAR).save(f"/tmp/cal500/{i:04d}.jpg", quality=90)
EOF
  for engine in ort tract; do
    # A cache of its own per engine: each pass runs, none is read from the other's cache.
    QUANTSCOPE_CACHE="/tmp/cache_calib500_$engine" "$BIN/quantscope" eval --model /tmp/zoo/resnet50.onnx --calib /tmp/cal500 --calib-count 500 \
      --precisions int8 --methods max --cpu-engine "$engine" --min-runs 3 --min-time-ms 10 \
      --cle off --center-activations off --report "/tmp/calib500_$engine.json" \
      2>&1 | grep -E "CPU engine|calibration pass|error" | tee -a "$OUT/calib500.txt"
  done
fi
if [ "${ZOO:-1}" != 0 ]; then
  # Models tract cannot load: calibration and INT8 through ONNX Runtime.
  for m in timm_levit_128s ssdlite320_mobilenet_v3_large; do
    [ -f "/tmp/zoo/$m.onnx" ] || { echo "$m: not exported" | tee -a "$OUT/zoo.txt"; continue; }
    "$BIN/quantscope" eval --model "/tmp/zoo/$m.onnx" --calib "$CARRY/coco/images" --calib-count 8 \
      --precisions fp32,fp16,int8 --methods max --min-runs 5 --min-time-ms 50 \
      --report "/tmp/zoo_$m.json" >"/tmp/zoo_$m.log" 2>&1
    echo "$m exit $?" | tee -a "$OUT/zoo.txt"
    grep -E "CPU engine|metric|calibration pass|error|Error" "/tmp/zoo_$m.log" | head -n 12 | tee -a "$OUT/zoo.txt"
  done
fi
if [ "${SOAK:-1}" != 0 ] && [ -x "$BIN/ui_flows" ]; then
  QUANTSCOPE_GUI_SOAK="$CARRY/deeplab.ron" QUANTSCOPE_GUI_SOAK_RUNS="${SOAK_RUNS:-5}" \
    "$BIN/ui_flows" soak_runs_a_saved_experiment_in_the_workbench --nocapture --test-threads=1 \
    >"$OUT/soak.txt" 2>&1
  echo "soak exit $?"; grep -E "^run |test result|panicked|CPU engine|signal" "$OUT/soak.txt" | head -n 20
fi
ls -la "$OUT"
