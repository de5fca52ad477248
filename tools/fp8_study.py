#!/usr/bin/env python3
"""Where a Q/DQ model loses against its float model, measured in ONNX Runtime: an independent
check of quantscope's own FP8 (and INT8) simulation, and a per-layer breakdown.

Usage: fp8_study.py FP32.onnx IMAGES_DIR QDQ.onnx [QDQ2.onnx ...] [--count N] [--size HW]
                    [--scale S] [--offset O]

Each image is resized to HW x HW (bilinear, Pillow), scaled as x * S + O (quantscope's
--scale/--offset) and run through every model in ONNX Runtime with basic graph optimisation
(QuantizeLinear/DequantizeLinear computed as written; ONNX Runtime's CPU runs float8e4m3fn
Q/DQ at opset 19). Printed per Q/DQ model:
- end to end: SQNR of the first output against FP32's (dB, over all images), and the share of
  positions whose arg-max over channels matches FP32's;
- the same with only the weights quantized (activations float), and only the activations;
- per conv: the model with only that conv quantized (its input's Q/DQ pair and its weights),
  every other tensor float (weights from FP32.onnx): the output SQNR against FP32. A layer that costs the most there is
  where the format loses.
- per conv, the rounding SQNR of its input tensor alone (the tensor against its Q/DQ round
  trip), which tells the format's own error from what the network does with it.
The geometry is a plain resize, not quantscope's, so absolute numbers differ a little from the
report's; both models see the same inputs.
"""
import argparse
import copy
import pathlib
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper
from PIL import Image


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.intra_op_num_threads = 2
    return ort.InferenceSession(
        model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )


def sqnr_db(ref: np.ndarray, x: np.ndarray) -> float:
    noise = float(np.sum((ref.astype(np.float64) - x) ** 2))
    signal = float(np.sum(ref.astype(np.float64) ** 2))
    return 10 * np.log10(signal / noise) if noise > 0 else float("inf")


def images(folder: str, count: int, hw: int, scale: float, offset: float) -> list:
    files = sorted(
        p
        for p in pathlib.Path(folder).iterdir()
        if p.suffix.lower() in (".jpg", ".jpeg", ".png")
    )[:count]
    out = []
    for p in files:
        im = Image.open(p).convert("RGB").resize((hw, hw), Image.BILINEAR)
        x = np.asarray(im, dtype=np.float32).transpose(2, 0, 1)[None] * scale + offset
        out.append(x.astype(np.float32))
    return out


def run_all(model: onnx.ModelProto, xs: list) -> list:
    s = session(model)
    name = s.get_inputs()[0].name
    return [s.run(None, {name: x})[0] for x in xs]


def float_weights(fp32: onnx.ModelProto, model: onnx.ModelProto) -> dict:
    """Each weight DequantizeLinear's output name in `model` -> the FP32 model's weight it
    stands for (the conv of the same name's second input)."""
    inits = {i.name: numpy_helper.to_array(i) for i in fp32.graph.initializer}
    by_name = {n.name: n for n in fp32.graph.node}
    out = {}
    for n in model.graph.node:
        f = by_name.get(n.name)
        if n.op_type == "Conv" and f is not None and len(f.input) > 1 and f.input[1] in inits:
            out[n.input[1]] = inits[f.input[1]]
    return out


def keep_only(model: onnx.ModelProto, weights: dict, keep) -> onnx.ModelProto:
    """`model` with the Q/DQ pairs and weight DQs that `keep(node, is_weight)` refuses made
    float: an activation pair becomes an Identity, a weight DQ the FP32 model's weight."""
    m = copy.deepcopy(model)
    g = m.graph
    producer = {o: n for n in g.node for o in n.output}
    reader = {}
    for n in g.node:
        for i in n.input:
            reader.setdefault(i, n)
    nodes = []
    for n in g.node:
        if n.op_type == "QuantizeLinear":
            dq = reader[n.output[0]]
            if keep(dq, False):
                nodes.append(n)
        elif n.op_type != "DequantizeLinear":
            nodes.append(n)
        elif n.output[0] in weights:
            if keep(n, True):
                nodes.append(n)
            else:
                g.initializer.append(numpy_helper.from_array(weights[n.output[0]], n.output[0]))
        elif keep(n, False):
            nodes.append(n)
        else:
            q = producer[n.input[0]]
            nodes.append(onnx.helper.make_node("Identity", [q.input[0]], [n.output[0]], n.name))
    del g.node[:]
    g.node.extend(nodes)
    return m


