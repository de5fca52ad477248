//! Device side of the CUDA backend: builds a plan into an engine and runs it. `build` reads
//! top-down: check every step's sizes before anything is allocated (`steps`), allocate the
//! tensors, the scratch and the constants (`device`), choose each conv's implementation by
//! timing the candidates of every family that applies (`choose`, `conv`) and the near ties
//! again in the run (`settle`), run once to learn
//! which steps may leave the main stream, put independent branches on auxiliary streams,
//! time each step for the Layers tab (`profile`), and capture the whole run as a CUDA graph.
//!
//! | file | holds |
//! |---|---|
//! | `kernels` | the NVRTC kernels: source, compile, loading, `launch!`, shared constants |
//! | `device` | device, buffers, memory, streams, and `Launch`, what each launch receives |
//! | `args` | the strided kernels' argument structs, every read checked |
//! | `steps/` | every step but the conv, one file per family: check and launch together |
//! | `conv/` | one file per conv implementation behind `ConvFamily` / `ConvSetup` |
//! | `choose` | the candidate timing, and the choice cache's picks |
//! | `settle` | near ties timed again with their neighbours in the run |
//! | `profile` | the Layers tab's per-step times and precisions |

mod args;
mod choose;
mod conv;
mod device;
mod kernels;
mod profile;
mod settle;
mod steps;
#[cfg(test)]
mod tests;

use std::cell::Cell;
use std::collections::HashMap;

use cudarc::driver::{CudaGraph, result, sys};

pub use choose::NEAR_TIE;
pub use conv::ConvImpl;
use conv::{ConvLayer, ConvRt, graph_cin};
pub use device::{BuildGuard, Device, build_lock};
use device::{Lanes, Launch, Memory, ScratchSizes};
pub(crate) use kernels::MMA_COMPUTE;
use kernels::round_up;

use super::cache::Choices;
use super::error::{CudaError, CudaResult, drv, have};
use super::plan::{ConvStep, DType, Plan, Step, assign_buffers, float_type};
use super::streams::schedule;
use crate::backend::{BackendError, BuildEffort, Engine, EngineInfo, Output, Precision};

/// Workspace offered to cuDNN and cuBLASLt.
const LIB_WORKSPACE_BYTES: usize = 64 << 20;
/// Auxiliary streams independent branches may run on, beside the main one. An ASPP head has
/// four convs side by side; ResNet's downsampling blocks one shortcut.
const AUX_STREAMS: usize = 3;

