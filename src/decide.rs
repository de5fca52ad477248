//! Choices made by measuring (bias correction's kind, the CPU engine's thread count and form):
//! each has a fixed default, and a measured alternative replaces it only when it wins by a
//! margin beyond the measurement's noise. Without the margin a choice follows the last bit of
//! the input: two spellings of one normalisation (`--mean 0.5 --std 0.5` against `--scale
//! 0.0078431373 --offset -1`) flipped DeepLab's bias-correction choice and moved its mIoU by
//! 0.83 pt, on SQNR differences of 0.1–0.6 dB over 32 images.

/// A paired comparison of an alternative against the default on the same samples (per-image
/// scores, higher is better): the mean difference and its standard error.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Paired {
    /// Mean of (alternative - default) over the samples.
    pub mean: f64,
    /// Standard error of that mean (0 with one sample).
    pub stderr: f64,
    pub samples: usize,
}

impl Paired {
    /// `alternative[i] - default[i]` over the samples both have.
    pub fn of(default: &[f64], alternative: &[f64]) -> Paired {
        let d: Vec<f64> = default
            .iter()
            .zip(alternative)
            .map(|(a, b)| b - a)
            .collect();
        let n = d.len();
        if n == 0 {
            return Paired {
                mean: 0.0,
                stderr: 0.0,
                samples: 0,
            };
        }
        let mean = d.iter().sum::<f64>() / n as f64;
        let var = if n > 1 {
            d.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64
        } else {
            0.0
        };
        Paired {
            mean,
            stderr: (var / n as f64).sqrt(),
            samples: n,
        }
    }

    /// The gain the alternative must show: twice the standard error (about 95 % one-sided
    /// confidence that it is real), and never less than `floor`, the smallest gain worth
    /// leaving the default for.
    pub fn margin(&self, floor: f64) -> f64 {
        (2.0 * self.stderr).max(floor)
    }

    /// Whether the alternative wins by more than [`Paired::margin`].
    pub fn clearly_better(&self, floor: f64) -> bool {
        self.mean > self.margin(floor)
    }
}

/// SQNR (dB) of each sample of `test` against `reference`, both holding `samples` equal-length
/// samples back to back; a sample identical to its reference reads `IDENTICAL_DB`, so that a
/// paired difference stays finite.
pub fn per_sample_sqnr_db(reference: &[f32], test: &[f32], samples: usize) -> Vec<f64> {
    let len = reference.len() / samples.max(1);
    if len == 0 {
        return vec![];
    }
    reference
        .chunks(len)
        .zip(test.chunks(len))
        .map(|(r, t)| {
            let mut s = crate::eval::Sqnr::default();
            s.add(r, t);
            s.db().unwrap_or(IDENTICAL_DB).min(IDENTICAL_DB)
        })
        .collect()
}

/// What an output identical to its reference counts as, in dB (above any float32 SQNR).
pub const IDENTICAL_DB: f64 = 200.0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_consistent_small_gain_passes_only_its_floor() {
        // +0.3 dB on every image: no noise, but below a 1 dB floor.
        let a = [20.0, 25.0, 30.0, 22.0];
        let b: Vec<f64> = a.iter().map(|x| x + 0.3).collect();
        let p = Paired::of(&a, &b);
        assert!((p.mean - 0.3).abs() < 1e-12 && p.stderr < 1e-12);
        assert!(!p.clearly_better(1.0));
        assert!(p.clearly_better(0.2));
    }

    #[test]
    fn a_gain_within_its_noise_is_not_clear() {
        // Mean +1.5 dB, but one image +9 and the rest -1: the standard error is 2.5 dB.
        let a = [10.0; 4];
        let b = [19.0, 9.0, 9.0, 9.0];
        let p = Paired::of(&a, &b);
        assert!((p.mean - 1.5).abs() < 1e-12);
        assert!((p.stderr - 2.5).abs() < 1e-12, "{}", p.stderr);
        assert!(!p.clearly_better(1.0));
        assert_eq!(p.margin(1.0), 5.0);
    }

    #[test]
    fn per_sample_sqnr_splits_the_samples() {
        let r = [1.0f32, 1.0, 2.0, 2.0];
        let t = [1.0f32, 1.0, 2.0, 1.8];
        let db = per_sample_sqnr_db(&r, &t, 2);
        assert_eq!(db[0], IDENTICAL_DB);
        // 8 / 0.04 = 200 → 23.0 dB.
        assert!((db[1] - 10.0 * 200f64.log10()).abs() < 1e-4, "{db:?}");
    }
}
