#!/usr/bin/env python3
"""Train quantscope's sample models and generate their committed data sets.

Reproducibly builds, from the Fashion-MNIST IDX files (Debian package
``dataset-fashion-mnist``, /usr/share/datasets/fashion-mnist/):

* ``fashion_resnet.onnx``          small ResNet classifier, input [N,3,32,32]
* ``fashion_scenes_deeplab.onnx``  DeepLabV3-style segmenter, input [N,3,160,160]
* ``data/fashion_calib/``          320 held-out TRAIN images (28x28 grey PNG)
* ``data/fashion_eval/<class>/``   1000 TEST images, 100 per class (ImageFolder)
* ``data/scenes_calib/``           256 scene JPEGs from held-out TRAIN items
* ``data/scenes_eval/{images,masks}/`` 240 scene JPEGs + palette PNG masks
                                   from TEST items
* ``*.labels.txt`` and ``train_metrics.json``

Example (about 5.5 minutes on one H200; see sample_models/README.md):
    python3 tools/train_samples.py --device cuda \
        --data /usr/share/datasets/fashion-mnist --out sample_models
    python3 tools/train_samples.py --quick --device cpu --out /tmp/smoke  # smoke test

All randomness is seeded. The committed data (calibration/evaluation images
and scenes) is generated on the CPU so it is bit-identical whatever the
training device. Training on CUDA is seeded too, but some CUDA kernels
(e.g. the bilinear upsampling backward pass) are not bit-deterministic, so
re-trained weights can differ in the last bits between runs.
"""

import argparse
import concurrent.futures as cf
import datetime
import gzip
import io
import json
import math
import os
import platform
import random
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image

# --------------------------------------------------------------------------
# Constants shared with the README / the Rust tool
# --------------------------------------------------------------------------
CLASS_NAMES = ["tshirt_top", "trouser", "pullover", "dress", "coat",
               "sandal", "shirt", "sneaker", "bag", "ankle_boot"]
CLASS_DIRS = [f"{i}_{n}" for i, n in enumerate(CLASS_NAMES)]
SEG_NAMES = ["background"] + CLASS_NAMES

CLS_SIZE = 32
CLS_MEAN = 0.2860   # Fashion-MNIST train-split pixel mean (x/255)
CLS_STD = 0.3530    # Fashion-MNIST train-split pixel std  (x/255)

SCENE = 160
SEG_MEAN = 0.5
SEG_STD = 0.25
SEG_CLASSES = 11
SCENE_JPEG_QUALITY = 90
MASK_THRESHOLD = 0.1  # item pixel (x/255) above this -> item's class

N_HOLDOUT = 2000        # train-split images never used for training
N_FASHION_CALIB = 320
N_EVAL_PER_CLASS = 100
N_SCENES_CALIB = 256
N_SCENES_EVAL = 240

