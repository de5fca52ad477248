//! Exports from the window: the report (JSON, Markdown, CSV), the view or mask composite as
//! PNG, the Q/DQ models through the I/O thread, and the TensorRT lines for what was written.

use std::path::{Path, PathBuf};

use super::Workbench;
use super::commands::*;
use crate::report::Report;
use crate::worker::IoRequest;

impl Workbench {
    /// The file name an export is offered under.
    pub(super) fn export_name(&self, kind: ExportKind) -> String {
        let stem = self.experiment_stem();
        match kind {
            ExportKind::ViewPng => format!("{stem}_{}.png", self.tab.name()),
            ExportKind::MaskPng => format!("{stem}_masks_{}.png", self.masks.image),
            ExportKind::Qdq => format!("{stem}_exports"),
            ExportKind::ConfusionCsv => format!("{stem}_confusion.csv"),
            ExportKind::GalleryCsv => format!("{stem}_gallery.csv"),
            k => format!("{stem}_report.{}", k.extension()),
        }
    }

    pub(super) fn export_to(&mut self, kind: ExportKind, path: &Path) {
        let result: Result<(), String> = match kind {
            ExportKind::Json | ExportKind::Markdown | ExportKind::Csv => {
                let report = match &self.results.report {
                    Some(r) => r.clone(),
                    None if !self.results.rows.is_empty() => Report {
                        experiment: self.exp.name.clone(),
                        rows: self.results.rows.clone(),
                        ..Default::default()
                    },
                    None => {
                        self.log_error("nothing to export yet: run the experiment first");
                        return;
                    }
                };
                let (j, m, c) = match kind {
                    ExportKind::Json => (Some(path), None, None),
                    ExportKind::Markdown => (None, Some(path), None),
                    _ => (None, None, Some(path)),
                };
                match report.write(j, m, c).into_iter().next() {
                    Some(e) => Err(e.to_string()),
                    None => Ok(()),
                }
            }
            ExportKind::ViewPng => self.screenshot(path),
            ExportKind::MaskPng => super::results::masks::export_png(self, path),
            ExportKind::Qdq => self.export_qdq(path),
            ExportKind::ConfusionCsv | ExportKind::GalleryCsv => self.export_classes(kind, path),
        };
        match result {
            Ok(()) if matches!(kind, ExportKind::ViewPng | ExportKind::Qdq) => {
                self.log_info(format!("export requested: {}", path.display()))
            }
            Ok(()) => self.notify(format!("Exported {}", path.display())),
            Err(e) => {
                let msg = format!("export to {}: {e}", path.display());
                self.log_error(msg.clone());
                self.banner = Some((msg, true));
            }
        }
    }

    /// Writes the Classes tab's confusion matrices or gallery as CSV.
    fn export_classes(&self, kind: ExportKind, path: &Path) -> Result<(), String> {
        let report = self
            .results
            .report
            .as_ref()
            .filter(|r| r.rows.iter().any(|row| row.confusion.is_some()))
            .ok_or("no confusion matrix in the results: run a classification experiment first")?;
        let text = if kind == ExportKind::ConfusionCsv {
            report.confusion_csv()
        } else {
            report.gallery_csv()
        };
        crate::files::write(path, text).map_err(|e| e.to_string())
    }

    /// Says where files went: in the log and in the banner above the results.
    pub(super) fn notify(&mut self, text: String) {
        self.log_info(text.clone());
        self.banner = Some((text, false));
    }

    /// Hands the finished run's Q/DQ models to the I/O thread, which writes them into `dir`.
    pub(super) fn export_qdq(&mut self, dir: &Path) -> Result<(), String> {
        let qdq = self
            .results
            .artifacts
            .as_ref()
            .map(|a| a.qdq.clone())
            .filter(|q| !q.is_empty())
            .ok_or("no INT8 engine in the results: run an experiment with INT8 first")?;
        let model = self
            .results
            .report
            .as_ref()
            .map(|r| r.model.file.clone())
            .unwrap_or_else(|| self.exp.model.clone());
        let report = self.results.report.as_ref();
        let check = crate::worker::ExportCheck {
            hw: report.map(|r| r.input_hw).unwrap_or([224, 224]),
            image: report.and_then(|r| r.evaluation.image_files.first().cloned()),
            preprocess: report
                .map(|r| r.preprocess.clone())
                .unwrap_or_else(|| self.exp.preprocess.clone()),
            fp16_guard: report.map(|r| r.fp16_guard.clone()).unwrap_or_default(),
        };
        let w = self.worker.as_mut().ok_or("no worker thread")?;
        w.request(IoRequest::ExportQdq {
            dir: dir.to_path_buf(),
            model,
            qdq,
            check,
        })
        .map(|_| ())
        .map_err(|e| e.to_string())
    }

    pub(super) fn screenshot(&mut self, path: &Path) -> Result<(), String> {
        let Some(ctx) = self.ctx.clone() else {
            return Err("no window to take a screenshot of".into());
        };
        let rect = self.central_rect;
        let ppp = ctx.pixels_per_point();
        let path = path.to_path_buf();
        let tx = self.notes_tx.clone();
        ctx.request_screenshot(move |img| {
            let [iw, ih] = img.size;
            let x0 = ((rect.min.x * ppp).max(0.0) as usize).min(iw);
            let y0 = ((rect.min.y * ppp).max(0.0) as usize).min(ih);
            let x1 = ((rect.max.x * ppp).max(0.0) as usize).clamp(x0, iw);
            let y1 = ((rect.max.y * ppp).max(0.0) as usize).clamp(y0, ih);
            let region = if x1 > x0 && y1 > y0 {
                img.region_by_pixels([x0, y0], [x1 - x0, y1 - y0])
            } else {
                (*img).clone()
            };
            let [w, h] = region.size;
            let bytes: Vec<u8> = region.pixels.iter().flat_map(|c| c.to_array()).collect();
            let note = match image::RgbaImage::from_raw(w as u32, h as u32, bytes) {
                Some(buf) => crate::files::write_png(&path, &buf.into())
                    .map(|_| format!("saved screenshot {}", path.display()))
                    .map_err(|e| format!("screenshot: {e}")),
                None => Err("screenshot: unexpected image size".into()),
            };
            let _ = tx.try_send(note);
        });
        ctx.request_repaint();
        Ok(())
    }

    /// The `trtexec` line for each exported file: strongly typed for the ONNX models, the
    /// TensorRT 8.6–10 implicit-INT8 line for a calibration cache.
    pub(super) fn trt_commands_for(&self, files: &[PathBuf]) -> Vec<(String, String)> {
        use crate::export::trtexec;
        let Some(info) = &self.model.info else {
            return vec![];
        };
        let [h, w] = self.input_hw();
        let input = trtexec::InputSpec::new(info, &[1, info.input_chw[0].max(1), h, w]);
        let fp32_for_cache = files
            .iter()
            .find(|f| f.to_string_lossy().ends_with("_fp32_for_cache.onnx"))
            .cloned()
            .unwrap_or_else(|| self.exp.model.clone());
        files
            .iter()
            .filter_map(|f| {
                let name = f.file_name()?.to_string_lossy().into_owned();
                let cmd = match f.extension()?.to_str()? {
                    "onnx" if !name.ends_with("_fp32_for_cache.onnx") => {
                        trtexec::strongly_typed(f, &input)
                    }
                    "cache" => trtexec::implicit_int8(&fp32_for_cache, f, &input),
                    _ => return None,
                };
                Some((name, cmd))
            })
            .collect()
    }
}
