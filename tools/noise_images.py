#!/usr/bin/env python3
"""Writes DIR/noise{0..N-1}.png: 256x256 RGB uniform noise (seed 0), calibration images for
the GPU benchmarks (random-weight models have no data of their own). Usage: noise_images.py DIR [N]"""
import sys

import numpy as np
from PIL import Image

out, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4
rng = np.random.default_rng(0)
for i in range(n):
    Image.fromarray(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)).save(f"{out}/noise{i}.png")