SEED_SPLIT = 1234
SEED_EVAL_PICK = 4321
SEED_SCENES_CALIB = 1001
SEED_SCENES_EVAL = 2002
SEED_SCENES_TRAIN = 3003
SEED_TORCH = 42


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def seed_all(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def voc_palette():
    pal = []
    for i in range(256):
        r = g = b = 0
        c = i
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        pal += [r, g, b]
    return pal


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------
def load_idx(data_dir, stem):
    for name in (stem + ".gz", stem):
        p = os.path.join(data_dir, name)
        if os.path.exists(p):
            opener = gzip.open if name.endswith(".gz") else open
            with opener(p, "rb") as f:
                raw = f.read()
            ndim = raw[3]
            dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
            return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(dims).copy()
    raise FileNotFoundError(f"{stem}(.gz) not found in {data_dir}")


def load_fmnist(data_dir):
    xtr = load_idx(data_dir, "train-images-idx3-ubyte")
    ytr = load_idx(data_dir, "train-labels-idx1-ubyte").astype(np.int64)
    xte = load_idx(data_dir, "t10k-images-idx3-ubyte")
    yte = load_idx(data_dir, "t10k-labels-idx1-ubyte").astype(np.int64)
    assert xtr.shape == (60000, 28, 28) and xte.shape == (10000, 28, 28)
    return xtr, ytr, xte, yte


def make_splits(ytr, yte):
    perm = np.random.RandomState(SEED_SPLIT).permutation(len(ytr))
    holdout = perm[:N_HOLDOUT]
    calib = np.sort(holdout[:N_FASHION_CALIB])
    train = np.sort(perm[N_HOLDOUT:])
    rs = np.random.RandomState(SEED_EVAL_PICK)
    ev = []
    for c in range(10):
        idx = np.where(yte == c)[0]
        ev.append(np.sort(rs.permutation(idx)[:N_EVAL_PER_CLASS]))
    return train, np.sort(holdout), calib, np.concatenate(ev)


# --------------------------------------------------------------------------
# Scene synthesis (vectorised torch; runs on CPU or CUDA)
# --------------------------------------------------------------------------
@torch.no_grad()
def render_scenes(items, labels, b, g, device):
    """items: uint8 [M,28,28] on device; labels: int64 [M] on device.
    Returns float image [b,3,S,S] in 0..1 and int64 label map [b,S,S]."""
    S = SCENE
    f32 = torch.float32

    def rnd(*shape):
        return torch.rand(*shape, generator=g, device=device, dtype=f32)

    lin = (torch.arange(S, device=device, dtype=f32) + 0.5) / S
    yy, xx = torch.meshgrid(lin, lin, indexing="ij")
    yy = yy[None, None]
    xx = xx[None, None]

    # random linear gradient between two colours
    c1, c2 = rnd(b, 3, 1, 1), rnd(b, 3, 1, 1)
    ang = rnd(b, 1, 1, 1) * 2 * math.pi
    t = xx * torch.cos(ang) + yy * torch.sin(ang)
    tmin = t.amin(dim=(2, 3), keepdim=True)
    tmax = t.amax(dim=(2, 3), keepdim=True)
    t = (t - tmin) / (tmax - tmin + 1e-6)
    img = c1 + (c2 - c1) * t
    # stripes (on ~60% of scenes)
    phi = rnd(b, 1, 1, 1) * 2 * math.pi
    freq = 3 + rnd(b, 1, 1, 1) * 17
    phase = rnd(b, 1, 1, 1) * 2 * math.pi
    amp = rnd(b, 1, 1, 1) * 0.25 * (rnd(b, 1, 1, 1) < 0.6).to(f32)
    scol = rnd(b, 3, 1, 1) * 2 - 1
    stripe = torch.sin(2 * math.pi * freq * (xx * torch.cos(phi) + yy * torch.sin(phi)) + phase)
    img = img + amp * scol * stripe
    # smooth colour blobs
    blob = F.interpolate(rnd(b, 3, 6, 6) * 2 - 1, size=(S, S), mode="bicubic",
                         align_corners=False)
    img = img + blob * rnd(b, 1, 1, 1) * 0.35
    img = img.clamp(0, 1)

    lab = torch.zeros(b, S, S, dtype=torch.int64, device=device)
    n_items = 2 + (rnd(b) * 4).long().clamp(max=3)  # 2..5
    M = items.shape[0]
    for k in range(5):
        active = (k < n_items).to(f32).view(b, 1, 1, 1)
        idx = (rnd(b) * M).long().clamp(max=M - 1)
        size = 40 + rnd(b) * 40                      # 40..80 px
        # best of 4 random positions: least already-covered area in the box
        # (overlaps stay possible, heavy occlusion becomes rarer)
        xc = rnd(b, 4) * (S - size)[:, None]
        yc = rnd(b, 4) * (S - size)[:, None]
        occ = (lab > 0).to(f32)
        ii = F.pad(occ.cumsum(1).cumsum(2), (1, 0, 1, 0)).view(b, -1)
        xa, ya = xc.round().long(), yc.round().long()
        xb_ = (xc + size[:, None]).round().long().clamp(max=S)
        yb_ = (yc + size[:, None]).round().long().clamp(max=S)

        def at(yv, xv):
            return ii.gather(1, yv * (S + 1) + xv)

        cover = at(yb_, xb_) - at(ya, xb_) - at(yb_, xa) + at(ya, xa)
        best = cover.argmin(1, keepdim=True)
        x0 = xc.gather(1, best)[:, 0]
        y0 = yc.gather(1, best)[:, 0]
        sx = torch.where(rnd(b) < 0.5, -1.0, 1.0)    # random horizontal flip
        theta = torch.zeros(b, 2, 3, device=device, dtype=f32)
        theta[:, 0, 0] = sx * S / size
        theta[:, 0, 2] = sx * ((S - 2 * x0) / size - 1)
        theta[:, 1, 1] = S / size
        theta[:, 1, 2] = (S - 2 * y0) / size - 1
        grid = F.affine_grid(theta, (b, 1, S, S), align_corners=False)
        src = items[idx].to(f32).unsqueeze(1) / 255.0
        a = F.grid_sample(src, grid, mode="bilinear", padding_mode="zeros",
                          align_corners=False)            # [b,1,S,S]
        tint = 0.15 + 0.85 * rnd(b, 3, 1, 1)
        item_rgb = tint * (0.2 + 0.8 * a)
        alpha = ((a - (MASK_THRESHOLD - 0.05)) / 0.1).clamp(0, 1) * active
        img = img * (1 - alpha) + item_rgb * alpha
        m = (a[:, 0] > MASK_THRESHOLD) & (active[:, 0] > 0)
        lab = torch.where(m, labels[idx].view(b, 1, 1) + 1, lab)

    sigma = rnd(b, 1, 1, 1) * 0.05
    noise = torch.randn(b, 3, S, S, generator=g, device=device, dtype=f32)
    img = (img + sigma * noise).clamp(0, 1)
    return img, lab


# Standard JPEG (ITU T.81 Annex K) quantisation tables, as used by libjpeg/PIL.
_QY = [16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55,
       14, 13, 16, 24, 40, 57, 69, 56, 14, 17, 22, 29, 51, 87, 80, 62,
       18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113, 92,
       49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99]
_QC = [17, 18, 24, 47, 99, 99, 99, 99, 18, 21, 26, 66, 99, 99, 99, 99,
       24, 26, 56, 99, 99, 99, 99, 99, 47, 66, 99, 99, 99, 99, 99, 99] + [99] * 32


def jpeg_sim(x, quality):
    """Differentiable-free JPEG simulation on any device (baseline JPEG as
    written by PIL: YCbCr, 4:2:0 chroma, quality-scaled standard tables,
    8x8 DCT quantisation, 'fancy' (bilinear) chroma upsampling).
    x: float [B,3,H,W] in 0..255 (H, W multiples of 16); quality: [B] in 1..100.
    Returns float [B,3,H,W] in 0..255 (rounded)."""
    dev = x.device
    n = torch.arange(8, device=dev, dtype=torch.float32)
    D = torch.cos(math.pi * (2 * n[None] + 1) * n[:, None] / 16) * math.sqrt(2 / 8)
    D[0] = math.sqrt(1 / 8)
    q = quality.to(torch.float32)
    scale = torch.where(q < 50, 5000 / q, 200 - 2 * q)

    def table(base):
        t = torch.tensor(base, device=dev, dtype=torch.float32).view(1, 8, 8)
        return torch.floor((t * scale.view(-1, 1, 1) + 50) / 100).clamp(1, 255)

    def blockq(c, Q):
        B, h, w = c.shape
        blk = (c - 128).view(B, h // 8, 8, w // 8, 8).permute(0, 1, 3, 2, 4)
        coef = D @ blk @ D.T
        Qb = Q[:, None, None]
        coef = torch.round(coef / Qb) * Qb
        rec = D.T @ coef @ D + 128
        return rec.permute(0, 1, 3, 2, 4).reshape(B, h, w)

    r, g, b = x[:, 0], x[:, 1], x[:, 2]
    y = (0.299 * r + 0.587 * g + 0.114 * b).round()
    cb = (-0.168736 * r - 0.331264 * g + 0.5 * b + 128).round()
    cr = (0.5 * r - 0.418688 * g - 0.081312 * b + 128).round()
    cb = F.avg_pool2d(cb[:, None], 2)[:, 0].round()
    cr = F.avg_pool2d(cr[:, None], 2)[:, 0].round()
    y = blockq(y, table(_QY)).round().clamp(0, 255)
    cb = blockq(cb, table(_QC)).round().clamp(0, 255)
    cr = blockq(cr, table(_QC)).round().clamp(0, 255)
    up = lambda c: F.interpolate(c[:, None], scale_factor=2.0, mode="bilinear",
                                 align_corners=False)[:, 0]
    cb, cr = up(cb) - 128, up(cr) - 128
    out = torch.stack([y + 1.402 * cr, y - 0.344136 * cb - 0.714136 * cr, y + 1.772 * cb], 1)
    return out.round().clamp(0, 255)


def make_scenes(items_np, labels_np, n, seed, device, batch=512):
    """Returns uint8 images [n,S,S,3] and uint8 masks [n,S,S] (numpy)."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    items = torch.from_numpy(items_np).to(device)
    labels = torch.from_numpy(labels_np).to(device)
    imgs, labs = [], []
    for s in range(0, n, batch):
        b = min(batch, n - s)
        img, lab = render_scenes(items, labels, b, g, device)
        imgs.append((img * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy())
        labs.append(lab.to(torch.uint8).cpu().numpy())
    return np.concatenate(imgs), np.concatenate(labs)


def _jpeg_chunk(args):
    arrs, qs = args
    out = np.empty_like(arrs)
    for i in range(len(arrs)):
        buf = io.BytesIO()
        Image.fromarray(arrs[i]).save(buf, format="JPEG", quality=int(qs[i]))
        buf.seek(0)
        out[i] = np.asarray(Image.open(buf).convert("RGB"))
    return out


def jpeg_roundtrip(imgs, qualities, workers):
    chunk = 256
    jobs = [(imgs[i:i + chunk], qualities[i:i + chunk]) for i in range(0, len(imgs), chunk)]
    try:  # processes: Pillow's JPEG codec does not scale with threads
        import multiprocessing as mp
        ex = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("fork"))
    except (ValueError, OSError):
        ex = cf.ThreadPoolExecutor(max_workers=workers)
    with ex:
        parts = list(ex.map(_jpeg_chunk, jobs))
    return np.concatenate(parts)


# --------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------
class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1, dilation=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, dilation, dilation, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, dilation, dilation, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        s = x if self.short is None else self.short(x)
        return F.relu(y + s)


def conv_bn_relu(cin, cout, k=3, stride=1, dilation=1):
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride, dilation * (k // 2), dilation, bias=False),
        nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class FashionResNet(nn.Module):
    """ResNet-20-style: stem + 3 stages x 3 basic blocks (16/32/64 ch)."""

    def __init__(self, widths=(16, 32, 64), blocks=3, num_classes=10):
        super().__init__()
        self.stem = conv_bn_relu(3, widths[0])
        layers, cin = [], widths[0]
        for si, w in enumerate(widths):
            for bi in range(blocks):
                layers.append(BasicBlock(cin, w, stride=2 if (si > 0 and bi == 0) else 1))
                cin = w
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


class ASPP(nn.Module):
    def __init__(self, cin, cout, rates=(2, 4, 6), pool_size=20):
        super().__init__()
        self.b0 = conv_bn_relu(cin, cout, k=1)
        self.bs = nn.ModuleList([conv_bn_relu(cin, cout, 3, 1, r) for r in rates])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.pool_conv = conv_bn_relu(cin, cout, k=1)
        self.pool_size = pool_size
        self.project = conv_bn_relu(cout * (2 + len(rates)), cout, k=1)

    def forward(self, x):
        p = self.pool_conv(self.pool(x))
        # constant scale factor -> ONNX Resize with constant scales (no shape math)
        p = F.interpolate(p, scale_factor=float(self.pool_size), mode="bilinear",
                          align_corners=False)
        ys = [self.b0(x)] + [b(x) for b in self.bs] + [p]
        return self.project(torch.cat(ys, 1))


class FashionDeepLab(nn.Module):
    """DeepLabV3-style, output stride 8 (160 -> 20), dilated residual blocks."""

    def __init__(self, num_classes=SEG_CLASSES):
        super().__init__()
        self.backbone = nn.Sequential(
            conv_bn_relu(3, 24, stride=2),        # 80
            conv_bn_relu(24, 32, stride=2),       # 40
            conv_bn_relu(32, 32),
            conv_bn_relu(32, 32),
            conv_bn_relu(32, 64, stride=2),       # 20
            conv_bn_relu(64, 64),
            BasicBlock(64, 96, dilation=2),
            BasicBlock(96, 96, dilation=4),
        )
        self.aspp = ASPP(96, 64, rates=(2, 4, 6), pool_size=SCENE // 8)
        self.head = conv_bn_relu(64, 64)
        self.classifier = nn.Conv2d(64, num_classes, 1)

    def forward(self, x):
        y = self.classifier(self.head(self.aspp(self.backbone(x))))
        return F.interpolate(y, scale_factor=8.0, mode="bilinear", align_corners=False)


# --------------------------------------------------------------------------
# Preprocessing
# --------------------------------------------------------------------------
def cls_preprocess_u8(x_u8):
    """uint8 [N,28,28] tensor -> float [N,3,32,32] normalised (same as README)."""
    x = x_u8.float().unsqueeze(1) / 255.0
    x = F.interpolate(x, size=(CLS_SIZE, CLS_SIZE), mode="bilinear",
                      align_corners=False, antialias=False)
    x = (x - CLS_MEAN) / CLS_STD
    return x.expand(-1, 3, -1, -1).contiguous()


def seg_preprocess_u8(x_u8_nhwc):
    x = x_u8_nhwc.permute(0, 3, 1, 2).float() / 255.0
    return (x - SEG_MEAN) / SEG_STD


def lr_at(step, total, peak, warm):
    if step < warm:
        return peak * (step + 1) / warm
    p = (step - warm) / max(1, total - warm)
    return peak * 0.5 * (1 + math.cos(math.pi * p))


# --------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------
def train_classifier(xtr, ytr, train_idx, args, dev):
    seed_all(SEED_TORCH)
    model = FashionResNet().to(dev).to(memory_format=torch.channels_last)
    nparam = sum(p.numel() for p in model.parameters())
    log(f"classifier: {nparam} params")
    X = cls_preprocess_u8(torch.from_numpy(xtr[train_idx]).to(dev))[:, :1]  # [N,1,32,32]
    Y = torch.from_numpy(ytr[train_idx]).to(dev)
    if args.quick:
        X, Y = X[:2048], Y[:2048]
    N = len(X)
    bs = args.cls_batch
    steps_per_epoch = N // bs
    total = steps_per_epoch * args.cls_epochs
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                          weight_decay=5e-4)
    g = torch.Generator(device=dev)
    g.manual_seed(SEED_TORCH)
    pad_val = (0.0 - CLS_MEAN) / CLS_STD
    Xp = F.pad(X, (2, 2, 2, 2), value=pad_val)  # [N,1,36,36]
    ar = torch.arange(CLS_SIZE, device=dev)
    use_amp = dev.type == "cuda"
    crit = nn.CrossEntropyLoss(label_smoothing=0.05)
    step = 0
    t0 = time.time()
    for ep in range(args.cls_epochs):
        model.train()
        perm = torch.randperm(N, generator=g, device=dev)
        tot_loss, n_logged = 0.0, 0
        for i in range(steps_per_epoch):
            idx = perm[i * bs:(i + 1) * bs]
            oy = torch.randint(0, 5, (bs,), generator=g, device=dev)
            ox = torch.randint(0, 5, (bs,), generator=g, device=dev)
            rows = (oy[:, None] + ar[None])[:, :, None]
            cols = (ox[:, None] + ar[None])[:, None, :]
            xb = Xp[idx, 0][torch.arange(bs, device=dev)[:, None, None], rows, cols]
            flip = torch.rand(bs, generator=g, device=dev) < 0.5
            xb = torch.where(flip[:, None, None], xb.flip(2), xb)
            xb = xb.unsqueeze(1).expand(-1, 3, -1, -1).contiguous(
                memory_format=torch.channels_last)
            yb = Y[idx]
            for gr in opt.param_groups:
                gr["lr"] = lr_at(step, total, args.cls_lr, steps_per_epoch)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_amp):
                out = model(xb)
            loss = crit(out.float(), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if i % 50 == 0:
                tot_loss += loss.item()
                n_logged += 1
        if ep == 0 and args.cls_budget > 0:
            proj = (time.time() - t0) * args.cls_epochs
            if proj > args.cls_budget:
                # shrink the schedule (keeps the cosine decay ending at 0)
                new_ep = max(2, min(args.cls_epochs, int(args.cls_budget / (time.time() - t0))))
                log(f"WARNING: projected {proj:.0f}s > budget; epochs {args.cls_epochs} -> {new_ep}")
                args.cls_epochs = new_ep
                total = steps_per_epoch * new_ep
        log(f"classifier epoch {ep + 1}/{args.cls_epochs} loss~{tot_loss / max(1, n_logged):.4f} "
            f"t={time.time() - t0:.1f}s")
        if ep + 1 >= args.cls_epochs:
            break
    return model, time.time() - t0, nparam


def train_segmenter(items_np, labels_np, args, dev):
    """Every step renders a fresh batch of scenes on `dev` and passes it
    through a JPEG simulation (random quality 70..95), so the network never
    sees the same scene twice and is used to the artefacts of the saved JPEGs."""
    seed_all(SEED_TORCH + 1)
    t0 = time.time()
    items = torch.from_numpy(items_np).to(dev)
    labels = torch.from_numpy(labels_np).to(dev)
    gs = torch.Generator(device=dev)
    gs.manual_seed(SEED_SCENES_TRAIN)
    # sanity check of the JPEG simulation against PIL's real encoder
    chk, _ = render_scenes(items, labels, 32, gs, dev)
    chk = (chk * 255).round()
    sim = jpeg_sim(chk, torch.full((32,), 90.0, device=dev))
    real = jpeg_roundtrip(chk.permute(0, 2, 3, 1).to(torch.uint8).cpu().numpy(),
                          [90] * 32, 1)
    real = torch.from_numpy(real).to(dev).permute(0, 3, 1, 2).float()
    log(f"JPEG sim check (q=90): mean|sim-PIL|={float((sim - real).abs().mean()):.3f}, "
        f"mean|orig-PIL|={float((chk - real).abs().mean()):.3f} (0..255)")
    model = FashionDeepLab().to(dev).to(memory_format=torch.channels_last)
    nparam = sum(p.numel() for p in model.parameters())
    log(f"segmenter: {nparam} params")
    opt = torch.optim.AdamW(model.parameters(), lr=args.seg_lr, weight_decay=1e-4)
    bs = args.seg_batch
    total = args.seg_steps
    use_amp = dev.type == "cuda"
    t1 = time.time()
    model.train()
    run_loss = 0.0
    step = 0
    while step < total:
        if step == 200 and args.seg_budget > 0:
            torch.cuda.synchronize() if dev.type == "cuda" else None
            proj = (time.time() - t1) / 200 * total
            if proj > args.seg_budget:
                new_total = int(args.seg_budget / ((time.time() - t1) / 200))
                log(f"WARNING: projected {proj:.0f}s > budget; steps {total} -> {new_total}")
                total = args.seg_steps = new_total
        with torch.no_grad():
            img, y = render_scenes(items, labels, bs, gs, dev)
            qual = 70 + torch.randint(0, 26, (bs,), generator=gs, device=dev)
            x = (jpeg_sim(img * 255, qual) / 255.0 - SEG_MEAN) / SEG_STD
        x = x.contiguous(memory_format=torch.channels_last)
        for gr in opt.param_groups:
            gr["lr"] = lr_at(step, total, args.seg_lr, max(1, total // 20))
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_amp):
            out = model(x)
        loss = F.cross_entropy(out.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == total - 1:
            run_loss = loss.item()
            log(f"segmenter step {step + 1}/{total} loss={run_loss:.4f} "
                f"t={time.time() - t1:.1f}s")
        step += 1
    return model, time.time() - t0, nparam


# --------------------------------------------------------------------------
# Export + checks
# --------------------------------------------------------------------------
def export_onnx(model, shape, path):
    import onnx
    import onnxruntime as ort
    model = model.float().cpu().eval()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(7))
    torch.onnx.export(model.eval(), x, path, opset_version=13, dynamo=False,
                      training=torch.onnx.TrainingMode.PRESERVE,
                      do_constant_folding=True, input_names=["input"],
                      output_names=["logits"],
                      dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}})
    m = onnx.load(path)
    # Keep the graph plain: every constant tensor is an initializer.
    # * Identity(initializer): the exporter de-duplicates equal initializers
    #   (e.g. a block's bn2.bias and its shortcut BN bias always train to the
    #   same values) and re-creates them with Identity nodes -> copy instead.
    # * Constant nodes (Resize scales) -> initializers.
    inits = {t.name: t for t in m.graph.initializer}
    keep = []
    for n in m.graph.node:
        if n.op_type == "Identity" and n.input[0] in inits:
            t = onnx.TensorProto()
            t.CopyFrom(inits[n.input[0]])
            t.name = n.output[0]
            m.graph.initializer.append(t)
        elif n.op_type == "Constant" and n.attribute[0].name == "value":
            t = onnx.TensorProto()
            t.CopyFrom(n.attribute[0].t)
            t.name = n.output[0]
            m.graph.initializer.append(t)
        else:
            keep.append(n)
    del m.graph.node[:]
    m.graph.node.extend(keep)
    onnx.checker.check_model(m)
    onnx.save(m, path)
    ops = {}
    for n in m.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    inputs = [i.name for i in m.graph.input]
    assert inputs == ["input"], f"graph inputs {inputs} (weights must be initializers)"
    assert [o.name for o in m.graph.output] == ["logits"]
    assert ops.get("BatchNormalization", 0) > 0, "BatchNormalization folded away!"
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    xb = torch.randn(2, *shape[1:], generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        ref = model(xb).numpy()
    got = sess.run(None, {"input": xb.numpy()})[0]
    diff = float(np.abs(ref - got).max())
    log(f"exported {path}: {os.path.getsize(path)} bytes, ops={ops}, "
        f"ort-vs-torch max abs diff={diff:.2e}")
    assert diff < 1e-3, diff
    return ops, diff


def ort_session(path, threads):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def ort_batched(sess, x, bs=256):
    outs = [sess.run(None, {"input": x[i:i + bs]})[0] for i in range(0, len(x), bs)]
    return np.concatenate(outs)


# --------------------------------------------------------------------------
# Committed data
# --------------------------------------------------------------------------
def write_committed_data(out, xtr, ytr, xte, yte, holdout, calib, eval_idx):
    d = os.path.join(out, "data")
    for sub in ("fashion_calib", "fashion_eval", "scenes_calib", "scenes_eval"):
        shutil.rmtree(os.path.join(d, sub), ignore_errors=True)
    os.makedirs(os.path.join(d, "fashion_calib"))
    for i in calib:
        Image.fromarray(xtr[i], mode="L").save(
            os.path.join(d, "fashion_calib", f"train_{i:05d}.png"), optimize=True)
    for cdir in CLASS_DIRS:
        os.makedirs(os.path.join(d, "fashion_eval", cdir))
    for i in eval_idx:
        Image.fromarray(xte[i], mode="L").save(
            os.path.join(d, "fashion_eval", CLASS_DIRS[yte[i]], f"test_{i:05d}.png"),
            optimize=True)
    cpu = torch.device("cpu")
    # scenes_calib: only held-out TRAIN items
    imgs, _ = make_scenes(xtr[holdout], ytr[holdout], N_SCENES_CALIB, SEED_SCENES_CALIB, cpu)
    os.makedirs(os.path.join(d, "scenes_calib"))
    for k in range(len(imgs)):
        Image.fromarray(imgs[k]).save(os.path.join(d, "scenes_calib", f"calib_{k:04d}.jpg"),
                                      quality=SCENE_JPEG_QUALITY)
    # scenes_eval: only TEST items
    imgs, masks = make_scenes(xte, yte, N_SCENES_EVAL, SEED_SCENES_EVAL, cpu)
    os.makedirs(os.path.join(d, "scenes_eval", "images"))
    os.makedirs(os.path.join(d, "scenes_eval", "masks"))
    pal = voc_palette()
    for k in range(len(imgs)):
        Image.fromarray(imgs[k]).save(
            os.path.join(d, "scenes_eval", "images", f"scene_{k:04d}.jpg"),
            quality=SCENE_JPEG_QUALITY)
        m = Image.frombytes("P", (SCENE, SCENE), masks[k].tobytes())
        m.putpalette(pal)
        m.save(os.path.join(d, "scenes_eval", "masks", f"scene_{k:04d}.png"), optimize=True)
    with open(os.path.join(out, "fashion_resnet.labels.txt"), "w") as f:
        f.write("\n".join(CLASS_NAMES) + "\n")
    with open(os.path.join(out, "fashion_scenes_deeplab.labels.txt"), "w") as f:
        f.write("\n".join(SEG_NAMES) + "\n")


def eval_classifier_files(out, sess):
    root = os.path.join(out, "data", "fashion_eval")
    xs, ys = [], []
    for ci, cdir in enumerate(sorted(os.listdir(root))):
        for fn in sorted(os.listdir(os.path.join(root, cdir))):
            xs.append(np.asarray(Image.open(os.path.join(root, cdir, fn)).convert("L")))
            ys.append(ci)
    x = cls_preprocess_u8(torch.from_numpy(np.stack(xs))).numpy()
    pred = ort_batched(sess, x).argmax(1)
    return float((pred == np.array(ys)).mean()), len(ys)


def eval_segmenter_files(out, sess):
    root = os.path.join(out, "data", "scenes_eval")
    conf = np.zeros((SEG_CLASSES, SEG_CLASSES), np.int64)
    stems = sorted(f[:-4] for f in os.listdir(os.path.join(root, "images")))
    xs, ms = [], []
    for s in stems:
        xs.append(np.asarray(Image.open(os.path.join(root, "images", s + ".jpg")).convert("RGB")))
        m = Image.open(os.path.join(root, "masks", s + ".png"))
        assert m.mode == "P"
        ms.append(np.asarray(m))
    x = seg_preprocess_u8(torch.from_numpy(np.stack(xs))).numpy()
    gt = np.stack(ms).astype(np.int64)
    for i in range(0, len(x), 16):
        pred = sess.run(None, {"input": x[i:i + 16]})[0].argmax(1)
        conf += np.bincount(gt[i:i + 16].ravel() * SEG_CLASSES + pred.ravel(),
                            minlength=SEG_CLASSES ** 2).reshape(SEG_CLASSES, SEG_CLASSES)
    tp = np.diag(conf)
    denom = conf.sum(0) + conf.sum(1) - tp
    present = conf.sum(1) > 0
    iou = np.where(denom > 0, tp / np.maximum(denom, 1), np.nan)
    miou = float(np.nanmean(iou[present]))
    pix_acc = float(tp.sum() / conf.sum())
    return miou, {SEG_NAMES[c]: (float(iou[c]) if present[c] else None)
                  for c in range(SEG_CLASSES)}, pix_acc, len(stems)


# --------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    choices=["cuda", "cpu"])
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist",
                    help="folder with the Fashion-MNIST IDX files (.gz or raw)")
    ap.add_argument("--out", default="sample_models")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: tiny training runs (models will be poor)")
    ap.add_argument("--cls-epochs", type=int, default=30)
    ap.add_argument("--cls-batch", type=int, default=256)
    ap.add_argument("--cls-lr", type=float, default=0.1)
    ap.add_argument("--seg-steps", type=int, default=21040)
    ap.add_argument("--seg-batch", type=int, default=128)
    ap.add_argument("--seg-lr", type=float, default=3e-3)
    ap.add_argument("--cls-budget", type=float, default=0,
                    help="safety only: if >0 and the projected classifier training time "
                         "exceeds this many seconds, train fewer epochs (logged)")
    ap.add_argument("--seg-budget", type=float, default=0,
                    help="safety only: same for the segmenter's steps")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--skip-data", action="store_true",
                    help="do not (re)write the committed data folders")
    args = ap.parse_args()
    if args.quick:
        args.cls_epochs, args.seg_steps = 1, 20
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("CUDA not available; use --device cpu")
    dev = torch.device(args.device)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    t_all = time.time()
    os.makedirs(args.out, exist_ok=True)
    gpu = torch.cuda.get_device_name(0) if dev.type == "cuda" else platform.processor() or "cpu"
    log(f"torch {torch.__version__} device={dev} ({gpu}) args={vars(args)}")

    xtr, ytr, xte, yte = load_fmnist(args.data)
    train_idx, holdout, calib, eval_idx = make_splits(ytr, yte)
    assert len(np.intersect1d(train_idx, holdout)) == 0
    log(f"train={len(train_idx)} holdout={len(holdout)} calib={len(calib)} eval={len(eval_idx)}")

    if not args.skip_data:
        t0 = time.time()
        write_committed_data(args.out, xtr, ytr, xte, yte, holdout, calib, eval_idx)
        log(f"committed data written in {time.time() - t0:.1f}s")

    cls_model, cls_time, cls_params = train_classifier(xtr, ytr, train_idx, args, dev)
    cls_path = os.path.join(args.out, "fashion_resnet.onnx")
    cls_ops, cls_diff = export_onnx(cls_model, (1, 3, CLS_SIZE, CLS_SIZE), cls_path)

    seg_model, seg_time, seg_params = train_segmenter(xtr[train_idx], ytr[train_idx], args, dev)
    seg_path = os.path.join(args.out, "fashion_scenes_deeplab.onnx")
    seg_ops, seg_diff = export_onnx(seg_model, (1, 3, SCENE, SCENE), seg_path)
    for bad in ("Shape", "Gather", "Unsqueeze", "ConstantOfShape"):
        if bad in seg_ops:
            log(f"WARNING: segmenter graph contains {bad} nodes")

    # ---- FP32 evaluation with onnxruntime on the saved files ----
    threads = os.cpu_count() or 1
    sess = ort_session(cls_path, threads)
    pred = ort_batched(sess, cls_preprocess_u8(torch.from_numpy(xte)).numpy()).argmax(1)
    top1_full = float((pred == yte).mean())
    top1_eval, n_eval = eval_classifier_files(args.out, sess)
    log(f"classifier FP32 (onnxruntime): top-1 full test split = {top1_full:.4f}; "
        f"committed fashion_eval ({n_eval}) = {top1_eval:.4f}")
    sess = ort_session(seg_path, threads)
    miou, per_class, pix_acc, n_sc = eval_segmenter_files(args.out, sess)
    log(f"segmenter FP32 (onnxruntime): mIoU on committed scenes_eval ({n_sc}) = {miou:.4f} "
        f"pixel acc = {pix_acc:.4f}")
    for k, v in per_class.items():
        log(f"   IoU {k:12s} {v:.4f}")

    metrics = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": str(dev), "gpu_name": gpu, "torch_version": torch.__version__,
        "onnx_opset": 13, "quick": args.quick, "args": vars(args),
        "classifier": {
            "file": "fashion_resnet.onnx", "params": cls_params,
            "fp32_top1_full_test_split": top1_full, "n_full_test": int(len(yte)),
            "fp32_top1_fashion_eval": top1_eval, "n_fashion_eval": n_eval,
            "train_seconds": round(cls_time, 1), "onnx_ops": cls_ops,
            "ort_vs_torch_max_abs_diff": cls_diff,
            "preprocess": {"resize": "28x28 -> 32x32 bilinear, align_corners=False, no antialias",
                           "channels": "grey replicated to 3", "mean": [CLS_MEAN] * 3,
                           "std": [CLS_STD] * 3, "scale": "x/255", "layout": "NCHW"},
        },
        "segmenter": {
            "file": "fashion_scenes_deeplab.onnx", "params": seg_params,
            "fp32_miou_scenes_eval": miou, "fp32_pixel_acc_scenes_eval": pix_acc,
            "per_class_iou": per_class, "n_scenes_eval": n_sc,
            "train_seconds": round(seg_time, 1), "onnx_ops": seg_ops,
            "ort_vs_torch_max_abs_diff": seg_diff,
            "preprocess": {"resize": "none (160x160 RGB)", "mean": [SEG_MEAN] * 3,
                           "std": [SEG_STD] * 3, "scale": "x/255", "channel_order": "RGB",
                           "layout": "NCHW"},
        },
        "total_seconds": round(time.time() - t_all, 1),
    }
    with open(os.path.join(args.out, "train_metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    log(f"done in {time.time() - t_all:.1f}s")


if __name__ == "__main__":
    main()
