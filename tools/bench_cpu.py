#!/usr/bin/env python3
"""CPU speed, side by side in one run: quantscope's CPU engines (ONNX Runtime and the built-in
tract engine) against plain ONNX Runtime on the same models, at 1 thread and at all cores.

Usage:
  tools/bench_cpu.py QUANTSCOPE_BIN CALIB_DIR --model NAME=PATH[:NORM] [--model ...]
                     [--threads 1,2] [--rounds 2] [--runs 20] [--out PREFIX]

NORM is `scale,offset` (x*scale + offset on 0..255 pixels) or `imagenet` (the default).

Rows printed for each model and each thread count:
  quantscope-ORT   fp32, fp16, int8   `quantscope eval --cpu-engine ort` (int8: max calibration)
  quantscope-tract fp32, int8         `quantscope eval --cpu-engine tract --precisions fp32,int8`
  plain ORT fp32                      the FP32 model, full graph optimisation
  plain ORT int8 our Q/DQ             the Q/DQ file quantscope exported (--export-qdq), at basic
                                      and at full graph optimisation
  plain ORT int8 ort u8/s8, s8/s8     ONNX Runtime's own onnxruntime.quantization.quantize_static
                                      (QDQ format, per-channel weights; activations QUInt8 or
                                      QInt8, weights QInt8), full optimisation. Calibrated on 8
                                      random inputs: the speed is meaningful, the accuracy not.
                                      quant_pre_process runs first where it works. Quantized once
                                      per model, before any timing.
Each quantscope int8 row also prints its `engine` string (which INT8 form ran), and each
quantscope row its per-layer profile summed by op kind (`kernel`), so the ratios come with the
ops that explain them. Ratios printed with the targets beside them:
  quantscope-ORT fp32 / plain ORT fp32                         target <= 1.1
  quantscope-ORT int8 / best plain-ORT int8 (our Q/DQ full, ort u8/s8, ort s8/s8)  target <= 1.0
  quantscope-ORT int8 / quantscope-ORT fp32                    target <= 0.6 (ResNet-50, VNNI CPU)
  quantscope-tract / quantscope-ORT (fp32, int8): the speed-up the move to ORT brought
and, after the last thread count when several were run, the all-cores speed-up (fewest-threads
ms / most-threads ms) of each quantscope-ORT precision and of plain ORT fp32 (target >= 5x on
ResNet-50 on 16 cores).

On a CPU without VNNI (AVX-512 VNNI or AVX-VNNI; the header says which) quantscope's ORT INT8
deliberately runs the Q/DQ model as exact fake quantization, with no graph optimisation (ORT's
fused u8 x s8 kernels saturate there), so its ratio to ORT's fused (full opt) int8 is expected to
be > 1 on such CPUs; compare it with the "our Q/DQ, basic opt" row instead.

Order of work, in this one process: ORT's own quantization of each model first; then for each
thread count, for each round, for each model: quantscope-ORT (fp32, fp16, int8; its own timing
loop: >= RUNS runs after a warm-up), quantscope-tract (fp32, int8), then plain ORT fp32, our
Q/DQ basic, our Q/DQ full, ort u8/s8, ort s8/s8 (>= RUNS runs each after 3 warm-ups). Engines
are therefore timed interleaved, not one after the other for minutes; each number printed is
the median over rounds of each round's median. An engine that fails on a model (a quantscope
error row, a failed eval, ONNX Runtime refusing a model) is printed as FAILED in its place and
the benchmark carries on.

Writes PREFIX.txt (what is printed) and PREFIX.json (every number, error and ratio) when --out
is given.
"""
import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

QS_ORT_PRECISIONS = ("fp32", "fp16", "int8")
QS_TRACT_PRECISIONS = ("fp32", "int8")
ENGINE_LABEL = {"ort": "quantscope-ORT", "tract": "quantscope-tract"}
ORT_FP32 = "plain ORT fp32, full opt"
OUR_BASIC = "plain ORT int8 our Q/DQ, basic opt"
OUR_FULL = "plain ORT int8 our Q/DQ, full opt"
# ONNX Runtime's own static quantization: label -> (activation type, weight type).
ORT_QUANT = {"plain ORT int8 ort u8/s8, full opt": ("QUInt8", "QInt8"),
             "plain ORT int8 ort s8/s8, full opt": ("QInt8", "QInt8")}
