//! The CPU backend. Its engines run on ONNX Runtime where the library is found
//! ([`onnxruntime`], `--cpu-engine auto|ort|tract`), else on tract, which is compiled in and runs
//! without setup. On tract: FP32 as the model is; FP16 numerics (weights and each layer's output
//! rounded to f16 once, f32 accumulation; see [`Numerics::Fp16`]); INT8 by lowering the Q/DQ
//! model to integer ops (QLinearConv / ConvInteger / MatMulInteger) that tract runs on
//! i8 x i8 -> i32 kernels. Slow tract ops are replaced by our kernels (`fast_ops`).

mod fast_ops;
mod lower;
pub mod onnxruntime;
pub mod tract_names;

use std::collections::HashMap;

use tract_onnx::pb;
use tract_onnx::prelude::*;

use super::{
    Backend, BackendError, BackendKind, BuildInput, BuildSpec, Engine, EngineInfo, FloatNode,
    LayerTime, Output, Precision,
};
use crate::backend::reference::Activation;
use crate::model::{Model, proto};
use crate::quant::QFormat;

pub use lower::{Lowered, lower_fp8, lower_qdq};
pub use onnxruntime::runtime::{CpuEngineChoice, CpuEngineInfo, CpuEngineKind};

/// The CPU backend; its engines run on the CPU engine in force ([`set_engine`]).
pub struct CpuBackend;

/// The CPU engine in force for this process: what `--cpu-engine` resolved to. One setting, as
/// one job runs at a time (like [`set_threads`]).
static ENGINE: std::sync::Mutex<Option<(CpuEngineKind, CpuEngineInfo)>> =
    std::sync::Mutex::new(None);

/// Resolves `choice` on this machine and puts it in force for every CPU engine and statistics
/// pass that follows. `Ort` without a usable ONNX Runtime is an error, never a fallback.
pub fn set_engine(choice: CpuEngineChoice) -> Result<CpuEngineInfo, String> {
    let resolved = onnxruntime::runtime::resolve(choice)?;
    let info = resolved.1.clone();
    *ENGINE.lock().unwrap_or_else(|e| e.into_inner()) = Some(resolved);
    Ok(info)
}

/// The CPU engine in force (`auto` resolved, when nobody set one).
pub fn engine() -> (CpuEngineKind, CpuEngineInfo) {
    let mut e = ENGINE.lock().unwrap_or_else(|e| e.into_inner());
    e.get_or_insert_with(onnxruntime::runtime::resolve_auto)
        .clone()
}

pub fn engine_kind() -> CpuEngineKind {
    engine().0
}

/// The threads CPU engines and passes run on now (what [`set_threads`] put in force).
pub fn threads() -> usize {
    *THREADS.lock().unwrap_or_else(|e| e.into_inner())
}

static THREADS: std::sync::Mutex<usize> = std::sync::Mutex::new(1);

type Plan = std::sync::Arc<TypedSimplePlan>;

/// The instruction-set edit quantscope applies to tract's CPU probe unless
/// `QUANTSCOPE_TRACT_AMX=1`: tract-linalg 0.23.9's Intel AMX kernels are left out. The workbench
/// crashed inside its AMX int8 kernel (`avx512amx_mmm_i32_8x8`) on an AMX CPU in 3 of 9 runs;
/// 24 CLI runs each way on an AMX host did not reproduce it, so the cause is not established,
/// and the AVX-512 VNNI kernels give the same integer results. `TRACT_CPU_ISA` set by the user
/// still wins.
pub const WITHOUT_AMX: &str = "-amx-int8,-amx-bf16";

/// Chooses tract's CPU kernels once per process, before tract first probes the CPU (it keeps
/// the first probe). Returns the edit in force, if any.
pub fn select_kernels() -> Option<&'static str> {
    static CHOSEN: std::sync::OnceLock<Option<&'static str>> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        if std::env::var("QUANTSCOPE_TRACT_AMX").is_ok_and(|v| v == "1") {
            return None;
        }
        tract_data::knobs::set_config_global("TRACT_CPU_ISA", WITHOUT_AMX)
            .ok()
            .map(|_| WITHOUT_AMX)
    })
}

