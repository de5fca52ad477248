//! Timing and memory: warm-up, then timed runs until both a minimum count and a minimum time
//! are reached; median / p90 / p99 latency and throughput; the process's resident memory.

use serde::{Deserialize, Serialize};

use crate::backend::{BackendError, Engine};

/// How long to measure. Saved in the experiment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BenchSpec {
    pub warmup_runs: usize,
    pub min_runs: usize,
    pub min_time_ms: f64,
    /// Extra batch size for throughput (batch 1 is always measured).
    pub batch: usize,
}

impl Default for BenchSpec {
    fn default() -> Self {
        BenchSpec {
            warmup_runs: 3,
            min_runs: 10,
            min_time_ms: 1000.0,
            batch: 8,
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

/// Memory the kernel says a new allocation can get without swapping (`MemAvailable`), where
/// the platform tells it.
pub fn available_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

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
    while (samples.len() < spec.min_runs || start.elapsed().as_secs_f64() * 1e3 < spec.min_time_ms)
        && keep_going()
    {
        samples.push(engine.timed_run(input)?);
        // Never spin forever on a very fast engine.
        if samples.len() >= 100_000 {
            break;
        }
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
