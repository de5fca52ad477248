#!/usr/bin/env python3
"""PyTorch side of tools/bench_gpu.sh: exports torchvision ResNet-50 (224) and
DeepLabV3-ResNet50 (513) with random weights to ONNX, writes noise calibration images, and
times PyTorch eager FP32/FP16 (channels_last, cudnn.benchmark) and, with --compile,
torch.compile(mode="max-autotune") FP16. Median of CUDA-event timings."""
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

    return {"resnet50": (r50, 224, [1, 32]), "deeplabv3_resnet50": (Seg(dl).eval(), 513, [1])}


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
    ap.add_argument("--compile-models", default="resnet50", help="comma-separated")
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    # PyTorch's defaults, recorded: cuDNN convolutions in FP32 use TF32, matmuls do not.
    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
           "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32, "results": []}
    t_start = time.time()
    for name, (m, hw, batches) in models().items():
        if a.export:
            os.makedirs(a.export, exist_ok=True)
            path = os.path.join(a.export, f"{name}.onnx")
            torch.onnx.export(m, torch.randn(1, 3, hw, hw), path, opset_version=13,
                              input_names=["input"], output_names=["output"], dynamo=False)
            print(f"exported {path}", flush=True)
        if a.export_only:
            continue
        m = m.cuda()
        for bs in batches:
            x = torch.randn(bs, 3, hw, hw, device="cuda")
            with torch.no_grad():
                xf = x.to(memory_format=torch.channels_last)
                m32 = m.to(memory_format=torch.channels_last).float()
                r = {"model": name, "batch": bs}
                r["eager_fp32_ms"] = time_fn(m32, xf)
                m16 = m32.half()
                xh = xf.half()
                r["eager_fp16_ms"] = time_fn(m16, xh)
                want = name in a.compile_models.split(",")
                if a.compile and want and time.time() - t_start < a.compile_budget_s:
                    try:
                        t0 = time.time()
                        mc = torch.compile(m16, mode="max-autotune")
                        mc(xh)
                        r["compile_s"] = time.time() - t0
                        r["compile_fp16_ms"] = time_fn(mc, xh)
                    except Exception as e:  # noqa
                        r["compile_error"] = str(e)[:300]
                elif a.compile and want:
                    r["compile_error"] = "skipped: compile time budget spent"
                m.float()
                print(json.dumps(r), flush=True)
                res["results"].append(r)
                with open(a.out, "w") as f:  # incrementally: a time limit keeps what was measured
                    json.dump(res, f, indent=1)
    if a.export_only:
        return
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