/// The threads the CPU engines use when the experiment does not say: every core this process
/// may use.
pub fn all_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Makes tract's matrix multiplies (every CPU engine, the calibration and layer passes) run on
/// `threads` threads (0 = [`all_threads`]); returns the count in force. One process-wide
/// setting, as one job runs at a time; the pool is rebuilt only when the count changes.
pub fn set_threads(threads: usize) -> usize {
    use tract_linalg::multithread::{Executor, set_default_executor};
    let n = match threads {
        0 => all_threads(),
        n => n,
    };
    let mut current = THREADS.lock().unwrap_or_else(|e| e.into_inner());
    if *current != n {
        set_default_executor(match n {
            1 => Executor::SingleThread,
            n => Executor::multithread_with_name(n, "quantscope-mm"),
        });
        *current = n;
    }
    n
}

/// The arithmetic a [`TractModel`] runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Numerics {
    /// The model as it is.
    Fp32,
    /// FP16 engine numerics: weights rounded to f16 once at build (after tract's folding),
    /// the input and each layer's output rounded to f16 once, accumulation in f32. Values
    /// live in f32 memory: the accuracy is an FP16 engine's, the speed is not an FP16
    /// device's.
    Fp16,
}

/// A model loaded into tract and optimized, with the outputs it was asked for.
pub struct TractModel {
    plan: Plan,
    input_shape: [usize; 4],
    pub activations_bytes: u64,
    /// The executor this model runs on when not the process's ([`TractModel::choose_threads`]).
    executor: Option<tract_linalg::multithread::Executor>,
}

impl TractModel {
    /// Parses, types and optimizes `p`. `outputs`: tensor names to expose after the model's
    /// first output (for calibration); empty for a plain engine.
    pub fn new(
        p: &pb::ModelProto,
        input_shape: [usize; 4],
        outputs: &[String],
    ) -> TractResult<TractModel> {
        TractModel::with_numerics(p, input_shape, outputs, Numerics::Fp32, &[])
    }

    /// As [`TractModel::new`], computing with `numerics`; with FP16 numerics the ONNX nodes
    /// named in `keep_fp32` (the overflow guard's) keep their outputs in f32.
    pub fn with_numerics(
        p: &pb::ModelProto,
        input_shape: [usize; 4],
        outputs: &[String],
        numerics: Numerics,
        keep_fp32: &[String],
    ) -> TractResult<TractModel> {
        select_kernels();
        let mut onnx = tract_onnx::onnx();
        fast_ops::fp8::register(&mut onnx);
        let parsed = onnx.parse(p, None)?;
        let mut m = parsed.model;
        if !outputs.is_empty() {
            let mut outlets = vec![m.output_outlets()?[0]];
            for t in outputs {
                let o = parsed
                    .outlets_by_name
                    .get(t)
                    .ok_or_else(|| anyhow::anyhow!("no tensor named `{t}`"))?;
                outlets.push(*o);
            }
            m.select_output_outlets(&outlets)?;
        }
        m.set_input_fact(0, f32::fact(input_shape).into())?;
        let mut typed = m.into_typed()?.into_decluttered()?;
        // Our rewrites go in between tract's declutter and codegen passes, so that tract still
        // fuses what surrounds them.
        fast_ops::replace_resizes(&mut typed)?;
        if numerics == Numerics::Fp16 {
            fast_ops::round_constants_to_f16(&mut typed)?;
        }
        fast_ops::replace_depthwise(&mut typed)?;
        fast_ops::fuse_requantize(&mut typed)?;
        typed.optimize()?;
        fast_ops::replace_i8_casts(&mut typed)?;
        if numerics == Numerics::Fp16 {
            // After codegen: one rounding per fused layer, not one per ONNX node.
            fast_ops::round_outputs_to_f16(&mut typed, keep_fp32)?;
        }
        let activations_bytes = peak_activation_bytes(&typed).unwrap_or(0);
        let plan = typed.into_runnable()?;
        Ok(TractModel {
            plan,
            input_shape,
            activations_bytes,
            executor: None,
        })
    }

