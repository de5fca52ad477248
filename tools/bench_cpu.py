#!/usr/bin/env python3
"""CPU speed, side by side in one run: quantscope's FP32 and INT8 engines against ONNX Runtime
running the same FP32 model and the same Q/DQ file quantscope wrote.

Usage:
  tools/bench_cpu.py QUANTSCOPE_BIN MODEL.onnx QDQ.onnx CALIB_DIR [--scale S --offset O | --mean M --std S]
                     [--runs N] [--threads T]

It times, on one preprocessed calibration image, each engine for at least N runs after a
warm-up, all with T threads (quantscope's --threads and ONNX Runtime's intra-op threads; 1 by
default, as in the committed results), and prints median
latencies and the ratios the project tracks. ONNX Runtime is measured twice on the Q/DQ
file: with basic graph optimisation (float arithmetic, exact) and with its default full
optimisation (fused u8 x s8 kernels, which saturate without VNNI).
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort


def ort_latency(path, x, level, threads, runs):
    o = ort.SessionOptions()
    o.graph_optimization_level = level
    o.intra_op_num_threads = threads
    o.inter_op_num_threads = 1
    s = ort.InferenceSession(path, o, providers=["CPUExecutionProvider"])
    name = s.get_inputs()[0].name
    for _ in range(3):
        s.run(None, {name: x})
    t = []
    for _ in range(runs):
        a = time.perf_counter()
        s.run(None, {name: x})
        t.append((time.perf_counter() - a) * 1e3)
    return float(np.median(t))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("quantscope")
    ap.add_argument("model")
    ap.add_argument("qdq")
    ap.add_argument("calib")
    ap.add_argument("--scale", type=float)
    ap.add_argument("--offset", type=float, default=0.0)
    ap.add_argument("--mean")
    ap.add_argument("--std")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()

    norm = ["--scale", str(a.scale), "--offset", str(a.offset)] if a.scale is not None else ["--mean", a.mean, "--std", a.std]
    with tempfile.TemporaryDirectory() as d:
        # quantscope: FP32 and INT8 (max) engines, timed by its own benchmark.
        cmd = [a.quantscope, "eval", "--model", a.model, "--calib", a.calib, "--calib-count", "8",
               "--precisions", "fp32,int8", "--methods", "max", "--min-runs", str(a.runs),
               "--min-time-ms", "2000", "--batch", "1", "--threads", str(a.threads),
               "--report", f"{d}/r.json"] + norm
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rows = json.load(open(f"{d}/r.json"))["rows"]
        ours = {r["precision"]: r["latency_ms"]["median"] for r in rows}
        shape = [1] + [d for d in json.load(open(f"{d}/r.json"))["model"]["inputs"][0]["shape"][1:]]
    x = np.random.default_rng(0).uniform(-1, 1, size=[int(v) for v in shape]).astype(np.float32)
    basic, full = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    res = {
        "quantscope fp32": ours["fp32"],
        "quantscope int8": ours["int8"],
        "onnxruntime fp32": ort_latency(a.model, x, full, a.threads, a.runs),
        "onnxruntime int8 Q/DQ, basic opt": ort_latency(a.qdq, x, basic, a.threads, a.runs),
        "onnxruntime int8 Q/DQ, full opt": ort_latency(a.qdq, x, full, a.threads, a.runs),
    }
    print(f"onnxruntime {ort.__version__}, {a.threads} thread(s), median of >= {a.runs} runs")
    for k, v in res.items():
        print(f"  {k:36} {v:9.2f} ms")
    q = res["quantscope int8"]
    print(f"  ratio quantscope int8 / quantscope fp32:            {q / res['quantscope fp32']:.2f}")
    print(f"  ratio quantscope int8 / onnxruntime int8 basic opt: {q / res['onnxruntime int8 Q/DQ, basic opt']:.2f}")
    print(f"  ratio quantscope int8 / onnxruntime int8 full opt:  {q / res['onnxruntime int8 Q/DQ, full opt']:.2f}")
    json.dump(res, sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
