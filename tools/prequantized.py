#!/usr/bin/env python3
"""Pre-quantized models as other tools write them, with reference outputs (issue 45: pre-quantized
models run as they come): PyTorch eager-mode quantized models exported to ONNX as users export
them, and ONNX Runtime's quantize_static QDQ models (asymmetric uint8 and symmetric int8).

  export DIR [NAME ...]     (GPU machine, needs torch/torchvision and onnxruntime) writes, for
                            each model below (or those named), DIR/<name>.onnx and, as raw
                            little-endian float32, DIR/<name>.x.f32 (16 seeded images, NCHW),
                            DIR/<name>.ort.f32 (ONNX Runtime running the file as it is, no graph
                            optimisation), DIR/<name>.torch.f32 (PyTorch's quantized model's
                            outputs, for PyTorch's exports) and DIR/<name>.json (shapes, the
                            output step the comparison counts in).

tests/prequantized_zoo.rs reads that folder (QUANTSCOPE_PREQUANTIZED=DIR) and holds quantscope's
CPU and CUDA engines to those references. `tools/zoo.py export` writes these models too.

The flow is the tutorial's: torchvision's quantizable model, `fuse_model()`, a qconfig, `prepare`,
calibrate, `convert`, then `torch.onnx.export(opset_version=13, dynamo=False)`. Weights are random
with BatchNorm statistics re-estimated on noise, which is enough for the graph's form and the
comparison against PyTorch's own int8 model.
"""
import sys

import numpy as np

IMAGES = 16

# name -> (torchvision quantizable model, qconfig) for PyTorch's eager-mode flow
MODELS = {
    # TensorRT's setting: per-tensor symmetric quint8 activations (zero point 128), per-channel
    # symmetric qint8 weights.
    "tq_resnet18_sym": ("resnet18", "symmetric"),
    "tq_mobilenet_v2_sym": ("mobilenet_v2", "symmetric"),
    # PyTorch's default (fbgemm): affine quint8 activations with data-dependent zero points.
    "tq_resnet18_fbgemm": ("resnet18", "fbgemm"),
}
# name -> ActivationSymmetric, for ONNX Runtime's quantize_static (QDQ, per-channel int8 weights)
ORT_MODELS = {
    # ONNX Runtime's default: uint8 activations with data-dependent zero points.
    "ortq_resnet18_u8": False,
    # Symmetric int8 activations: TensorRT's form.
    "ortq_resnet18_s8": True,
}


def qconfig(kind):
    import torch
    from torch.ao.quantization import QConfig, MinMaxObserver, PerChannelMinMaxObserver

    if kind == "fbgemm":
        return torch.ao.quantization.get_default_qconfig("fbgemm")
    return QConfig(
        activation=MinMaxObserver.with_args(dtype=torch.quint8, qscheme=torch.per_tensor_symmetric),
        weight=PerChannelMinMaxObserver.with_args(dtype=torch.qint8, qscheme=torch.per_channel_symmetric),
    )


def build(arch, kind, seed=0):
    import torch
    import torchvision.models.quantization as qm

    torch.manual_seed(seed)
    m = getattr(qm, arch)(weights=None, quantize=False)
    # BatchNorm statistics on noise, so activations stay in a sane range with random weights.
    m.train()
    with torch.no_grad():
        for _ in range(4):
            m(torch.randn(8, 3, 224, 224))
    m.eval()
    m.fuse_model()
    m.qconfig = qconfig(kind)
    torch.backends.quantized.engine = "fbgemm"
    torch.ao.quantization.prepare(m, inplace=True)
    with torch.no_grad():
        for _ in range(4):
            m(torch.randn(8, 3, 224, 224))
    torch.ao.quantization.convert(m, inplace=True)
    return m


def inputs(images):
    return np.random.default_rng(1).standard_normal((images, 3, 224, 224)).astype(np.float32)