def conv_dqs(model: onnx.ModelProto, conv: onnx.NodeProto) -> set:
    producer = {o: n for n in model.graph.node for o in n.output}
    return {producer[t].name for t in conv.input[:2] if t in producer and producer[t].op_type == "DequantizeLinear"}


def input_rounding_sqnr(model: onnx.ModelProto, conv: onnx.NodeProto, xs: list) -> float:
    """SQNR of `conv`'s input activation against its own Q/DQ round trip."""
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    dq = producer.get(conv.input[0])
    if dq is None or dq.op_type != "DequantizeLinear":
        return float("nan")
    q = producer[dq.input[0]]
    m = copy.deepcopy(model)
    del m.graph.output[:]
    for o in (q.input[0], dq.output[0]):
        m.graph.output.append(onnx.helper.make_empty_tensor_value_info(o))
    s = session(m)
    name = s.get_inputs()[0].name
    pairs = [s.run([q.input[0], dq.output[0]], {name: x}) for x in xs]
    ref = np.concatenate([p[0].ravel() for p in pairs])
    got = np.concatenate([p[1].ravel() for p in pairs])
    return sqnr_db(ref, got)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fp32")
    ap.add_argument("images")
    ap.add_argument("qdq", nargs="+")
    ap.add_argument("--count", type=int, default=16)
    ap.add_argument("--size", type=int, default=257)
    ap.add_argument("--scale", type=float, default=1 / 127.5)
    ap.add_argument("--offset", type=float, default=-1.0)
    ap.add_argument("--layers", type=int, default=0, help="per-layer rows to print (0: all)")
    a = ap.parse_args()
    xs = images(a.images, a.count, a.size, a.scale, a.offset)
    fp32 = onnx.load(a.fp32)
    ref = run_all(fp32, xs)
    r = np.concatenate([y.ravel() for y in ref])
    table = {}
    names = []
    for path in a.qdq:
        model = onnx.load(path)
        got = run_all(model, xs)
        agree = np.mean(
            np.concatenate(
                [(np.argmax(y, 1) == np.argmax(z, 1)).ravel() for y, z in zip(ref, got)]
            )
        )
        e2e = sqnr_db(r, np.concatenate([y.ravel() for y in got]))
        tag = pathlib.Path(path).stem
        names.append(tag)
        print(f"{tag}: end to end {e2e:.2f} dB, arg-max agreement {100 * agree:.2f} % ({len(xs)} images)")
        weights = float_weights(fp32, model)
        for what, keep in [
            ("weights only", lambda n, w: w),
            ("activations only", lambda n, w: not w),
        ]:
            part = run_all(keep_only(model, weights, keep), xs)
            print(f"  {what}: {sqnr_db(r, np.concatenate([y.ravel() for y in part])):.2f} dB")
        for conv in (n for n in model.graph.node if n.op_type == "Conv"):
            mine = conv_dqs(model, conv)
            alone = run_all(keep_only(model, weights, lambda n, w: n.name in mine), xs)
            db = sqnr_db(r, np.concatenate([y.ravel() for y in alone]))
            table.setdefault(conv.name, {})[tag] = (db, input_rounding_sqnr(model, conv, xs))
        sys.stdout.flush()
    print()
    print("| conv | " + " | ".join(f"{t}: output SQNR alone / input rounding SQNR (dB)" for t in names) + " |")
    print("|---|" + "---|" * len(names))
    rows = sorted(table.items(), key=lambda kv: min(v[0] for v in kv[1].values()))
    for name, v in rows[: a.layers or len(rows)]:
        cells = [f"{v[t][0]:.1f} / {v[t][1]:.1f}" if t in v else "-" for t in names]
        print(f"| {name} | " + " | ".join(cells) + " |")
    for t in names:
        alone = sorted(v[t][0] for v in table.values() if t in v)
        rnd = sorted(v[t][1] for v in table.values() if t in v and np.isfinite(v[t][1]))
        print(
            f"{t}: {len(alone)} convs; output SQNR alone median {alone[len(alone) // 2]:.1f} dB, "
            f"worst {alone[0]:.1f}; input rounding median {rnd[len(rnd) // 2]:.1f} dB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
