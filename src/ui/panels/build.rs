//! The Build panel: backend (CUDA disabled with the reason when it cannot run here),
//! precisions, TF32 or strict FP32 on the GPU, batch size, timed iterations; Run and Cancel
//! with the progress bar.

use crate::backend::{BackendKind, BuildEffort, Fp32Math, Precision};
use crate::experiment::Experiment;
use crate::ui::{Command, Workbench, chrome::progress_ui};
use eframe::egui;

pub fn build_ui(wb: &mut Workbench, exp: &mut Experiment, ui: &mut egui::Ui) {
    ui.horizontal(|ui| {
        ui.label("Backend:");
        ui.radio_value(&mut exp.backend, BackendKind::Cpu, "CPU")
            .on_hover_text(match wb.backend_status(BackendKind::Cpu) {
                Some(Ok(d)) => d.clone(),
                _ => "this machine's CPU".into(),
            });
        let cuda = wb.backend_status(BackendKind::Cuda).cloned();
        let enabled = matches!(cuda, Some(Ok(_)));
        let r = ui
            .add_enabled(
                enabled,
                egui::RadioButton::new(exp.backend == BackendKind::Cuda, "CUDA"),
            )
            .on_hover_text(match &cuda {
                Some(Ok(d)) => format!("cuDNN + cuBLASLt on {d}"),
                _ => String::new(),
            })
            .on_disabled_hover_text(match &cuda {
                Some(Err(why)) => format!("CUDA cannot run here: {why}"),
                _ => "checking for CUDA…".into(),
            });
        if r.clicked() {
            exp.backend = BackendKind::Cuda;
        }
    });
    // Wrapped: four precisions, two of them "(simulated)", would widen the side panel.
    ui.horizontal_wrapped(|ui| {
        ui.label("Precisions:");
        for p in Precision::ALL {
            let mut on = exp.precisions.contains(&p);
            let simulated =
                matches!(p, Precision::Fp16 | Precision::Fp8) && exp.backend == BackendKind::Cpu;
            let label = match simulated {
                true => format!("{} (simulated)", p.name().to_uppercase()),
                false => p.name().to_uppercase(),
            };
            let tip = match p {
                Precision::Fp32 => "The reference engine",
                Precision::Fp16 if simulated => {
                    "FP16 numerics on CPU: accuracy is real, latency is not an FP16 device's \
                     (weights rounded to f16 once, each layer's output rounded to f16, f32 \
                     accumulation; about FP32's time). Off by default on the CPU"
                }
                Precision::Fp16 => "Half precision on the GPU",
                Precision::Int8 => "Q/DQ INT8 engines, one per calibration method",
                Precision::Fp8 if simulated => {
                    "FP8 E4M3 numerics on CPU: accuracy is real, latency is not an FP8 \
                     device's (each quantized tensor rounded to E4M3 at amax / 448 from max \
                     calibration, weights per channel, the rest FP32). Off by default"
                }
                Precision::Fp8 => {
                    "FP8 E4M3 Q/DQ engine (max calibration, scale amax / 448): Hopper and Ada \
                     GPUs (compute capability 8.9 and newer)"
                }
            };
            if ui.checkbox(&mut on, label).on_hover_text(tip).changed() {
                if on {
                    exp.precisions.push(p);
                    exp.precisions.sort();
                } else {
                    exp.precisions.retain(|q| *q != p);
                }
            }
        }
    });
    egui::Grid::new("build.grid").num_columns(2).show(ui, |ui| {
        ui.label("FP32 on the GPU");
        let mut tf32 = exp.fp32_math == Fp32Math::Tf32;
        ui.add_enabled(
            exp.backend == BackendKind::Cuda,
            egui::Checkbox::new(&mut tf32, "TF32 tensor cores"),
        )
        .on_hover_text(
            "FP32 convolutions and GEMMs on TF32 tensor cores (10-bit mantissa inputs, FP32 \
             sums; compute capability 8.0+), as PyTorch and TensorRT do by default; the row \
             reads `fp32 (tf32)`. Off: strict FP32, slower, what the CPU computes",
        )
        .on_disabled_hover_text("The CPU backend's FP32 is always strict FP32");
        exp.fp32_math = if tf32 {
            Fp32Math::Tf32
        } else {
            Fp32Math::Strict
        };
        ui.end_row();
        let name = ui.label("GPU build effort");
        ui.add_enabled_ui(exp.backend == BackendKind::Cuda, |ui| {
            egui::ComboBox::from_id_salt("build.effort")
                .selected_text(exp.build_effort.name())
                .show_ui(ui, |ui| {
                    for (e, tip) in [
                        (
                            BuildEffort::Fast,
                            "Nothing timed: each conv takes the first implementation a fixed \
                             order offers (cuDNN's heuristic pick where cuDNN runs it). Builds \
                             in seconds; the engine ran 1.1-1.3x slower on an H200",
                        ),
                        (
                            BuildEffort::Default,
                            "Every candidate timed once per conv shape: a conv shaped like one \
                             already timed takes its choice",
                        ),
                        (
                            BuildEffort::Exhaustive,
                            "Every candidate of every conv timed, the choice cache ignored",
                        ),
                    ] {
                        ui.selectable_value(&mut exp.build_effort, e, e.name())
                            .on_hover_text(tip);
                    }
                })
                .response
                .labelled_by(name.id)
                .on_hover_text(
                    "How hard the CUDA builder searches each conv's implementation, as \
                     TensorRT's builder optimization level. Timed choices are cached: a second \
                     build of the same engine (fast or default) sets up only the chosen ones",
                )
                .on_disabled_hover_text("The CPU backend has nothing to search");
        });
        ui.end_row();
        ui.label("INT8 on the GPU");
        ui.add_enabled(
            exp.backend == BackendKind::Cuda,
            egui::Checkbox::new(&mut exp.fp16_regions, "FP16 where faster"),
        )
        .on_hover_text(
            "Precision per region: where a run of the INT8 engine's layers is slower than the \
             same layers in FP16, the builder times an engine with them in FP16 and keeps the \
             faster one (the Layers tab marks them \"fp16 region\"); where INT8 still loses, \
             the whole engine runs in FP16. Off: every quantized layer runs in INT8",
        )
        .on_disabled_hover_text("The CPU backend runs every quantized layer in INT8");
        ui.end_row();
        ui.label("Batch size");
        ui.add(egui::DragValue::new(&mut exp.bench.batch).range(1..=256))
            .on_hover_text(
                "Extra batch size for throughput (batch 1 is always timed). A model exported \
                 for batch 1 only is measured at batch 1, with a note saying so",
            );
        ui.end_row();
        ui.label("Threads");
        ui.horizontal(|ui| {
            let mut all = exp.threads == 0;
            ui.checkbox(&mut all, "all cores").on_hover_text(format!(
                "CPU engines, calibration and layer passes use every core ({})",
                crate::backend::cpu::all_threads()
            ));
            let mut n = match exp.threads {
                0 => crate::backend::cpu::all_threads(),
                n => n,
            };
            ui.add_enabled(!all, egui::DragValue::new(&mut n).range(1..=256))
                .on_hover_text(
                    "Threads for the CPU engines (timings depend on it). An engine that runs faster on one thread keeps one; each row says which",
                );
            exp.threads = if all { 0 } else { n };
        });
        ui.end_row();
        ui.label("CPU engine");
        cpu_engine_ui(wb, exp, ui);
        ui.end_row();
        ui.label("Timed iterations");
        ui.add(egui::DragValue::new(&mut exp.bench.min_runs).range(1..=10_000))
            .on_hover_text("At least this many timed runs per engine");
        ui.end_row();
        ui.label("Warm-up runs");
        ui.add(egui::DragValue::new(&mut exp.bench.warmup_runs).range(0..=1000))
            .on_hover_text("Untimed runs before timing");
        ui.end_row();
        ui.label("Min time");
        ui.add(
            egui::DragValue::new(&mut exp.bench.min_time_ms)
                .range(0.0..=60_000.0)
                .suffix(" ms"),
        )
        .on_hover_text("Keep timing until at least this long has passed");
        ui.end_row();
        ui.label("Until stable");
        ui.checkbox(&mut exp.bench.until_stable, "time until the median is known to ±2 %")
            .on_hover_text(format!(
                "Then keep timing until the median's 95 % interval is within ±2 %, or {:.0} s have passed: for a busy machine",
                exp.bench.max_time_ms / 1e3
            ));
        ui.end_row();
    });
}

