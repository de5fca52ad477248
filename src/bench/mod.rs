//! Timing and memory: warm-up, then timed runs until both a minimum count and a minimum time
//! are reached; median / p90 / p99 latency and throughput; the process's resident memory.

use serde::{Deserialize, Serialize};

use crate::backend::{BackendError, Engine};

/// How long to measure. Saved in the experiment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[serde(deny_unknown_fields)]
pub struct BenchSpec {
    pub warmup_runs: usize,
    pub min_runs: usize,
    pub min_time_ms: f64,
    /// Extra batch size for throughput (batch 1 is always measured).
    pub batch: usize,
    /// After the minimum runs and time, keep timing until the median's 95 % confidence
    /// interval is within ±`STABLE_CI_REL` or `max_time_ms` has passed (`--until-stable`).
    pub until_stable: bool,
    /// The most time "until stable" spends timing one engine.
    pub max_time_ms: f64,
}

/// The interval "until stable" stops at: the median known to ±2 %.
pub const STABLE_CI_REL: f64 = 0.02;

impl Default for BenchSpec {
    fn default() -> Self {
        BenchSpec {
            warmup_runs: 3,
            min_runs: 10,
            min_time_ms: 1000.0,
            batch: 8,
            until_stable: false,
            max_time_ms: 20_000.0,
        }
    }
}

impl BenchSpec {
    /// A timing with no runs would report 0 ms; a batch of 0 or a huge one cannot be built.
    pub fn validate(&self) -> Result<(), String> {
        if self.min_runs < 1 {
            return Err("timed runs must be ≥ 1 (--min-runs)".into());
        }
        if !(self.min_time_ms.is_finite() && self.min_time_ms >= 0.0) {
            return Err(format!(
                "minimum timing {} ms must be finite and ≥ 0 (--min-time-ms)",
                self.min_time_ms
            ));
        }
        if !(1..=4096).contains(&self.batch) {
            return Err(format!(
                "batch {} must be between 1 and 4096 (--batch; 1 skips the batch measurement)",
                self.batch
            ));
        }
        if self.until_stable
            && !(self.max_time_ms.is_finite() && self.max_time_ms >= self.min_time_ms)
        {
            return Err(format!(
                "the timing limit {} ms must be finite and at least the minimum time {} ms (--max-time-ms)",
                self.max_time_ms, self.min_time_ms
            ));
        }
        if self.warmup_runs > 10_000 {
            return Err(format!(
                "{} warm-up runs is too many (at most 10000)",
                self.warmup_runs
            ));
        }
        Ok(())
    }
}

pub use crate::timing::{Latency, latency_from, percentile};

pub use crate::host::available_memory_bytes;

/// Times `engine` on `input` (one batch). `keep_going` is polled between runs (cancel).
pub fn measure(
    engine: &mut dyn Engine,
    input: &[f32],
    spec: &BenchSpec,
    keep_going: &dyn Fn() -> bool,
) -> Result<Latency, BackendError> {
    for _ in 0..spec.warmup_runs {
        engine.timed_run(input)?;
    }
    let mut samples = vec![];
    let start = std::time::Instant::now();
    let elapsed_ms = || start.elapsed().as_secs_f64() * 1e3;
    loop {
        let minimum_met = samples.len() >= spec.min_runs && elapsed_ms() >= spec.min_time_ms;
        // Never spin forever on a very fast engine.
        if !keep_going() || samples.len() >= 100_000 {
            break;
        }
        if minimum_met {
            if !spec.until_stable || elapsed_ms() >= spec.max_time_ms {
                break;
            }
            // Checked every 16 runs: sorting each time would cost more than a fast run.
            if samples.len() % 16 == 0 {
                let mut sorted = samples.clone();
                sorted.sort_by(f64::total_cmp);
                if crate::timing::median_ci95_rel(&sorted).is_some_and(|c| c <= STABLE_CI_REL) {
                    break;
                }
            }
        }
        samples.push(engine.timed_run(input)?);
    }
    Ok(latency_from(samples))
}

/// Resident memory now and the peak since the last reset, in bytes (Linux; 0 elsewhere).
pub fn rss_bytes() -> (u64, u64) {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else {
        return (0, 0);
    };
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Resets the peak-RSS mark so the next engine's peak is its own (Linux `clear_refs` 5).
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}