    /// Runs `f` on this model's executor.
    fn scoped<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.executor {
            Some(e) => tract_linalg::multithread::multithread_tract_scope(e.clone(), f),
            None => f(),
        }
    }

    /// Keeps one thread for this model where one runs it faster than the process's threads,
    /// timed on a fixed input (tract threads small int8 matrix products at a loss:
    /// MobileNetV2's INT8 engine took 22.6 ms on the 2-core EPYC's two threads, 13.5 ms on
    /// one); returns the threads it will run on. On an error the process's threads stay.
    pub fn choose_threads(&mut self) -> TractResult<usize> {
        let chosen = self.time_threads();
        if chosen.is_err() {
            self.executor = None;
        }
        chosen
    }

    fn time_threads(&mut self) -> TractResult<usize> {
        use tract_linalg::multithread::{Executor, current_tract_executor};
        let n = match current_tract_executor() {
            Executor::MultiThread(pool) => pool.current_num_threads(),
            _ => return Ok(1),
        };
        let x = vec![0.5f32; self.input_shape.iter().product()];
        let mut time = |executor: Option<Executor>| -> TractResult<f64> {
            self.executor = executor;
            let start = std::time::Instant::now();
            self.run_all(&x)?;
            Ok(start.elapsed().as_secs_f64())
        };
        // Runs back to back each way, as the latency loop runs them: a pool's threads take
        // a few runs to wake, so each block starts with warm-up runs (three where runs are
        // short), and the best run of each way is compared (noise only slows runs down).
        let first = time(None)?;
        let (rounds, warm, runs) = if first > 0.05 { (1, 1, 2) } else { (2, 3, 3) };
        let (mut multi, mut single) = (vec![], vec![]);
        for _ in 0..rounds {
            for (executor, samples) in [
                (Some(Executor::SingleThread), &mut single),
                (None, &mut multi),
            ] {
                for _ in 0..warm {
                    time(executor.clone())?;
                }
                for _ in 0..runs {
                    samples.push(time(executor.clone())?);
                }
            }
        }
        let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
        let median = |v: &[f64]| crate::timing::latency_from(v.to_vec()).median;
        // One thread only when clearly faster, by its best run and by its median alike: within
        // 5 %, or where the two disagree (a probe slowed by another process), the cores are
        // kept, so the choice does not follow the machine's noise.
        if best(&single) < 0.95 * best(&multi) && median(&single) < 0.95 * median(&multi) {
            self.executor = Some(Executor::SingleThread);
            Ok(1)
        } else {
            self.executor = None;
            Ok(n)
        }
    }

    pub fn run_all(&self, input: &[f32]) -> TractResult<TVec<TValue>> {
        let t = Tensor::from_shape(&self.input_shape, input)?;
        self.scoped(|| self.plan.run(tvec!(t.into())))
    }

    /// Runs `input` (the model's whole input shape, batch included) and hands each extra output
    /// (index k after the graph's own, as named in [`TractModel::new`]) to `adjust` as soon as
    /// it is computed, before any node downstream reads it: what `adjust` leaves in the tensor
    /// is what the rest of the graph sees. Returns the outputs. Sequential bias correction uses
    /// it to correct each layer while the batch flows through.
    pub fn run_adjusting(
        &self,
        input: &[f32],
        mut adjust: impl FnMut(usize, &mut Tensor) -> TractResult<()>,
    ) -> TractResult<TVec<TValue>> {
        let outlets: Vec<OutletId> = self.plan.model().output_outlets()?.to_vec();
        let t = Tensor::from_shape(&self.input_shape, input)?;
        let mut state = self.plan.spawn()?;
        self.scoped(|| {
            state.run_plan_with_eval(tvec!(t.into()), |ctx, op_state, node, inputs| {
                let mut out = tract_onnx::tract_core::plan::eval(ctx, op_state, node, inputs)?;
                for (k, o) in outlets.iter().enumerate().skip(1) {
                    if o.node == node.id {
                        let mut t = out[o.slot].clone().into_tensor();
                        adjust(k - 1, &mut t)?;
                        out[o.slot] = t.into_tvalue();
                    }
                }
                TractResult::Ok(out)
            })
        })
    }

    /// Time of each tract node over `runs` runs (median per node), slowest first.
    pub fn profile(&self, input: &[f32], runs: usize) -> TractResult<Vec<LayerTime>> {
        let mut samples: HashMap<usize, Vec<f64>> = HashMap::new();
        for _ in 0..runs.max(1) {
            let t = Tensor::from_shape(&self.input_shape, input)?;
            let mut state = self.plan.spawn()?;
            self.scoped(|| {
                state.run_plan_with_eval(tvec!(t.into()), |ctx, op_state, node, inputs| {
                    let start = std::time::Instant::now();
                    let r = tract_onnx::tract_core::plan::eval(ctx, op_state, node, inputs);
                    samples
                        .entry(node.id)
                        .or_default()
                        .push(start.elapsed().as_secs_f64() * 1e3);
                    r
                })
            })?;
        }
        let model = self.plan.model();
        let mut out: Vec<LayerTime> = samples
            .into_iter()
            .map(|(id, v)| {
                let node = model.node(id);
                LayerTime {
                    layer: node.name.clone(),
                    kernel: node.op().name().to_string(),
                    time_ms: crate::timing::latency_from(v).median,
                    precision: None,
                }
            })
            .collect();
        out.sort_by(|a, b| b.time_ms.total_cmp(&a.time_ms));
        Ok(out)
    }
}

