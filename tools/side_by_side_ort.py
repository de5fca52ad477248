"""Two identical ONNX Runtime sessions of one model, timed alone one after the other and then side by
side as quantscope times its rows (`bench::measure_side_by_side`): turns of 100 ms, the runs of a
turn's first SETTLE ms not counted (0: only the first run; 100: quantscope's wait for the other
session's spinning pool threads), then alone again. Identical sessions should read alike; a method
that reads them further apart, or away from their alone timings, is biased.

Usage: python3 tools/side_by_side_ort.py MODEL.onnx N,C,H,W [ROUNDS] [THREADS]
"""
import sys
import time

import numpy as np
import onnxruntime as ort


def main():
    model, shape = sys.argv[1], [int(v) for v in sys.argv[2].split(",")]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    threads = int(sys.argv[4]) if len(sys.argv) > 4 else 2

    def session():
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads  # spinning stays on, as in quantscope's engines
        return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])

    sessions = [session(), session()]
    name = sessions[0].get_inputs()[0].name
    x = np.random.default_rng(0).random(shape, dtype=np.float32)

    def run(s):
        t = time.perf_counter()
        s.run(None, {name: x})
        return (time.perf_counter() - t) * 1e3

    def alone(s, ms=1000):
        for _ in range(3):
            run(s)
        out, t0 = [], time.perf_counter()
        while (time.perf_counter() - t0) * 1e3 < ms:
            out.append(run(s))
        return float(np.median(out))

    def side(settle_ms, total_ms=1000, turn_ms=100):
        out, spent = [[], []], [0.0, 0.0]
        while min(spent) < total_ms:
            for i, s in enumerate(sessions):
                t0 = time.perf_counter()
                run(s)
                while (time.perf_counter() - t0) * 1e3 < settle_ms:
                    run(s)
                t1 = time.perf_counter()
                while (time.perf_counter() - t1) * 1e3 < turn_ms:
                    out[i].append(run(s))
                spent[i] += (time.perf_counter() - t1) * 1e3
        return [float(np.median(o)) for o in out]

    print(f"{model} {shape}, {threads} threads; median ms of sessions A and B")
    for _ in range(rounds):
        a, b = alone(sessions[0]), alone(sessions[1])
        s0, s100 = side(0), side(100)
        a2, b2 = alone(sessions[0]), alone(sessions[1])
        print(f"alone {a:.3f} {b:.3f} | side by side, settle 0: {s0[0]:.3f} {s0[1]:.3f}; "
              f"settle 100: {s100[0]:.3f} {s100[1]:.3f} | alone again {a2:.3f} {b2:.3f}", flush=True)


if __name__ == "__main__":
    main()
