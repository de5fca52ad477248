//! The CPU engine on ONNX Runtime: FP32 as the model is (full graph optimisation); INT8 from the
//! same Q/DQ model quantscope exports for TensorRT, in the form that is both exact and fastest
//! on this CPU ([`cpu_form`]); FP16 from the strongly typed FP16 export (FP16 numerics: ORT
//! inserts casts where the CPU has no FP16 kernel, so the latency is not an FP16 device's).
//! Also the reference interpreter's ORT side: a graph with chosen tensors exposed as extra
//! outputs.

pub mod cpu_form;
pub mod profile;
pub mod runtime;

use std::sync::Mutex;

use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;
use ort::value::{Tensor, TensorElementType, ValueType};
use tract_onnx::pb;

use super::initializer_bytes;
use crate::backend::{
    BackendError, BuildInput, BuildSpec, Engine, EngineInfo, LayerTime, Output, Precision,
};
use crate::model::Model;
use runtime::CpuIsa;

/// Graph optimisation, by what the session is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Optimisation {
    /// Every ORT fusion and layout change: FP32 and FP16 engines, and INT8 where ORT's integer
    /// kernels do not saturate (their requantizing rounds in float, so a code near a boundary
    /// can differ by one from the fake-quantized model's).
    Full,
    /// No graph rewrite, every node as the file writes it: Q/DQ is fake quantization in float,
    /// exact on every CPU (the reference for statistics, and INT8 on x86 without VNNI). Even
    /// ORT's basic level changes how convs sum (constant-folded, prepacked weights), which moved
    /// 2 of 16,384 stem codes of the bundled classifier by one step against tract's INT8 engine;
    /// unoptimised, the two agree to float rounding, at the same speed (DeepLab on the 2-core
    /// EPYC: 26.4 vs 27.8 ms at 2 threads, 44.0 vs 43.6 ms at 1).
    Exact,
}

impl Optimisation {
    fn level(self) -> GraphOptimizationLevel {
        match self {
            Optimisation::Full => GraphOptimizationLevel::All,
            Optimisation::Exact => GraphOptimizationLevel::Disable,
        }
    }
}

/// What a session is for: its threads spin between runs only where latency is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// An engine, timed run after run: idle threads spin, ready for the next run.
    Engine,
    /// A statistics pass: between runs the histograms are filled on every core, so ORT's idle
    /// threads sleep instead of spinning on those cores.
    Statistics,
}

/// An ORT session on `model_bytes` with `threads` intra-op threads.
pub fn session(
    model_bytes: &[u8],
    opt: Optimisation,
    threads: usize,
    for_use: Use,
    profile_prefix: Option<&std::path::Path>,
) -> Result<Session, String> {
    let rt = runtime::runtime()?;
    let e = |e: ort::Error| format!("{e}");
    let mut b = Session::builder(&rt.env)
        .map_err(e)?
        .with_optimization_level(opt.level())
        .map_err(|x| x.to_string())?
        .with_intra_threads(threads.max(1))
        .map_err(|x| x.to_string())?
        // ORT's own log would print every failed run to stderr; its errors reach the caller as
        // values instead (an error row, or the batch a probe falls back from).
        .with_log_level(ort::logging::LogLevel::Fatal)
        .map_err(|x| x.to_string())?;
    if for_use == Use::Statistics {
        b = b.with_intra_op_spinning(false).map_err(|x| x.to_string())?;
    }
    if let Some(prefix) = profile_prefix {
        b = b.with_profiling(prefix).map_err(|x| x.to_string())?;
    }
    b.commit_from_memory(model_bytes).map_err(e)
}

/// Whether the session's first input takes f16 (a model exported with `model.half()`).
fn input_is_f16(s: &Session) -> bool {
    matches!(
        s.inputs().first().map(|i| i.dtype()),
        Some(ValueType::Tensor {
            ty: TensorElementType::Float16,
            ..
        })
    )
}

