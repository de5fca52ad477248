//! The |x| histogram collected per tensor, and the four ways of turning it into an amax:
//! max, percentile, MSE and entropy (TensorRT's KL-divergence search), as DESIGN.md states.

use serde::{Deserialize, Serialize};

/// Bins a first batch spreads over. Later batches past the range add bins of the same width.
pub const INITIAL_BINS: usize = 2048;
/// Above this many bins, pairs are merged (the width doubles) so the searches stay fast.
pub const MAX_BINS: usize = 4096;
/// The searches start at this bin: 128 int8 levels need at least 128 bins.
pub const START_BIN: usize = 128;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    /// Width of every bin; bin `i` covers `[i * width, (i + 1) * width)`.
    pub bin_width: f32,
    pub counts: Vec<u64>,
    /// Exact running max of |x|.
    pub amax: f32,
    /// Values seen before the range was known (all zero so far).
    pub zeros_pending: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            bin_width: 0.0,
            counts: vec![],
            amax: 0.0,
            zeros_pending: 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    Max,
    Percentile,
    Mse,
    Entropy,
}

impl Method {
    pub const ALL: [Method; 4] = [
        Method::Max,
        Method::Percentile,
        Method::Mse,
        Method::Entropy,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Method::Max => "max",
            Method::Percentile => "percentile",
            Method::Mse => "mse",
            Method::Entropy => "entropy",
        }
    }
}

