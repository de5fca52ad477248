//! Choosing how each conv runs, as the build effort says. A key known before any timing (the
//! choice cache's) sets up only the family that offers it and takes it; so do the keys of an
//! identically shaped conv timed earlier in the same build or an earlier build of the process
//! (default effort). Otherwise, at the default and exhaustive efforts, every family that
//! applies sets the layer up and the candidates are timed alone in rounds (each as a captured
//! CUDA graph of back-to-back launches) and the fastest median is kept, with every candidate
//! within the near tie of it: those `settle` times again in the engine's run. At the fast
//! effort the families are set up in `FAST_ORDER` with their heuristic first choice only, and
//! the first that offers a candidate gives it, untimed. Everything the other candidates set
//! up is dropped.

use std::collections::HashMap;
use std::time::Instant;

use super::conv::{
    ConvFamily, ConvImpl, ConvSetup, DIRECT, DIRECT_MAX_MACS, F16_WAY, FAMILIES, FAST_ORDER,
    family_of, family_token,
};
use super::{CudaEngine, log_msg};
use crate::backend::BuildEffort;
use crate::backend::cuda::cache::Choices;
use crate::backend::cuda::dnn_graph::PlanPick;
use crate::backend::cuda::error::{CudaError, CudaResult, drv, have};

/// Rounds in which every conv candidate is timed once; the median of its rounds decides.
const CHOICE_ROUNDS: usize = 3;
/// Each candidate timing launches the layer back to back for about this long ...
const CHOICE_BATCH_MS: f64 = 0.2;
/// ... and at most this many times.
const CHOICE_MAX_LAUNCHES: usize = 20;

/// How much slower alone than the fastest (a fraction of its time) a candidate may be and
/// still be timed again in the engine's run (`settle`): 0 by default, so the fastest alone
/// is kept. At 0.10, on an H200, ResNet-50 INT8 (torchvision, random weights) ran batch 32
/// no faster (0.6854 ms against 0.6863) and batch 1 slower (0.2164 against 0.2023-0.2084),
/// and built in 36 s against 30 from cold (a repeated shape's layers set up every contender's
/// family): five steps timed back to back as a graph do not tell a few-µs layer's place in
/// the run either (bench/results/2026-12-01-nvidia-h200-settle-near-ties.txt).
/// QUANTSCOPE_CUDA_NEAR_TIE turns it on, to measure.
pub const NEAR_TIE: f64 = 0.0;

/// What one build chose so far: each timed conv shape's contenders (the fastest alone first),
/// and how every conv got its implementation (the build log's summary).
#[derive(Default)]
pub(super) struct Seen {
    by_shape: HashMap<String, Vec<String>>,
    cached: usize,
    reused: usize,
    timed: usize,
    ruled: usize,
    only: usize,
    setup_ms: f64,
    timing_ms: f64,
    /// Convs whose near ties were timed in the run, and those where that changed the choice.
    pub(super) settled: usize,
    pub(super) changed: usize,
    pub(super) settle_ms: f64,
}

