#!/usr/bin/env bash
# Benchmarks quantscope's CUDA engines against PyTorch on the same GPU, in one run.
# Usage: tools/bench_gpu.sh QUANTSCOPE_BIN OUT_DIR [--compile]
#   BENCH_MODELS (comma-separated; default all): resnet50, mobilenet_v2, efficientnet_b0 (224,
#   batch 1 and 32), deeplabv3_resnet50 (513, batch 1). torchvision, random weights, exported
#   to ONNX (opset 13); 4 noise images for calibration. For each model, `quantscope eval
#   --backend cuda` FP32 (TF32, the default) / FP16 / INT8 / FP8 (max calibration on the
#   noise; BENCH_PRECISIONS overrides the list), and
#   FP32 again with --fp32-math strict; then PyTorch at the same batch sizes: eager FP32/FP16
#   (FP32 with PyTorch's defaults, recorded in bench.json: TF32 for cuDNN convolutions),
#   the same replayed from a CUDA graph, and with --compile torch.compile
#   (max-autotune-no-cudagraphs, replayed from a CUDA graph captured by hand) FP16 at every
#   batch size (COMPILE_MODELS, COMPILE_BATCHES choose; COMPILE_BUDGET_S caps the total
#   compile time: on an H100 max-autotune took 336 s for ResNet-50 at batch 1; on an H200 258 s
#   and 138 s for ResNet-50 at batch 1 and 32, 223 s and 158 s for MobileNetV2). Prints a table;
#   writes OUT_DIR/bench.json (and the quantscope reports next to it). Split the models, and
#   with COMPILE_BATCHES the compiled batch sizes, over several runs where one would not fit a
#   time limit (one model's two compiles plus our engines took more than 10 minutes), or set
#   TORCH_TIMEOUT_S: PyTorch's eager timings come first, the compiles after them, and the
#   table is printed with whatever PyTorch measured before the limit.
#   QS_MODELS (comma-separated ONNX paths, inputs in [-1, 1], e.g. ../shared's DeepLab) are
#   timed by quantscope alone at batch 1. The table's ratios: INT8 over its own FP16, over
#   torch.compile FP16 and over torch eager FP16 from a CUDA graph, INT8 µs per image, and for
#   ResNet-50 that over TensorRT's MLPerf offline figure on one H100 (11.3 µs per image).
set -euo pipefail
QS=${1:?quantscope binary}; OUT=${2:?out dir}; COMPILE=${3:-}
PY=${PYTHON:-/opt/torch/.venv/bin/python}
[ -x "$PY" ] || PY=python3
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
mkdir -p "$OUT" "$WORK/noise"
"$PY" "$HERE/noise_images.py" "$WORK/noise" 4
MODELS=${BENCH_MODELS:-resnet50,mobilenet_v2,efficientnet_b0,deeplabv3_resnet50}
"$PY" "$HERE/bench_torch.py" --out "$OUT/torch.json" --export "$WORK" --export-only --models "$MODELS"
for name in ${MODELS//,/ }; do
  bs=32; [ "$name" = deeplabv3_resnet50 ] && bs=1
  "$QS" eval --model "$WORK/$name.onnx" --calib "$WORK/noise" --precisions "${BENCH_PRECISIONS:-fp32,fp16,int8,fp8}" \
    --methods max --recipe fast --backend cuda --batch "$bs" --min-runs 20 --min-time-ms 300 \
    --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225 \
    --report "$OUT/quantscope_$name.json" 2>&1 | grep -E "^(fp|int8)|ERROR|error" | tail -n 10 || true
  "$QS" eval --model "$WORK/$name.onnx" --calib "$WORK/noise" --precisions fp32 --fp32-math strict \
    --backend cuda --batch "$bs" --min-runs 20 --min-time-ms 300 \
    --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225 \
    --report "$OUT/quantscope_${name}_strict.json" 2>&1 | grep -E "^(fp|int8)|ERROR|error" | tail -n 4 || true
done
# PyTorch: every eager timing, then the compiles. TORCH_TIMEOUT_S stops it (a compile starts
# while COMPILE_BUDGET_S lasts, and one can take minutes); torch.json keeps what it measured,
# and the table below is printed all the same, without the compiles it did not reach.
TORCH_LIMIT=()
[ -n "${TORCH_TIMEOUT_S:-}" ] && TORCH_LIMIT=(timeout "$TORCH_TIMEOUT_S")
"${TORCH_LIMIT[@]}" "$PY" "$HERE/bench_torch.py" --out "$OUT/torch.json" --models "$MODELS" ${COMPILE:+--compile} \
  --compile-budget-s "${COMPILE_BUDGET_S:-480}" \
  --compile-models "${COMPILE_MODELS:-resnet50,mobilenet_v2,efficientnet_b0}" \
  --compile-batches "${COMPILE_BATCHES:-1,32}" ||
  echo "PyTorch stopped early (exit $?): the table has what it measured"
EXTRA=()
QSM=${QS_MODELS:-}
for m in ${QSM//,/ }; do
  # An ONNX file of the user's (inputs in [-1, 1]), timed by quantscope alone at batch 1.
  name=$(basename "$m" .onnx); EXTRA+=("$name")
  "$QS" eval --model "$m" --calib "$WORK/noise" --precisions "${BENCH_PRECISIONS:-fp32,fp16,int8,fp8}" \
    --methods max --recipe fast --backend cuda --batch 1 --min-runs 20 --min-time-ms 300 \
    --scale 0.0078431373 --offset -1 --report "$OUT/quantscope_$name.json" 2>&1 | grep -E "^(fp|int8)|ERROR|error" | tail -n 10 || true
done
"$PY" - "$OUT" "$MODELS" "${EXTRA[@]}" <<'PYEOF'
import json, sys, datetime, os
out = sys.argv[1]
models = sys.argv[2].split(",")
TRT_MLPERF_RESNET50_US = 11.3
t = json.load(open(f"{out}/torch.json"))
rows = []
for name in models:
    bss = [1] if name == "deeplabv3_resnet50" else [1, 32]
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
               "torch_eager_fp32_graph_ms": tr.get("eager_fp32_graph_ms"), "torch_eager_fp16_graph_ms": tr.get("eager_fp16_graph_ms"),
               "torch_compile_fp16_ms": tr.get("compile_fp16_ms"), "torch_compile_note": tr.get("compile_error"),
               "qs_fp32_tf32_ms": qs.get(("fp32", bs)), "qs_fp32_strict_ms": qs.get(("fp32_strict", bs)),
               "qs_fp16_ms": qs.get(("fp16", bs)), "qs_int8_ms": qs.get(("int8", bs)),
               "qs_fp8_ms": qs.get(("fp8", bs))}
        e32, t32 = row["qs_fp32_tf32_ms"], row["torch_eager_fp32_graph_ms"]
        row["fp32_tf32_over_torch_eager_fp32_graph"] = e32 / t32 if e32 and t32 else None
        i8, c16, f16 = row["qs_int8_ms"], row["torch_compile_fp16_ms"], row["qs_fp16_ms"]
        row["int8_over_compile_fp16"] = i8 / c16 if i8 and c16 else None
        row["int8_over_own_fp16"] = i8 / f16 if i8 and f16 else None
        f8 = row["qs_fp8_ms"]
        row["fp8_over_int8"] = f8 / i8 if f8 and i8 else None
        g16 = row["torch_eager_fp16_graph_ms"]
        row["int8_over_torch_eager_fp16_graph"] = i8 / g16 if i8 and g16 else None
        row["int8_us_per_image"] = i8 * 1e3 / bs if i8 else None
        # TensorRT's MLPerf ResNet-50 offline result on one H100: about 88,700 img/s.
        if name == "resnet50" and i8:
            row["int8_us_per_image_over_trt_mlperf"] = i8 * 1e3 / bs / TRT_MLPERF_RESNET50_US
        rows.append(row)
f = lambda v: "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))
cols = ["model", "batch", "torch_eager_fp32_ms", "torch_eager_fp32_graph_ms", "torch_eager_fp16_graph_ms", "torch_compile_fp16_ms", "qs_fp32_tf32_ms", "qs_fp32_strict_ms", "qs_fp16_ms", "qs_int8_ms", "qs_fp8_ms", "fp32_tf32_over_torch_eager_fp32_graph", "int8_over_compile_fp16", "int8_over_own_fp16", "fp8_over_int8", "int8_over_torch_eager_fp16_graph", "int8_us_per_image", "int8_us_per_image_over_trt_mlperf"]
for extra in sys.argv[3:]:
    # Models timed by quantscope alone (QS_MODELS): no PyTorch counterpart.
    q = json.load(open(f"{out}/quantscope_{extra}.json"))
    qs = {r.get("precision"): r["latency_ms"]["median"] for r in q["rows"] if r.get("latency_ms")}
    i8, f16 = qs.get("int8"), qs.get("fp16")
    rows.append({"model": extra, "batch": 1, "qs_fp32_tf32_ms": qs.get("fp32"), "qs_fp16_ms": f16,
                 "qs_int8_ms": i8, "qs_fp8_ms": qs.get("fp8"),
                 "int8_over_own_fp16": i8 / f16 if i8 and f16 else None,
                 "int8_us_per_image": i8 * 1e3 if i8 else None})
print(" | ".join(cols))
for r in rows: print(" | ".join(f(r.get(c)) for c in cols))
json.dump({"date": datetime.date.today().isoformat(), "gpu": t["gpu"], "torch": t["torch"],
           "torch_cudnn_allow_tf32": t.get("cudnn_allow_tf32"), "torch_matmul_allow_tf32": t.get("matmul_allow_tf32"),
           "rows": rows},
          open(f"{out}/bench.json", "w"), indent=1)
PYEOF
