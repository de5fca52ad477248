//! The FP16 overflow guard's measuring pass: every float tensor's peak over the first
//! calibration images (the same images GPTQ and bias correction use), then the rule of
//! [`crate::fp16_guard`]. One list per model the run builds FP16 computation from: the model
//! as loaded for the FP16 (and FP8) engines, the INT8-prepared one for the INT8 engines' float
//! layers and the mixed export.

use super::*;
use crate::fp16_guard::{self, KeptFp32, Peaks};

/// The peaks of every float tensor of `model` at input size `hw` over `inputs` (one
/// preprocessed image each), on the CPU reference interpreter.
pub fn tensor_peaks(
    model: &Model,
    hw: [usize; 2],
    inputs: impl IntoIterator<Item = Result<Vec<f32>, String>>,
) -> Result<Peaks, String> {
    let names = fp16_guard::measured_tensors(&model.proto);
    let probe = backend::reference::open_model(model, hw, &names).map_err(|e| e.to_string())?;
    let mut peaks = Peaks::default();
    for input in inputs {
        let (_, acts) = probe.run(&input?).map_err(|e| e.to_string())?;
        for (n, a) in names.iter().zip(&acts) {
            peaks.add(n, a.as_ref());
        }
        peaks.images += 1;
    }
    Ok(peaks)
}

/// What a guard list is for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum GuardFor {
    /// The FP16 engine and export (and the FP8 engine's float layers).
    Float,
    /// The float layers of the INT8 engines and the mixed export.
    Int8,
}

impl Rows<'_> {
    /// The overflow guard's list for `p`'s model, measured once per purpose and noted in the
    /// report when it keeps anything. Empty, with a log line saying why, where there are no
    /// calibration images or the pass fails: the engines then run every layer in FP16, and a
    /// non-finite output still voids its row.
    pub(super) fn fp16_guard(&mut self, p: &Prepared, purpose: GuardFor) -> Vec<KeptFp32> {
        fn slot(r: &mut Report, purpose: GuardFor) -> &mut Option<Vec<KeptFp32>> {
            match purpose {
                GuardFor::Float => &mut r.fp16_guard.float,
                GuardFor::Int8 => &mut r.fp16_guard.int8,
            }
        }
        if let Some(g) = slot(&mut self.report, purpose) {
            return g.clone();
        }
        let sink = self.ctx.sink;
        let images = &p.calib_images[..p.calib_images.len().min(self.exp.correction_images)];
        let kept = if images.is_empty() {
            sink.log(
                "FP16 overflow guard off: no calibration images to measure ranges on (--calib); \
                 every layer computes in FP16",
            );
            vec![]
        } else {
            let t = Instant::now();
            let inputs = images.iter().enumerate().map(|(i, f)| {
                sink.progress("measuring ranges for FP16", i, images.len());
                data::open_rgb(f)
                    .map(|img| p.input_of(&img))
                    .map_err(|e| format!("{}: {e}", f.display()))
            });
            match tensor_peaks(&p.model, p.hw, inputs) {
                Ok(peaks) => {
                    let shapes = crate::model::infer_shapes(&p.model, p.hw).ok();
                    let kept = fp16_guard::keep_fp32(&p.model.proto, &peaks, shapes.as_ref());
                    sink.log(&format!(
                        "FP16 overflow guard: ranges of {} tensors on {} images in {:.0} ms; {} layer{} kept in FP32",
                        peaks.abs_max.len(),
                        peaks.images,
                        t.elapsed().as_secs_f64() * 1e3,
                        kept.len(),
                        if kept.len() == 1 { "" } else { "s" }
                    ));
                    let what = match purpose {
                        GuardFor::Float => "the FP16 engine",
                        GuardFor::Int8 => "the INT8 engines' float layers and the mixed export",
                    };
                    if let Some(note) = fp16_guard::describe(&kept, peaks.images, what) {
                        self.report.notes.push(note);
                    }
                    kept
                }
                Err(e) => {
                    sink.log(&format!(
                        "FP16 overflow guard off: measuring ranges failed ({e}); every layer computes in FP16"
                    ));
                    vec![]
                }
            }
        };
        *slot(&mut self.report, purpose) = Some(kept.clone());
        kept
    }

    /// The guard for a quantized engine's float layers: measured only where the backend runs
    /// them in FP16 (CUDA); the CPU engines compute them in FP32.
    pub(super) fn quantized_guard(&mut self, p: &Prepared, purpose: GuardFor) -> Vec<KeptFp32> {
        if self.exp.backend == backend::BackendKind::Cuda {
            self.fp16_guard(p, purpose)
        } else {
            vec![]
        }
    }
}