/// Auxiliary streams an engine uses: none unless QUANTSCOPE_CUDA_AUX_STREAMS asks for up to
/// [`AUX_STREAMS`]. With three, fresh FP16 builds of a ResNet-18 (model.half() export) on an
/// H200 read 15-16 dB SQNR against FP32 in 3 of 4 builds, and 62 dB in every build on the main
/// stream alone: a fault in running branches side by side that is not found yet, for a gain
/// of 4 % at batch 1 and none at batch 32 (ResNet-50 INT8). Correct first; opt in to measure.
fn aux_streams() -> usize {
    std::env::var("QUANTSCOPE_CUDA_AUX_STREAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(0, |n: usize| n.min(AUX_STREAMS))
}

/// What an engine is built for, and how hard its builder searches.
#[derive(Clone, Copy, Debug)]
pub struct BuildHow {
    pub precision: Precision,
    /// An FP32 engine's convolutions and GEMMs may use TF32 tensor cores.
    pub tf32: bool,
    pub batch: usize,
    pub effort: BuildEffort,
    /// How much slower alone than the fastest (a fraction) a conv candidate may be and still
    /// be timed again in the run (`settle`); 0 keeps the fastest alone.
    pub near_tie: f64,
}

pub struct CudaEngine {
    plan: Plan,
    mem: Memory,
    convs: HashMap<usize, ConvRt>,
    graph: Option<CudaGraph>,
    /// The auxiliary streams and the schedule; every step on the main stream until the first
    /// run says which may leave it.
    lanes: Lanes,
    /// Set when a step takes the engine-wide scratch (raw output, im2col columns, FP16 input
    /// copy), which only the main stream owns.
    scratch_taken: Cell<bool>,
    info: EngineInfo,
    batch: usize,
    out_shape: Vec<usize>,
    /// FP32 convolutions and GEMMs may use TF32 tensor cores.
    tf32: bool,
    /// Last, so it is dropped last: cuDNN execution plans, cuBLASLt descriptors, the graph
    /// and the buffers above must go while the handles and the context they belong to live.
    dev: Device,
}

// The raw cuDNN / cuBLASLt handles are only used from the thread that owns the engine.
unsafe impl Send for CudaEngine {}

impl CudaEngine {
    /// Builds the engine: buffers, weights, per-conv choice (from `cached`, timed, or by
    /// rule, as `how.effort` says), telling `progress` how many convs are chosen.
    pub fn build(
        dev: Device,
        plan: Plan,
        how: BuildHow,
        cached: &Choices,
        progress: &dyn Fn(usize, usize),
    ) -> CudaResult<(CudaEngine, Choices)> {
        let BuildHow {
            precision,
            tf32,
            batch,
            effort,
            near_tie,
        } = how;
        // One build at a time in the process (see `device::build_lock`).
        let _one_at_a_time = device::build_lock();
        drv(dev.ctx.bind_to_thread(), "binding the context")?;
        // Every step's sizes against its tensors, before anything is allocated: a planner bug
        // becomes an error naming the step, not an out-of-bounds access on the device.
        for s in &plan.steps {
            steps::run(&plan, s, None).map_err(|e| e.in_step(s.name(), Some(s.kind())))?;
        }
        let (free_before, _) = drv(result::mem_get_info(), "cuMemGetInfo")?;
        let float = float_type(precision);
        let tf32 = tf32 && float == DType::F32;
        let mut eng = CudaEngine::allocate(dev, plan, float, tf32, batch)?;
        let choose_start = std::time::Instant::now();
        let (mut choices, mut seen) = eng.choose_convs(cached, (effort, near_tie), progress)?;
        eng.settle_near_ties(&mut choices, &mut seen)?;
        log_msg(&seen.summary());
        eng.dev.drop_unused_graphs();
        drv(eng.dev.stream.synchronize(), "synchronize")?;
        eng.first_run()?;
        let profile_start = std::time::Instant::now();
        let (layer_times, layer_times_in_run) = eng.profile_layers(precision)?;
        let capture_start = std::time::Instant::now();
        let graph_note = match eng.capture() {
            Ok(()) => match eng.lanes.schedule() {
                Some(s) => format!(
                    "CUDA graph, {} steps on {} streams beside the main one",
                    s.aux_steps(),
                    s.streams - 1
                ),
                None => "CUDA graph".to_string(),
            },
            Err(e) => format!("eager launches (graph capture failed: {e})"),
        };
        log_msg(&format!(
            "{precision} batch {batch}: conv choices {:.0} ms, layer profile {:.0} ms, graph capture {:.0} ms",
            (profile_start - choose_start).as_secs_f64() * 1e3,
            (capture_start - profile_start).as_secs_f64() * 1e3,
            capture_start.elapsed().as_secs_f64() * 1e3
        ));
        let (free_after, _) = drv(result::mem_get_info(), "cuMemGetInfo")?;
        eng.info = EngineInfo {
            backend: "cuda".into(),
            device: format!(
                "{} ({graph_note}; float layers {})",
                eng.dev.name,
                match float {
                    DType::F16 => "FP16",
                    _ if eng.tf32 => "FP32 with TF32 tensor cores",
                    _ => "FP32",
                }
            ),
            simulated: false,
            tf32: eng.tf32,
            threads: None,
            int8_nodes: eng.plan.int8_nodes.len(),
            float_nodes: eng.plan.float_nodes.clone(),
            fp32_layers: eng.plan.fp32_layers.clone(),
            weights_bytes: Memory::constants_bytes(&eng.plan)
                + eng.convs.values().map(ConvRt::weights_bytes).sum::<u64>(),
            activations_bytes: eng.mem.activations_bytes(),
            workspace_bytes: eng.mem.scratch_bytes() + eng.lanes.workspace_bytes(),
            device_mem_bytes: Some(free_before.saturating_sub(free_after) as u64),
            device_free_bytes: Some(free_after as u64),
            layer_times,
            layer_times_in_run,
            engine: Some(format!(
                "quantscope cuda, build effort {}: {}",
                effort.name(),
                seen.brief()
            )),
        };
        Ok((eng, choices))
    }

    /// The engine's memory (tensors, scratch, constants) and its conv layers, everything on
    /// the main stream.
    fn allocate(
        dev: Device,
        plan: Plan,
        float: DType,
        tf32: bool,
        batch: usize,
    ) -> CudaResult<CudaEngine> {
        // Buffers are shared only between steps that stay ordered when every step that may
        // leave the main stream does (which ones do is known after the first run).
        let roots: Vec<usize> = (0..plan.tensors.len()).map(|t| plan.root(t)).collect();
        let draft = schedule(&plan, &roots, &vec![true; plan.steps.len()], aux_streams());
        let (slot_of, sizes) = assign_buffers(&plan, |a, b| draft.before(a, b));
        let mem = Memory::new(&plan, slot_of, &sizes, scratch_sizes(&plan, float))?;
        let mut convs = HashMap::new();
        for (si, s) in plan.steps.iter().enumerate() {
            if let Step::Conv(c) = s {
                let f = conv_float(&plan, c, float);
                convs.insert(
                    si,
                    ConvRt::new(ConvLayer::new(&plan, c, f, tf32 && f == DType::F32)?),
                );
            }
        }
        Ok(CudaEngine {
            dev,
            out_shape: plan.tensors[plan.output].shape.clone(),
            plan,
            mem,
            convs,
            graph: None,
            lanes: Lanes::default(),
            scratch_taken: Cell::new(false),
            info: EngineInfo::default(),
            batch,
            tf32,
        })
    }

    /// Chooses each conv's implementation, in execution order (inputs exist by then), as
    /// `effort` says; returns the choices for the cache.
    fn choose_convs(
        &mut self,
        cached: &Choices,
        effort: (BuildEffort, f64),
        progress: &dyn Fn(usize, usize),
    ) -> CudaResult<(Choices, choose::Seen)> {
        let mut choices = Choices::default();
        let mut conv_ids: Vec<usize> = self.convs.keys().copied().collect();
        conv_ids.sort();
        let mut seen = choose::Seen::default();
        for (done, si) in conv_ids.iter().enumerate() {
            progress(done, conv_ids.len());
            let chosen = self.choose_conv(*si, cached, effort, &mut seen)?;
            choices
                .convs
                .insert(self.convs[si].layer.step.name.clone(), chosen.key());
        }
        progress(conv_ids.len(), conv_ids.len());
        Ok((choices, seen))
    }

    /// A first run on the main stream, which also tells which steps take the main stream's
    /// scratch; then the auxiliary streams for the others.
    fn first_run(&mut self) -> CudaResult<()> {
        let mut movable = vec![];
        for si in 0..self.plan.steps.len() {
            self.scratch_taken.set(false);
            self.run_step(si)
                .map_err(|e| e.in_step(self.plan.steps[si].name(), None))?;
            movable.push(!self.scratch_taken.get());
        }
        drv(self.dev.stream.synchronize(), "first run")?;
        let ws_need = |si: usize| self.convs.get(&si).map_or(0, ConvRt::workspace_bytes);
        self.lanes = Lanes::set_up(&self.dev, &self.plan, self.mem.slot_of(), &movable, ws_need)?;
        Ok(())
    }

    /// The launch context of step `si`, on the stream the lanes point at.
    fn launch_cx(&self, si: usize) -> Launch<'_> {
        Launch::new(
            &self.dev,
            &self.plan,
            &self.mem,
            &self.lanes,
            si,
            &self.scratch_taken,
        )
    }

    /// Launches step `si`: a conv as chosen, any other step on its kernel.
    fn run_step(&self, si: usize) -> CudaResult<()> {
        let s = &self.plan.steps[si];
        let cx = self.launch_cx(si);
        match s {
            Step::Conv(_) if self.plan.tensors[s.output()].numel() > 0 => {
                have(self.convs.get(&si), "conv layer")?.run(&cx)
            }
            _ => steps::run(&self.plan, s, Some(&cx)),
        }
    }

    /// Every step, in plan order, each on its stream.
    fn run_steps(&self) -> CudaResult<()> {
        self.lanes.run(&self.dev, self.plan.steps.len(), |si| {
            self.run_step(si)
                .map_err(|e| e.in_step(self.plan.steps[si].name(), None))
        })
    }

    fn capture(&mut self) -> CudaResult<()> {
        let g = self.capture_graph(|| self.run_steps())?;
        drv(g.launch(), "graph launch")?;
        drv(self.dev.stream.synchronize(), "graph run")?;
        self.graph = Some(g);
        Ok(())
    }

    /// What `launches` puts on the stream, captured as an instantiated, uploaded CUDA graph.
    fn capture_graph(&self, launches: impl FnOnce() -> CudaResult<()>) -> CudaResult<CudaGraph> {
        let st = &self.dev.stream;
        drv(st.synchronize(), "synchronize")?;
        drv(
            st.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
            "begin capture",
        )?;
        let r = launches();
        let g = drv(
            st.end_capture(sys::CUgraphInstantiate_flags(0)),
            "end capture",
        );
        r?;
        let g = g?.ok_or_else(|| CudaError::Internal("empty graph".into()))?;
        drv(g.upload(), "graph upload")?;
        Ok(g)
    }

    fn launch_all(&self) -> CudaResult<()> {
        match &self.graph {
            Some(g) => drv(g.launch(), "graph launch"),
            None => self.run_steps(),
        }
    }

    fn upload_input(&self, input: &[f32]) -> CudaResult<()> {
        let want = self.plan.tensors[self.plan.input].numel();
        if input.len() != want {
            return Err(CudaError::Shape(format!(
                "input holds {} values, the engine takes {want}",
                input.len()
            )));
        }
        let p = self.mem.ptr(self.plan.input);
        drv(
            unsafe { result::memcpy_htod_async(p, input, self.dev.stream.cu_stream()) },
            "copying the input",
        )
    }

    fn run_once(&mut self, input: &[f32]) -> CudaResult<Output> {
        Ok(self.run_reading(input, false)?.0)
    }

    /// Runs one batch and copies back the output and every tap (`Plan::taps`, in order): the
    /// statistics pass's run.
    pub fn run_tapped(&mut self, input: &[f32]) -> CudaResult<(Output, Vec<Vec<f32>>)> {
        self.run_reading(input, true)
    }

    /// Runs one batch and copies back the output, and the taps where `taps`.
    fn run_reading(&mut self, input: &[f32], taps: bool) -> CudaResult<(Output, Vec<Vec<f32>>)> {
        drv(self.dev.ctx.bind_to_thread(), "bind")?;
        self.upload_input(input)?;
        self.launch_all()?;
        let read = |t: usize| -> CudaResult<Vec<f32>> {
            let mut v = vec![0f32; self.plan.tensors[t].numel()];
            drv(
                unsafe {
                    result::memcpy_dtoh_async(&mut v, self.mem.ptr(t), self.dev.stream.cu_stream())
                },
                "copying a tensor to the host",
            )?;
            Ok(v)
        };
        let out = read(self.plan.output)?;
        let tapped = if taps {
            self.plan
                .taps
                .iter()
                .map(|&t| read(t))
                .collect::<CudaResult<Vec<_>>>()?
        } else {
            vec![]
        };
        // The copies land in pageable memory: they are complete once the stream is.
        drv(self.dev.stream.synchronize(), "synchronize")?;
        Ok((
            Output {
                shape: self.out_shape.clone(),
                data: out,
            },
            tapped,
        ))
    }

    fn time_once(&mut self, input: &[f32]) -> CudaResult<f64> {
        drv(self.dev.ctx.bind_to_thread(), "bind")?;
        self.upload_input(input)?;
        choose::StreamTimer::new(self)?.per_launch(1, &|| self.launch_all())
    }
}

