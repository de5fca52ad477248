//! The command line: `inspect`, `run`, `eval` and `gui`. Progress goes to stderr as a bar;
//! results go to stdout and the report files. The flags are in `args`, the progress and log
//! output in `sink`.

mod args;
mod sink;

pub use args::*;
pub use sink::CliSink;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Parser;

use crate::backend::BackendKind;
use crate::experiment::Experiment;
use crate::model::Model;
use crate::pipeline::{self, CancelToken, Sink};
use crate::report::Report;

/// Exit codes: what a script can rely on. When several apply, the highest wins.
pub mod exit {
    /// Every requested engine produced its row and every output was written.
    pub const OK: u8 = 0;
    /// quantscope itself failed (a bug): please report it with the command.
    pub const INTERNAL: u8 = 1;
    /// Bad input, refused before any engine ran: a flag, the model, the data or the experiment
    /// file (also clap's own usage errors).
    pub const BAD_INPUT: u8 = 2;
    /// Some engines failed: their rows carry the error, or their outputs held NaN/Inf and their
    /// metrics are void; the other rows are in the report.
    /// (`inspect --backend cuda`: some nodes cannot be built by that backend.)
    pub const ENGINES_FAILED: u8 = 3;
    /// An output (report, experiment, Q/DQ export, mask overlays) could not be written.
    pub const OUTPUT_FAILED: u8 = 4;
    /// Interrupted (Ctrl-C): the rows already finished were written, marked incomplete.
    pub const INTERRUPTED: u8 = 130;
}

/// The cancel token that Ctrl-C sets: the run stops between images and writes what is finished.
/// A second Ctrl-C quits at once. One handler for the process (a command may run sensitivity
/// and then the engines), installed on first use.
fn interrupt_token(sink: &CliSink) -> CancelToken {
    static TOKEN: std::sync::OnceLock<Result<CancelToken, String>> = std::sync::OnceLock::new();
    let installed = TOKEN.get_or_init(|| {
        let cancel = CancelToken::default();
        let c = cancel.clone();
        ctrlc::set_handler(move || {
            if c.is_cancelled() {
                std::process::exit(exit::INTERRUPTED as i32);
            }
            c.cancel();
            eprintln!(
                "\ninterrupted: stopping after the current image and writing the finished rows (Ctrl-C again quits at once)"
            );
        })
        .map(|_| cancel)
        .map_err(|e| e.to_string())
    });
    match installed {
        Ok(t) => t.clone(),
        Err(e) => {
            sink.log(&format!(
                "Ctrl-C will quit without writing partial results: {e}"
            ));
            CancelToken::default()
        }
    }
}

/// Prints the result table to stdout, or to stderr where one of `outputs` is `-` (stdout then
/// carries that output alone, for a pipe).
fn print_table<'a>(table: &str, outputs: impl IntoIterator<Item = &'a PathBuf>) {
    if outputs.into_iter().any(|p| crate::files::is_stdout(p)) {
        eprintln!("{table}");
    } else {
        println!("{table}");
    }
}

/// The exit code a finished run earns (see [`exit`]).
fn run_exit_code(report: &Report, output_errors: &[String]) -> u8 {
    if report.incomplete {
        exit::INTERRUPTED
    } else if !output_errors.is_empty() {
        exit::OUTPUT_FAILED
    } else if report.rows.iter().any(crate::report::Row::failed) {
        exit::ENGINES_FAILED
    } else {
        exit::OK
    }
}

/// Runs `exp` with a progress bar; prints the table; writes the experiment to `save_as` only
/// when the run succeeded, so a failed run never replaces a good experiment file.
fn run_experiment(
    exp: &Experiment,
    experiment_file: Option<&Path>,
    save_as: Option<&Path>,
) -> Result<u8> {
    let mut inputs: Vec<(&Path, &str)> = vec![];
    inputs.extend(experiment_file.map(|f| (f, "the experiment file")));
    pipeline::check_outputs(exp, &inputs, save_as.as_slice())?;
    let sink = CliSink::new();
    let cancel = interrupt_token(&sink);
    let out = pipeline::run(exp, &sink, &cancel)
        .with_context(|| format!("running `{}`", exp.model.display()))?;
    sink.finish();
    print_table(
        &out.report.to_terminal_markdown(),
        exp.output.report_files(),
    );
    let mut code = run_exit_code(&out.report, &out.output_errors);
    for e in &out.output_errors {
        eprintln!("error: {e}");
    }
    if let Some(p) = save_as {
        if matches!(code, exit::OK | exit::OUTPUT_FAILED) {
            match exp.save(p) {
                Ok(()) => eprintln!("saved the experiment to {}", p.display()),
                Err(e) => {
                    eprintln!("error: {e}");
                    code = code.max(exit::OUTPUT_FAILED);
                }
            }
        } else {
            eprintln!(
                "not saving the experiment to {}: the run did not succeed (exit code {code})",
                p.display()
            );
        }
    }
    match code {
        exit::ENGINES_FAILED => {
            eprintln!("error: some engines failed or output NaN/Inf; see their rows")
        }
        exit::INTERRUPTED if out.report.finished_rows() == 0 => {
            eprintln!(
                "interrupted before any row finished: existing outputs were left as they were"
            )
        }
        exit::INTERRUPTED => eprintln!("interrupted: the report holds the finished rows"),
        _ => {}
    }
    Ok(code)
}