def ort_outputs(path, x):
    """ONNX Runtime on the file as it is: no graph optimisation, the Q/DQ arithmetic as written."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: x[i : i + 1]})[0] for i in range(len(x))])


def save(base, x, y_ort, out_scale, note, y_torch=None):
    import json

    x.tofile(base + ".x.f32")
    y_ort.astype(np.float32).tofile(base + ".ort.f32")
    if y_torch is not None:
        y_torch.astype(np.float32).tofile(base + ".torch.f32")
    with open(base + ".json", "w") as f:
        json.dump({"input_shape": list(x.shape), "output_shape": list(y_ort.shape),
                   "out_scale": out_scale, "note": note}, f)


def export_torch(out_dir, name, arch, kind, x):
    import os

    import torch

    m = build(arch, kind)
    # The output step: the scale of the quantized tensor the model dequantizes at its end.
    steps = []
    hook = m.dequant.register_forward_hook(lambda mod, inp, out: steps.append(inp[0].q_scale()))
    with torch.no_grad():
        y = m(torch.from_numpy(x)).numpy()
    hook.remove()
    path = os.path.join(out_dir, f"{name}.onnx")
    torch.onnx.export(m, torch.from_numpy(x[:1]), path, opset_version=13, dynamo=False,
                      input_names=["input"], output_names=["logits"])
    out_scale = float(steps[0])
    y_ort = ort_outputs(path, x)
    save(os.path.join(out_dir, name), x, y_ort, out_scale, f"PyTorch eager-mode, qconfig {kind}", y)
    err = np.abs(y_ort - y) / out_scale
    print(f"{name}: {path} ({os.path.getsize(path)} bytes), output step {out_scale:.5f}; "
          f"ONNX Runtime on the file vs PyTorch: max {err.max():.1f} steps, "
          f"{(err <= 2.0001).mean() * 100:.1f} % within 2, top-1 agreement "
          f"{(y_ort.argmax(1) == y.argmax(1)).mean() * 100:.1f} %", flush=True)


def export_ort(out_dir, name, symmetric, x):
    """torchvision's ResNet-18 (random weights, BatchNorm statistics on noise) exported in float,
    then quantize_static in QDQ form on 8 noise images."""
    import os
    import tempfile

    import torch
    import torchvision
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    torch.manual_seed(0)
    m = torchvision.models.resnet18(weights=None)
    m.train()
    with torch.no_grad():
        for _ in range(4):
            m(torch.randn(8, 3, 224, 224))
    m.eval()

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.left = [{"input": np.random.default_rng(k).standard_normal((1, 3, 224, 224)).astype(np.float32)}
                         for k in range(8)]

        def get_next(self):
            return self.left.pop() if self.left else None

    path = os.path.join(out_dir, f"{name}.onnx")
    # quantize_static writes its shape-inference temporaries into the working folder.
    with tempfile.TemporaryDirectory() as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            fp32 = os.path.join(tmp, "fp32.onnx")
            torch.onnx.export(m, torch.randn(1, 3, 224, 224), fp32, opset_version=13, dynamo=False,
                              input_names=["input"], output_names=["logits"])
            quantize_static(fp32, path, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                            activation_type=QuantType.QInt8 if symmetric else QuantType.QUInt8,
                            weight_type=QuantType.QInt8,
                            extra_options={"ActivationSymmetric": symmetric})
        finally:
            os.chdir(cwd)
    y_ort = ort_outputs(path, x)
    # The logits are float (the last Gemm is not requantized): count in 1/127 of their range.
    out_scale = float(np.abs(y_ort).max() / 127)
    save(os.path.join(out_dir, name), x, y_ort, out_scale,
         f"ONNX Runtime quantize_static QDQ, ActivationSymmetric={symmetric}; step = max|y|/127")
    print(f"{name}: {path} ({os.path.getsize(path)} bytes)", flush=True)


def export(out_dir, only=None):
    import os

    os.makedirs(out_dir, exist_ok=True)
    x = inputs(IMAGES)
    for name, (arch, kind) in MODELS.items():
        if not only or name in only:
            export_torch(out_dir, name, arch, kind, x)
    for name, symmetric in ORT_MODELS.items():
        if not only or name in only:
            export_ort(out_dir, name, symmetric, x)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "export":
        export(sys.argv[2], set(sys.argv[3:]) or None)
    else:
        sys.exit(__doc__)