/// Runs `s` on `input` (shape `shape`), returning the named outputs as f32 (the graph's first
/// output when `names` is empty). ORT's errors name the node and its op.
fn run_session(
    s: &mut Session,
    shape: &[usize],
    input: &[f32],
    names: &[String],
) -> Result<Vec<Output>, String> {
    let e = |e: ort::Error| format!("{e}");
    let input_name = s
        .inputs()
        .first()
        .map(|i| i.name().to_string())
        .ok_or("the model has no input")?;
    let value: ort::value::DynValue = if input_is_f16(s) {
        let h: Vec<half::f16> = input.iter().map(|&v| half::f16::from_f32(v)).collect();
        Tensor::from_array((shape.to_vec(), h))
            .map_err(e)?
            .into_dyn()
    } else {
        Tensor::from_array((shape.to_vec(), input.to_vec()))
            .map_err(e)?
            .into_dyn()
    };
    let first = s
        .outputs()
        .first()
        .map(|o| o.name().to_string())
        .ok_or("the model has no output")?;
    let wanted: Vec<String> = if names.is_empty() {
        vec![first]
    } else {
        names.to_vec()
    };
    let mut selector = ort::session::OutputSelector::no_default();
    for n in &wanted {
        selector = selector.with(n.clone());
    }
    let options = ort::session::RunOptions::new()
        .map_err(e)?
        .with_outputs(selector);
    let outs = s
        .run_with_options(ort::inputs![input_name.as_str() => value], &options)
        .map_err(e)?;
    wanted
        .iter()
        .map(|n| {
            let v = outs
                .get(n.as_str())
                .ok_or_else(|| format!("ONNX Runtime returned no tensor `{n}`"))?;
            to_f32(v).map_err(|why| format!("tensor `{n}`: {why}"))
        })
        .collect()
}

/// An output value as f32 (float, half and integer tensors; others are refused).
fn to_f32(v: &ort::value::DynValue) -> Result<Output, String> {
    let shape_of = |s: &ort::value::Shape| s.iter().map(|&d| d.max(0) as usize).collect();
    macro_rules! as_f32 {
        ($t:ty, $conv:expr) => {
            if let Ok((shape, data)) = v.try_extract_tensor::<$t>() {
                return Ok(Output {
                    shape: shape_of(shape),
                    data: data.iter().map($conv).collect(),
                });
            }
        };
    }
    as_f32!(f32, |&x: &f32| x);
    as_f32!(half::f16, |x: &half::f16| x.to_f32());
    as_f32!(f64, |&x: &f64| x as f32);
    as_f32!(i8, |&x: &i8| x as f32);
    as_f32!(u8, |&x: &u8| x as f32);
    as_f32!(i32, |&x: &i32| x as f32);
    as_f32!(i64, |&x: &i64| x as f32);
    Err(format!(
        "a value of type {:?}, not a numeric tensor",
        v.dtype()
    ))
}

/// The CPU engine on ORT.
pub struct OrtEngine {
    session: Session,
    /// The model the session runs, for a profiling session of the same graph.
    model_bytes: Vec<u8>,
    opt: Optimisation,
    threads: usize,
    shape: [usize; 4],
    info: EngineInfo,
}