/// The most bytes of intermediate tensors alive at once, walking tract's execution order.
fn peak_activation_bytes(m: &TypedModel) -> TractResult<u64> {
    let order = m.eval_order()?;
    let pos: HashMap<usize, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let outputs: Vec<OutletId> = m.output_outlets()?.to_vec();
    let mut frees: Vec<Vec<u64>> = vec![vec![]; order.len() + 1];
    let mut peak = 0u64;
    let mut live = 0u64;
    for (i, &n) in order.iter().enumerate() {
        let node = m.node(n);
        if node.op_is::<tract_onnx::tract_core::ops::konst::Const>()
            || node.inputs.is_empty() && !m.input_outlets()?.iter().any(|o| o.node == n)
        {
            continue;
        }
        for (slot, o) in node.outputs.iter().enumerate() {
            let bytes = o
                .fact
                .shape
                .as_concrete()
                .map(|s| s.iter().product::<usize>() as u64)
                .unwrap_or(0)
                * o.fact.datum_type.size_of() as u64;
            let last = o
                .successors
                .iter()
                .filter_map(|s| pos.get(&s.node))
                .max()
                .copied();
            let outlet = OutletId::new(n, slot);
            let end = if outputs.contains(&outlet) {
                order.len()
            } else {
                last.unwrap_or(i)
            };
            live += bytes;
            frees[end].push(bytes);
        }
        peak = peak.max(live);
        for b in std::mem::take(&mut frees[i]) {
            live -= b;
        }
    }
    Ok(peak)
}

fn to_output(v: &TValue) -> Result<Output, BackendError> {
    let run_err = |e: TractError| BackendError::Run(format!("{e:#}"));
    let v = v.cast_to::<f32>().map_err(run_err)?;
    let data = v
        .try_as_plain_ram()
        .map_err(run_err)?
        .as_slice::<f32>()
        .map_err(run_err)?
        .to_vec();
    Ok(Output {
        shape: v.shape().to_vec(),
        data,
    })
}

/// Sum of the bytes of the initializers the engine is built from.
fn initializer_bytes(p: &pb::ModelProto) -> u64 {
    p.graph
        .iter()
        .flat_map(|g| g.initializer.iter())
        .map(|t| {
            let (n, b) = proto::tensor_numel_and_elem_bytes(t);
            n * b
        })
        .sum()
}

