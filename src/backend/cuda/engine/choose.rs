//! Choosing how each conv runs: every family that applies sets the layer up and offers its
//! candidates; a candidate the choice cache names is taken as it is, otherwise all are timed
//! in rounds (each as a captured CUDA graph of back-to-back launches, as the engine runs) and
//! the fastest median is kept. Everything the other candidates set up is dropped.

use std::time::Instant;

use super::conv::{ConvFamily, ConvImpl, ConvSetup, DIRECT, DIRECT_MAX_MACS, F16_WAY, FAMILIES};
use super::{CudaEngine, log_msg};
use crate::backend::cuda::cache::Choices;
use crate::backend::cuda::error::{CudaResult, drv, have};

/// Rounds in which every conv candidate is timed once; the median of its rounds decides.
const CHOICE_ROUNDS: usize = 3;
/// Each candidate timing launches the layer back to back for about this long ...
const CHOICE_BATCH_MS: f64 = 0.2;
/// ... and at most this many times.
const CHOICE_MAX_LAUNCHES: usize = 20;

impl CudaEngine {
    /// Sets up conv step `si` in every way that applies and keeps one: the cached choice, the
    /// only candidate, or the fastest.
    pub(super) fn choose_conv(&mut self, si: usize, cached: &Choices) -> CudaResult<ConvImpl> {
        let setup_start = Instant::now();
        let setups = self.set_up_conv(si)?;
        let rt = self.convs.get_mut(&si).expect("conv");
        for s in setups {
            rt.add(s);
        }
        let mut cands = rt.candidates();
        let name = rt.layer.step.name.clone();
        // A diagnosis knob: QUANTSCOPE_CUDA_AVOID=gemm,cudnng leaves out the candidates whose
        // key starts with one of them (where another is left), to find which implementation
        // a wrong engine comes from (tests/cuda_zoo.rs, QUANTSCOPE_ZOO_DIAGNOSE).
        if let Ok(avoid) = std::env::var("QUANTSCOPE_CUDA_AVOID") {
            let avoided = |c: &ConvImpl| {
                let key = c.key();
                avoid
                    .split(',')
                    .any(|a| !a.trim().is_empty() && key.starts_with(a.trim()))
            };
            if cands.iter().any(|(_, c)| !avoided(c)) {
                cands.retain(|(_, c)| !avoided(c));
            }
        }
        // A cached key picks its candidate; a key without its algorithm (`gemmf`,
        // `f16+cudnn`) picks the first of that family, which is how the tests force an
        // implementation.
        let cached_pick = cached
            .convs
            .get(&name)
            .and_then(|k| cands.iter().find(|(_, c)| c.answers(k)));
        let (setup, pick) = match (cached_pick, cands.as_slice()) {
            (Some(c), _) => c.clone(),
            (None, [only]) => only.clone(),
            (None, _) => {
                let setup_ms = setup_start.elapsed().as_secs_f64() * 1e3;
                self.fastest(si, &name, &cands, setup_ms)?
            }
        };
        let rt = self.convs.get_mut(&si).expect("conv");
        rt.keep(setup, pick.clone());
        Ok(pick)
    }

    /// Every applicable family's setup of conv step `si`, in `FAMILIES` order, then the FP16
    /// way, then the direct kernel where nothing else applies or the layer is small. A
    /// library that cannot set the layer up is left out with a note (QUANTSCOPE_CUDA_VERBOSE).
    fn set_up_conv(&self, si: usize) -> CudaResult<Vec<Box<dyn ConvSetup>>> {
        let cx = self.launch_cx(si);
        let layer = &have(self.convs.get(&si), "conv layer")?.layer;
        let step = &layer.step;
        let mut setups: Vec<Box<dyn ConvSetup>> = vec![];
        let families: Vec<&dyn ConvFamily> = FAMILIES.iter().copied().chain([F16_WAY]).collect();
        for fam in families {
            if !fam.applies(&cx, layer) {
                continue;
            }
            match fam.prepare(&cx, layer) {
                Ok(s) => setups.extend(s),
                Err(e) if fam.optional() => {
                    log_msg(&format!("{}: no {} ({e})", step.name, fam.name()));
                }
                Err(e) => return Err(e),
            }
        }
        let offered = setups.iter().any(|s| !s.candidates(layer).is_empty());
        let macs = (layer.m * step.cout * step.reduction()) as f64;
        if !offered || macs < DIRECT_MAX_MACS {
            setups.extend(DIRECT.prepare(&cx, layer)?);
        }
        Ok(setups)
    }