impl Engine for OrtEngine {
    fn info(&self) -> &EngineInfo {
        &self.info
    }
    fn batch(&self) -> usize {
        self.shape[0]
    }
    fn run(&mut self, input: &[f32]) -> Result<Output, BackendError> {
        crate::guard::catch("running the ONNX Runtime engine", || {
            run_session(&mut self.session, &self.shape, input, &[])
        })
        .and_then(|r| r)
        .map_err(BackendError::Run)?
        .pop()
        .ok_or_else(|| BackendError::Run("ONNX Runtime returned no output".into()))
    }
    fn profile(&mut self, input: &[f32]) -> Result<Vec<LayerTime>, BackendError> {
        let graph: pb::ModelProto = prost::Message::decode(self.model_bytes.as_slice())
            .map_err(|e| BackendError::Run(e.to_string()))?;
        let names = profile::OnnxNames::of(&graph);
        profile::per_node(
            &self.model_bytes,
            self.opt,
            self.threads,
            &self.shape,
            input,
            3,
        )
        .map(|times| names.rename(times))
        .map_err(BackendError::Run)
    }
    fn choose_threads(&mut self) -> Result<Option<usize>, BackendError> {
        // ORT's intra-op pool spins its threads between runs and splits small products well:
        // the count asked for is the count used.
        Ok(Some(self.threads))
    }
    fn idle_spin_ms(&self) -> f64 {
        match self.threads {
            1 => 0.0,
            _ => IDLE_SPIN_MS,
        }
    }
}

/// How long the pool threads of an engine session spin after a run before they sleep: ORT's
/// worker loop spins 2^20 pauses, measured at 45-50 ms on a 2-core AMD EPYC (the process's CPU
/// time while it slept after a run); a pause takes longer on recent Intel cores, hence the
/// margin.
const IDLE_SPIN_MS: f64 = 100.0;

/// Builds the ORT engine for `input`. INT8 runs the Q/DQ model: where the fused u8 x s8 kernels
/// do not saturate (VNNI, or not x86), as written or in its CPU form ([`cpu_form`]), whichever
/// runs faster (both timed); elsewhere as exact fake quantization ([`Optimisation::Exact`]).
pub fn build(
    input: BuildInput<'_>,
    spec: BuildSpec,
    threads: usize,
    device: String,
) -> Result<Box<dyn Engine>, BackendError> {
    let precision = input.precision();
    let model = input.model();
    let build_err = |reason: String| BackendError::Build { precision, reason };
    let shape = model.input_shape(spec.batch, spec.hw);
    let mut info = EngineInfo {
        backend: "cpu".into(),
        device,
        threads: Some(threads),
        ..Default::default()
    };
    let fixed = model.with_fixed_input(spec.batch, spec.hw);
    let (p, opt, note) = match input {
        BuildInput::Float {
            precision: Precision::Fp16,
            ..
        } => {
            // FP16 numerics through the strongly typed model; the row is labelled simulated.
            // export::typed reads only model and quant, so this is no import cycle.
            info.simulated = true;
            let m = Model {
                proto: fixed,
                ..model.clone()
            };
            let typed = crate::export::typed::fp16_model(&m, None, input.keep_fp32())
                .map_err(|e| build_err(e.to_string()))?;
            info.fp32_layers = input.keep_fp32().to_vec();
            // Reached where tract cannot load the model (`CpuBackend::build`).
            let caveat = "FP16 numerics on ONNX Runtime, where tract cannot load the model: \
                          layers without a CPU FP16 kernel compute in FP32, so this row may \
                          read closer to FP32 than an FP16 device";
            (typed.proto, Optimisation::Full, Some(caveat.to_string()))
        }
        BuildInput::Float { .. } => (fixed, Optimisation::Full, None),
        BuildInput::Quantized { qdq, .. } => {
            let q = Model {
                proto: qdq.proto.clone(),
                ..model.clone()
            }
            .with_fixed_input(spec.batch, spec.hw);
            // The same census the tract engine reports: which nodes read quantized inputs.
            let census = super::lower_qdq(&q).map_err(build_err)?;
            // ONNX Runtime also runs the asymmetric (uint8, zero point ≠ 0) layers of another
            // tool's Q/DQ model quantized, which tract's census (symmetric int8) leaves out.
            let asymmetric = crate::quant::carried::asymmetric_layers(
                q.graph
                    .as_ref()
                    .ok_or_else(|| build_err("no graph".into()))?,
            );
            info.int8_nodes = census.quantized_nodes.len() + asymmetric.len();
            info.float_nodes = census
                .float_nodes
                .into_iter()
                .filter(|f| !asymmetric.contains(&f.node))
                .collect();
            if CpuIsa::get().fused_int8_exact() {
                let mut cpu = q.clone();
                let pads = cpu_form::pads_into_convs(&mut cpu);
                let pairs = cpu_form::quantize_before_activations(&mut cpu);
                let u8s = cpu_form::to_u8_activations(&mut cpu);
                let (p, note) = if pairs + u8s > 0 {
                    let padded = match pads {
                        0 => String::new(),
                        n => format!(", {n} centering pads back in their convs"),
                    };
                    let what = format!(
                        "{u8s} activations as u8 (zero point 128), {pairs} layers quantized \
                         before their ReLU / Clip{padded}"
                    );
                    faster_form(&q, &cpu, &what, &shape, threads).map_err(build_err)?
                } else {
                    (q, "as written".to_string())
                };
                (p, Optimisation::Full, Some(note))
            } else {
                (
                    q,
                    Optimisation::Exact,
                    Some(
                        "exact fake quantization (no graph optimisation): this CPU has no \
                         VNNI, where ONNX Runtime's fused u8 x s8 kernels saturate"
                            .to_string(),
                    ),
                )
            }
        }
    };
    info.weights_bytes = initializer_bytes(&p);
    info.activations_bytes = crate::model::infer_shapes(model, spec.hw)
        .map(|shapes| peak_activation_bytes(&p, &shapes, spec.batch, precision))
        .unwrap_or(0);
    let model_bytes = prost::Message::encode_to_vec(&p);
    let session = crate::guard::catch("building the ONNX Runtime engine", || {
        session(&model_bytes, opt, threads, Use::Engine, None)
    })
    .and_then(|r| r)
    .map_err(build_err)?;
    info.engine = Some(match note {
        Some(note) if precision == Precision::Fp16 => format!("{}; {note}", engine_name()),
        Some(note) => format!("{}; INT8 form: {note}", engine_name()),
        None => engine_name(),
    });
    Ok(Box::new(OrtEngine {
        session,
        model_bytes,
        opt,
        threads,
        shape,
        info,
    }))
}