impl Seen {
    /// How the convs got their implementations, for the engine's description.
    pub(super) fn brief(&self) -> String {
        let parts: Vec<String> = [
            (self.timed, "timed"),
            (self.reused, "reused for a repeated shape"),
            (self.cached, "from the choice cache"),
            (self.ruled, "by the fast order, untimed"),
            (self.only, "with one candidate"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
        let settled = match (self.settled, self.changed) {
            (0, _) => String::new(),
            (n, c) => format!("; {n} near ties settled in the run, {c} of them changed"),
        };
        format!("convs {}{settled}", parts.join(", "))
    }
    /// The build log's line: how the convs were chosen, and where the time went.
    pub(super) fn summary(&self) -> String {
        format!(
            "conv choices: {}; set-up {:.0} ms, timing {:.0} ms, settling {:.0} ms",
            self.brief(),
            self.setup_ms,
            self.timing_ms,
            self.settle_ms
        )
    }
}

/// What decides which implementation a conv's candidates are timed against: its shapes and
/// types, its kernel geometry, its epilogue, and the float type it computes in. Two convs
/// alike in all of it time alike (their weights and scales do not change the work).
fn shape_key(cx: &super::device::Launch, l: &super::conv::ConvLayer) -> String {
    let c = &l.step;
    let (xd, od) = (cx.td(c.input), cx.td(c.out));
    format!(
        "{:?}",
        (
            (
                &xd.shape, xd.dtype, xd.layout, &od.shape, od.dtype, od.layout
            ),
            c.residual.map(|r| cx.td(r).dtype),
            (
                c.cin,
                c.cout,
                c.k,
                c.stride,
                c.pads,
                c.pad_code != 0,
                c.dilation,
                c.groups
            ),
            (
                c.act,
                c.quant.as_ref().map(|q| q.dtype),
                l.float,
                l.tf32,
                c.pool_hw
            ),
        )
    )
}

/// Each conv shape's contenders as this process timed them, by GPU, diagnosis knob, near tie
/// and shape: the default effort's reuse of a shape timed before reaches across builds. The INT8 regions'
/// trial engine (`crate::fp16_regions`) shares most of its convs with the all-INT8 and FP16
/// engines built just before it: with them timed again, EfficientNet-B0's INT8 row took 28.8 s
/// to build on an H200, against 1.1 s from the choice cache without the trial.
static TIMED_SHAPES: std::sync::LazyLock<std::sync::Mutex<HashMap<String, Vec<String>>>> =
    std::sync::LazyLock::new(Default::default);

fn timed_key(gpu: &str, near_tie: f64, shape: &str) -> String {
    let avoid = std::env::var("QUANTSCOPE_CUDA_AVOID").unwrap_or_default();
    format!("{gpu}|{avoid}|{near_tie}|{shape}")
}

/// The contenders an earlier build of this process timed for `shape` on `gpu`.
fn timed_before(gpu: &str, near_tie: f64, shape: &str) -> Option<Vec<String>> {
    let m = TIMED_SHAPES.lock().unwrap_or_else(|e| e.into_inner());
    m.get(&timed_key(gpu, near_tie, shape)).cloned()
}

fn remember_timed(gpu: &str, near_tie: f64, shape: &str, keys: &[String]) {
    let mut m = TIMED_SHAPES.lock().unwrap_or_else(|e| e.into_inner());
    m.insert(timed_key(gpu, near_tie, shape), keys.to_vec());
}

/// The candidates of `timed` (median milliseconds alone, the fastest first) within `near_tie`
/// (a fraction) of the fastest: the contenders the run settles.
pub(super) fn near_ties<T>(timed: Vec<(f64, T)>, near_tie: f64) -> Vec<T> {
    let Some(best) = timed.first().map(|t| t.0) else {
        return vec![];
    };
    timed
        .into_iter()
        .enumerate()
        .filter(|(i, (t, _))| *i == 0 || *t <= best * (1.0 + near_tie))
        .map(|(_, (_, c))| c)
        .collect()
}

/// The median of `v`; infinite for none.
pub(super) fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::INFINITY)
}