pub struct CpuEngine {
    model: TractModel,
    info: EngineInfo,
    batch: usize,
    /// The model's node names, which the profile's tract names are mapped back to.
    names: tract_names::OnnxNodes,
}

impl Engine for CpuEngine {
    fn info(&self) -> &EngineInfo {
        &self.info
    }
    fn batch(&self) -> usize {
        self.batch
    }
    fn run(&mut self, input: &[f32]) -> Result<Output, BackendError> {
        let out = self
            .model
            .run_all(input)
            .map_err(|e| BackendError::Run(format!("{e:#}")))?;
        to_output(&out[0])
    }
    fn profile(&mut self, input: &[f32]) -> Result<Vec<LayerTime>, BackendError> {
        self.model
            .profile(input, 3)
            .map(|times| self.names.rename(times))
            .map_err(|e| BackendError::Run(format!("{e:#}")))
    }
    fn choose_threads(&mut self) -> Result<Option<usize>, BackendError> {
        let t = self
            .model
            .choose_threads()
            .map_err(|e| BackendError::Run(format!("{e:#}")))?;
        self.info.threads = Some(t);
        Ok(Some(t))
    }
}

/// Rounds every float initializer through f16 and puts a Cast(f16) -> Cast(f32) pair after
/// every float activation: the FP16 simulation the CPU backend used before [`Numerics::Fp16`]
/// (two tract passes per ONNX node, 25x the FP32 time), kept as the tests' reference.
#[cfg(test)]
pub fn fp16_simulation(model: &Model, spec: BuildSpec) -> TractResult<pb::ModelProto> {
    let mut p = model.with_fixed_input(spec.batch, spec.hw);
    let float_tensors = float_activation_names(&p, model.input_shape(spec.batch, spec.hw))?;
    let g = p
        .graph
        .as_mut()
        .ok_or_else(|| anyhow::anyhow!("no graph"))?;
    // Constants that describe shapes (Resize scales and the like) keep full precision: an
    // FP16 engine stores weights and activations in f16, not its output sizes.
    let shape_inputs: std::collections::HashSet<String> = g
        .node
        .iter()
        .filter(|n| {
            matches!(
                n.op_type.as_str(),
                "Resize"
                    | "Upsample"
                    | "Reshape"
                    | "Expand"
                    | "Tile"
                    | "Slice"
                    | "Pad"
                    | "ConstantOfShape"
            )
        })
        .flat_map(|n| n.input.iter().skip(1).cloned())
        .collect();
    for t in g.initializer.iter_mut() {
        if t.data_type == pb::tensor_proto::DataType::Float as i32
            && !shape_inputs.contains(&t.name)
            && let Some(f) = proto::tensor_f32(t)
        {
            let rounded: Vec<f32> = f
                .data
                .iter()
                .map(|&v| half::f16::from_f32(v).to_f32())
                .collect();
            *t = proto::f32_tensor(&t.name, &f.dims, &rounded);
        }
    }
    let graph_outputs: std::collections::HashSet<String> =
        g.output.iter().map(|o| o.name.clone()).collect();
    let mut nodes = Vec::with_capacity(g.node.len() * 3);
    let mut renamed: HashMap<String, String> = HashMap::new();
    // Casts `t` through f16 right where it is produced; later readers get the rounded copy.
    let round_through_f16 =
        |t: &str, nodes: &mut Vec<pb::NodeProto>, renamed: &mut HashMap<String, String>| {
            if !float_tensors.contains(t) || graph_outputs.contains(t) {
                return;
            }
            let (h, back) = (format!("{t}_as_f16"), format!("{t}_through_f16"));
            let to = |d: pb::tensor_proto::DataType| vec![proto::int_attr("to", d as i64)];
            nodes.push(proto::node(
                "Cast",
                &format!("{t}_to_f16"),
                &[t],
                &[&h],
                to(pb::tensor_proto::DataType::Float16),
            ));
            nodes.push(proto::node(
                "Cast",
                &format!("{t}_from_f16"),
                &[&h],
                &[&back],
                to(pb::tensor_proto::DataType::Float),
            ));
            renamed.insert(t.to_string(), back);
        };
    round_through_f16(&g.input[0].name.clone(), &mut nodes, &mut renamed);
    for mut n in std::mem::take(&mut g.node) {
        for i in n.input.iter_mut() {
            if let Some(r) = renamed.get(i) {
                *i = r.clone();
            }
        }
        let outs = n.output.clone();
        nodes.push(n);
        for t in outs.iter().filter(|t| !t.is_empty()) {
            round_through_f16(t, &mut nodes, &mut renamed);
        }
    }
    g.node = nodes;
    Ok(p)
}

