#!/usr/bin/env python3
"""Copies of an image folder at input-rounding level (issue 43: accuracy that does not flip on
noise), to check that a quantscope result holds when nothing that matters changes:

  input_noise.py SRC DST [--seed N]   each image under SRC decoded (Pillow), each pixel shifted
                                      by a random -1, 0 or +1 grey level (seeded; clipped to
                                      0..255) and written losslessly as DST/<same path>.png;
                                      every other file (masks, labels) copied as it is
  input_noise.py SRC DST --lossless   the same without the noise: Pillow's decode, stored as PNG
                                      (a JPEG decoder's own rounding differs from quantscope's)

The folder keeps its layout (images/ + masks/, or ImageFolder), so `quantscope eval --data DST`
reads it as it read SRC. Needs Pillow and NumPy (`pip install pillow numpy`).
"""
import argparse
import os
import shutil
import sys

import numpy as np
from PIL import Image

IMAGE_EXT = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lossless", action="store_true", help="no noise, only the PNG copy")
    a = ap.parse_args()
    if os.path.abspath(a.dst).startswith(os.path.abspath(a.src) + os.sep):
        sys.exit(f"{a.dst} is inside {a.src}: give a folder outside it")
    rng = np.random.default_rng(a.seed)
    n = 0
    for root, _, files in os.walk(a.src):
        rel = os.path.relpath(root, a.src)
        # Masks are labels, not pixels: copied as they are.
        is_mask_dir = any(p.endswith("masks") for p in rel.split(os.sep))
        out_dir = os.path.join(a.dst, rel)
        os.makedirs(out_dir, exist_ok=True)
        for f in sorted(files):
            src = os.path.join(root, f)
            stem, ext = os.path.splitext(f)
            if is_mask_dir or ext.lower() not in IMAGE_EXT:
                shutil.copy2(src, os.path.join(out_dir, f))
                continue
            img = np.asarray(Image.open(src).convert("RGB"), dtype=np.int16)
            if not a.lossless:
                img = img + rng.integers(-1, 2, size=img.shape, dtype=np.int16)
            out = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
            out.save(os.path.join(out_dir, stem + ".png"))
            n += 1
    print(f"{n} images written under {a.dst} ({'lossless' if a.lossless else f'±1 grey level, seed {a.seed}'})")


if __name__ == "__main__":
    main()