impl CudaEngine {
    /// Sets up conv step `si` and keeps what runs it: the implementation a known key names, the
    /// only candidate, the fastest alone with those within `near_tie` of it (the contenders of
    /// an earlier conv of its shape, reused), or (fast effort) the first by rule.
    pub(super) fn choose_conv(
        &mut self,
        si: usize,
        cached: &Choices,
        (effort, near_tie): (BuildEffort, f64),
        seen: &mut Seen,
    ) -> CudaResult<ConvImpl> {
        let setup_start = Instant::now();
        let (name, shape) = {
            let rt = have(self.convs.get(&si), "conv layer")?;
            (
                rt.layer.step.name.clone(),
                shape_key(&self.launch_cx(si), &rt.layer),
            )
        };
        let reusable = effort != BuildEffort::Exhaustive;
        let known = match cached.convs.get(&name) {
            Some(k) => Some((vec![k.clone()], true)),
            None => seen
                .by_shape
                .get(&shape)
                .cloned()
                .or_else(|| {
                    (effort == BuildEffort::Default)
                        .then(|| timed_before(&self.dev.name, near_tie, &shape))
                        .flatten()
                })
                .filter(|_| reusable)
                .map(|k| (k, false)),
        }
        // The diagnosis knob leaves a choice out wherever it comes from (a run cached
        // before the knob was set).
        .map(|(keys, from_cache)| {
            (
                keys.into_iter().filter(|k| !avoided(k)).collect(),
                from_cache,
            )
        })
        .filter(|(keys, _): &(Vec<String>, bool)| !keys.is_empty());
        // The families the known keys name, set up alone; the others only where they offer
        // nothing that answers a key (a cached plan index cuDNN no longer returns).
        let mut named: Vec<&str> = vec![];
        if let Some((keys, from_cache)) = &known {
            let tokens: Vec<&str> = keys.iter().map(|k| family_token(k)).collect();
            // `cudnng:k` needs plan k finalized, no other (several: the family's default).
            let plans: Vec<usize> = keys
                .iter()
                .filter_map(|k| k.strip_prefix("cudnng:")?.parse().ok())
                .collect();
            self.convs.get_mut(&si).expect("conv").layer.graph_pick = match plans.as_slice() {
                [k] => Some(PlanPick::Only(*k)),
                _ => None,
            };
            self.add_setups(si, |f| tokens.iter().any(|t| f.tokens().contains(t)))?;
            let rt = self.convs.get_mut(&si).expect("conv");
            let cands = rt.candidates();
            // A family that offers nothing (it could not set its known plan up) is timed with
            // the others; one that offers candidates but none a key answers is not set up again.
            named = tokens
                .into_iter()
                .filter(|t| {
                    family_of(t).is_some_and(|f| {
                        cands
                            .iter()
                            .any(|(_, c)| f.tokens().contains(&family_token(&c.key())))
                    })
                })
                .collect();
            // A key without its algorithm (`gemmf`, `f16+cudnn`) picks the first of that
            // family, which is how the tests force an implementation.
            let mut found: Vec<(usize, ConvImpl)> = vec![];
            for k in keys {
                if let Some(c) = cands.iter().find(|(_, c)| c.answers(k))
                    && !found.contains(c)
                {
                    found.push(c.clone());
                }
            }
            if let Some((_, pick)) = found.first().cloned() {
                rt.keep_contenders(found);
                if *from_cache {
                    seen.cached += 1;
                } else {
                    seen.reused += 1;
                }
                seen.setup_ms += setup_start.elapsed().as_secs_f64() * 1e3;
                return Ok(pick);
            }
        }
        self.convs.get_mut(&si).expect("conv").layer.graph_pick = None;
        if effort == BuildEffort::Fast {
            let pick = self.first_by_rule(si)?;
            seen.ruled += 1;
            seen.setup_ms += setup_start.elapsed().as_secs_f64() * 1e3;
            return Ok(pick);
        }
        self.add_setups(si, |f| !named.iter().any(|t| f.tokens().contains(t)))?;
        let cands = self.candidates_of(si)?;
        let setup_ms = setup_start.elapsed().as_secs_f64() * 1e3;
        seen.setup_ms += setup_ms;
        let contenders = match cands.as_slice() {
            [only] => {
                seen.only += 1;
                vec![only.clone()]
            }
            _ => {
                let timing_start = Instant::now();
                let timed = self.timed(si, &name, &cands, setup_ms)?;
                seen.timing_ms += timing_start.elapsed().as_secs_f64() * 1e3;
                seen.timed += 1;
                let contenders = near_ties(timed, near_tie);
                let contenders = if contenders.is_empty() {
                    vec![cands[0].clone()]
                } else {
                    contenders
                };
                let keys: Vec<String> = contenders.iter().map(|(_, c)| c.key()).collect();
                remember_timed(&self.dev.name, near_tie, &shape, &keys);
                seen.by_shape.insert(shape, keys);
                contenders
            }
        };
        let pick = contenders[0].1.clone();
        self.convs
            .get_mut(&si)
            .expect("conv")
            .keep_contenders(contenders);
        Ok(pick)
    }

