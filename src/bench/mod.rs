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
            if samples.len() % 16 == 0 && stable(&samples) {
                break;
            }
        }
        samples.push(engine.timed_run(input)?);
    }
    Ok(latency_from(samples))
}

/// Whether `samples`' median is known to ±[`STABLE_CI_REL`] ("until stable" may stop).
fn stable(samples: &[f64]) -> bool {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    crate::timing::median_ci95_rel(&sorted).is_some_and(|c| c <= STABLE_CI_REL)
}

/// How long each engine runs in one turn when engines are timed side by side.
pub const TURN_MS: f64 = 100.0;

/// An engine timed side by side with others, and the input it runs.
pub struct Contestant<'a> {
    pub engine: &'a mut dyn Engine,
    pub input: &'a [f32],
}

/// Times `contestants` taking turns of about [`TURN_MS`] each, round after round, until every
/// one has what [`measure`] asks of one engine alone (`spec`'s runs and time; "until stable",
/// its interval or its time limit). A slow drift (a GPU's clocks as it warms, a neighbour's
/// load) then falls on every engine alike: on an H200, INT8 rows that ran FP16's kernels layer
/// for layer, timed after FP16 one at a time, came out 1.4-3.7 % slower. The first run of each
/// turn is not timed: it reloads the caches the other engines' turns took; nor are the runs
/// while the engine before it may still spin its idle threads ([`Engine::idle_spin_ms`]: ONNX
/// Runtime's CPU pool, which would take a core from the runs timed). One engine's error stops
/// only its own timing. `progress` hears (rounds done, rounds the minimum needs).
pub fn measure_side_by_side(
    contestants: &mut [Contestant<'_>],
    spec: &BenchSpec,
    keep_going: &dyn Fn() -> bool,
    progress: &dyn Fn(usize, usize),
) -> Vec<Result<Latency, BackendError>> {
    let n = contestants.len();
    let mut failed: Vec<Option<BackendError>> = (0..n).map(|_| None).collect();
    for (c, f) in contestants.iter_mut().zip(&mut failed) {
        for _ in 0..spec.warmup_runs {
            if let Err(e) = c.engine.timed_run(c.input) {
                *f = Some(e);
                break;
            }
        }
    }
    let mut samples: Vec<Vec<f64>> = vec![vec![]; n];
    let mut spent_ms = vec![0.0f64; n];
    let rounds_needed = (spec.min_time_ms / TURN_MS).ceil().max(1.0) as usize;
    let mut round = 0;
    while keep_going() {
        let live = || (0..n).filter(|&i| failed[i].is_none());
        let minimum_met =
            live().all(|i| samples[i].len() >= spec.min_runs && spent_ms[i] >= spec.min_time_ms);
        if minimum_met {
            let out_of_time = live().all(|i| spent_ms[i] >= spec.max_time_ms);
            if !spec.until_stable || out_of_time || live().all(|i| stable(&samples[i])) {
                break;
            }
        }
        if live().count() == 0 || samples.iter().any(|s| s.len() >= 100_000) {
            break;
        }
        // "Until stable" may go past the rounds the minimum needs: the bar then stays full.
        progress(round.min(rounds_needed), rounds_needed);
        for i in 0..n {
            if failed[i].is_some() {
                continue;
            }
            // The engine that ran last (the round before, for the first) may still spin.
            let before = (1..n)
                .map(|k| (i + n - k) % n)
                .find(|&j| failed[j].is_none());
            let settle_ms = before.map_or(0.0, |j| contestants[j].engine.idle_spin_ms());
            match turn(&mut contestants[i], settle_ms, &mut samples[i]) {
                Ok(ms) => spent_ms[i] += ms,
                Err(e) => failed[i] = Some(e),
            }
        }
        round += 1;
    }
    samples
        .into_iter()
        .zip(failed)
        .map(|(s, f)| match f {
            Some(e) => Err(e),
            None => Ok(latency_from(s)),
        })
        .collect()
}

/// One engine's turn: untimed runs, at least one, until `settle_ms` have passed, then runs
/// timed into `samples` for about [`TURN_MS`]. Returns the milliseconds the timed runs took.
fn turn(
    c: &mut Contestant<'_>,
    settle_ms: f64,
    samples: &mut Vec<f64>,
) -> Result<f64, BackendError> {
    let since = |t: std::time::Instant| t.elapsed().as_secs_f64() * 1e3;
    let settling = std::time::Instant::now();
    loop {
        c.engine.timed_run(c.input)?;
        if since(settling) >= settle_ms {
            break;
        }
    }
    let timing = std::time::Instant::now();
    loop {
        samples.push(c.engine.timed_run(c.input)?);
        if since(timing) >= TURN_MS {
            return Ok(since(timing));
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{EngineInfo, Output};
    use std::cell::Cell;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// An engine whose "device time" is `base_ms` scaled by a drift that grows with every run
    /// of any engine sharing `clock` (0.01 % a run). Each run takes 0.2 ms of wall time, so a
    /// turn holds a few hundred runs. Its run `fail_at` (counting from 1) fails.
    struct Drifting {
        info: EngineInfo,
        base_ms: f64,
        clock: Arc<AtomicU64>,
        spin_ms: f64,
        runs: usize,
        fail_at: Option<usize>,
    }

    impl Drifting {
        fn new(base_ms: f64, clock: &Arc<AtomicU64>) -> Self {
            Drifting {
                info: EngineInfo::default(),
                base_ms,
                clock: clock.clone(),
                spin_ms: 0.0,
                runs: 0,
                fail_at: None,
            }
        }
    }

    impl Engine for Drifting {
        fn info(&self) -> &EngineInfo {
            &self.info
        }
        fn batch(&self) -> usize {
            1
        }
        fn run(&mut self, _: &[f32]) -> Result<Output, BackendError> {
            unreachable!("the benchmark calls timed_run")
        }
        fn timed_run(&mut self, _: &[f32]) -> Result<f64, BackendError> {
            self.runs += 1;
            if self.fail_at == Some(self.runs) {
                return Err(BackendError::Run("device lost".into()));
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
            let t = self.clock.fetch_add(1, Ordering::Relaxed);
            Ok(self.base_ms * (1.0 + 1e-4 * t as f64))
        }
        fn idle_spin_ms(&self) -> f64 {
            self.spin_ms
        }
    }

    fn spec() -> BenchSpec {
        BenchSpec {
            warmup_runs: 2,
            min_runs: 10,
            min_time_ms: 400.0,
            ..Default::default()
        }
    }

    #[test]
    fn two_copies_of_one_engine_time_alike_side_by_side_under_drift() {
        let clock = Arc::new(AtomicU64::new(0));
        let (mut a, mut b) = (Drifting::new(1.0, &clock), Drifting::new(1.0, &clock));
        // One after another, the second comes out slower by the drift of the first's runs.
        let spec = BenchSpec {
            min_time_ms: 800.0,
            ..spec()
        };
        let alone_a = measure(&mut a, &[], &spec, &|| true).unwrap().median;
        let alone_b = measure(&mut b, &[], &spec, &|| true).unwrap().median;
        let alone_gap = alone_b / alone_a - 1.0;
        assert!(alone_gap > 0.05, "{alone_a} then {alone_b}");
        let mut c = [
            Contestant {
                engine: &mut a,
                input: &[],
            },
            Contestant {
                engine: &mut b,
                input: &[],
            },
        ];
        let rounds = Cell::new(0);
        let side = measure_side_by_side(&mut c, &spec, &|| true, &|done, _| rounds.set(done));
        let (sa, sb) = (side[0].as_ref().unwrap(), side[1].as_ref().unwrap());
        // Taking turns, each sees the same drift but for one turn's worth (an eighth of the
        // 800 ms the first timed alone).
        let gap = sb.median / sa.median - 1.0;
        assert!(
            gap.abs() < alone_gap / 3.0,
            "{gap} against {alone_gap} alone"
        );
        assert!(sa.runs >= 10 && sb.runs >= 10);
        assert!(
            rounds.get() >= 7,
            "800 ms in turns of 100 ms: {} rounds",
            rounds.get()
        );
    }

    #[test]
    fn runs_while_the_engine_before_spins_are_not_counted_and_an_error_stops_one_engine() {
        let clock = Arc::new(AtomicU64::new(0));
        let mut spinning = Drifting::new(1.0, &clock);
        spinning.spin_ms = 30.0;
        let mut after = Drifting::new(2.0, &clock);
        let mut failing = Drifting::new(3.0, &clock);
        failing.fail_at = Some(50);
        let mut c = [
            Contestant {
                engine: &mut spinning,
                input: &[],
            },
            Contestant {
                engine: &mut after,
                input: &[],
            },
            Contestant {
                engine: &mut failing,
                input: &[],
            },
        ];
        let rounds = Cell::new(0);
        let r = measure_side_by_side(&mut c, &spec(), &|| true, &|done, _| rounds.set(done + 1));
        assert!(matches!(r[2], Err(BackendError::Run(_))), "{:?}", r[2]);
        let (s, a) = (r[0].as_ref().unwrap(), r[1].as_ref().unwrap());
        // Each of `after`'s turns starts with about 30 ms (some 100+ runs) not counted; the
        // others' turns with one run (`failing` no longer ran, so `spinning` follows `after`).
        let rounds = rounds.get();
        let untimed = |runs: usize, timed: usize| runs - 2 - timed;
        assert!(
            untimed(after.runs, a.runs) >= 50 * rounds,
            "{rounds} rounds: {} runs, {} timed",
            after.runs,
            a.runs
        );
        assert!(
            untimed(spinning.runs, s.runs) <= rounds,
            "{rounds} rounds: {} runs, {} timed",
            spinning.runs,
            s.runs
        );
        assert!((a.median / s.median - 2.0).abs() < 0.2, "{s:?} {a:?}");
    }
}