/// The most bytes of intermediate tensors alive at once, walking the graph in its node order
/// with the shapes inferred at batch 1 (times `batch`): f32 tensors, except the codes of a
/// QuantizeLinear (one byte) and an FP16 engine's (two). ORT's arena plans its own reuse, so
/// this is the graph's need, not ORT's allocation.
fn peak_activation_bytes(
    p: &pb::ModelProto,
    shapes: &std::collections::HashMap<String, Vec<usize>>,
    batch: usize,
    precision: Precision,
) -> u64 {
    let Some(g) = p.graph.as_ref() else {
        return 0;
    };
    let consts: std::collections::HashSet<&str> =
        g.initializer.iter().map(|t| t.name.as_str()).collect();
    let mut last_use: std::collections::HashMap<&str, usize> = Default::default();
    for (i, n) in g.node.iter().enumerate() {
        for t in &n.input {
            last_use.insert(t.as_str(), i);
        }
    }
    let float_bytes: u64 = if precision == Precision::Fp16 { 2 } else { 4 };
    let (mut live, mut peak) = (0u64, 0u64);
    let mut frees: Vec<Vec<u64>> = vec![vec![]; g.node.len()];
    for (i, n) in g.node.iter().enumerate() {
        let per = if n.op_type == "QuantizeLinear" {
            1
        } else {
            float_bytes
        };
        for t in n
            .output
            .iter()
            .filter(|t| !t.is_empty() && !consts.contains(t.as_str()))
        {
            let Some(shape) = shapes.get(t) else { continue };
            let bytes = shape.iter().product::<usize>() as u64 * batch as u64 * per;
            live += bytes;
            match last_use.get(t.as_str()) {
                Some(&j) if j > i => frees[j].push(bytes),
                _ => frees[i].push(bytes),
            }
        }
        peak = peak.max(live);
        for b in std::mem::take(&mut frees[i]) {
            live -= b;
        }
    }
    peak
}