    /// Times `cands` of conv step `si` in CHOICE_ROUNDS rounds, each round every candidate
    /// once, so that clock changes during the build weigh on all of them alike; each timing
    /// averages back-to-back launches (a layer of 10-20 µs timed launch by launch picked
    /// different cuDNN plans from one build to the next, 5 % apart end to end). Returns the
    /// fastest median; a candidate that fails is left out.
    fn fastest(
        &mut self,
        si: usize,
        name: &str,
        cands: &[(usize, ConvImpl)],
        setup_ms: f64,
    ) -> CudaResult<(usize, ConvImpl)> {
        let timing_start = Instant::now();
        let mut times: Vec<Option<Vec<f64>>> = vec![Some(vec![]); cands.len()];
        for _ in 0..CHOICE_ROUNDS {
            for ((setup, c), ts) in cands.iter().zip(times.iter_mut()) {
                let Some(v) = ts else { continue };
                self.convs
                    .get_mut(&si)
                    .expect("conv")
                    .set(*setup, c.clone());
                match self.time_launches(si) {
                    Ok(t) => v.push(t),
                    Err(e) => {
                        log_msg(&format!("{name}: candidate {} failed: {e}", c.key()));
                        *ts = None;
                    }
                }
            }
        }
        let median = |v: &Vec<f64>| {
            let mut v = v.clone();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(f64::INFINITY)
        };
        let timed: Vec<(f64, &(usize, ConvImpl))> = cands
            .iter()
            .zip(&times)
            .filter_map(|(c, t)| t.as_ref().map(|t| (median(t), c)))
            .collect();
        log_msg(&format!(
            "{name}: {} (set up in {setup_ms:.0} ms, timed in {:.0} ms)",
            timed
                .iter()
                .map(|(t, (_, c))| format!("{} {:.1} us", c.key(), t * 1e3))
                .collect::<Vec<_>>()
                .join(", "),
            timing_start.elapsed().as_secs_f64() * 1e3
        ));
        Ok(timed
            .into_iter()
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map_or_else(|| cands[0].clone(), |(_, c)| c.clone()))
    }

    /// Milliseconds per launch of step `si`, averaged over enough back-to-back launches to fill
    /// about [`CHOICE_BATCH_MS`] (at most [`CHOICE_MAX_LAUNCHES`]) after one warm-up launch.
    /// The launches are captured in a CUDA graph and timed as one, because the engine runs as
    /// a graph: timed as eager launches, a small layer's host-side cost (a cuDNN call's most)
    /// counted as its time, which favoured the cheapest-to-launch kernel over the fastest (on
    /// an H200, EfficientNet-B0's layers at batch 32 timed that way summed 1.05 ms more than
    /// its whole FP16 graph took, 0.57 ms more than its INT8 one). A step the graph capture
    /// refuses is timed eagerly.
    pub(super) fn time_launches(&self, si: usize) -> CudaResult<f64> {
        let ctx = &self.dev.ctx;
        let st = &self.dev.stream;
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let (e0, e1) = (
            drv(ctx.new_event(flags), "event")?,
            drv(ctx.new_event(flags), "event")?,
        );
        let timed = |launch: &dyn Fn() -> CudaResult<()>, n: usize| -> CudaResult<f64> {
            drv(e0.record(st), "event record")?;
            launch()?;
            drv(e1.record(st), "event record")?;
            Ok(drv(e0.elapsed_ms(&e1), "event elapsed")? as f64 / n as f64)
        };
        let once = timed(&|| self.run_step(si), 1)?;
        let n = ((CHOICE_BATCH_MS / once.max(1e-4)) as usize).clamp(1, CHOICE_MAX_LAUNCHES);
        let eager = || (0..n).try_for_each(|_| self.run_step(si));
        match self.capture_graph(eager) {
            Ok(g) => {
                drv(g.launch(), "graph launch")?;
                timed(&|| drv(g.launch(), "graph launch"), n)
            }
            Err(_) => timed(&eager, n),
        }
    }
}