/// Names of tensors tract types as f32 (so casts through f16 make sense for them).
#[cfg(test)]
fn float_activation_names(
    p: &pb::ModelProto,
    input_shape: [usize; 4],
) -> TractResult<std::collections::HashSet<String>> {
    use tract_onnx::tract_hir::infer::Factoid;
    let onnx = tract_onnx::onnx();
    let parsed = onnx.parse(p, None)?;
    let mut m = parsed.model;
    m.set_input_fact(0, f32::fact(input_shape).into())?;
    m.analyse(false)?;
    let mut out = std::collections::HashSet::new();
    for (name, outlet) in parsed.outlets_by_name {
        if m.node(outlet.node)
            .op_is::<tract_onnx::tract_hir::ops::konst::Const>()
        {
            continue;
        }
        if let Ok(f) = m.outlet_fact(outlet)
            && f.datum_type.concretize() == Some(DatumType::F32)
        {
            out.insert(name);
        }
    }
    Ok(out)
}

impl Backend for CpuBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    /// The CPU, and what runs on it: ONNX Runtime's version where its library is found, else
    /// tract, with the command that enables ONNX Runtime.
    fn check(&self) -> Result<String, String> {
        let runtime = match onnxruntime::runtime::runtime() {
            Ok(rt) => format!("ONNX Runtime {}", rt.version),
            Err(_) => format!(
                "tract only (`{}` enables ONNX Runtime)",
                onnxruntime::runtime::INSTALL_HINT
            ),
        };
        Ok(format!("{}; {runtime}", cpu_device()))
    }

    fn build(
        &self,
        input: BuildInput<'_>,
        spec: BuildSpec,
    ) -> Result<Box<dyn Engine>, BackendError> {
        // FP8 Q/DQ stays on tract's simulation: ONNX Runtime's CPU kernels have no E4M3 path.
        // FP16 numerics too, where tract loads the model: ONNX Runtime's CPU provider has no
        // FP16 conv or MatMul, computes them in FP32 behind casts it then folds away, and its
        // "FP16" ResNet-18 read 73 dB against FP32 where FP16 storage gives about 60 (tract
        // rounds each layer's output to FP16, as an FP16 engine stores it).
        match (engine_kind(), input.precision()) {
            (CpuEngineKind::Ort, Precision::Fp16) => {
                build_tract(input, spec).or_else(|_| build_ort(input, spec))
            }
            (CpuEngineKind::Ort, p) if p != Precision::Fp8 => build_ort(input, spec),
            _ => build_tract(input, spec),
        }
    }
}

/// The CPU backend pinned to tract, whatever `--cpu-engine` says: an engine independent of ONNX
/// Runtime, for checks of what ONNX Runtime computes (the exports' checks in the tests).
pub struct TractBackend;

impl Backend for TractBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }
    fn check(&self) -> Result<String, String> {
        CpuBackend.check()
    }
    fn build(
        &self,
        input: BuildInput<'_>,
        spec: BuildSpec,
    ) -> Result<Box<dyn Engine>, BackendError> {
        build_tract(input, spec)
    }
}

/// The CPU an engine runs on, for its `device` (the row's `engine` says which runtime ran it).
fn cpu_device() -> String {
    format!(
        "{} ({} threads available)",
        onnxruntime::runtime::CpuIsa::get().summary(),
        all_threads()
    )
}

/// The CPU engine of `input` on ONNX Runtime (which must be loadable), on [`threads`] threads.
pub fn build_ort(input: BuildInput<'_>, spec: BuildSpec) -> Result<Box<dyn Engine>, BackendError> {
    onnxruntime::build(input, spec, threads(), cpu_device())
}