/// Run and Cancel, and the run's progress: drawn at the foot of the setup panel, outside its
/// scrolling, so Run is never below the fold.
pub fn run_bar_ui(wb: &mut Workbench, ui: &mut egui::Ui) {
    ui.horizontal(|ui| {
        let running = wb.is_running();
        let blocker = wb.run_blocker();
        if ui
            .add_enabled(blocker.is_none(), egui::Button::new("Run"))
            .on_hover_text("Build and compare the engines (Ctrl+R)")
            .on_disabled_hover_text(blocker.unwrap_or_default())
            .clicked()
        {
            wb.push(Command::Run);
        }
        if ui
            .add_enabled(running, egui::Button::new("Cancel"))
            .on_hover_text("Stop and keep the rows already finished (Esc)")
            .on_disabled_hover_text("Nothing is running")
            .clicked()
        {
            wb.push(Command::Cancel);
        }
    });
    if let Some(run) = &wb.run {
        progress_ui(ui, run, wb.live_rows(), ui.available_width());
    }
}

/// The CPU engine combo: auto, ONNX Runtime (disabled with the reason where its library is not
/// found) or tract. The CPU engine also runs every statistics pass, on either backend.
fn cpu_engine_ui(wb: &Workbench, exp: &mut Experiment, ui: &mut egui::Ui) {
    use crate::backend::cpu::CpuEngineChoice;
    let ort = &wb.ort;
    let label = |c: CpuEngineChoice| match c {
        CpuEngineChoice::Auto => match ort {
            Some(Ok(o)) => format!("auto (ONNX Runtime {})", o.version),
            Some(Err(_)) => "auto (tract: no ONNX Runtime)".to_string(),
            None => "auto".to_string(),
        },
        CpuEngineChoice::Ort => "ONNX Runtime".to_string(),
        CpuEngineChoice::Tract => "tract (built in)".to_string(),
    };
    egui::ComboBox::from_id_salt("cpu_engine")
        .selected_text(label(exp.cpu_engine))
        .show_ui(ui, |ui| {
            for c in CpuEngineChoice::ALL {
                let enabled = c != CpuEngineChoice::Ort || matches!(ort, Some(Ok(_)));
                let r = ui.add_enabled(
                    enabled,
                    egui::Button::selectable(exp.cpu_engine == c, label(c)),
                );
                let r = match c {
                    CpuEngineChoice::Auto => {
                        r.on_hover_text("ONNX Runtime where its library is found, else tract")
                    }
                    CpuEngineChoice::Ort => r
                        .on_hover_text(
                            "ONNX Runtime, the CPU runtime people deploy: 2-7x faster than tract, \
                             and INT8 on its integer kernels where they are exact on this CPU",
                        )
                        .on_disabled_hover_text(match ort {
                            Some(Err(why)) => why.clone(),
                            _ => "looking for ONNX Runtime…".into(),
                        }),
                    CpuEngineChoice::Tract => r.on_hover_text(
                        "tract, compiled into quantscope: runs without any setup, slower",
                    ),
                };
                if r.clicked() {
                    exp.cpu_engine = c;
                }
            }
        })
        .response
        .on_hover_text(
            "Runs the CPU rows and every statistics pass (calibration, GPTQ, bias correction, \
             sensitivity), on either backend. `pip install onnxruntime` enables ONNX Runtime",
        );
}