/// The exit code for an error that ended a command early.
fn error_code(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if let Some(p) = cause.downcast_ref::<pipeline::PipelineError>() {
            return match p {
                pipeline::PipelineError::Cancelled => exit::INTERRUPTED,
                _ => exit::BAD_INPUT,
            };
        }
        if cause.downcast_ref::<crate::files::OutputError>().is_some()
            || matches!(
                cause.downcast_ref::<crate::experiment::ExperimentError>(),
                Some(crate::experiment::ExperimentError::Write { .. })
            )
        {
            return exit::OUTPUT_FAILED;
        }
    }
    exit::BAD_INPUT
}

fn inspect(
    path: &PathBuf,
    json: bool,
    backend: Option<BackendKind>,
    size: Option<[usize; 2]>,
) -> Result<u8> {
    let model = Model::load(path)?;
    let info = &model.info;
    let coverage = match backend {
        Some(BackendKind::Cuda) => Some(crate::backend::cuda::coverage_all(&model, size)),
        _ => None,
    };
    let gaps = coverage
        .as_ref()
        .is_some_and(|c| c.iter().any(|(_, r)| !matches!(r, Ok(v) if v.is_empty())));
    let code = if gaps { exit::ENGINES_FAILED } else { exit::OK };
    if json {
        let mut v = serde_json::to_value(info)?;
        if let (Some(c), Some(obj)) = (&coverage, v.as_object_mut()) {
            let per: serde_json::Map<String, serde_json::Value> = c
                .iter()
                .map(|(p, r)| {
                    let val = match r {
                        Ok(list) => serde_json::json!(list
                            .iter()
                            .map(|u| serde_json::json!({"node": u.node, "op": u.op, "why": u.why}))
                            .collect::<Vec<_>>()),
                        Err(e) => serde_json::json!({ "error": e }),
                    };
                    (p.name().to_string(), val)
                })
                .collect();
            obj.insert("cuda_unsupported".into(), serde_json::Value::Object(per));
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(code);
    }
    let shape = |s: &[Option<i64>]| {
        s.iter()
            .map(|d| d.map(|v| v.to_string()).unwrap_or_else(|| "?".into()))
            .collect::<Vec<_>>()
            .join("x")
    };
    println!("model    {}", info.file.display());
    println!(
        "opset    {}   producer {}",
        info.opset,
        if info.producer.is_empty() {
            "-"
        } else {
            &info.producer
        }
    );
    for i in &info.inputs {
        println!(
            "input    {} {} {} (layout {:?})",
            i.name,
            shape(&i.shape),
            i.dtype,
            info.layout
        );
    }
    for o in &info.outputs {
        println!("output   {} {} {}", o.name, shape(&o.shape), o.dtype);
    }
    println!(
        "task     {}",
        info.task
            .map(|t| format!("{t:?}").to_lowercase())
            .unwrap_or_else(|| "unknown (output is neither [N, C] nor [N, C, H, W])".into())
    );
    println!(
        "params   {} ({:.2} MiB)",
        info.params,
        info.param_bytes as f64 / 1048576.0
    );
    println!(
        "nodes    {} ({} BatchNormalization folded into Conv)",
        info.nodes, info.batch_norms_folded
    );
    match &info.normalization {
        Some(n) => println!(
            "input    normalised as (x/255 - mean) / std, mean {:?}, std {:?} (metadata {})",
            n.mean, n.std, n.keys
        ),
        None => println!(
            "input    no normalisation in the metadata: runs assume ImageNet mean/std unless --mean/--std, --scale or --preset says otherwise"
        ),
    }
    if info.prequantized {
        println!(
            "note     the model already holds Q/DQ pairs: its quantized row runs them with the model's own scales (no calibration); FP32/FP16 run the float model they carry (weights dequantized, activation Q/DQ removed)"
        );
        for r in &info.qdq_rewrites {
            println!("rewrote  {r}");
        }
        for k in &info.qdq_kept {
            println!("kept     {k}");
        }
    }
    if info.fp16_initializers > 0 {
        println!(
            "note     stored in FP16 ({} tensors): upcast to FP32 at load, exactly; the FP32 rows compute from the FP16 weights",
            info.fp16_initializers
        );
    }
    println!("ops:");
    for (op, n) in &info.op_census {
        println!("  {op:<24} {n}");
    }
    if !info.unsupported.is_empty() {
        println!("unsupported:");
        for u in &info.unsupported {
            println!("  {} (node `{}`)", u.op, u.node);
        }
    }
    for (p, r) in coverage.iter().flatten() {
        match r {
            Ok(list) if list.is_empty() => {
                println!("cuda {:<5} every node lowers", p.name())
            }
            Ok(list) => {
                println!(
                    "cuda {:<5} {} node(s) it cannot take:",
                    p.name(),
                    list.len()
                );
                for u in list {
                    println!("  {}", u.why);
                }
            }
            Err(e) => println!("cuda {:<5} cannot plan: {e}", p.name()),
        }
    }
    Ok(code)
}

fn sensitivity(
    e: &Experiment,
    opts: &crate::sensitivity::SensitivityOptions,
) -> Result<(
    crate::sensitivity::SensitivityReport,
    crate::quant::QdqModel,
)> {
    let sink = CliSink::new();
    let cancel = interrupt_token(&sink);
    let out = crate::sensitivity::run(e, opts, &sink, &cancel)
        .with_context(|| format!("sensitivity of `{}`", e.model.display()))?;
    sink.finish();
    if let Some(a) = &out.0.amp {
        eprintln!(
            "mixed precision: {} (FP32 {:.2} %)",
            a.summary(),
            out.0.fp32_metric * 100.0
        );
    }
    Ok(out)
}

/// The default experiment the app opens with: the bundled segmentation sample.
pub fn default_experiment_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sample_models/fashion_scenes_deeplab.ron")
}

