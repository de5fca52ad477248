#!/usr/bin/env bash
# The calibration statistics pass on each backend, side by side in one run, on a GPU machine:
# the FP32 pass over N images (decode, run, histograms; engine set-up included) that every
# INT8 engine of a run starts from, on the CPU (ONNX Runtime, where the venv's `onnxruntime`
# package is found, else tract) and on the GPU (cuda: an FP32 engine that copies out the
# tensors calibration reads).
# Usage: tools/bench_calib.sh QUANTSCOPE_BIN MODELS_DIR OUT_DIR
#   MODELS_DIR holds <name>.onnx (`tools/zoo.py export DIR NAME...`); CALIB_MODELS
#   (comma-separated, default resnet50) picks some. CALIB_IMAGES (default 500) JPEG images
#   of 500x375 (COCO's size), smooth random colour fields, are made once.
# Each run is `quantscope eval --precisions int8 --methods max --recipe fast` with an empty
# statistics cache of its own (QUANTSCOPE_CACHE), so the pass really runs. Prints per model
# the pass's seconds on each backend (the `calibration pass:` log line) and their ratio, and per
# method the largest relative difference between the two passes' ranges; writes OUT/calib.json.
set -uo pipefail
QS=${1:?quantscope binary}; MODELS=${2:?models dir}; OUT=${3:?out dir}
PY=${PYTHON:-/opt/torch/.venv/bin/python}
[ -x "$PY" ] || PY=python3
export PATH="$(dirname "$PY"):$PATH"
N=${CALIB_IMAGES:-500}
WORK=$(mktemp -d)
mkdir -p "$OUT" "$WORK/calib"
"$PY" - "$WORK/calib" "$N" <<'EOF'
import sys
import numpy as np
from PIL import Image
out, n = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
for i in range(n):
    # A 16x12 colour field upsampled: photo-like smoothness, so JPEG decode costs what a
    # photo's does.
    small = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
    Image.fromarray(small).resize((500, 375), Image.BICUBIC).save(f"{out}/img{i:04d}.jpg", quality=90)
EOF
for name in ${CALIB_MODELS//,/ }; do
  [ -n "$name" ] || continue
  for backend in cpu cuda; do
    rm -rf "$WORK/cache-$backend"
    start=$(date +%s.%N)
    QUANTSCOPE_CACHE="$WORK/cache-$backend" "$QS" eval --model "$MODELS/$name.onnx" \
      --calib "$WORK/calib" --precisions int8 --methods max --recipe fast \
      --backend "$backend" --eval-count 8 --min-runs 1 --min-time-ms 0 \
      --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225 \
      --report "$OUT/${name}_$backend.json" >"$OUT/${name}_$backend.log" 2>&1
    echo "$name $backend: exit $?, whole run $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
    grep -E "calibration pass" "$OUT/${name}_$backend.log" | tail -n 1
  done
done
"$PY" - "$OUT" ${CALIB_MODELS//,/ } <<'EOF'
import json, sys
out, names = sys.argv[1], sys.argv[2:]
rows = []
for name in names:
    r = {}
    for b in ("cpu", "cuda"):
        try:
            r[b] = json.load(open(f"{out}/{name}_{b}.json"))
        except (OSError, ValueError) as e:
            print(f"{name} {b}: no report ({e})")
    if len(r) < 2:
        continue
    cal = {b: r[b].get("calibration") or {} for b in r}
    ms = {b: cal[b].get("pass_ms") for b in cal}
    amax = {b: {t["tensor"]: t.get("amax", {}) for t in cal[b].get("tensors", [])} for b in cal}
    common = set(amax["cpu"]) & set(amax["cuda"])
    # Per method, the largest relative difference of a tensor's range between the two passes.
    worst = {}
    for t in common:
        for m, a in amax["cpu"][t].items():
            g = amax["cuda"][t].get(m)
            if g is not None:
                worst[m] = max(worst.get(m, 0.0), abs(g - a) / max(abs(a), 1e-12))
    row = {"model": name, "images": cal["cuda"].get("images"), "cpu_pass_s": (ms["cpu"] or 0) / 1e3,
           "cuda_pass_s": (ms["cuda"] or 0) / 1e3, "range_rel_diff": worst, "tensors": len(common),
           "cpu_engine": r["cpu"]["rows"][0].get("engine") if r["cpu"].get("rows") else None}
    rows.append(row)
    print(f"{name}: {row['images']} images, pass cpu {row['cpu_pass_s']:.2f} s, cuda {row['cuda_pass_s']:.2f} s "
          f"(cuda/cpu {row['cuda_pass_s'] / max(row['cpu_pass_s'], 1e-9):.2f}); ranges of {len(common)} tensors "
          f"differ by at most " + ", ".join(f"{m} {d:.1e}" for m, d in sorted(worst.items())) + " (relative)")
json.dump(rows, open(f"{out}/calib.json", "w"), indent=1)
EOF