/// The CPU engine of `input` on tract.
pub fn build_tract(
    input: BuildInput<'_>,
    spec: BuildSpec,
) -> Result<Box<dyn Engine>, BackendError> {
    let precision = input.precision();
    let model = input.model();
    let build_err = |e: TractError| BackendError::Build {
        precision,
        reason: format!("{e:#}"),
    };
    let shape = model.input_shape(spec.batch, spec.hw);
    let mut info = EngineInfo {
        backend: "cpu".into(),
        device: cpu_device(),
        ..Default::default()
    };
    let p = match input {
        BuildInput::Float {
            precision: Precision::Fp16,
            ..
        } => {
            info.simulated = true;
            model.with_fixed_input(spec.batch, spec.hw)
        }
        BuildInput::Float { .. } => model.with_fixed_input(spec.batch, spec.hw),
        BuildInput::Quantized { qdq, .. } => {
            let fixed = Model {
                proto: qdq.proto.clone(),
                ..model.clone()
            }
            .with_fixed_input(spec.batch, spec.hw);
            let lowered = match qdq.format {
                QFormat::Int8 => lower_qdq(&fixed),
                QFormat::Fp8E4M3 => {
                    info.simulated = true;
                    lower_fp8(&fixed)
                }
            }
            .map_err(|e| BackendError::Build {
                precision,
                reason: e,
            })?;
            info.int8_nodes = lowered.quantized_nodes.len();
            info.float_nodes = lowered.float_nodes;
            lowered.proto
        }
    };
    info.weights_bytes = initializer_bytes(&p);
    let numerics = match precision {
        Precision::Fp16 => Numerics::Fp16,
        _ => Numerics::Fp32,
    };
    // The overflow guard's layers stay f32 in FP16 numerics (FP32 has nothing to keep).
    let keep: Vec<String> = match numerics {
        Numerics::Fp16 => {
            info.fp32_layers = input.keep_fp32().to_vec();
            input.keep_fp32().iter().map(|k| k.node.clone()).collect()
        }
        Numerics::Fp32 => vec![],
    };
    let tm = TractModel::with_numerics(&p, shape, &[], numerics, &keep).map_err(build_err)?;
    info.activations_bytes = tm.activations_bytes;
    info.engine = Some(format!("tract {}", onnxruntime::runtime::TRACT_VERSION));
    Ok(Box::new(CpuEngine {
        model: tm,
        info,
        batch: spec.batch,
        names: tract_names::OnnxNodes::of(&model.proto),
    }))
}

/// The reference interpreter's tract side: a graph with named intermediate tensors exposed.
pub struct Probe {
    model: TractModel,
    pub tensors: Vec<String>,
}

impl Probe {
    pub fn new(model: &Model, hw: [usize; 2], tensors: &[String]) -> Result<Probe, BackendError> {
        Probe::from_graph(
            &model.with_fixed_input(1, hw),
            model.input_shape(1, hw),
            tensors,
        )
    }

    /// `graph` with its input fixed at `input_shape`.
    pub fn from_graph(
        graph: &pb::ModelProto,
        input_shape: [usize; 4],
        tensors: &[String],
    ) -> Result<Probe, BackendError> {
        let tm = TractModel::new(graph, input_shape, tensors).map_err(|e| BackendError::Build {
            precision: Precision::Fp32,
            reason: format!("{e:#}"),
        })?;
        Ok(Probe {
            model: tm,
            tensors: tensors.to_vec(),
        })
    }