/// "onnxruntime 1.32.0".
fn engine_name() -> String {
    runtime::runtime()
        .map(|rt| format!("onnxruntime {}", rt.version))
        .unwrap_or_else(|_| "onnxruntime".into())
}

/// How much faster (as a ratio of times) the model as written must run to replace its CPU form.
const FORM_MARGIN: f64 = 0.95;

/// Per (Q/DQ model, input shape, threads), whether the CPU form won when this process timed
/// it. The two forms round differently in the last bits, so a model built twice in one run
/// (the run's engine and sensitivity's, the same model under two settings) must not take the
/// other form because the machine was busier the second time.
static FORM_CHOICES: std::sync::OnceLock<Mutex<std::collections::HashMap<u64, bool>>> =
    std::sync::OnceLock::new();

/// Times the Q/DQ model as written and its CPU form (best of a few runs each, after warm-up
/// runs) and returns the faster, with a line saying which ran and by how much; a model this
/// process timed before takes the same form again.
fn faster_form(
    as_written: &pb::ModelProto,
    cpu: &pb::ModelProto,
    what: &str,
    shape: &[usize; 4],
    threads: usize,
) -> Result<(pb::ModelProto, String), String> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    prost::Message::encode_to_vec(as_written).hash(&mut h);
    (shape, threads).hash(&mut h);
    let key = h.finish();
    let choices = FORM_CHOICES.get_or_init(Default::default);
    let earlier = choices.lock().ok().and_then(|c| c.get(&key).copied());
    let (cpu_form, why) = match earlier {
        Some(cpu_form) => (
            cpu_form,
            "the form this run timed faster for this model before".to_string(),
        ),
        None => {
            let (written, ours) = (
                time_form(as_written, shape, threads)?,
                time_form(cpu, shape, threads)?,
            );
            // The CPU form unless the model as written is clearly faster (by more than 5 %,
            // as the tract engine's thread choice), so the form does not follow the noise.
            let cpu_form = written >= FORM_MARGIN * ours;
            if let Ok(mut c) = choices.lock() {
                c.insert(key, cpu_form);
            }
            let times = format!("{ours:.2} ms with the CPU form, {written:.2} ms as written");
            (cpu_form, times)
        }
    };
    Ok(if cpu_form {
        (cpu.clone(), format!("{what} ({why})"))
    } else {
        (as_written.clone(), format!("as written ({why})"))
    })
}

