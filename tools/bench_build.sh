#!/usr/bin/env bash
# CUDA engine build times at each --build-effort, side by side in one run, on a GPU machine.
# Usage: tools/bench_build.sh QUANTSCOPE_BIN MODELS_DIR OUT_DIR
#   MODELS_DIR holds <name>.onnx (`tools/zoo.py export DIR NAME...`); BUILD_MODELS
#   (comma-separated names) picks some, default every model there. BUILD_BATCH (default 1).
# For each model: `quantscope eval --backend cuda --precisions fp16,int8 --recipe fast
# --methods max` on 4 noise images, with the choice cache off, at the efforts fast, default
# and exhaustive; then default twice more with a cache folder of its own, the second build
# finding the cache warm (BUILD_EFFORTS picks among fast,default,exhaustive,warm).
# FAST_ORDERS ("dwr,dw,...;dwr,...") adds fast runs with other key orders
# (QUANTSCOPE_CUDA_FAST_ORDER), labelled fast1, fast2, ... BUILD_FIRST=1: see below. Every run keeps its report and its
# builder log (phases, and every candidate's time) as OUT/<model>_<label>.{json,log}. Prints,
# per model and precision, each effort's build seconds and its engine's median latency over
# the exhaustive engine's; writes OUT/build.json.
set -uo pipefail
QS=${1:?quantscope binary}; MODELS=${2:?models dir}; OUT=${3:?out dir}
PY=${PYTHON:-/opt/torch/.venv/bin/python}
[ -x "$PY" ] || PY=python3
BATCH=${BUILD_BATCH:-1}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
mkdir -p "$OUT" "$WORK/noise"
"$PY" "$HERE/noise_images.py" "$WORK/noise" 4
if [ -n "${BUILD_MODELS:-}" ]; then
  names=${BUILD_MODELS//,/ }
else
  names=$(cd "$MODELS" && ls *.onnx | sed 's/\.onnx$//')
fi
# One eval of model $1 at effort $2 with the cache setting $3 (off or a folder), labelled $4:
# OUT/<model>_<label>.json, and the builder's log (every phase, every candidate's time) in
# OUT/<model>_<label>.log.
run() {
  QUANTSCOPE_CUDA_VERBOSE=1 QUANTSCOPE_CUDA_CACHE=$3 "$QS" eval --model "$MODELS/$1.onnx" \
    --calib "$WORK/noise" --precisions fp16,int8 --methods max --recipe fast --backend cuda \
    --batch "$BATCH" --build-effort "$2" --min-runs 20 --min-time-ms 200 \
    --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225 --report "$OUT/$1_$4.json" \
    >"$OUT/$1_$4.log" 2>&1
  grep -E "^(fp|int8)|ERROR|error" "$OUT/$1_$4.log" | tail -n 4
}
EFFORTS=${BUILD_EFFORTS:-fast,default,exhaustive,warm}
has() { [[ ",$EFFORTS," == *",$1,"* ]]; }
for name in $names; do
  echo "== $name"
  # The first builds on a machine also compile: the driver turns the engine's PTX and cuDNN's
  # fused kernels into machine code, and keeps it (CUDA's compute cache) for later processes.
  # BUILD_FIRST=1 runs an exhaustive build first, labelled `first`, so that the efforts below
  # are compared in the steady state a user's second session sees.
  [ "${BUILD_FIRST:-0}" = 1 ] && run "$name" exhaustive off first
  if has fast; then
    run "$name" fast off fast
    i=0
    IFS=';' read -ra orders <<<"${FAST_ORDERS:-}"
    for order in "${orders[@]}"; do
      i=$((i + 1))
      QUANTSCOPE_CUDA_FAST_ORDER=$order run "$name" fast off "fast$i"
    done
  fi
  has default && run "$name" default off default
  has exhaustive && run "$name" exhaustive off exhaustive
  if has warm; then
    mkdir -p "$WORK/cache_$name"
    run "$name" default "$WORK/cache_$name" cold
    run "$name" default "$WORK/cache_$name" warm
  fi
done
"$PY" - "$OUT" "$names" "$BATCH" <<'PYEOF'
import json, os, sys
out, names, batch = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
efforts = ["first"] * os.path.exists(f"{out}/{names[0]}_first.json") + ["fast"] + sorted({f.split("_")[-1][:-5] for f in os.listdir(out) if "_fast" in f and f.endswith(".json") and f.split("_")[-1][:-5] != "fast"}) + ["default", "exhaustive", "cold", "warm"]
records = []
print(f"batch {batch}; build s (engine median latency / exhaustive's)")
print(f"{'model':24} {'prec':5} " + " ".join(f"{e:>18}" for e in efforts))
for name in names:
    rows = {}
    for e in efforts:
        path = f"{out}/{name}_{e}.json"
        if not os.path.exists(path):
            continue
        for r in json.load(open(path)).get("rows", []):
            if r.get("precision") in ("fp16", "int8"):
                lat = (r.get("latency_batch_ms") or r.get("latency_ms") or {}).get("median")
                rows[(e, r["precision"])] = (r.get("build_ms"), lat, r.get("error"), r.get("device"))
    for p in ("fp16", "int8"):
        base = rows.get(("exhaustive", p), (None, None, None, None))[1]
        cells = []
        for e in efforts:
            b, lat, err, dev = rows.get((e, p), (None, None, None, None))
            records.append({"model": name, "precision": p, "effort": e, "batch": batch,
                            "build_s": b / 1e3 if b else None, "latency_ms": lat, "error": err, "device": dev})
            if err or b is None:
                cells.append(f"{'failed':>18}")
            else:
                ratio = f"{lat / base:.2f}" if lat and base else "-"
                cells.append(f"{b / 1e3:8.1f} s ({ratio:>5})")
        print(f"{name:24} {p:5} " + " ".join(cells))
json.dump({"batch": batch, "records": records}, open(f"{out}/build.json", "w"), indent=1)
PYEOF
