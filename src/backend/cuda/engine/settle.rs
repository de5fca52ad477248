//! Settling near ties in the engine's run. The builder times each conv's candidates alone:
//! the layer launched after itself, its input warm in L2, its start overlapping its own last
//! launch. That cannot tell candidates a few per cent apart: on an H200, a 3x3 kernel 1-3 %
//! faster than cuDNN alone took 10-25 % longer in ResNet-50's run, and the engine 2.5 % longer
//! (bench/results/2026-12-01-nvidia-h200-halo-experiment.txt). So once every conv has its
//! contenders (`choose`), each conv with more than one is timed again with its neighbours:
//! the steps `SETTLE_REACH` before and after it, captured as one graph, with each contender in
//! turn; the fastest window keeps its contender. Convs are settled in plan order, each window
//! running the choices settled before it and the fastest-alone contenders after it.
//! Off by default (`choose::NEAR_TIE` says why); QUANTSCOPE_CUDA_NEAR_TIE turns it on.

use std::time::Instant;

use super::CudaEngine;
use super::choose::{Seen, StreamTimer, median};
use super::log_msg;
use crate::backend::cuda::cache::Choices;
use crate::backend::cuda::error::CudaResult;

/// Steps on each side of a conv that its window runs: the one before writes its input and
/// overlaps its start, the one after overlaps its end; a second on each side takes in a
/// bottleneck's branch (its shortcut's conv, the add it feeds).
const SETTLE_REACH: usize = 2;
/// Rounds in which every contender's window is timed once; the median of its rounds decides.
const SETTLE_ROUNDS: usize = 3;

impl CudaEngine {
    /// Keeps, for every conv with contenders, the one whose window runs fastest, and writes
    /// it to `choices` (the cache then holds the settled choice).
    pub(super) fn settle_near_ties(
        &mut self,
        choices: &mut Choices,
        seen: &mut Seen,
    ) -> CudaResult<()> {
        let start = Instant::now();
        let mut tied: Vec<usize> = self
            .convs
            .iter()
            .filter(|(_, rt)| rt.contenders().len() > 1)
            .map(|(si, _)| *si)
            .collect();
        tied.sort();
        let last = self.plan.steps.len().saturating_sub(1);
        for si in tied {
            let rt = &self.convs[&si];
            let (name, contenders) = (rt.layer.step.name.clone(), rt.contenders().to_vec());
            let window = si.saturating_sub(SETTLE_REACH)..=(si + SETTLE_REACH).min(last);
            let mut times: Vec<Vec<f64>> = vec![vec![]; contenders.len()];
            for _ in 0..SETTLE_ROUNDS {
                for ((setup, imp), ts) in contenders.iter().zip(times.iter_mut()) {
                    self.convs
                        .get_mut(&si)
                        .expect("conv")
                        .set(*setup, imp.clone());
                    let ran = StreamTimer::new(self).and_then(|timer| {
                        self.graph_ms(&timer, || window.clone().try_for_each(|s| self.run_step(s)))
                    });
                    match ran {
                        Ok(t) => ts.push(t),
                        Err(e) => {
                            log_msg(&format!("{name}: contender {} failed: {e}", imp.key()));
                            ts.push(f64::INFINITY);
                        }
                    }
                }
            }
            let medians: Vec<f64> = times.iter().map(|t| median(t)).collect();
            // The fastest alone stays where the window cannot tell (every contender failed).
            let best = (0..contenders.len())
                .min_by(|&a, &b| medians[a].total_cmp(&medians[b]))
                .unwrap_or(0);
            log_msg(&format!(
                "{name}: in the run (steps {}-{}): {}; kept {}",
                window.start(),
                window.end(),
                contenders
                    .iter()
                    .zip(&medians)
                    .map(|((_, c), t)| format!("{} {:.1} us", c.key(), t * 1e3))
                    .collect::<Vec<_>>()
                    .join(", "),
                contenders[best].1.key()
            ));
            let (setup, imp) = contenders[best].clone();
            choices.convs.insert(name, imp.key());
            self.convs.get_mut(&si).expect("conv").keep(setup, imp);
            seen.settled += 1;
            seen.changed += usize::from(best != 0);
        }
        seen.settle_ms = start.elapsed().as_secs_f64() * 1e3;
        Ok(())
    }
}