ROWS = ([f"quantscope-ORT {p}" for p in QS_ORT_PRECISIONS]
        + [f"quantscope-tract {p}" for p in QS_TRACT_PRECISIONS]
        + [ORT_FP32, OUR_BASIC, OUR_FULL] + list(ORT_QUANT))


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def all_cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_flags():
    have = all_cpu_flags()
    return [x for x in ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx_vnni",
                        "avx512_fp16", "amx_int8") if x in have]


def vnni_flags():
    """The VNNI (int8 dot product) extensions this CPU has; empty for none."""
    have = all_cpu_flags()
    return [x for x in ("avx512_vnni", "avx_vnni", "amx_int8") if x in have]


def short_error(e, limit=360):
    """One line; a long message keeps its start and its end (where ONNX Runtime says why)."""
    s = " ".join(str(e).split())
    return s if len(s) <= limit else s[:limit // 2] + " ... " + s[-limit // 2:]


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


def model_shape(path):
    """Batch-1 shape of the model's first input from ONNX Runtime's session, or None where a
    non-batch dimension is dynamic."""
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    dims = s.get_inputs()[0].shape
    shape = [1]
    for d in dims[1:]:
        if not isinstance(d, int) or d <= 0:
            return None
        shape.append(d)
    return shape


def ort_quantize(name, path, shape, work):
    """ONNX Runtime's own static INT8 quantization of the model, once per variant in ORT_QUANT:
    QDQ format, per-channel weights, calibrated on 8 random inputs (speed only). Returns
    ({label: path or None}, {label: error}, info for the JSON)."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quant_pre_process, quantize_static)

    logging.getLogger().setLevel(logging.ERROR)
    input_name = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).get_inputs()[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(1)
            self.data = iter([{input_name: rng.uniform(-1, 1, size=shape).astype(np.float32)}
                              for _ in range(8)])

        def get_next(self):
            return next(self.data, None)

    info = {"calibration": "8 random inputs (speed only)"}
    src = path
    # Per-channel Q/DQ needs DequantizeLinear's `axis`, opset 13 on; quantize_static leaves an
    # older opset as it is and writes a model ONNX Runtime refuses. Convert such models first.
    try:
        import onnx
        from onnx import version_converter

        m = onnx.load(path)
        opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 13)
        if opset < 13:
            src = os.path.join(work, f"{name}-opset13.onnx")
            onnx.save(version_converter.convert_version(m, 13), src)
            info["opset"] = f"converted {opset} -> 13 for per-channel Q/DQ"
    except Exception as e:  # noqa: BLE001 - quantize what we have; ORT will say if it fails
        src = path
        info["opset"] = f"conversion to opset 13 failed: {short_error(e)}"
    pre = os.path.join(work, f"{name}-ort-pre.onnx")
    try:
        quant_pre_process(src, pre)
        src = pre
        info["pre_process"] = "ok"
    except Exception as e:  # noqa: BLE001 - any failure: quantize the raw model
        info["pre_process"] = f"failed, raw model used: {short_error(e)}"
    paths, errors = {}, {}
    for label, (act, wt) in ORT_QUANT.items():
        out = os.path.join(work, f"{name}-ort-{act}-{wt}.onnx")
        a = time.perf_counter()
        try:
            quantize_static(src, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                            activation_type=getattr(QuantType, act),
                            weight_type=getattr(QuantType, wt))
            paths[label] = out
            info[label] = {"activations": act, "weights": wt, "seconds": time.perf_counter() - a}
        except Exception as e:  # noqa: BLE001
            paths[label] = None
            errors[label] = f"quantize_static failed: {short_error(e)}"
            info[label] = {"activations": act, "weights": wt, "error": errors[label]}
    return paths, errors, info


def quantscope_round(a, name, path, norm, threads, work, engine):
    """One `quantscope eval --cpu-engine ENGINE` (ort: fp32, fp16, int8; tract: fp32, int8; int8
    by max calibration). Never raises for a failed run. Returns a dict: times {precision: ms},
    errors {precision: message}, ops {precision: {kernel: ms}}, used {precision: threads the
    engine ran on} (an engine keeps one thread where one ran it faster), engines {precision:
    the row's `engine` string}, shape (batch 1; None without a report), qdq (the exported Q/DQ
    file or None), cpu_engine (the report's `cpu_engine` object or None)."""
    precisions = QS_ORT_PRECISIONS if engine == "ort" else QS_TRACT_PRECISIONS
    report = os.path.join(work, f"{name}-{engine}-t{threads}.json")
    qdq_dir = os.path.join(work, f"{name}-{engine}-qdq")
    if os.path.exists(report):
        os.remove(report)
    cmd = [a.quantscope, "eval", "--model", path, "--calib", a.calib, "--calib-count", "4",
           "--precisions", ",".join(precisions), "--methods", "max", "--min-runs", str(a.runs),
           "--min-time-ms", "1000", "--batch", "1", "--threads", str(threads),
           "--cle", "off", "--cpu-engine", engine, "--export-qdq", qdq_dir,
           "--report", report] + norm
    out = {"times": {}, "errors": {}, "ops": {}, "used": {}, "engines": {}, "shape": None,
           "qdq": None, "cpu_engine": None}
    try:
        run = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    except OSError as e:
        for p in precisions:
            out["errors"][p] = f"could not start quantscope: {e}"
        return out
    r = None
    if os.path.isfile(report):
        try:
            with open(report) as f:
                r = json.load(f)
        except (OSError, ValueError) as e:
            why = f"unreadable report: {e}"
    if r is None:
        tail = [l for l in (run.stderr or "").splitlines() if l.strip()][-3:]
        if os.path.isfile(report):
            tail = [why] + tail
        msg = (f"eval exited {run.returncode}, no report: "
               + (short_error(" | ".join(tail)) or "nothing on stderr"))
        for p in precisions:
            out["errors"][p] = msg
        return out
    out["cpu_engine"] = r.get("cpu_engine")
    for row in r.get("rows", []):
        p = row.get("precision")
        if p not in precisions:
            continue
        if row.get("engine"):
            out["engines"][p] = row["engine"]
        if row.get("error") or not row.get("latency_ms"):
            out["errors"][p] = short_error(row.get("error") or "no latency in the report")
            continue
        out["times"][p] = row["latency_ms"]["median"]
        out["used"][p] = row.get("threads")
        per_kind = {}
        for l in row.get("layer_times") or []:
            per_kind[l["kernel"]] = per_kind.get(l["kernel"], 0.0) + l["time_ms"]
        out["ops"][p] = per_kind
    for p in precisions:
        if p not in out["times"] and p not in out["errors"]:
            out["errors"][p] = f"no {p} row in the report (eval exited {run.returncode})"
    try:
        dims = r["model"]["inputs"][0]["shape"]
        out["shape"] = [1] + [int(d) for d in dims[1:]]
    except (KeyError, IndexError, TypeError, ValueError):
        hw = r.get("input_hw")
        if hw:
            out["shape"] = [1, 3, int(hw[0]), int(hw[1])]
    if os.path.isdir(qdq_dir):
        # The INT8 Q/DQ model, not the float model written beside it for the calibration cache.
        qdq = [os.path.join(qdq_dir, f) for f in sorted(os.listdir(qdq_dir))
               if f.endswith(".onnx") and "_int8_" in f]
        out["qdq"] = qdq[0] if qdq else None
    return out


def engine_line(e):
    if not e:
        return "unknown (no report)"
    return ", ".join(f"{k} {e.get(k)}" for k in ("name", "version", "path", "isa", "note")
                     if e.get(k) not in (None, ""))


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

    vnni = vnni_flags()
    say(f"# tools/bench_cpu.py, {time.strftime('%Y-%m-%d')}")
    say(f"CPU: {cpu_name()}, {os.cpu_count()} logical cores, flags {' '.join(cpu_flags())}; "
        f"load average at the start: {os.getloadavg()[0]:.2f}")
    if vnni:
        say(f"VNNI: yes ({' '.join(vnni)})")
    else:
        say("VNNI: no. quantscope's ORT INT8 deliberately runs exact fake quantization (no graph "
            "optimisation) on this CPU, so its ratio to ORT's fused (full opt) int8 is expected "
            "to be > 1 here")
    say(f"onnxruntime {ort.__version__} (Python package); quantscope {a.quantscope}; {a.rounds} rounds, "
        f">= {a.runs} runs per engine per round; median over rounds of per-round medians")
    say("ORT's own int8 (quantize_static, QDQ, per-channel weights) is calibrated on 8 random "
        "inputs: speed only, not accuracy")
    results = {"cpu": cpu_name(), "flags": cpu_flags(), "vnni": vnni,
               "onnxruntime": ort.__version__, "rounds": a.rounds, "runs": a.runs,
               "threads": threads, "quantscope_cpu_engine": {}, "ort_quantization": {},
               "models": {}}
    medians = {}  # name -> threads -> {row: ms}
    with tempfile.TemporaryDirectory() as work:
        # ONNX Runtime's own quantization, once per model, before any timing.
        shapes, ort_q, ort_q_err = {}, {}, {}
        for name, path, _ in models:
            try:
                shapes[name] = model_shape(path)
            except Exception as e:  # noqa: BLE001
                shapes[name] = None
                say(f"{name}: ONNX Runtime cannot load the FP32 model: {short_error(e)}")
            if shapes[name] is None:
                ort_q[name] = {k: None for k in ORT_QUANT}
                ort_q_err[name] = {k: "no static input shape for calibration" for k in ORT_QUANT}
                continue
            a0 = time.perf_counter()
            ort_q[name], ort_q_err[name], info = ort_quantize(name, path, shapes[name], work)
            results["ort_quantization"][name] = info
            say(f"{name}: ORT quantize_static took {time.perf_counter() - a0:.1f} s; "
                + (f"opset {info['opset']}; " if "opset" in info else "")
                + f"quant_pre_process {info['pre_process']}")

        engines_said = set()
        for t in threads:
            samples = {n: {} for n, _, _ in models}
            errors = {n: {} for n, _, _ in models}
            ops, used, eng_str = {}, {}, {}
            for _ in range(a.rounds):
                for name, path, norm in models:
                    got, err = {}, {}
                    qdq, shape = None, shapes.get(name)
                    for engine in ("ort", "tract"):
                        q = quantscope_round(a, name, path, norm, t, work, engine)
                        label = ENGINE_LABEL[engine]
                        if q["cpu_engine"] and engine not in engines_said:
                            engines_said.add(engine)
                            results["quantscope_cpu_engine"][engine] = q["cpu_engine"]
                            say(f"quantscope cpu_engine (--cpu-engine {engine}): "
                                f"{engine_line(q['cpu_engine'])}")
                        for p, v in q["times"].items():
                            got[f"{label} {p}"] = v
                        for p, e in q["errors"].items():
                            err[f"{label} {p}"] = e
                        for p, v in q["ops"].items():
                            ops.setdefault(name, {})[f"{label} {p}"] = v
                        for p, n in q["used"].items():
                            used.setdefault(name, {}).setdefault(f"{label} {p}", []).append(n)
                        for p, s in q["engines"].items():
                            eng_str.setdefault(name, {})[f"{label} {p}"] = s
                        qdq = qdq or q["qdq"]
                        shape = shape or q["shape"]
                    if shape is None:
                        for k in (ORT_FP32, OUR_BASIC, OUR_FULL, *ORT_QUANT):
                            err[k] = "input shape unknown (dynamic, and no quantscope report)"
                    else:
                        x = np.random.default_rng(0).uniform(-1, 1, size=shape).astype(np.float32)
                        plain = [(ORT_FP32, path, full), (OUR_BASIC, qdq, basic),
                                 (OUR_FULL, qdq, full)]
                        plain += [(k, ort_q[name].get(k), full) for k in ORT_QUANT]
                        for k, p, level in plain:
                            if p is None:
                                err[k] = ort_q_err[name].get(k) or "quantscope wrote no Q/DQ model"
                                continue
                            try:
                                got[k] = ort_latency(p, x, level, t, a.runs)
                            except Exception as e:  # noqa: BLE001 - ORT refusing a model
                                err[k] = f"onnxruntime: {short_error(e)}"
                    for k, v in got.items():
                        samples[name].setdefault(k, []).append(v)
                    for k, e in err.items():
                        errors[name].setdefault(k, e)
            say()
            # Other work on the machine skews everything: say how busy it was.
            say(f"## {t} thread(s) (load average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)")
            for name, _, _ in models:
                res = {k: statistics.median(samples[name][k]) for k in ROWS if k in samples[name]}
                medians.setdefault(name, {})[t] = res
                ratios = {}
                say(f"### {name}")
                for k in ROWS:
                    if k in res:
                        extra = ""
                        if len(samples[name][k]) < a.rounds:
                            extra = f"  ({len(samples[name][k])} of {a.rounds} rounds; failed: {errors[name].get(k)})"
                        say(f"  {k:38} {res[k]:9.2f} ms{extra}")
                    else:
                        say(f"  {k:38}    FAILED: {errors[name].get(k, 'no result')}")
                for k in ROWS:
                    if k.endswith("int8") and k.startswith("quantscope"):
                        say(f"  {k} engine: {eng_str.get(name, {}).get(k, 'n/a')}")

                def ratio(label, num, den, target="", den_name=None):
                    if num in res and den in res:
                        v = res[num] / res[den]
                        ratios[label] = v
                        extra = f" (vs {den_name or den})" if den_name else ""
                        say(f"  ratio {label:52} {v:6.2f}  {target}{extra}".rstrip())
                    else:
                        ratios[label] = None
                        missing = " and ".join(x for x in (num, den) if x not in res)
                        say(f"  ratio {label:52}    n/a  ({missing} failed)")

                ratio("quantscope-ORT fp32 / plain ORT fp32", "quantscope-ORT fp32", ORT_FP32,
                      "(target <= 1.1)")
                ints = [k for k in (OUR_FULL, *ORT_QUANT) if k in res]
                best = min(ints, key=lambda k: res[k]) if ints else OUR_FULL
                best_short = best.replace("plain ORT int8 ", "").replace(", full opt", "")
                ratio("quantscope-ORT int8 / best plain-ORT int8", "quantscope-ORT int8", best,
                      "(target <= 1.0" + ("" if vnni else "; > 1 expected without VNNI") + ")",
                      den_name=best_short)
                ratio("quantscope-ORT int8 / plain ORT int8 our Q/DQ basic", "quantscope-ORT int8",
                      OUR_BASIC)
                ratio("quantscope-ORT int8 / quantscope-ORT fp32", "quantscope-ORT int8",
                      "quantscope-ORT fp32", "(target <= 0.6 on ResNet-50, VNNI CPU)")
                ratio("quantscope-ORT fp16 / quantscope-ORT fp32", "quantscope-ORT fp16",
                      "quantscope-ORT fp32", "(target <= 2.0)")
                ratio("quantscope-tract fp32 / quantscope-ORT fp32", "quantscope-tract fp32",
                      "quantscope-ORT fp32", "(speed-up of the move to ORT)")
                ratio("quantscope-tract int8 / quantscope-ORT int8", "quantscope-tract int8",
                      "quantscope-ORT int8", "(speed-up of the move to ORT)")
                ratio("plain ORT int8 our Q/DQ full / plain ORT fp32", OUR_FULL, ORT_FP32)
                say("  quantscope threads per round: " + ", ".join(
                    f"{k.replace('quantscope-', '')} {v}" for k, v in used.get(name, {}).items()))
                for k in ROWS:
                    if not k.startswith("quantscope"):
                        continue
                    if k not in ops.get(name, {}):
                        continue
                    top = sorted(ops[name][k].items(), key=lambda kv: -kv[1])[:6]
                    say(f"  {k} profile, ms by op (last round): "
                        + (", ".join(f"{kk} {v:.2f}" for kk, v in top) or "none in the report"))
                results["models"].setdefault(name, {})[f"threads_{t}"] = {
                    "median_ms": res, "rounds_ms": samples[name], "errors": errors[name],
                    "ratios": ratios, "best_plain_ort_int8": best if ints else None,
                    "quantscope_ms_by_op": ops.get(name, {}),
                    "quantscope_threads": used.get(name, {}),
                    "quantscope_engine": eng_str.get(name, {})}
        if len(threads) > 1:
            lo, hi = threads[0], threads[-1]
            say()
            say(f"## all-cores speed-up ({lo}-thread ms / {hi}-thread ms; target >= 5x on "
                f"ResNet-50 on 16 cores)")
            for name, _, _ in models:
                say(f"### {name}")
                sp = {}
                for k in ("quantscope-ORT fp32", "quantscope-ORT fp16", "quantscope-ORT int8",
                          ORT_FP32):
                    a1, an = medians[name][lo].get(k), medians[name][hi].get(k)
                    if a1 is not None and an is not None:
                        sp[k] = a1 / an
                        say(f"  {k:38} {sp[k]:6.2f}x  ({a1:.2f} ms -> {an:.2f} ms)")
                    else:
                        sp[k] = None
                        say(f"  {k:38}    n/a  (failed at {lo} or {hi} threads)")
                results["models"].setdefault(name, {})["all_core_speedup"] = {
                    "threads": [lo, hi], "speedup": sp}
    if a.out:
        with open(a.out + ".txt", "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(a.out + ".json", "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
