#!/usr/bin/env bash
# Benchmarks quantscope's CUDA engines against PyTorch on the same GPU, in one run.
# Usage: tools/bench_gpu.sh QUANTSCOPE_BIN OUT_DIR [--compile]
#   Exports torchvision ResNet-50 (224) and DeepLabV3-ResNet50 (513), random weights, to
#   ONNX (opset 13); writes 4 noise images for calibration; runs `quantscope eval --backend cuda` FP32/FP16/INT8 (max calibration on the noise) at
#   batch 1 and 32 (ResNet-50) and batch 1 (DeepLabV3), FP32 with TF32 (the default) and
#   again with --fp32-math strict; then times PyTorch eager FP32/FP16 (FP32 with PyTorch's
#   defaults, recorded in bench.json: TF32 for cuDNN convolutions)
#   (channels_last, cudnn.benchmark) and, with --compile, torch.compile(mode="max-autotune")
#   FP16 (ResNet-50; COMPILE_BUDGET_S caps the compile time). Prints a table; writes
#   OUT_DIR/bench.json (and the quantscope reports next to it).
set -euo pipefail
QS=${1:?quantscope binary}; OUT=${2:?out dir}; COMPILE=${3:-}
PY=${PYTHON:-/opt/torch/.venv/bin/python}
[ -x "$PY" ] || PY=python3
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
mkdir -p "$OUT" "$WORK/noise"
"$PY" - "$WORK/noise" <<'PYEOF'
import sys, numpy as np
from PIL import Image
rng = np.random.default_rng(0)
for i in range(4):
    Image.fromarray(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)).save(f"{sys.argv[1]}/noise{i}.png")
PYEOF
"$PY" "$HERE/bench_torch.py" --out "$OUT/torch.json" --export "$WORK" --export-only
for spec in "resnet50 32" "deeplabv3_resnet50 1"; do
  set -- $spec
  "$QS" eval --model "$WORK/$1.onnx" --calib "$WORK/noise" --precisions fp32,fp16,int8 \
    --methods max --backend cuda --batch "$2" --min-runs 20 --min-time-ms 300 \
    --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225 \
    --report "$OUT/quantscope_$1.json" 2>&1 | grep -v "^quantscope cuda:" | tail -n 30
  "$QS" eval --model "$WORK/$1.onnx" --calib "$WORK/noise" --precisions fp32 --fp32-math strict \
    --backend cuda --batch "$2" --min-runs 20 --min-time-ms 300 \
    --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225 \
    --report "$OUT/quantscope_$1_strict.json" 2>&1 | grep -v "^quantscope cuda:" | tail -n 8
done
"$PY" "$HERE/bench_torch.py" --out "$OUT/torch.json" ${COMPILE:+--compile} --compile-budget-s ${COMPILE_BUDGET_S:-240}
"$PY" - "$OUT" <<'PYEOF'
import json, sys, datetime, os
out = sys.argv[1]
t = json.load(open(f"{out}/torch.json"))
rows = []
for name, bss in [("resnet50", [1, 32]), ("deeplabv3_resnet50", [1])]:
    q = json.load(open(f"{out}/quantscope_{name}.json"))
    strict = json.load(open(f"{out}/quantscope_{name}_strict.json"))
    qs = {}
    for r in q["rows"] + [dict(x, precision="fp32_strict") for x in strict["rows"] if x.get("precision") == "fp32"]:
        p = r.get("precision")
        if r.get("error"):
            print(f"{name} {p}: ERROR {r['error']}")
        if r.get("latency_ms"): qs[(p, 1)] = r["latency_ms"]["median"]
        if r.get("latency_batch_ms"): qs[(p, r.get("batch"))] = r["latency_batch_ms"]["median"]
    for bs in bss:
        tr = next((x for x in t["results"] if x["model"] == name and x["batch"] == bs), {})
        row = {"model": name, "batch": bs,
               "torch_eager_fp32_ms": tr.get("eager_fp32_ms"), "torch_eager_fp16_ms": tr.get("eager_fp16_ms"),
               "torch_compile_fp16_ms": tr.get("compile_fp16_ms"), "torch_compile_note": tr.get("compile_error"),
               "qs_fp32_tf32_ms": qs.get(("fp32", bs)), "qs_fp32_strict_ms": qs.get(("fp32_strict", bs)),
               "qs_fp16_ms": qs.get(("fp16", bs)), "qs_int8_ms": qs.get(("int8", bs))}
        e32, t32 = row["qs_fp32_tf32_ms"], row["torch_eager_fp32_ms"]
        row["fp32_tf32_over_torch_eager_fp32"] = e32 / t32 if e32 and t32 else None
        i8, c16, f16 = row["qs_int8_ms"], row["torch_compile_fp16_ms"], row["qs_fp16_ms"]
        row["int8_over_compile_fp16"] = i8 / c16 if i8 and c16 else None
        row["int8_over_own_fp16"] = i8 / f16 if i8 and f16 else None
        rows.append(row)
f = lambda v: "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))
cols = ["model", "batch", "torch_eager_fp32_ms", "torch_eager_fp16_ms", "torch_compile_fp16_ms", "qs_fp32_tf32_ms", "qs_fp32_strict_ms", "qs_fp16_ms", "qs_int8_ms", "fp32_tf32_over_torch_eager_fp32", "int8_over_compile_fp16", "int8_over_own_fp16"]
print(" | ".join(cols))
for r in rows: print(" | ".join(f(r[c]) for c in cols))
json.dump({"date": datetime.date.today().isoformat(), "gpu": t["gpu"], "torch": t["torch"],
           "torch_cudnn_allow_tf32": t.get("cudnn_allow_tf32"), "torch_matmul_allow_tf32": t.get("matmul_allow_tf32"),
           "rows": rows},
          open(f"{out}/bench.json", "w"), indent=1)
PYEOF