    /// The model output and then each requested tensor. The tensors are moved out of tract,
    /// not copied: they are large (every quantized activation of the model) and `Send`.
    pub fn run(&self, input: &[f32]) -> Result<(Output, Vec<Activation>), BackendError> {
        let run_err = |e: TractError| BackendError::Run(format!("{e:#}"));
        let mut outs = self.model.run_all(input).map_err(run_err)?;
        let first = to_output(&outs[0])?;
        let rest = outs
            .drain(1..)
            .map(|v| {
                let t = v.into_tensor();
                if t.datum_type() == DatumType::F32 {
                    Ok(Activation::from_tract(t))
                } else {
                    t.cast_to::<f32>()
                        .map(|c| Activation::from_tract(c.into_owned()))
                        .map_err(run_err)
                }
            })
            .collect::<Result<_, _>>()?;
        Ok((first, rest))
    }
}

impl crate::backend::reference::Interpreter for Probe {
    fn run_batch(
        &self,
        input: &[f32],
        images: usize,
    ) -> Result<(Output, Vec<Activation>), BackendError> {
        if images != 1 {
            return Err(BackendError::Run(format!(
                "the tract probe runs one image at a time, not {images}"
            )));
        }
        Probe::run(self, input)
    }
    fn max_batch(&self) -> usize {
        1
    }
    fn engine(&self) -> &'static str {
        "tract"
    }
}

/// Float nodes of a lowered model that the report lists.
pub fn float_node(node: &pb::NodeProto, reason: &str) -> FloatNode {
    FloatNode {
        node: node.name.clone(),
        op: node.op_type.clone(),
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use tract_onnx::prelude::tract_linalg;

    use crate::backend::{BuildInput, BuildSpec, Precision};
    use crate::model::proto;
    use crate::model::testing::{GraphBuilder, values};

    #[test]
    fn threads_change_the_speed_not_the_numbers() {
        let mut b = GraphBuilder::new(&[1, 3, 96, 96]);
        let c1 = b.conv("c1", "x", 3, 32, 3);
        let r1 = b.op("Relu", "r1", &[&c1]);
        // A depthwise conv large enough for our kernel to split its planes over threads.
        let w = b.random("dw.w", &[32, 1, 3, 3], 0.5);
        let dw = b.node(
            "Conv",
            "dw",
            &[&r1, &w],
            vec![
                proto::ints_attr("kernel_shape", &[3, 3]),
                proto::ints_attr("pads", &[1, 1, 1, 1]),
                proto::int_attr("group", 32),
            ],
        );
        let c2 = b.conv("c2", &dw, 32, 32, 3);
        b.output(&c2);
        let m = b.model();
        let spec = BuildSpec {
            batch: 1,
            hw: [96, 96],
        };
        let input = values(3 * 96 * 96, 5);
        let run = |threads: usize| {
            assert_eq!(super::set_threads(threads), threads);
            let mut e = super::build_tract(
                BuildInput::Float {
                    model: &m,
                    precision: Precision::Fp32,
                    keep_fp32: &[],
                },
                spec,
            )
            .expect("build");
            // The engine runs on the threads given, or on one where one was faster.
            let used = e
                .choose_threads()
                .expect("timed")
                .expect("a CPU engine chooses its threads");
            assert!(used == 1 || used == threads, "{used} threads of {threads}");
            e.run(&input).expect("run").data
        };
        let one = run(1);
        let two = run(2);
        assert_eq!(one, two, "the same numbers on 1 and 2 threads");
        assert_eq!(super::set_threads(0), super::all_threads());
    }

    #[test]
    fn amx_kernels_are_left_out_unless_asked_for() {
        if std::env::var_os("QUANTSCOPE_TRACT_AMX").is_some()
            || std::env::var_os("TRACT_CPU_ISA").is_some()
        {
            eprintln!("skipped: QUANTSCOPE_TRACT_AMX or TRACT_CPU_ISA is set in this environment");
            return;
        }
        assert_eq!(super::select_kernels(), Some(super::WITHOUT_AMX));
        assert_eq!(
            tract_linalg::knobs::TRACT_CPU_ISA.get().as_deref(),
            Some(super::WITHOUT_AMX)
        );
        let isa = tract_linalg::isa::native();
        assert!(!isa.has(tract_linalg::isa::Isa::X86_64AmxInt8), "{isa:?}");
        assert!(!isa.has(tract_linalg::isa::Isa::X86_64AmxBf16), "{isa:?}");
    }
}
