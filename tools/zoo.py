#!/usr/bin/env python3
"""The zoo: everyday vision architectures exported to ONNX, for op-coverage and speed checks.

  export DIR      (GPU machine, needs torch/torchvision/timm) exports every model to DIR/<name>.onnx
                  (random weights, opset 17 unless the name says otherwise, dynamo=False: what users
                  get from torch.onnx.export today).
  pack DIR OUT    zeroes every large float initializer (recording its mean/std) so the folder
                  compresses to a few MiB and travels back from the GPU machine.
  unpack IN DIR   refills those initializers with seeded normal noise (see `unpack`).
  ratio QS DIR OUT [NAME...]
                  (GPU machine) INT8 / FP16 latency per model as a user's run gets it: `QS eval
                  --backend cuda --precisions fp16,int8` (max calibration on 4 noise images, the
                  fast recipe, batch 1 and 32, precision per region on), one line per model, the
                  ratios in OUT (JSON) and each model's report in OUT's name + "-reports/".

Random weights are fine for coverage and timing; accuracy is checked on ../shared's trained models.
`export` also writes the pre-quantized models of tools/prequantized.py (PyTorch eager-mode and
ONNX Runtime quantize_static exports, named tq_* and ortq_*).
"""
import json
import os
import sys
import tarfile
import zlib

import numpy as np

# name -> (constructor source, input shape, opset, fp16)
MODELS = {
    "resnet50": ("tv:resnet50", (1, 3, 224, 224), 17, False),
    "mobilenet_v2": ("tv:mobilenet_v2", (1, 3, 224, 224), 17, False),
    "mobilenet_v3_large": ("tv:mobilenet_v3_large", (1, 3, 224, 224), 17, False),
    "mobilenet_v3_small": ("tv:mobilenet_v3_small", (1, 3, 224, 224), 17, False),
    "efficientnet_b0": ("tv:efficientnet_b0", (1, 3, 224, 224), 17, False),
    "regnet_y_400mf": ("tv:regnet_y_400mf", (1, 3, 224, 224), 17, False),
    "convnext_tiny": ("tv:convnext_tiny", (1, 3, 224, 224), 17, False),
    "convnext_tiny_op13": ("tv:convnext_tiny", (1, 3, 224, 224), 13, False),
    "vit_b_16": ("tv:vit_b_16", (1, 3, 224, 224), 17, False),
    "swin_t": ("tv:swin_t", (1, 3, 224, 224), 17, False),
    "maxvit_t": ("tv:maxvit_t", (1, 3, 224, 224), 17, False),
    "shufflenet_v2_x1_0": ("tv:shufflenet_v2_x1_0", (1, 3, 224, 224), 17, False),
    "squeezenet1_0": ("tv:squeezenet1_0", (1, 3, 224, 224), 17, False),
    "squeezenet1_1": ("tv:squeezenet1_1", (1, 3, 224, 224), 17, False),
    "efficientnet_v2_s": ("tv:efficientnet_v2_s", (1, 3, 224, 224), 17, False),
    "densenet121": ("tv:densenet121", (1, 3, 224, 224), 17, False),
    "googlenet": ("tv:googlenet", (1, 3, 224, 224), 17, False),
    "mnasnet1_0": ("tv:mnasnet1_0", (1, 3, 224, 224), 17, False),
    "deeplabv3_mobilenet_v3_large": ("seg:deeplabv3_mobilenet_v3_large", (1, 3, 256, 256), 17, False),
    "lraspp_mobilenet_v3_large": ("seg:lraspp_mobilenet_v3_large", (1, 3, 256, 256), 17, False),
    "fcn_resnet50": ("seg:fcn_resnet50", (1, 3, 256, 256), 17, False),
    "resnet18_fp16": ("tv:resnet18", (1, 3, 224, 224), 17, True),
    "timm_mobilevit_s": ("timm:mobilevit_s", (1, 3, 256, 256), 17, False),
    "timm_efficientformer_l1": ("timm:efficientformer_l1", (1, 3, 224, 224), 17, False),
    # Attention with BatchNorm1d between the matmuls (tract cannot load it).
    "timm_levit_128s": ("timm:levit_128s", (1, 3, 224, 224), 17, False),
    # Cheap depthwise "ghost" features concatenated with the primary ones and cut by Slice.
    "timm_ghostnet_100": ("timm:ghostnet_100", (1, 3, 224, 224), 17, False),
    # ReLU linear attention: K^T V summed over every token, beyond FP16's range in FP16.
    "timm_efficientvit_b0": ("timm:efficientvit_b0", (1, 3, 224, 224), 17, False),
    # Detection with its post-processing in the graph (NonZero, TopK, NMS-style gathers).
    "ssdlite320_mobilenet_v3_large": ("det:ssdlite320_mobilenet_v3_large", (1, 3, 320, 320), 17, False),
}
BIG = 1024  # float initializers with at least this many elements are zeroed by `pack`


