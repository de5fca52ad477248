//! The Model panel: file, opset, inputs and outputs with shapes, task, parameters and size,
//! op census; unsupported ops in red with their node names.

use super::{PathKind, path_field_ui};
use crate::model::{Task, TensorInfo};
use crate::ui::{Command, Workbench, theme};
use eframe::egui;

fn shape_text(t: &TensorInfo) -> String {
    let dims: Vec<String> = t
        .shape
        .iter()
        .map(|d| d.map(|v| v.to_string()).unwrap_or_else(|| "?".into()))
        .collect();
    format!("{} [{}] {}", t.name, dims.join("×"), t.dtype)
}

/// What the CUDA backend would refuse, found by planning the engine (no GPU needed).
fn cuda_coverage_ui(cov: &crate::backend::cuda::Coverage, ui: &mut egui::Ui) {
    if cov.is_empty() {
        return;
    }
    let gaps: Vec<_> = cov
        .iter()
        .filter(|(_, r)| !matches!(r, Ok(v) if v.is_empty()))
        .collect();
    if gaps.is_empty() {
        ui.label("CUDA backend: every node lowers in FP32, FP16 and INT8")
            .on_hover_text("Planned without a GPU; the build itself still needs one");
        return;
    }
    for (p, r) in gaps {
        match r {
            Ok(list) => {
                ui.colored_label(
                    theme::ERROR,
                    format!("CUDA {}: {} node(s) it cannot take:", p.name(), list.len()),
                )
                .on_hover_text("Found by planning the engine; the CPU backend may still run them");
                for u in list.iter().take(20) {
                    ui.colored_label(theme::ERROR, format!("  {}", u.why));
                }
                if list.len() > 20 {
                    ui.weak(format!("  … and {} more", list.len() - 20));
                }
            }
            Err(e) => {
                ui.colored_label(theme::ERROR, format!("CUDA {}: cannot plan: {e}", p.name()));
            }
        }
    }
}

pub fn model_ui(wb: &mut Workbench, ui: &mut egui::Ui) {
    let current = (!wb.exp.model.as_os_str().is_empty()).then(|| wb.exp.model.clone());
    if let Some(Some(p)) = path_field_ui(
        wb,
        ui,
        "File:",
        current.as_deref(),
        PathKind::Model,
        Some(Command::OpenDialog),
        "An ONNX model: type its path, drop it here, or choose it (Ctrl+O also opens experiments)",
    ) {
        wb.push(Command::Open(p));
    }
    if wb.model.loading.is_some() {
        ui.horizontal(|ui| {
            ui.spinner();
            ui.label("reading the model…");
        });
        return;
    }
    if let Some(err) = &wb.model.error {
        ui.colored_label(theme::ERROR, err)
            .on_hover_text("The model could not be read");
        return;
    }
    let Some(info) = &wb.model.info else {
        ui.weak("Open a model to see its inputs, outputs and operators.");
        return;
    };
    egui::Grid::new("model.grid")
        .num_columns(2)
        .striped(true)
        .show(ui, |ui| {
            ui.label("Opset");
            ui.label(info.opset.to_string())
                .on_hover_text(format!("Produced by {}", info.producer));
            ui.end_row();
            ui.label("Task");
            ui.label(match info.task {
                Some(Task::Classification) => "classification",
                Some(Task::Segmentation) => "segmentation",
                None => "unknown",
            })
            .on_hover_text("Detected from the output shape");
            ui.end_row();
            ui.label("Parameters");
            ui.label(format!(
                "{:.2} M, {:.1} MiB",
                info.params as f64 / 1e6,
                info.param_bytes as f64 / (1024.0 * 1024.0)
            ))
            .on_hover_text(format!(
                "{} parameters, {} bytes",
                info.params, info.param_bytes
            ));
            ui.end_row();
            ui.label("Nodes");
            ui.label(format!(
                "{} ({} BatchNorm folded){}",
                info.nodes,
                info.batch_norms_folded,
                if info.prequantized {
                    ", Q/DQ present"
                } else {
                    ""
                }
            ))
            .on_hover_text("Graph nodes after preparation");
            ui.end_row();
        });
    ui.label("Inputs")
        .on_hover_text("Graph inputs with their shapes");
    for t in &info.inputs {
        ui.monospace(format!("  {}", shape_text(t)))
            .on_hover_text(format!("layout {:?}", info.layout));
    }
    ui.label("Outputs")
        .on_hover_text("Graph outputs with their shapes");
    for t in &info.outputs {
        ui.monospace(format!("  {}", shape_text(t)))
            .on_hover_text("Output tensor");
    }
    if !info.unsupported.is_empty() {
        ui.colored_label(
            theme::ERROR,
            format!("{} unsupported op(s):", info.unsupported.len()),
        )
        .on_hover_text("No backend can run these operators");
        for u in &info.unsupported {
            ui.colored_label(theme::ERROR, format!("  {} (node `{}`)", u.op, u.node))
                .on_hover_text("Unsupported operator and the node using it");
        }
    }
    cuda_coverage_ui(&wb.model.cuda, ui);
    egui::CollapsingHeader::new(format!("Op census ({} op types)", info.op_census.len()))
        .id_salt("model.census")
        .show(ui, |ui| {
            egui::Grid::new("model.census.grid")
                .num_columns(2)
                .striped(true)
                .show(ui, |ui| {
                    let mut ops: Vec<_> = info.op_census.iter().collect();
                    ops.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
                    for (op, n) in ops {
                        let bad = info.unsupported.iter().any(|u| &u.op == op);
                        if bad {
                            ui.colored_label(theme::ERROR, op);
                        } else {
                            ui.label(op);
                        }
                        ui.label(n.to_string());
                        ui.end_row();
                    }
                });
        });
}
