//! Latency statistics from timed samples (median, p90, p99): plain arithmetic shared by the
//! benchmark and the engines' per-layer profiles, so neither depends on the other.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub median: f64,
    pub p90: f64,
    pub p99: f64,
    pub runs: usize,
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
    }
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
}