def build(src):
    kind, name = src.split(":")
    if kind == "tv":
        import torchvision

        return torchvision.models.get_model(name, weights=None)
    if kind == "seg":
        import torchvision

        return torchvision.models.get_model(name, weights=None, weights_backbone=None, aux_loss=None)
    if kind == "det":
        import torchvision

        return torchvision.models.get_model(name, weights=None, weights_backbone=None)
    import timm

    return timm.create_model(name, pretrained=False)


def recalibrate_batch_norms(m, shape, batches=4):
    """Gives a random-weight model's BatchNorm layers the statistics of its own activations
    (a few forward passes in train mode, cumulative average), as training would. With
    torchvision's init (running mean 0, var 1) MobileNetV2's and MNASNet's activations shrink
    layer after layer to logits around 1e-9, where any two engines' outputs differ by 100 %
    relative and the zoo's INT8 comparison means nothing."""
    import torch

    bns = [b for b in m.modules() if isinstance(b, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    for b in bns:
        b.reset_running_stats()
        b.momentum = None  # cumulative moving average over the batches below
    m.train()
    with torch.no_grad():
        for _ in range(batches):
            m(torch.randn(8, *shape[1:]))
    m.eval()


def export(out_dir, only=None):
    import torch

    os.makedirs(out_dir, exist_ok=True)
    # nn.MultiheadAttention's fused fast path (ViT in eval mode) has no ONNX export.
    torch.backends.mha.set_fastpath_enabled(False)
    for name, (src, shape, opset, fp16) in MODELS.items():
        if only and name not in only:
            continue
        # Seeded per model: a model's random weights (and its BatchNorm recalibration) are the
        # same whichever subset a call exports. Seeded once per call, they depended on the
        # models exported before it, and zoo checks of one model differed between calls.
        torch.manual_seed(zlib.crc32(name.encode()))
        path = os.path.join(out_dir, f"{name}.onnx")
        try:
            m = build(src).eval()
            if src.startswith("seg:"):
                inner = m

                class Wrap(torch.nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.m = inner

                    def forward(self, x):
                        return self.m(x)["out"]

                m = Wrap().eval()
            outputs = ["output"]
            if src.startswith("det:"):
                inner = m

                class Det(torch.nn.Module):
                    """The first image's boxes, scores and labels (post-processing included)."""

                    def __init__(self):
                        super().__init__()
                        self.m = inner

                    def forward(self, x):
                        d = self.m(x)[0]
                        return d["boxes"], d["scores"], d["labels"]

                m = Det().eval()
                outputs = ["boxes", "scores", "labels"]
            x = torch.randn(*shape)
            if not src.startswith("det:"):  # a detector in train mode wants targets
                recalibrate_batch_norms(m, shape)
            if fp16:
                m, x = m.cuda().half(), x.cuda().half()
            with torch.no_grad():
                torch.onnx.export(m, x, path, opset_version=opset, dynamo=False,
                                  input_names=["input"], output_names=outputs)
            print(f"zoo: exported {name} ({os.path.getsize(path) / 1e6:.1f} MB)", flush=True)
        except Exception as e:  # one model failing must not lose the others
            print(f"zoo: {name} failed to export: {type(e).__name__}: {e}", flush=True)
    # Pre-quantized models as PyTorch and ONNX Runtime write them (tools/prequantized.py), with
    # their reference outputs beside them for tests/prequantized_zoo.rs.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import prequantized

    names = [n for n in list(prequantized.MODELS) + list(prequantized.ORT_MODELS) if not only or n in only]
    if names:
        try:
            prequantized.export(out_dir, set(names))
        except Exception as e:
            print(f"zoo: pre-quantized exports failed: {type(e).__name__}: {e}", flush=True)


def pack(in_dir, out):
    import onnx
    from onnx import numpy_helper

    stats = {}
    with tarfile.open(out, "w:xz") as tar:
        for f in sorted(os.listdir(in_dir)):
            if not f.endswith(".onnx"):
                continue
            m = onnx.load(os.path.join(in_dir, f))
            rec = {}
            for t in m.graph.initializer:
                a = numpy_helper.to_array(t)
                if a.dtype.kind == "f" and a.size >= BIG:
                    rec[t.name] = [float(a.astype(np.float64).mean()), float(a.astype(np.float64).std())]
                    t.CopyFrom(numpy_helper.from_array(np.zeros_like(a), t.name))
            stats[f] = rec
            tmp = os.path.join(in_dir, f + ".packed")
            onnx.save(m, tmp)
            tar.add(tmp, arcname=f)
            os.remove(tmp)
        js = os.path.join(in_dir, "zoo_stats.json")
        with open(js, "w") as fh:
            json.dump(stats, fh)
        tar.add(js, arcname="zoo_stats.json")
    print(f"zoo: packed {len(stats)} models into {out} ({os.path.getsize(out) / 1e6:.1f} MB)")


def refill(m, rec, gain, seed=0):
    """The model with its zeroed initializers refilled: convolutions LeCun-style with `gain`
    (std = sqrt(gain / fan_in)), tensors that were all zero (a head torchvision initialises to
    0) with std sqrt(1 / fan_in), the rest with the recorded mean/std."""
    from onnx import numpy_helper

    rng = np.random.default_rng(seed)
    for t in m.graph.initializer:
        if t.name in rec:
            a = numpy_helper.to_array(t)
            mean, std = rec[t.name]
            fan_in = max(1, int(np.prod(a.shape[1:]))) if a.ndim > 1 else 1
            if a.ndim == 4:
                mean, std = 0.0, float(np.sqrt(gain / fan_in))
            elif std == 0.0 and a.ndim == 2:
                mean, std = 0.0, float(np.sqrt(1.0 / fan_in))
            r = rng.normal(mean, std, a.shape).astype(a.dtype)
            t.CopyFrom(numpy_helper.from_array(r, t.name))
    return m


def output_scale(path):
    """log10 of the largest |output| on a random input (ONNX Runtime), or None."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    try:
        s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        i = s.get_inputs()[0]
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        x = (np.random.default_rng(7).random(shape, dtype=np.float32) * 2 - 1) * 2
        if "float16" in i.type:
            x = x.astype(np.float16)
        y = s.run(None, {i.name: x})[0].astype(np.float32)
    except Exception as e:  # a model ORT cannot run keeps gain 1
        print(f"zoo: {path}: onnxruntime: {e}")
        return None
    peak = float(np.abs(y).max())
    return np.log10(peak) if np.isfinite(y).all() and peak > 0 else float("inf")


def unpack(src, out_dir):
    """Refills each model, choosing the convolution gain (1, 1.5, 2 or 3) that keeps its outputs
    nearest 1 in magnitude: random weights otherwise make deep nets' activations vanish below
    FP16's range (MobileNets) or overflow it (ResNets), which tests nothing."""
    import onnx

    os.makedirs(out_dir, exist_ok=True)
    with tarfile.open(src) as tar:
        tar.extractall(out_dir, filter="data")
    stats = json.load(open(os.path.join(out_dir, "zoo_stats.json")))
    for f, rec in stats.items():
        path = os.path.join(out_dir, f)
        packed = onnx.load(path)
        best = None
        for gain in (1.0, 1.5, 2.0, 3.0):
            m = refill(onnx.ModelProto.FromString(packed.SerializeToString()), rec, gain)
            onnx.save(m, path)
            score = output_scale(path)
            if score is None:
                break
            if best is None or abs(score) < abs(best[1]):
                best = (gain, score)
        if best is not None:
            onnx.save(refill(packed, rec, best[0]), path)
        print(f"zoo: {path}" + (f" (gain {best[0]}, max |y| 1e{best[1]:.1f})" if best else ""))


def ratio(qs, model_dir, out, only=None):
    import subprocess
    import tempfile
    here = os.path.dirname(os.path.abspath(__file__))
    work = tempfile.mkdtemp()
    noise = os.path.join(work, "noise")
    os.makedirs(noise)
    subprocess.run([sys.executable, os.path.join(here, "noise_images.py"), noise, "4"],
                   check=True, stdout=subprocess.DEVNULL)
    # Each model's whole report (layer times, region choices) beside OUT, for the why.
    reports = os.path.splitext(out)[0] + "-reports"
    os.makedirs(reports, exist_ok=True)
    names = sorted(n for n in MODELS if os.path.exists(os.path.join(model_dir, n + ".onnx")))
    records, over, ties = [], 0, 0
    for name in names:
        if only and name not in only:
            continue
        report = os.path.join(reports, name + ".json")
        cmd = [qs, "eval", "--model", os.path.join(model_dir, name + ".onnx"), "--calib", noise,
               "--backend", "cuda", "--precisions", "fp16,int8", "--methods", "max", "--recipe",
               "fast", "--batch", "32", "--min-runs", "20", "--min-time-ms", "300",
               "--mean", "0.485,0.456,0.406", "--std", "0.229,0.224,0.225", "--report", report]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True,
                                 timeout=float(os.environ.get("ZOO_RATIO_TIMEOUT_S", "240")))
            ok = run.returncode == 0 and os.path.exists(report)
            why = (run.stderr.strip().splitlines() or ["no report"])[-1] if not ok else ""
        except subprocess.TimeoutExpired:
            ok, why = False, "timed out"
        if not ok:
            print(f"zoo ratio {name:34s} not measured: {why}", flush=True)
            records.append({"model": name, "error": why})
            continue
        rows = {r["precision"]: r for r in json.load(open(report))["rows"] if not r.get("error")}
        if "fp16" not in rows or "int8" not in rows:
            print(f"zoo ratio {name:34s} not measured: no fp16 or int8 row", flush=True)
            records.append({"model": name, "error": "no fp16 or int8 row"})
            continue
        rec = {"model": name}
        # The rows' own timings and the side-by-side medians that replaced them (the log line).
        rec["side_by_side"] = next((l.split(": ", 1)[1] for l in run.stderr.splitlines()
                                    if l.startswith("timed side by side")), None)
        for key, batch in (("latency_ms", 1), ("latency_batch_ms", 32)):
            f16, i8 = rows["fp16"].get(key), rows["int8"].get(key)
            if f16 and i8:
                rec[f"fp16_ms_bs{batch}"] = f16["median"]
                rec[f"int8_ms_bs{batch}"] = i8["median"]
                rec[f"int8_over_fp16_bs{batch}"] = i8["median"] / f16["median"]
        if "int8_over_fp16_bs32" not in rec:
            # The run times batch 1 only where the batch-32 engine did not build; its note says why.
            notes = json.load(open(report)).get("notes", [])
            rec["batch32"] = next((n for n in notes if "no engine at batch" in n), "no batch-32 row")
        # What the builder kept per batch size: all INT8, INT8 with regions in FP16, or FP16
        # throughout; and the all-INT8 engine's own in-run time over FP16's, before any choice.
        kept = []
        for c in rows["int8"].get("fp16_regions", []):
            b = 1 if c["batch"] == 1 else 32
            rec[f"kept_bs{b}"] = {"regions": f"{len(c['regions'])} fp16 region(s)",
                                  "fp16": "fp16 throughout"}.get(c.get("kept"), "all int8")
            rec[f"all_int8_over_fp16_bs{b}"] = c["int8_ms"] / max(c["fp16_ms"], 1e-9)
            kept.append(f"bs{b} {rec[f'kept_bs{b}']} (all-int8 {rec[f'all_int8_over_fp16_bs{b}']:.2f})")
        # An INT8 row the builder ran in FP16 throughout whose steps ran the FP16 row's kernels,
        # layer for layer: its ratio is how two builds with the same kernels time apart.
        same = []
        for b, key in ((1, "layer_times"), (32, "layer_times_batch")):
            ks = [[(t["layer"], t["kernel"]) for t in rows[p].get(key) or []] for p in ("fp16", "int8")]
            if ks[0] and ks[0] == ks[1]:
                rec[f"fp16_kernels_bs{b}"] = True
                same.append(b)
        # Two builds of one engine time within about 1 % of each other: a ratio within that of
        # 1.00 is a tie, not a loss (an INT8 row run in FP16 throughout is FP16's engine).
        slower = [b for b in (1, 32) if rec.get(f"int8_over_fp16_bs{b}", 0) > 1.01]
        tied = [b for b in (1, 32) if 1.0 < rec.get(f"int8_over_fp16_bs{b}", 0) <= 1.01]
        over += bool(slower)
        ties += bool(tied) and not slower
        ratios = ", ".join(f"bs{b} {rec[f'int8_over_fp16_bs{b}']:.3f}" for b in (1, 32)
                           if f"int8_over_fp16_bs{b}" in rec)
        if "batch32" in rec:
            ratios += " (no batch 32: see the report's notes)"
        print(f"zoo ratio {name:34s} int8 / fp16: {ratios}; kept: {'; '.join(kept) or '-'}"
              + ("; INT8 SLOWER at bs " + ",".join(map(str, slower)) if slower else "")
              + ("; within 1 % at bs " + ",".join(map(str, tied)) if tied else "")
              + ("; FP16's kernels layer for layer at bs " + ",".join(map(str, same)) if same else ""),
              flush=True)
        records.append(rec)
    with open(out, "w") as f:
        json.dump(records, f, indent=1)
    measured = sum("error" not in r for r in records)
    print(f"zoo ratio: {measured} of {len(records)} measured; INT8 slower than FP16 by more than "
          f"1 % on {over}, within 1 % on {ties}")


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "export":
        export(sys.argv[2], set(sys.argv[3:]) or None)
    elif cmd == "pack":
        pack(sys.argv[2], sys.argv[3])
    elif cmd == "unpack":
        unpack(sys.argv[2], sys.argv[3])
    elif cmd == "ratio":
        ratio(sys.argv[2], sys.argv[3], sys.argv[4], set(sys.argv[5:]) or None)
    else:
        sys.exit(__doc__)