/// Best of 4 timed runs of `p` (after 2 warm-up runs), in ms.
fn time_form(p: &pb::ModelProto, shape: &[usize; 4], threads: usize) -> Result<f64, String> {
    let x = vec![0.5f32; shape.iter().product()];
    let mut s = session(
        &prost::Message::encode_to_vec(p),
        Optimisation::Full,
        threads,
        Use::Engine,
        None,
    )?;
    let mut best = f64::INFINITY;
    for i in 0..6 {
        let t = std::time::Instant::now();
        run_session(&mut s, shape, &x, &[])?;
        if i >= 2 {
            best = best.min(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    Ok(best)
}

/// The reference interpreter's ORT side: `graph` with `tensors` exposed as extra outputs.
pub struct OrtProbe {
    session: Mutex<Session>,
    /// The input shape for one image; the batch dimension is free.
    image_shape: [usize; 4],
    tensors: Vec<String>,
    /// The graph input's name: asked for as a tensor, it is the input itself.
    input_name: String,
    /// The graph's first output.
    output_name: String,
}

impl OrtProbe {
    /// `graph` has its input fixed at batch 1; the probe frees the batch dimension so one run
    /// can take several images (a graph that fixes its batch elsewhere fails at run time, and
    /// the caller runs one image at a time).
    pub fn new(
        graph: &pb::ModelProto,
        image_shape: [usize; 4],
        tensors: &[String],
        threads: usize,
    ) -> Result<OrtProbe, String> {
        let mut p = graph.clone();
        let g = p.graph.as_mut().ok_or("the model has no graph")?;
        let input_name = g.input.first().map(|i| i.name.clone()).unwrap_or_default();
        let output_name = g
            .output
            .first()
            .map(|o| o.name.clone())
            .ok_or("the model has no output")?;
        let mut outputs: std::collections::HashSet<String> =
            g.output.iter().map(|o| o.name.clone()).collect();
        for t in tensors {
            if *t != input_name && outputs.insert(t.clone()) {
                g.output.push(pb::ValueInfoProto {
                    name: t.clone(),
                    ..Default::default()
                });
            }
        }
        free_batch_dim(g);
        let quantized = g.node.iter().any(|n| n.op_type == "QuantizeLinear");
        // Q/DQ graphs are read as exact fake quantization on every CPU.
        let opt = if quantized {
            Optimisation::Exact
        } else {
            Optimisation::Full
        };
        let bytes = prost::Message::encode_to_vec(&p);
        let session = crate::guard::catch("building the ONNX Runtime probe", || {
            session(&bytes, opt, threads, Use::Statistics, None)
        })
        .and_then(|r| r)?;
        Ok(OrtProbe {
            session: Mutex::new(session),
            image_shape,
            tensors: tensors.to_vec(),
            input_name,
            output_name,
        })
    }

    /// Runs `images` images; returns the graph's first output and each requested tensor, in
    /// the order asked for, each holding all the images (the graph input given back as it came).
    pub fn run(&self, input: &[f32], images: usize) -> Result<(Output, Vec<Output>), String> {
        let mut shape = self.image_shape;
        shape[0] = images;
        let mut names = vec![self.output_name.clone()];
        for t in &self.tensors {
            if *t != self.input_name && !names.contains(t) {
                names.push(t.clone());
            }
        }
        let outs = {
            let mut s = self.session.lock().unwrap_or_else(|e| e.into_inner());
            crate::guard::catch("running the ONNX Runtime probe", || {
                run_session(&mut s, &shape, input, &names)
            })
            .and_then(|r| r)?
        };
        // Moved out, not copied: they are every quantized activation of the model.
        let mut by_name: std::collections::HashMap<&str, Output> =
            names.iter().map(String::as_str).zip(outs).collect();
        let first = by_name
            .remove(self.output_name.as_str())
            .ok_or("no output")?;
        let mut rest = Vec::with_capacity(self.tensors.len());
        for (k, t) in self.tensors.iter().enumerate() {
            let value = if *t == self.input_name {
                Some(Output {
                    shape: shape.to_vec(),
                    data: input.to_vec(),
                })
            } else if *t == self.output_name {
                Some(first.clone())
            } else if self.tensors[k + 1..].contains(t) {
                // Asked for again later: this one is a copy.
                by_name.get(t.as_str()).cloned()
            } else {
                by_name.remove(t.as_str())
            }
            .ok_or_else(|| format!("ONNX Runtime returned no tensor `{t}`"))?;
            rest.push(value);
        }
        Ok((first, rest))
    }
}

/// Makes the graph input's first dimension symbolic, and drops the fixed output shapes.
fn free_batch_dim(g: &mut pb::GraphProto) {
    use pb::tensor_shape_proto::dimension::Value;
    if let Some(pb::type_proto::Value::TensorType(t)) = g
        .input
        .first_mut()
        .and_then(|i| i.r#type.as_mut())
        .and_then(|t| t.value.as_mut())
        && let Some(d) = t.shape.as_mut().and_then(|s| s.dim.first_mut())
    {
        d.value = Some(Value::DimParam("batch".into()));
    }
}