    /// The fast effort's choice: the key families of `FAST_ORDER` (or of the diagnosis knob
    /// QUANTSCOPE_CUDA_FAST_ORDER, comma-separated), each family set up once with its
    /// heuristic first choice only, until one offers a candidate of that key family; the
    /// direct kernel where none does.
    fn first_by_rule(&mut self, si: usize) -> CudaResult<ConvImpl> {
        self.convs.get_mut(&si).expect("conv").layer.untimed = true;
        let knob = std::env::var("QUANTSCOPE_CUDA_FAST_ORDER").ok();
        let order: Vec<&str> = match &knob {
            Some(k) => k.split(',').map(str::trim).collect(),
            None => FAST_ORDER.to_vec(),
        };
        let mut set_up: Vec<&'static str> = vec![];
        for token in order {
            let Some(fam) = family_of(token) else {
                continue;
            };
            let first = fam.tokens()[0];
            if !set_up.contains(&first) {
                set_up.push(first);
                self.add_setups(si, |f| f.tokens() == fam.tokens())?;
            }
            let rt = self.convs.get_mut(&si).expect("conv");
            if let Some((setup, pick)) = avoid_filter(rt.candidates())
                .into_iter()
                .find(|(_, c)| family_token(&c.key()) == token)
            {
                rt.keep(setup, pick.clone());
                return Ok(pick);
            }
        }
        self.add_direct(si)?;
        let (setup, pick) = have(self.candidates_of(si)?.pop(), "a candidate")?;
        self.convs
            .get_mut(&si)
            .expect("conv")
            .keep(setup, pick.clone());
        Ok(pick)
    }

    /// Adds to conv step `si` the setups of the families `wanted` picks that apply to it, in
    /// `FAMILIES` order, then the FP16 way; then the direct kernel where no family offers a
    /// candidate or the layer is small (where every family was wanted). A library that
    /// cannot set the layer up is left out with a note (QUANTSCOPE_CUDA_VERBOSE).
    fn add_setups(
        &mut self,
        si: usize,
        wanted: impl Fn(&dyn ConvFamily) -> bool,
    ) -> CudaResult<()> {
        let setups = {
            let cx = self.launch_cx(si);
            let layer = &have(self.convs.get(&si), "conv layer")?.layer;
            let mut setups: Vec<Box<dyn ConvSetup>> = vec![];
            for fam in FAMILIES.iter().copied().chain([F16_WAY]) {
                // Only a family that reads a pad code runs a conv centering's pad folded into,
                // and only one whose kernels pool runs a conv a pool is fused into.
                let pad_ok = layer.step.pad_code == 0 || fam.takes_pad_code();
                let pool_ok = layer.step.pool_hw.is_none() || fam.fuses_pool();
                if !wanted(fam) || !pad_ok || !pool_ok || !fam.applies(&cx, layer) {
                    continue;
                }
                match fam.prepare(&cx, layer) {
                    Ok(s) => setups.extend(s),
                    Err(e) if fam.optional() => {
                        log_msg(&format!("{}: no {} ({e})", layer.step.name, fam.name()));
                    }
                    Err(e) => return Err(e),
                }
            }
            setups
        };
        let rt = self.convs.get_mut(&si).expect("conv");
        for s in setups {
            rt.add(s);
        }
        let layer = &rt.layer;
        let macs = (layer.m * layer.step.cout * layer.step.reduction()) as f64;
        let direct_wanted = wanted(&DIRECT);
        // The direct kernel pads with zeros: `add_direct` leaves a conv with a pad code out.
        let small = macs < DIRECT_MAX_MACS;
        if direct_wanted && (rt.candidates().is_empty() || small) {
            self.add_direct(si)?;
        }
        Ok(())
    }

    /// Adds the direct kernel's setup to conv step `si`: it runs every conv, except one that
    /// pads with a code, which it leaves to the depthwise kernels, and one a pool is fused
    /// into, which it leaves to the tensor-core kernels (a choice naming the direct kernel
    /// there, cached or forced, then falls back to timing those).
    fn add_direct(&mut self, si: usize) -> CudaResult<()> {
        let setup = {
            let cx = self.launch_cx(si);
            let layer = &have(self.convs.get(&si), "conv layer")?.layer;
            if layer.step.pad_code != 0 || layer.step.pool_hw.is_some() {
                return Ok(());
            }
            DIRECT.prepare(&cx, layer)?
        };
        if let Some(s) = setup {
            self.convs.get_mut(&si).expect("conv").add(s);
        }
        Ok(())
    }

