#!/usr/bin/env python3
"""Runs an ONNX model in ONNX Runtime with basic graph optimisation (the Q/DQ arithmetic as
written, except that ONNX Runtime 1.2x+ quantizes a conv's float bias to int32 at input scale x
weight scale even at this level; quantscope floors weight scales so that every bias fits, so the
difference is at most half of that step).

Usage: ort_run.py MODEL.onnx INPUT.f32 D0,D1,D2,D3 OUTPUT.f32 [THREADS]
Reads a raw little-endian float32 input of the given shape, writes the first output as raw
float32, and prints the median latency in ms of 20 runs on stdout. quantscope's tests use it
to check that its Q/DQ models run in ONNX Runtime and match its INT8 engine.
"""
import sys
import time

import numpy as np
import onnxruntime as ort


def main() -> int:
    model, inp, shape, out = sys.argv[1:5]
    threads = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    x = np.fromfile(inp, dtype=np.float32).reshape([int(d) for d in shape.split(",")])
    name = sess.get_inputs()[0].name
    y = sess.run(None, {name: x})[0]
    y.astype(np.float32).tofile(out)
    times = []
    for _ in range(20):
        t = time.perf_counter()
        sess.run(None, {name: x})
        times.append((time.perf_counter() - t) * 1e3)
    print(f"{sorted(times)[len(times) // 2]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