impl std::str::FromStr for Method {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Method::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                format!(
                    "unknown calibration method `{s}` (expected max, percentile, mse or entropy)"
                )
            })
    }
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Histogram {
    /// Adds the absolute values of one batch. Non-finite values are ignored.
    pub fn add(&mut self, values: &[f32]) {
        // A plain fold vectorises; non-finite values (rare) take the filtered path.
        let mut batch_max = values.iter().fold(0f32, |m, v| m.max(v.abs()));
        let all_finite = batch_max.is_finite() && !values.iter().any(|v| v.is_nan());
        if !all_finite {
            batch_max = values
                .iter()
                .filter(|v| v.is_finite())
                .fold(0f32, |m, v| m.max(v.abs()));
        }
        if self.counts.is_empty() {
            if batch_max == 0.0 {
                self.zeros_pending += values.len() as u64;
                return;
            }
            self.bin_width = batch_max / INITIAL_BINS as f32;
            self.counts = vec![0; INITIAL_BINS];
            self.counts[0] = self.zeros_pending;
            self.zeros_pending = 0;
        }
        self.amax = self.amax.max(batch_max);
        let needed = (batch_max / self.bin_width).floor() as usize + 1;
        if needed > self.counts.len() {
            self.counts.resize(needed, 0);
        }
        while self.counts.len() > MAX_BINS {
            self.merge_pairs();
        }
        let inv = 1.0 / self.bin_width;
        let last = self.counts.len() - 1;
        let bin = |v: f32| ((v.abs() * inv) as usize).min(last);
        if all_finite {
            // Four interleaved tallies: after a ReLU most values land in bin 0, and one tally
            // would make every increment wait for the previous one.
            let mut t = vec![0u32; 4 * (last + 1)];
            let n = last + 1;
            let chunks = values.chunks_exact(4);
            for v in chunks.remainder() {
                t[bin(*v)] += 1;
            }
            for c in chunks {
                t[bin(c[0])] += 1;
                t[n + bin(c[1])] += 1;
                t[2 * n + bin(c[2])] += 1;
                t[3 * n + bin(c[3])] += 1;
            }
            for (i, c) in self.counts.iter_mut().enumerate() {
                *c += (t[i] + t[n + i] + t[2 * n + i] + t[3 * n + i]) as u64;
            }
        } else {
            for v in values.iter().filter(|v| v.is_finite()) {
                self.counts[bin(*v)] += 1;
            }
        }
    }

    fn merge_pairs(&mut self) {
        self.counts = self.counts.chunks(2).map(|c| c.iter().sum()).collect();
        self.bin_width *= 2.0;
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().sum::<u64>() + self.zeros_pending
    }

    /// The amax a method picks. 0 for a tensor that was always zero.
    pub fn amax_for(&self, method: Method, percentile: f64) -> f32 {
        if self.counts.is_empty() || self.amax == 0.0 {
            return 0.0;
        }
        match method {
            Method::Max => self.amax,
            Method::Percentile => self.percentile(percentile),
            Method::Mse => self.mse(),
            Method::Entropy => self.entropy(),
        }
    }

    /// The upper edge of the bin where the cumulative count first reaches `p` percent.
    fn percentile(&self, p: f64) -> f32 {
        let total = self.total() as f64;
        let target = total * (p / 100.0).clamp(0.0, 1.0);
        let mut acc = 0f64;
        for (i, &c) in self.counts.iter().enumerate() {
            acc += c as f64;
            if acc >= target {
                return ((i + 1) as f32 * self.bin_width).min(self.amax);
            }
        }
        self.amax
    }

    /// Candidate amax at each bin centre from `START_BIN` up; the one whose symmetric int8
    /// fake quantization of the histogram has the least count-weighted squared error.
    fn mse(&self) -> f32 {
        let n = self.counts.len();
        let centers: Vec<f64> = (0..n)
            .map(|i| (i as f64 + 0.5) * self.bin_width as f64)
            .collect();
        let nonzero: Vec<(f64, f64)> = self
            .counts
            .iter()
            .zip(&centers)
            .filter(|(c, _)| **c > 0)
            .map(|(&c, &x)| (x, c as f64))
            .collect();
        let mut best = (f64::INFINITY, self.amax as f64);
        for &amax in centers.iter().skip(START_BIN.min(n.saturating_sub(1))) {
            let scale = amax / 127.0;
            let err: f64 = nonzero
                .iter()
                .map(|&(x, c)| {
                    let q = (x / scale).round_ties_even().clamp(-127.0, 127.0) * scale;
                    (x - q) * (x - q) * c
                })
                .sum();
            if err < best.0 {
                best = (err, amax);
            }
        }
        best.1 as f32
    }

    /// TensorRT's entropy calibration: for each threshold bin `i`, the reference P is
    /// `bins[0..i]` with the tail mass added to its last bin, the candidate Q is `bins[0..i]`
    /// merged into 128 levels and expanded back over the non-empty bins; the `i` with the
    /// least KL(P‖Q) wins and amax is the upper edge of bin `i - 1` (`i * width`).
    ///
    /// As in pytorch-quantization, bin 0 is given the count of bin 1 first, so the spike of
    /// exact zeros after a ReLU does not dominate the divergence.
    fn entropy(&self) -> f32 {
        let mut bins: Vec<f64> = self.counts.iter().map(|&c| c as f64).collect();
        let n = bins.len();
        if n < 2 {
            return self.amax;
        }
        bins[0] = bins[1];
        let total: f64 = bins.iter().sum();
        let mut suffix = vec![0f64; n + 1];
        for i in (0..n).rev() {
            suffix[i] = suffix[i + 1] + bins[i];
        }
        const LEVELS: usize = 128;
        let mut best = (f64::INFINITY, n);
        let mut level_sum = [0f64; LEVELS];
        let mut level_nonzero = [0usize; LEVELS];
        for i in START_BIN.min(n)..=n {
            if i == 0 {
                continue;
            }
            level_sum.fill(0.0);
            level_nonzero.fill(0);
            let level = |j: usize| ((j * LEVELS) / i).min(LEVELS - 1);
            for (j, &b) in bins[..i].iter().enumerate() {
                if b > 0.0 {
                    let l = level(j);
                    level_sum[l] += b;
                    level_nonzero[l] += 1;
                }
            }
            let q_total: f64 = (0..i)
                .filter(|&j| bins[j] > 0.0)
                .map(|j| {
                    let l = level(j);
                    level_sum[l] / level_nonzero[l] as f64
                })
                .sum();
            let p_total = total;
            let mut kl = 0f64;
            for j in 0..i {
                let p = if j == i - 1 {
                    bins[j] + suffix[i]
                } else {
                    bins[j]
                };
                if p <= 0.0 {
                    continue;
                }
                let q = if bins[j] > 0.0 {
                    let l = level(j);
                    level_sum[l] / level_nonzero[l] as f64
                } else {
                    0.0
                };
                if q <= 0.0 {
                    kl = f64::INFINITY;
                    break;
                }
                let (p, q) = (p / p_total, q / q_total);
                kl += p * (p / q).ln();
            }
            // Ties go to the larger threshold, as in pytorch-quantization (last argmin).
            if kl <= best.0 {
                best = (kl, i);
            }
        }
        (best.1 as f32 * self.bin_width).min(self.amax)
    }

    /// A coarser copy for drawing: at most `bins` bins covering the same range.
    pub fn downsampled(&self, bins: usize) -> (f32, Vec<u64>) {
        if self.counts.len() <= bins || bins == 0 {
            return (self.bin_width, self.counts.clone());
        }
        let k = self.counts.len().div_ceil(bins);
        (
            self.bin_width * k as f32,
            self.counts.chunks(k).map(|c| c.iter().sum()).collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic normal samples (xorshift + Box-Muller): no rand dependency needed.
    fn gaussian(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64
        };
        (0..n)
            .map(|_| {
                let (u1, u2) = (next().max(1e-12), next());
                ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
            })
            .collect()
    }

    #[test]
    fn gaussian_with_one_far_outlier() {
        let mut h = Histogram::default();
        // With 2M samples the outlier's weight is small enough that MSE, like the others,
        // clips it (by the closed form the MSE optimum is near 9; with 200k it is near 49).
        let mut v = gaussian(2_000_000, 7);
        v.push(100.0);
        for chunk in v.chunks(100_000) {
            h.add(chunk);
        }
        assert_eq!(h.amax_for(Method::Max, 99.99), 100.0);
        for m in [Method::Percentile, Method::Mse, Method::Entropy] {
            let a = h.amax_for(m, 99.99);
            assert!(
                a > 1.5 && a < 15.0,
                "{m}: amax {a} should sit far below the outlier"
            );
        }
    }

    #[test]
    fn uniform_keeps_all_methods_near_the_max() {
        let mut h = Histogram::default();
        let v: Vec<f32> = (0..100_000)
            .map(|i| (i as f32 / 100_000.0) * 2.0 - 1.0)
            .collect();
        h.add(&v);
        for m in Method::ALL {
            let a = h.amax_for(m, 99.99);
            assert!(a > 0.9 && a <= 1.0, "{m}: amax {a} should be near 1");
        }
    }

    #[test]
    fn range_grows_when_a_later_batch_exceeds_it() {
        let mut h = Histogram::default();
        h.add(&[0.0, 0.0]);
        h.add(&[1.0, -0.5]);
        let w = h.bin_width;
        h.add(&[1.5]);
        assert_eq!(h.bin_width, w, "growing keeps the bin width while bins fit");
        assert_eq!(h.total(), 5);
        assert_eq!(h.amax, 1.5);
        assert!((h.counts.len() as f32 * h.bin_width) >= 1.5);
        h.add(&[1000.0]);
        assert!(h.counts.len() <= MAX_BINS);
        assert_eq!(h.total(), 6);
        assert_eq!(h.amax_for(Method::Max, 99.99), 1000.0);
    }

    #[test]
    fn percentile_cuts_the_tail() {
        let mut h = Histogram::default();
        let mut v = vec![1.0f32; 9_999];
        v.push(50.0);
        h.add(&v);
        assert!(h.amax_for(Method::Percentile, 99.9) < 1.1);
        assert_eq!(h.amax_for(Method::Percentile, 100.0), 50.0);
    }

    #[test]
    fn all_zero_tensor_gives_zero() {
        let mut h = Histogram::default();
        h.add(&[0.0; 16]);
        assert_eq!(h.amax_for(Method::Entropy, 99.99), 0.0);
    }
}
