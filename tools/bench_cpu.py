#!/usr/bin/env python3
"""CPU speed, side by side in one run: quantscope's FP32, FP16 and INT8 CPU engines against
ONNX Runtime running the same FP32 model and the same Q/DQ file quantscope wrote (at basic and
at full graph optimisation), at 1 thread and at all cores, on several models.

Usage:
  tools/bench_cpu.py QUANTSCOPE_BIN CALIB_DIR --model NAME=PATH[:NORM] [--model ...]
                     [--threads 1,2] [--rounds 2] [--runs 20] [--out PREFIX]

NORM is `scale,offset` (x*scale + offset on 0..255 pixels) or `imagenet` (the default).

Order of work, in this one process: for each thread count, for each round, for each model:
quantscope (fp32, fp16, int8 max; its own timing loop: >= RUNS runs after a warm-up), then
ONNX Runtime fp32, int8 Q/DQ basic, int8 Q/DQ full (>= RUNS runs each after 3 warm-ups).
Engines are therefore timed interleaved, not one after the other for minutes; each number
printed is the median over rounds of each round's median. quantscope's per-layer profile
(its CPU engine times each tract node) is summed by op kind and printed with the times, so
the ratios come with the ops that explain them.

Writes PREFIX.txt (what is printed) and PREFIX.json when --out is given.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [x for x in ("avx2", "fma", "f16c", "avx512f", "avx512_vnni",
                                        "avx_vnni", "avx512_fp16", "amx_int8") if x in have]
    except OSError:
        pass
    return []


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
    while len(t) < runs:
        a = time.perf_counter()
        s.run(None, {name: x})
        t.append((time.perf_counter() - a) * 1e3)
    return float(np.median(t))


def quantscope_round(a, name, path, norm, threads, work):
    """One quantscope eval: fp32, fp16, int8 (max). Returns {precision: ms}, per-op ms, shape,
    the Q/DQ path, {precision: threads the engine ran on} (an engine keeps one thread where
    one ran it faster)."""
    report = os.path.join(work, f"{name}-t{threads}.json")
    qdq_dir = os.path.join(work, f"{name}-qdq")
    cmd = [a.quantscope, "eval", "--model", path, "--calib", a.calib, "--calib-count", "4",
           "--precisions", "fp32,fp16,int8", "--methods", "max", "--min-runs", str(a.runs),
           "--min-time-ms", "1000", "--batch", "1", "--threads", str(threads),
           "--cle", "off", "--export-qdq", qdq_dir, "--report", report] + norm
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = json.load(open(report))
    times, ops, used = {}, {}, {}
    for row in r["rows"]:
        if row.get("error"):
            raise SystemExit(f"{name}: quantscope {row['precision']} failed: {row['error']}")
        p = row["precision"]
        times[p] = row["latency_ms"]["median"]
        used[p] = row.get("threads")
        per_kind = {}
        for l in row.get("layer_times", []):
            per_kind[l["kernel"]] = per_kind.get(l["kernel"], 0.0) + l["time_ms"]
        ops[p] = per_kind
    shape = [1] + [int(d) for d in r["model"]["inputs"][0]["shape"][1:]]
    qdq = [os.path.join(qdq_dir, f) for f in sorted(os.listdir(qdq_dir)) if f.endswith(".onnx")]
    if not qdq:
        raise SystemExit(f"{name}: quantscope wrote no Q/DQ model under {qdq_dir}")
    return times, ops, shape, qdq[0], used


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("quantscope")
    ap.add_argument("calib")
    ap.add_argument("--model", action="append", required=True, help="NAME=PATH[:NORM]")
    ap.add_argument("--threads", default=f"1,{os.cpu_count()}")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--out")
    a = ap.parse_args()

    models = []
    for m in a.model:
        name, rest = m.split("=", 1)
        path, _, norm = rest.partition(":")
        if not os.path.isfile(path):
            raise SystemExit(f"--model {m}: no file at {path}")
        if norm in ("", "imagenet"):
            flags = ["--mean", "0.485,0.456,0.406", "--std", "0.229,0.224,0.225"]
        else:
            s, o = norm.split(",")
            flags = ["--scale", s, "--offset", o]
        models.append((name, path, flags))
    threads = sorted({int(t) for t in a.threads.split(",")})
    basic, full = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, ort.GraphOptimizationLevel.ORT_ENABLE_ALL

    lines = []

    def say(s=""):
        print(s, flush=True)
        lines.append(s)

    say(f"# tools/bench_cpu.py, {time.strftime('%Y-%m-%d')}")
    say(f"CPU: {cpu_name()}, {os.cpu_count()} logical cores, flags {' '.join(cpu_flags())}; "
        f"load average at the start: {os.getloadavg()[0]:.2f}")
    say(f"onnxruntime {ort.__version__}; quantscope {a.quantscope}; {a.rounds} rounds, "
        f">= {a.runs} runs per engine per round; median over rounds of per-round medians")
    results = {"cpu": cpu_name(), "flags": cpu_flags(), "onnxruntime": ort.__version__,
               "rounds": a.rounds, "runs": a.runs, "models": {}}
    with tempfile.TemporaryDirectory() as work:
        for t in threads:
            samples = {n: {} for n, _, _ in models}
            ops, used = {}, {}
            for _ in range(a.rounds):
                for name, path, norm in models:
                    times, per_op, shape, qdq, ran_on = quantscope_round(a, name, path, norm, t, work)
                    ops[name] = per_op
                    for p, n in ran_on.items():
                        used.setdefault(name, {}).setdefault(p, []).append(n)
                    x = np.random.default_rng(0).uniform(-1, 1, size=shape).astype(np.float32)
                    got = {f"quantscope {p}": v for p, v in times.items()}
                    got["onnxruntime fp32"] = ort_latency(path, x, full, t, a.runs)
                    got["onnxruntime int8 Q/DQ, basic opt"] = ort_latency(qdq, x, basic, t, a.runs)
                    got["onnxruntime int8 Q/DQ, full opt"] = ort_latency(qdq, x, full, t, a.runs)
                    for k, v in got.items():
                        samples[name].setdefault(k, []).append(v)
            say()
            # Other work on the machine skews everything: say how busy it was.
            say(f"## {t} thread(s) (load average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)")
            for name, _, _ in models:
                res = {k: statistics.median(v) for k, v in samples[name].items()}
                results["models"].setdefault(name, {})[f"threads_{t}"] = {
                    "median_ms": res, "rounds_ms": samples[name], "quantscope_ms_by_op": ops[name],
                    "quantscope_threads": used.get(name, {})}
                say(f"### {name}")
                for k, v in res.items():
                    say(f"  {k:36} {v:9.2f} ms")
                q = lambda p: res[f"quantscope {p}"]
                o_fp32 = res["onnxruntime fp32"]
                o_full = res["onnxruntime int8 Q/DQ, full opt"]
                o_basic = res["onnxruntime int8 Q/DQ, basic opt"]
                say(f"  ratio quantscope fp32 / ort fp32          {q('fp32') / o_fp32:6.2f}  (target <= 1.2)")
                say(f"  ratio quantscope int8 / ort int8 full opt {q('int8') / o_full:6.2f}  (target <= 1.0)")
                say(f"  ratio quantscope int8 / ort int8 basic    {q('int8') / o_basic:6.2f}")
                say(f"  ratio quantscope int8 / quantscope fp32   {q('int8') / q('fp32'):6.2f}")
                say(f"  ratio quantscope fp16 / quantscope fp32   {q('fp16') / q('fp32'):6.2f}  (target <= 2.0)")
                say(f"  ratio ort int8 full opt / ort fp32        {o_full / o_fp32:6.2f}")
                say("  quantscope threads per round: " + ", ".join(
                    f"{p} {used.get(name, {}).get(p)}" for p in ("fp32", "fp16", "int8")))
                for p in ("fp32", "fp16", "int8"):
                    top = sorted(ops[name].get(p, {}).items(), key=lambda kv: -kv[1])[:6]
                    say(f"  quantscope {p} profile, ms by op (last round): "
                        + ", ".join(f"{k} {v:.2f}" for k, v in top))
    if a.out:
        with open(a.out + ".txt", "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(a.out + ".json", "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