/// Parses the command line and runs it; returns the process's exit code (see [`exit`]). A panic
/// anywhere below becomes exit code 1 with its message, never an abort with a backtrace.
pub fn main() -> std::process::ExitCode {
    crate::guard::install_hook();
    let cli = Cli::parse();
    let code = match crate::guard::catch("running the command", || dispatch(cli)) {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => {
            eprintln!("error: {e:#}");
            error_code(&e)
        }
        Err(panic) => {
            eprintln!("error: {panic}");
            exit::INTERNAL
        }
    };
    std::process::ExitCode::from(code)
}

fn dispatch(cli: Cli) -> Result<u8> {
    match cli.command {
        None => crate::ui::run(Some(default_experiment_path())).map(|_| exit::OK),
        Some(Command::Gui { path }) => {
            crate::ui::run(path.or_else(|| Some(default_experiment_path()))).map(|_| exit::OK)
        }
        Some(Command::Inspect {
            model,
            json,
            backend,
            size,
        }) => inspect(&model, json, backend, size),
        Some(Command::Run { experiment, out }) => {
            let mut e = Experiment::load(&experiment)?;
            out.apply(&mut e);
            run_experiment(&e, Some(&experiment), None)
        }
        Some(Command::Eval(args)) => {
            args.check_preprocess_flags()?;
            let mut e = args.to_experiment();
            let save_as = args.save_experiment.as_deref();
            if let Some(budget) = args.budget() {
                // Refuse bad outputs before the (long) sensitivity pass, not after it.
                pipeline::check_outputs(&e, &[], save_as.as_slice())?;
                let opts = crate::sensitivity::SensitivityOptions {
                    budget: Some(budget),
                    ..Default::default()
                };
                let (report, _) = sensitivity(&e, &opts)?;
                e.mixed_precision = Some(report.mixed_precision());
            }
            run_experiment(&e, None, save_as)
        }
        Some(Command::Sensitivity(args)) => {
            args.eval.check_preprocess_flags()?;
            let mut e = args.eval.to_experiment();
            let out = &args.eval.out;
            let save_as = args.eval.save_experiment.as_deref();
            let report_files: Vec<&Path> = [&out.report, &out.md]
                .into_iter()
                .flatten()
                .map(PathBuf::as_path)
                .chain(save_as)
                .collect();
            // The sensitivity report goes to --report/--md, not the run's outputs.
            let mut checked = e.clone();
            checked.output = Default::default();
            pipeline::check_outputs(&checked, &[], &report_files)?;
            let opts = crate::sensitivity::SensitivityOptions {
                probe_images: args.probe_images,
                candidates: args.candidates,
                probe_eval_images: args.probe_eval_images,
                budget: args.eval.budget(),
                method: args.method,
            };
            let (report, qdq) = sensitivity(&e, &opts)?;
            print_table(
                &report.to_markdown(),
                [&out.report, &out.md].into_iter().flatten(),
            );
            let mut code = exit::OK;
            let mut put = |r: Result<(), String>| {
                if let Err(e) = r {
                    eprintln!("error: {e}");
                    code = exit::OUTPUT_FAILED;
                }
            };
            let json = serde_json::to_string_pretty(&report).unwrap_or_default();
            for (path, text) in [(&out.report, json), (&out.md, report.to_markdown())] {
                if let Some(p) = path {
                    put(crate::files::write(p, text).map_err(|e| e.to_string()));
                }
            }
            if report.amp.is_some() {
                e.mixed_precision = Some(report.mixed_precision());
                if let Some(dir) = out.export.as_ref().or(out.export_qdq.as_ref()) {
                    let model = Model::load(&e.model)?;
                    let m = e.mixed_precision.as_ref().and_then(|m| m.method);
                    put(pipeline::export_qdq(dir, &model.path, &qdq, m, "_mixed").map(|_| ()));
                }
            }
            if let Some(p) = save_as {
                put(e.save(p).map_err(|e| e.to_string()));
            }
            Ok(code)
        }
    }
}
