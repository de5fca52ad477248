#!/usr/bin/env python3
"""PyTorch side of tools/bench_gpu.sh: exports torchvision ResNet-50, MobileNetV2,
EfficientNet-B0 (224) and DeepLabV3-ResNet50 (513) with random weights to ONNX, and times
PyTorch at every batch size the bench reports (channels_last, cudnn.benchmark):

- eager FP32 and FP16, launched from Python as a user runs them;
- the same eager models replayed from a CUDA graph captured by hand (the GPU's time without
  Python's launch cost, which on a slow host dominates eager timings);
- with --compile, torch.compile(mode="max-autotune-no-cudagraphs") FP16, replayed from a CUDA
  graph captured by hand: max-autotune's own graphs plus its autotuning did not fit the
  device's 10-minute calls at every batch size, and this times the same kernels. The compiles
  come after every eager timing, each started while --compile-budget-s lasts; the results
  file is rewritten after each measurement, so a time limit keeps what was measured.

Median of CUDA-event timings."""
import argparse, json, os, sys, time
import torch, torchvision


def models():
    torch.manual_seed(0)
    r50 = torchvision.models.resnet50(weights=None).eval()
    dl = torchvision.models.segmentation.deeplabv3_resnet50(weights=None, weights_backbone=None, aux_loss=False).eval()

    class Seg(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(x)["out"]

    mnv2 = torchvision.models.mobilenet_v2(weights=None).eval()
    effb0 = torchvision.models.efficientnet_b0(weights=None).eval()
    return {"resnet50": (r50, 224, [1, 32]), "mobilenet_v2": (mnv2, 224, [1, 32]),
            "efficientnet_b0": (effb0, 224, [1, 32]),
            "deeplabv3_resnet50": (Seg(dl).eval(), 513, [1])}


def graphed(fn, x):
    """`fn(x)` captured in a CUDA graph (after warm-up on a side stream); returns its replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(x)
    return lambda _x: g.replay()


def time_fn(fn, x, iters=50, warm=10):
    for _ in range(warm):
        fn(x)
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(x)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--export", help="folder for ONNX files and noise images")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--compile-budget-s", type=float, default=240)
    ap.add_argument("--export-only", action="store_true")
    ap.add_argument("--compile-models", default="resnet50,mobilenet_v2,efficientnet_b0",
                    help="comma-separated")
    ap.add_argument("--models", default="", help="comma-separated subset to time (default: all)")
    ap.add_argument("--compile-batches", default="1,32", help="batch sizes to compile at")
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    # PyTorch's defaults, recorded: cuDNN convolutions in FP32 use TF32, matmuls do not.
    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
           "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32, "results": []}
    # Every eager timing first, saved as it comes; then the compiles, which may not all fit a
    # call's time limit: a limit that stops one keeps every eager number and earlier compile.
    mods = {}
    for name, (m, hw, batches) in models().items():
        if a.models and name not in a.models.split(","):
            continue
        if a.export:
            os.makedirs(a.export, exist_ok=True)
            path = os.path.join(a.export, f"{name}.onnx")
            torch.onnx.export(m, torch.randn(1, 3, hw, hw), path, opset_version=13,
                              input_names=["input"], output_names=["output"], dynamo=False)
            print(f"exported {path}", flush=True)
        if a.export_only:
            continue
        m = m.cuda()
        mods[name] = (m, hw)
        for bs in batches:
            x = torch.randn(bs, 3, hw, hw, device="cuda")
            with torch.no_grad():
                xf = x.to(memory_format=torch.channels_last)
                m32 = m.to(memory_format=torch.channels_last).float()
                r = {"model": name, "batch": bs}
                r["eager_fp32_ms"] = time_fn(m32, xf)
                r["eager_fp32_graph_ms"] = time_fn(graphed(m32, xf), xf)
                m16 = m32.half()
                xh = xf.half()
                r["eager_fp16_ms"] = time_fn(m16, xh)
                r["eager_fp16_graph_ms"] = time_fn(graphed(m16, xh), xh)
                m.float()
                print(json.dumps(r), flush=True)
                res["results"].append(r)
                save(a.out, res)
    t_start = time.time()
    for r in res["results"] if a.compile else []:
        name, bs = r["model"], r["batch"]
        if name not in a.compile_models.split(",") or str(bs) not in a.compile_batches.split(","):
            continue
        if time.time() - t_start >= a.compile_budget_s:
            r["compile_error"] = "skipped: compile time budget spent"
            continue
        m, hw = mods[name]
        with torch.no_grad():
            m16 = m.to(memory_format=torch.channels_last).half()
            xh = torch.randn(bs, 3, hw, hw, device="cuda").to(memory_format=torch.channels_last).half()
            try:
                t0 = time.time()
                torch._dynamo.reset()
                mc = torch.compile(m16, mode="max-autotune-no-cudagraphs")
                mc(xh)
                r["compile_s"] = time.time() - t0
                r["compile_fp16_ms"] = time_fn(graphed(mc, xh), xh)
            except Exception as e:  # noqa
                r["compile_error"] = str(e)[:300]
            m.float()
        print(json.dumps(r), flush=True)
        save(a.out, res)
    if a.export_only:
        return
    save(a.out, res)


def save(path, res):
    """Writes what was measured so far: a time limit that stops the run keeps it."""
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