/// The float type conv `c` computes in: its input's for a float conv (F32 where the overflow
/// guard kept the layer in an FP16 engine), the engine's for a quantized one (its FP16 way).
fn conv_float(plan: &Plan, c: &ConvStep, engine_float: DType) -> DType {
    match plan.tensors[c.input].dtype {
        d @ (DType::F16 | DType::F32) if c.quant.is_none() => d,
        _ => engine_float,
    }
}

/// Bytes each part of the scratch needs: every conv's raw output (cout rounded up to 16, as
/// 4-byte values), its im2col columns (int8 always; float up to `conv::COL_MAX_BYTES`), the
/// FP16 copy of a quantized conv's input (its FP16 way) or a channel-padded copy (cuDNN's
/// graph conv), and a split global average pool's partial sums.
fn scratch_sizes(plan: &Plan, float: DType) -> ScratchSizes {
    let mut s = ScratchSizes::default();
    for step in &plan.steps {
        match step {
            Step::Conv(c) => {
                let (n, _, hw) = plan.tensors[c.out].nchw();
                let m = n * hw;
                s.raw = s.raw.max(m * round_up(c.cout, 16) * 4);
                let kpad = round_up(c.reduction(), 16);
                let xd = &plan.tensors[c.input];
                if c.groups == 1 {
                    if c.quant.is_some() {
                        s.col = s.col.max(m * kpad);
                        s.f16_in = s.f16_in.max(xd.numel() * 2);
                    }
                    let cin_pad = graph_cin(c.cin, xd.dtype);
                    if cin_pad != c.cin {
                        let copy = xd.numel() / c.cin * cin_pad * xd.dtype.bytes();
                        s.f16_in = s.f16_in.max(copy);
                    }
                    // Float GEMMs (an int8 layer's FP16 way included) need im2col columns.
                    let esz = if c.quant.is_some() {
                        2
                    } else {
                        conv_float(plan, c, float).bytes()
                    };
                    if m * kpad * esz <= conv::COL_MAX_BYTES {
                        s.col = s.col.max(m * kpad * esz);
                    }
                } else if c.quant.is_some() {
                    s.f16_in = s.f16_in.max(xd.numel() * 2);
                }
            }
            Step::GlobalAvgPool { input, .. } => {
                let x = &plan.tensors[*input];
                let (n, c, hw) = x.nchw();
                let splits = steps::gap_splits(n, c, hw, x.dtype.bytes());
                if splits > 1 {
                    s.raw = s.raw.max(n * splits * c * 4);
                }
            }
            _ => {}
        }
    }
    s
}

/// Prints `msg` on stderr when `QUANTSCOPE_CUDA_VERBOSE` is set (the builder's candidate times
/// and phases).
pub(crate) fn log_msg(msg: &str) {
    if std::env::var_os("QUANTSCOPE_CUDA_VERBOSE").is_some() {
        eprintln!("quantscope cuda: {msg}");
    }
}

impl Engine for CudaEngine {
    fn info(&self) -> &EngineInfo {
        &self.info
    }
    fn batch(&self) -> usize {
        self.batch
    }
    fn run(&mut self, input: &[f32]) -> Result<Output, BackendError> {
        self.run_once(input).map_err(CudaError::at_run)
    }
    fn timed_run(&mut self, input: &[f32]) -> Result<f64, BackendError> {
        self.time_once(input).map_err(CudaError::at_run)
    }
}
