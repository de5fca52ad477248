//! Metrics: top-1/top-5 and per-class accuracy, mIoU over classes present with per-class IoU
//! and pixel accuracy, agreement with FP32 and SQNR of outputs against FP32.

use serde::{Deserialize, Serialize};

/// Running classification tallies.
#[derive(Clone, Debug, Default)]
pub struct ClassTally {
    pub n: usize,
    pub top1: usize,
    pub top5: usize,
    pub per_class: Vec<(usize, usize)>,
}

impl ClassTally {
    /// `scores`: one image's class scores.
    pub fn add(&mut self, scores: &[f32], label: usize) -> usize {
        let mut idx: Vec<usize> = (0..scores.len()).collect();
        idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
        let pred = idx.first().copied().unwrap_or(0);
        if self.per_class.len() <= label {
            self.per_class.resize(label + 1, (0, 0));
        }
        self.n += 1;
        self.per_class[label].1 += 1;
        if pred == label {
            self.top1 += 1;
            self.per_class[label].0 += 1;
        }
        if idx.iter().take(5).any(|&i| i == label) {
            self.top5 += 1;
        }
        pred
    }

    pub fn top1(&self) -> f64 {
        self.top1 as f64 / self.n.max(1) as f64
    }
    pub fn top5(&self) -> f64 {
        self.top5 as f64 / self.n.max(1) as f64
    }
    pub fn per_class_accuracy(&self) -> Vec<Option<f64>> {
        self.per_class
            .iter()
            .map(|&(c, t)| (t > 0).then(|| c as f64 / t as f64))
            .collect()
    }
}

/// Confusion counts for segmentation (255 = ignore).
#[derive(Clone, Debug, Default)]
pub struct SegTally {
    pub classes: usize,
    pub intersection: Vec<u64>,
    pub union: Vec<u64>,
    pub gt_pixels: Vec<u64>,
    pub correct: u64,
    pub labelled: u64,
}

pub const IGNORE: u8 = 255;

impl SegTally {
    pub fn new(classes: usize) -> Self {
        SegTally {
            classes,
            intersection: vec![0; classes],
            union: vec![0; classes],
            gt_pixels: vec![0; classes],
            ..Default::default()
        }
    }

    /// Adds one image: `pred` and `gt` are class indices per pixel at mask resolution.
    /// Returns the image's own mIoU (over the classes present in it).
    pub fn add(&mut self, pred: &[u8], gt: &[u8]) -> f64 {
        let mut inter = vec![0u64; self.classes];
        let mut uni = vec![0u64; self.classes];
        let mut present = vec![false; self.classes];
        for (&p, &g) in pred.iter().zip(gt) {
            if g == IGNORE {
                continue;
            }
            let (p, g) = (p as usize, g as usize);
            if g >= self.classes {
                continue;
            }
            present[g] = true;
            self.gt_pixels[g] += 1;
            self.labelled += 1;
            if p == g {
                self.correct += 1;
                inter[g] += 1;
                uni[g] += 1;
            } else {
                uni[g] += 1;
                if p < self.classes {
                    uni[p] += 1;
                }
            }
        }
        let mut sum = 0.0;
        let mut k = 0;
        for c in 0..self.classes {
            self.intersection[c] += inter[c];
            self.union[c] += uni[c];
            if present[c] && uni[c] > 0 {
                sum += inter[c] as f64 / uni[c] as f64;
                k += 1;
            }
        }
        if k == 0 { 1.0 } else { sum / k as f64 }
    }

    /// IoU per class; `None` for classes absent from the ground truth.
    pub fn per_class_iou(&self) -> Vec<Option<f64>> {
        (0..self.classes)
            .map(|c| {
                (self.gt_pixels[c] > 0)
                    .then(|| self.intersection[c] as f64 / self.union[c].max(1) as f64)
            })
            .collect()
    }

    /// Mean IoU over the classes present in the ground truth.
    pub fn miou(&self) -> f64 {
        let v: Vec<f64> = self.per_class_iou().into_iter().flatten().collect();
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    }

    pub fn pixel_accuracy(&self) -> f64 {
        self.correct as f64 / self.labelled.max(1) as f64
    }
}

/// Signal-to-quantization-noise ratio in dB of `test` against `reference`, accumulated.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Sqnr {
    pub signal: f64,
    pub noise: f64,
}

impl Sqnr {
    pub fn add(&mut self, reference: &[f32], test: &[f32]) {
        for (&r, &t) in reference.iter().zip(test) {
            self.signal += (r as f64) * (r as f64);
            self.noise += ((r - t) as f64) * ((r - t) as f64);
        }
    }
    /// `None` when the outputs are identical (infinite SQNR).
    pub fn db(&self) -> Option<f64> {
        (self.noise > 0.0).then(|| 10.0 * (self.signal / self.noise).log10())
    }
}

/// Per-pixel argmax over channels of one `[C, H, W]` output.
pub fn argmax_chw(data: &[f32], c: usize, hw: usize) -> Vec<u8> {
    (0..hw)
        .map(|p| {
            let mut best = (f32::NEG_INFINITY, 0usize);
            for k in 0..c {
                let v = data[k * hw + p];
                if v > best.0 {
                    best = (v, k);
                }
            }
            best.1.min(254) as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn miou_counts_only_present_classes() {
        let mut t = SegTally::new(3);
        // gt: class 0 and 1 only; pred gets class 1 half right.
        let gt = [0, 0, 1, 1, IGNORE];
        let pred = [0, 0, 1, 0, 2];
        let img = t.add(&pred, &gt);
        // class 0: inter 2, union 3; class 1: inter 1, union 2.
        assert!((t.miou() - (2.0 / 3.0 + 0.5) / 2.0).abs() < 1e-12);
        assert!((img - t.miou()).abs() < 1e-12);
        assert_eq!(t.per_class_iou()[2], None);
        assert!((t.pixel_accuracy() - 0.75).abs() < 1e-12);
    }

    #[test]
    fn top_k() {
        let mut t = ClassTally::default();
        t.add(&[0.1, 0.9, 0.0], 1);
        t.add(&[0.5, 0.4, 0.1], 1);
        assert_eq!(t.top1(), 0.5);
        assert_eq!(t.top5(), 1.0);
    }

    #[test]
    fn sqnr_of_small_noise() {
        let mut s = Sqnr::default();
        s.add(&[1.0, -1.0], &[1.01, -1.01]);
        assert!((s.db().unwrap_or(0.0) - 40.0).abs() < 1e-3);
    }
}
