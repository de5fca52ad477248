//! Latency statistics from timed samples (median, p90, p99): plain arithmetic shared by the
//! benchmark and the engines' per-layer profiles, so neither depends on the other.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub median: f64,
    pub p90: f64,
    pub p99: f64,
    pub runs: usize,
    /// Half the width of the median's 95 % confidence interval, as a fraction of the median
    /// (0.02 = ±2 %); `None` under 8 runs. Wide means the machine was busy or the engine
    /// unsteady: "time until stable" runs until it is tight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci95_rel: Option<f64>,
}

/// Percentile of sorted samples (nearest rank).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn latency_from(mut samples_ms: Vec<f64>) -> Latency {
    samples_ms.sort_by(f64::total_cmp);
    let n = samples_ms.len();
    let median = if n == 0 {
        0.0
    } else if n % 2 == 1 {
        samples_ms[n / 2]
    } else {
        (samples_ms[n / 2 - 1] + samples_ms[n / 2]) / 2.0
    };
    Latency {
        median,
        p90: percentile(&samples_ms, 90.0),
        p99: percentile(&samples_ms, 99.0),
        runs: n,
        ci95_rel: median_ci95_rel(&samples_ms),
    }
}

/// The median's 95 % confidence interval from order statistics (distribution-free: the ranks
/// n/2 ± 1.96·√n/2 of the sorted samples), as half its width over the median.
pub fn median_ci95_rel(sorted: &[f64]) -> Option<f64> {
    let n = sorted.len();
    if n < 8 {
        return None;
    }
    let half = 1.96 * (n as f64).sqrt() / 2.0;
    let lo = ((n as f64 / 2.0 - half).floor().max(0.0)) as usize;
    let hi = ((n as f64 / 2.0 + half).ceil() as usize).min(n - 1);
    let median = sorted[n / 2];
    (median > 0.0).then(|| (sorted[hi] - sorted[lo]) / 2.0 / median)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let l = latency_from((1..=100).map(|v| v as f64).collect());
        assert_eq!(l.median, 50.5);
        assert_eq!(l.p90, 90.0);
        assert_eq!(l.p99, 99.0);
    }

    #[test]
    fn the_median_interval_narrows_with_steady_samples() {
        let steady: Vec<f64> = (0..200).map(|i| 10.0 + (i % 3) as f64 * 0.01).collect();
        let l = latency_from(steady);
        assert!(l.ci95_rel.expect("200 runs") < 0.01, "{l:?}");
        // Half the runs slowed twice over by another process: wide.
        let noisy: Vec<f64> = (0..40)
            .map(|i| if i % 2 == 0 { 10.0 } else { 20.0 })
            .collect();
        assert!(latency_from(noisy).ci95_rel.expect("40 runs") > 0.2);
        assert_eq!(latency_from(vec![1.0; 5]).ci95_rel, None);
    }
}
