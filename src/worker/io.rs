//! The I/O thread's answers: model inspection, folder scans with thumbnails, the
//! preprocessing preview, image decoding, backend checks and file dialogs. Each is short;
//! none touches an engine.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use image::RgbImage;

use super::{Event, ExportCheck, IoRequest, JobId};
use crate::backend::{self, BackendKind};
use crate::data::{self, EvalSet, Preprocess, ResizeMode, Selection};
use crate::model::{Layout, Model, Task};

/// A calibration folder: how many images it holds and the selection takes, plus thumbnails.
#[derive(Debug, Clone)]
pub struct CalibScan {
    pub dir: PathBuf,
    pub total: usize,
    pub selected: usize,
    pub skipped_files: usize,
    pub first: Option<PathBuf>,
    pub thumbs: Vec<(PathBuf, RgbImage)>,
}

/// An evaluation folder: its layout, size and classes.
#[derive(Debug, Clone)]
pub struct EvalScan {
    pub dir: PathBuf,
    pub kind: Task,
    pub count: usize,
    pub classes: Vec<String>,
    pub first: Option<PathBuf>,
}

/// One image as the model sees it: the resized image, and the normalised tensor mapped
/// back to 0..255 per channel for display.
#[derive(Debug, Clone)]
pub struct PreviewImage {
    pub source: PathBuf,
    pub resized: RgbImage,
    pub tensor_view: RgbImage,
    /// Per input channel: min and max of the normalised values.
    pub channel_range: Vec<[f32; 2]>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DialogKind {
    OpenFile,
    PickFolder,
    SaveFile,
}

/// A native file dialog, run on the I/O thread so the UI never waits on it.
#[derive(Debug, Clone)]
pub struct FileDialog {
    pub kind: DialogKind,
    pub title: String,
    /// (name, extensions without dots)
    pub filters: Vec<(String, Vec<String>)>,
    pub directory: Option<PathBuf>,
    pub file_name: Option<String>,
}

/// [`answer`], with a panic turned into the request's own error answer, so the UI never waits
/// for an answer that will not come and the thread lives on.
pub(super) fn answer_guarded(job: JobId, req: IoRequest) -> Event {
    let asked = req.clone();
    crate::guard::catch("answering the request", || answer(job, req))
        .unwrap_or_else(|error| failed(job, asked, error))
}

/// The answer to `req` that says it failed with `error`.
fn failed(job: JobId, req: IoRequest, error: String) -> Event {
    match req {
        IoRequest::Inspect { path } => Event::Inspected {
            job,
            path,
            result: Err(error),
        },
        IoRequest::CudaCoverage { path } => Event::CudaCoverage {
            job,
            path,
            coverage: vec![],
        },
        IoRequest::Diagram { path } => Event::Diagram {
            job,
            path,
            result: Err(error),
        },
        IoRequest::ScanCalib { .. } => Event::CalibScanned {
            job,
            result: Err(error),
        },
        IoRequest::ScanEval { .. } => Event::EvalScanned {
            job,
            result: Err(error),
        },
        IoRequest::Preview { .. } => Event::Preview {
            job,
            result: Err(error),
        },
        IoRequest::Image { path, .. } => Event::Image {
            job,
            path,
            result: Err(error),
        },
        IoRequest::CheckBackends => Event::Backends {
            job,
            status: [BackendKind::Cpu, BackendKind::Cuda]
                .into_iter()
                .map(|k| (k, Err(error.clone())))
                .collect(),
            ort: Err(error.clone()),
        },
        IoRequest::Dialog(_) => Event::Picked {
            job,
            path: None,
            dialog_ms: 0.0,
        },
        IoRequest::ExportQdq { .. } => Event::Exported {
            job,
            result: Err(error),
            checks: vec![],
        },
    }
}

/// The strongly typed FP16 model and the mixed INT8/FP16 model (from the mixed-precision plan's
/// Q/DQ model, else the first method's) next to the Q/DQ exports, each written and checked in
/// ONNX Runtime against the CPU engine as `quantscope eval --export` does (`check`: the input
/// size and the image the check runs on, else a constant input).
fn typed_exports(
    dir: &std::path::Path,
    model_path: &std::path::Path,
    qdq: &[crate::pipeline::QdqArtifact],
    check: &ExportCheck,
) -> Result<Vec<crate::export::ExportedModel>, String> {
    let model = Model::load(model_path).map_err(|e| format!("{e:#}"))?;
    let hw = check.hw;
    let input = match &check.image {
        Some(img) => {
            let img = data::open_rgb(img).map_err(|e| format!("{e:#}"))?;
            check
                .preprocess
                .apply(&img, hw, model.info.input_chw[0], model.info.layout)
        }
        None => vec![0.5; model.input_shape(1, hw).iter().product()],
    };
    let backend = crate::backend::backend(crate::backend::BackendKind::Cpu);
    let guard = &check.fp16_guard;
    let mut out = vec![crate::export::export_fp16(
        dir,
        &model,
        hw,
        backend.as_ref(),
        &input,
        guard.float.as_deref().unwrap_or_default(),
    )?];
    // The mixed model is INT8 where INT8: FP8 Q/DQ models are not its source.
    let int8: Vec<&crate::pipeline::QdqArtifact> = qdq
        .iter()
        .filter(|q| q.model.format == crate::quant::QFormat::Int8)
        .collect();
    let mixed_source = int8
        .iter()
        .find(|q| !q.suffix.is_empty())
        .or_else(|| int8.first());
    if let Some(q) = mixed_source {
        out.push(crate::export::export_mixed(
            dir,
            model_path,
            &model,
            &q.model,
            hw,
            backend.as_ref(),
            &input,
            guard.int8.as_deref().unwrap_or_default(),
        )?);
    }
    Ok(out)
}

/// The drawing of the prepared model's graph (the node names every engine reports), laid out.
fn diagram(path: &Path) -> Result<std::sync::Arc<crate::model::diagram::Diagram>, String> {
    let model = Model::load(path).map_err(|e| format!("{e:#}"))?;
    let mut d = crate::model::diagram::Diagram::of(&model.proto);
    d.lay_out()
        .map_err(|e| format!("{}: {e:#}", path.display()))?;
    Ok(std::sync::Arc::new(d))
}

pub(super) fn answer(job: JobId, req: IoRequest) -> Event {
    match req {
        IoRequest::Inspect { path } => Event::Inspected {
            job,
            result: Model::load(&path)
                .map(|m| Box::new(m.info))
                .map_err(|e| format!("{e:#}")),
            path,
        },
        IoRequest::Diagram { path } => Event::Diagram {
            job,
            result: diagram(&path),
            path,
        },
        IoRequest::CudaCoverage { path } => Event::CudaCoverage {
            job,
            coverage: Model::load(&path)
                .map(|m| crate::backend::cuda::coverage_all(&m, None))
                .unwrap_or_default(),
            path,
        },
        IoRequest::ScanCalib {
            dir,
            select,
            thumbs,
            thumb_px,
        } => Event::CalibScanned {
            job,
            result: scan_calib(&dir, select, thumbs, thumb_px),
        },
        IoRequest::ScanEval { dir, task, labels } => Event::EvalScanned {
            job,
            result: scan_eval(&dir, task, labels.as_ref()),
        },
        IoRequest::Preview {
            image,
            preprocess,
            hw,
            channels,
            layout,
        } => Event::Preview {
            job,
            result: preview(&image, &preprocess, hw, channels, layout),
        },
        IoRequest::Image { path, max_side } => Event::Image {
            job,
            result: data::open_rgb(&path)
                .map(|img| shrink(&img, max_side))
                .map_err(|e| format!("{e:#}")),
            path,
        },
        IoRequest::CheckBackends => Event::Backends {
            job,
            status: [BackendKind::Cpu, BackendKind::Cuda]
                .into_iter()
                .map(|k| (k, backend::backend(k).check()))
                .collect(),
            ort: backend::cpu::onnxruntime::runtime::found(),
        },
        IoRequest::ExportQdq {
            dir,
            model,
            qdq,
            check,
        } => {
            let written = qdq
                .iter()
                .map(|q| match q.model.format {
                    crate::quant::QFormat::Int8 => {
                        crate::pipeline::export_qdq(&dir, &model, &q.model, q.method, q.suffix)
                            .map(Vec::from)
                    }
                    crate::quant::QFormat::Fp8E4M3 => {
                        crate::export::write_fp8(&dir, &model, &q.model).map(|f| vec![f])
                    }
                })
                .collect::<Result<Vec<Vec<PathBuf>>, String>>()
                .map(|v| v.into_iter().flatten().collect::<Vec<PathBuf>>());
            let mut checks = vec![];
            let result = written.and_then(|mut files| {
                for e in typed_exports(&dir, &model, &qdq, &check)? {
                    checks.push(e.summary());
                    files.push(e.file);
                }
                Ok(files)
            });
            Event::Exported {
                job,
                result,
                checks,
            }
        }
        IoRequest::Dialog(d) => {
            let t = Instant::now();
            let path = run_dialog(d);
            Event::Picked {
                job,
                path,
                dialog_ms: t.elapsed().as_secs_f64() * 1e3,
            }
        }
    }
}

fn shrink(img: &RgbImage, max_side: u32) -> RgbImage {
    let (w, h) = img.dimensions();
    let long = w.max(h);
    if long <= max_side || long == 0 {
        return img.clone();
    }
    let s = max_side as f32 / long as f32;
    let (nw, nh) = (
        ((w as f32 * s).round() as u32).max(1),
        ((h as f32 * s).round() as u32).max(1),
    );
    image::imageops::resize(img, nw, nh, image::imageops::FilterType::Triangle)
}

fn scan_calib(
    dir: &Path,
    select: Selection,
    thumbs: usize,
    thumb_px: u32,
) -> Result<CalibScan, String> {
    let (images, skipped_files) = data::list_images(dir).map_err(|e| format!("{e:#}"))?;
    let total = images.len();
    let picked = select.pick(images);
    let thumbs = picked
        .iter()
        .take(thumbs)
        .filter_map(|p| {
            let img = data::open_rgb(p).ok()?;
            Some((
                p.clone(),
                data::resize(&img, [thumb_px as usize; 2], ResizeMode::Crop),
            ))
        })
        .collect();
    Ok(CalibScan {
        dir: dir.into(),
        total,
        selected: picked.len(),
        skipped_files,
        first: picked.first().cloned(),
        thumbs,
    })
}

fn scan_eval(
    dir: &Path,
    task: Option<Task>,
    labels: Option<&(PathBuf, bool)>,
) -> Result<EvalScan, String> {
    let labels = labels.map(|(path, explicit)| crate::data::LabelsFile {
        path,
        explicit: *explicit,
    });
    let set = EvalSet::open_labelled(dir, &HashSet::new(), labels).map_err(|e| format!("{e:#}"))?;
    Ok(EvalScan {
        dir: dir.into(),
        kind: task.unwrap_or(set.kind),
        count: set.items.len(),
        classes: set.classes,
        first: set.items.first().map(|i| i.image.clone()),
    })
}

fn preview(
    path: &Path,
    pre: &Preprocess,
    hw: [usize; 2],
    channels: usize,
    layout: Layout,
) -> Result<PreviewImage, String> {
    let img = data::open_rgb(path).map_err(|e| format!("{e:#}"))?;
    let [h, w] = hw;
    if h == 0 || w == 0 || h * w > 4096 * 4096 {
        return Err(format!("input size {h}x{w} cannot be previewed"));
    }
    let resized = pre.resized(&img, hw);
    let channels = channels.clamp(1, 3);
    let tensor = pre.apply(&img, hw, channels, layout);
    let at = |c: usize, y: usize, x: usize| match layout {
        Layout::Nchw => tensor[c * h * w + y * w + x],
        Layout::Nhwc => tensor[(y * w + x) * channels + c],
    };
    let mut channel_range = vec![[f32::INFINITY, f32::NEG_INFINITY]; channels];
    for c in 0..channels {
        for y in 0..h {
            for x in 0..w {
                let v = at(c, y, x);
                channel_range[c][0] = channel_range[c][0].min(v);
                channel_range[c][1] = channel_range[c][1].max(v);
            }
        }
    }
    let mut tensor_view = RgbImage::new(w as u32, h as u32);
    for (x, y, p) in tensor_view.enumerate_pixels_mut() {
        for k in 0..3 {
            let c = k.min(channels - 1);
            let [lo, hi] = channel_range[c];
            let v = at(c, y as usize, x as usize);
            let t = if hi > lo { (v - lo) / (hi - lo) } else { 0.5 };
            p[k] = (t * 255.0).round().clamp(0.0, 255.0) as u8;
        }
    }
    Ok(PreviewImage {
        source: path.into(),
        resized,
        tensor_view,
        channel_range,
    })
}

fn run_dialog(d: FileDialog) -> Option<PathBuf> {
    let mut dlg = rfd::FileDialog::new().set_title(&d.title);
    for (name, exts) in &d.filters {
        dlg = dlg.add_filter(name, exts);
    }
    if let Some(dir) = &d.directory {
        dlg = dlg.set_directory(dir);
    }
    if let Some(name) = &d.file_name {
        dlg = dlg.set_file_name(name);
    }
    match d.kind {
        DialogKind::OpenFile => dlg.pick_file(),
        DialogKind::PickFolder => dlg.pick_folder(),
        DialogKind::SaveFile => dlg.save_file(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calib::{Method, Ranges};
    use crate::pipeline::QdqArtifact;
    use crate::quant::{self, QFormat};

    /// The window's export writes each INT8 model with its cache, the FP8 model without one
    /// (TensorRT reads FP8 only from Q/DQ), and the FP16 and mixed models; the mixed one comes
    /// from an INT8 model even when the FP8 one is listed first.
    #[test]
    fn window_export_writes_fp8_without_a_cache() {
        let dir = std::env::temp_dir().join(format!("qs-io-export-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("net.onnx");
        let b = crate::model::testing::residual_classifier(4);
        std::fs::write(&path, b.to_bytes(13)).expect("model");
        let model = Model::load(&path).expect("loads");
        let plan = quant::plan(&model, &[]);
        let ranges = Ranges {
            method: Method::Max,
            percentile: 99.99,
            amax: plan.tensors().into_iter().map(|t| (t, 2.0)).collect(),
            bias_correction: Default::default(),
        };
        let art = |format| QdqArtifact {
            method: Some(Method::Max),
            suffix: "",
            model: quant::build_qdq_as(&model, &plan, Some(&ranges), format).expect("qdq"),
        };
        let qdq = vec![art(QFormat::Fp8E4M3), art(QFormat::Int8)];
        let files = match answer(
            1,
            IoRequest::ExportQdq {
                dir: dir.clone(),
                model: path.clone(),
                qdq,
                check: ExportCheck {
                    hw: [16, 16],
                    image: None,
                    preprocess: Default::default(),
                    fp16_guard: Default::default(),
                },
            },
        ) {
            Event::Exported { result, checks, .. } => {
                // The strongly typed models get the CLI's ONNX Runtime check (or say why not).
                assert_eq!(checks.len(), 2, "{checks:?}");
                assert!(
                    checks
                        .iter()
                        .all(|c| c.contains("ORT check") && !c.contains("OUTSIDE")),
                    "{checks:?}"
                );
                result.expect("exported")
            }
            e => panic!("unexpected {e:?}"),
        };
        let names: Vec<String> = files
            .iter()
            .filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        for want in [
            "net_fp8_max.onnx",
            "net_int8_max.onnx",
            "net_int8_max.cache",
            "net_fp16.onnx",
            "net_mixed_int8_fp16_max.onnx",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
        }
        assert!(
            !names
                .iter()
                .any(|n| n.starts_with("net_fp8") && n.ends_with(".cache"))
        );
        // The FP8 file loads back as a pre-quantized FP8 model, which its FP8 row runs.
        let m = Model::load(&dir.join("net_fp8_max.onnx")).expect("an FP8 Q/DQ file loads");
        assert_eq!(
            crate::quant::carried::carried_format(&m),
            Some(crate::quant::QFormat::Fp8E4M3)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