    /// The candidates of conv step `si`, or an error where none could be set up (the direct
    /// kernel runs every conv but one with a pad code or a fused pool, and
    /// `fold_pads_into_depthwise` folds a pad only into an int8 depthwise conv, which every
    /// depthwise kernel runs, `fuse_global_pools_into_convs` a pool only into a conv the
    /// tensor-core kernels run: a bug).
    fn candidates_of(&self, si: usize) -> CudaResult<Vec<(usize, ConvImpl)>> {
        let rt = have(self.convs.get(&si), "conv layer")?;
        let cands = avoid_filter(rt.candidates());
        if cands.is_empty() {
            let step = &rt.layer.step;
            let why = if step.pad_code != 0 {
                format!(
                    "its pad code {} (the depthwise kernels did not take it)",
                    step.pad_code
                )
            } else if step.pool_hw.is_some() {
                "its fused pool (the tensor-core kernels did not take it)".to_string()
            } else {
                "it".to_string()
            };
            return Err(CudaError::Internal(format!(
                "{}: no kernel for {why}",
                step.name
            )));
        }
        Ok(cands)
    }

    /// Times `cands` of conv step `si` in CHOICE_ROUNDS rounds, each round every candidate
    /// once, so that clock changes during the build weigh on all of them alike; each timing
    /// averages back-to-back launches (a layer of 10-20 µs timed launch by launch picked
    /// different cuDNN plans from one build to the next, 5 % apart end to end). Returns each
    /// candidate's median milliseconds, the fastest first; a candidate that fails is left out.
    fn timed(
        &mut self,
        si: usize,
        name: &str,
        cands: &[(usize, ConvImpl)],
        setup_ms: f64,
    ) -> CudaResult<Vec<(f64, (usize, ConvImpl))>> {
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
        let mut timed: Vec<(f64, (usize, ConvImpl))> = cands
            .iter()
            .zip(&times)
            .filter_map(|(c, t)| t.as_ref().map(|t| (median(t), c.clone())))
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
        timed.sort_by(|a, b| a.0.total_cmp(&b.0));
        Ok(timed)
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
        let timer = StreamTimer::new(self)?;
        let timed = |launch: &dyn Fn() -> CudaResult<()>, n: usize| timer.per_launch(n, launch);
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

/// Two events around launches on the engine's main stream: milliseconds per launch.
pub(super) struct StreamTimer<'a> {
    st: &'a cudarc::driver::CudaStream,
    e0: cudarc::driver::CudaEvent,
    e1: cudarc::driver::CudaEvent,
}

impl<'a> StreamTimer<'a> {
    pub(super) fn new(eng: &'a CudaEngine) -> CudaResult<Self> {
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        Ok(StreamTimer {
            st: &eng.dev.stream,
            e0: drv(eng.dev.ctx.new_event(flags), "event")?,
            e1: drv(eng.dev.ctx.new_event(flags), "event")?,
        })
    }

    /// Milliseconds per launch of what `launches` puts on the stream (`n` launches).
    pub(super) fn per_launch(
        &self,
        n: usize,
        launches: &dyn Fn() -> CudaResult<()>,
    ) -> CudaResult<f64> {
        drv(self.e0.record(self.st), "event record")?;
        launches()?;
        drv(self.e1.record(self.st), "event record")?;
        Ok(drv(self.e0.elapsed_ms(&self.e1), "event elapsed")? as f64 / n as f64)
    }
}

/// Whether the diagnosis knob QUANTSCOPE_CUDA_AVOID=gemm,cudnng names choice `key`: it
/// starts with one of them.
fn avoided(key: &str) -> bool {
    std::env::var("QUANTSCOPE_CUDA_AVOID").is_ok_and(|avoid| {
        avoid
            .split(',')
            .any(|a| !a.trim().is_empty() && key.starts_with(a.trim()))
    })
}

/// Leaves out the candidates the diagnosis knob names (where another is left), to find which
/// implementation a wrong engine comes from (tests/cuda_zoo.rs, QUANTSCOPE_ZOO_DIAGNOSE).
fn avoid_filter(mut cands: Vec<(usize, ConvImpl)>) -> Vec<(usize, ConvImpl)> {
    if cands.iter().any(|(_, c)| !avoided(&c.key())) {
        cands.retain(|(_, c)| !avoided(&c.key()));
    }
    cands
}
