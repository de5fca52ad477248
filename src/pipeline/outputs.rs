//! Writing what a run produced: the report files and its calibration section, mask overlays
//! and Q/DQ exports.

use super::*;

/// Writes `<model>_int8_<method><suffix>.onnx` and its TensorRT calibration cache into `dir`;
/// returns both paths.
pub fn export_qdq(
    dir: &std::path::Path,
    model_path: &Path,
    qdq: &QdqModel,
    method: Option<Method>,
    suffix: &str,
) -> Result<[PathBuf; 2], String> {
    let stem = model_path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("model");
    let m = method.map(|m| m.name()).unwrap_or("qat");
    let base = format!("{stem}_int8_{m}{suffix}");
    let (onnx, cache) = (
        dir.join(format!("{base}.onnx")),
        dir.join(format!("{base}.cache")),
    );
    let err = |e: crate::files::OutputError| e.to_string();
    crate::files::refuse_inputs([onnx.as_path()], &[(model_path, "the model")]).map_err(err)?;
    qdq.save(&onnx).map_err(err)?;
    qdq.save_calibration_cache(&cache).map_err(err)?;
    Ok([onnx, cache])
}

/// Writes the report files and mask overlays the experiment asks for; returns what failed.
pub(super) fn write_outputs(
    exp: &Experiment,
    report: &Report,
    artifacts: &Artifacts,
    sink: &dyn Sink,
) -> Vec<String> {
    let o = &exp.output;
    let mut failed: Vec<String> = report
        .write(
            o.report_json.as_deref(),
            o.markdown.as_deref(),
            o.csv.as_deref(),
        )
        .into_iter()
        .map(|e| e.to_string())
        .collect();
    type Text = fn(&Report) -> String;
    let classes_csv: [(Option<&Path>, Text); 2] = [
        (o.confusion_csv.as_deref(), Report::confusion_csv),
        (o.gallery_csv.as_deref(), Report::gallery_csv),
    ];
    for (path, text) in classes_csv {
        let Some(path) = path else { continue };
        if report.model.task != Some(Task::Classification) {
            sink.log("--confusion-csv and --gallery-csv apply to classifiers only");
            continue;
        }
        if let Err(e) = crate::files::write(path, text(report)) {
            failed.push(e.to_string());
        }
    }
    if let Some(dir) = &o.masks_dir {
        if report.model.task != Some(Task::Segmentation) {
            sink.log("--save-masks applies to segmentation models only");
        } else {
            match save_masks(dir, report, artifacts, o.mask_count) {
                Ok(n) => sink.log(&format!("wrote {n} mask overlays to {}", dir.display())),
                Err(e) => failed.push(format!("mask overlays in {}: {e}", dir.display())),
            }
        }
    }
    for e in &failed {
        sink.log(&format!("could not write an output: {e}"));
    }
    failed
}

/// Writes overlays for the first `count` images: FP32 and every INT8 row.
pub fn save_masks(
    dir: &std::path::Path,
    report: &Report,
    artifacts: &Artifacts,
    count: usize,
) -> Result<usize, String> {
    let Some(fp32_i) = report
        .rows
        .iter()
        .position(|r| r.precision == Some(Precision::Fp32) && !r.failed())
    else {
        return Err("no FP32 result to compare with".into());
    };
    let mut n = 0;
    for (i, file) in report.evaluation.image_files.iter().enumerate().take(count) {
        let Some(fp32) = artifacts.predictions[fp32_i].get(i) else {
            continue;
        };
        let hw = artifacts.mask_hw[i];
        let img = data::open_rgb(file).map_err(|e| e.to_string())?;
        let img = image::imageops::resize(
            &img,
            hw[1] as u32,
            hw[0] as u32,
            image::imageops::FilterType::Triangle,
        );
        let others: Vec<(String, &[u8])> = report
            .rows
            .iter()
            .enumerate()
            .filter(|(_, r)| r.precision == Some(Precision::Int8) && !r.failed())
            .filter_map(|(k, r)| {
                artifacts.predictions[k]
                    .get(i)
                    .map(|m| (r.label(), m.as_slice()))
            })
            .collect();
        let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("image");
        crate::report::write_mask_overlays(dir, stem, &img, fp32, &others)
            .map_err(|e| e.to_string())?;
        n += 1;
    }
    Ok(n)
}

/// The report's calibration section: images, cache hit, timings and each tensor's histogram
/// with every method's range.
pub(super) fn calib_summary(
    stats: &Stats,
    all: &[Ranges],
    cache_hit: bool,
    pass_ms: f64,
    ranges_ms: f64,
) -> CalibSummary {
    let tensors = stats
        .tensors
        .iter()
        .map(|(name, h)| {
            let (bin_width, counts) = h.downsampled(256);
            TensorRanges {
                tensor: name.clone(),
                bin_width,
                counts,
                amax: all
                    .iter()
                    .filter_map(|r| r.amax.get(name).map(|a| (r.method, *a)))
                    .collect(),
            }
        })
        .collect();
    CalibSummary {
        images: stats.images,
        cache_hit,
        pass_ms,
        ranges_ms,
        tensors,
    }
}
