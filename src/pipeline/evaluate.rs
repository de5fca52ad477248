//! Evaluating one engine on the evaluation images: the task metric, agreement and SQNR
//! against the FP32 reference, and the NaN/Inf count that voids them.

use super::*;

/// The result of evaluating one engine.
pub struct Evaluated {
    pub row: Row,
    /// Segmentation: the argmax mask of each image at mask resolution (empty for classifiers).
    pub predictions: Vec<Vec<u8>>,
    /// Classification: the predicted class index of each image, in full (1000-class models
    /// too), for agreement with FP32.
    pub classes: Vec<usize>,
    /// Classification: each image's top-3 with probabilities and the true class's probability
    /// (never the whole score vector), for the gallery of flipped images.
    pub tops: Vec<ImageTop>,
}

impl Evaluated {
    /// A row with no predictions (the engine failed before or while evaluating).
    pub(super) fn failed(row: Row) -> Evaluated {
        Evaluated {
            row,
            predictions: vec![],
            classes: vec![],
            tops: vec![],
        }
    }
}

/// FP32 reference kept while the other engines run.
#[derive(Default)]
pub struct Reference {
    pub predictions: Vec<Vec<u8>>,
    pub classes: Vec<usize>,
    pub outputs: Vec<Vec<f32>>,
    /// The FP32 engine output NaN/Inf: nothing can be compared with it.
    pub non_finite: bool,
}

#[allow(clippy::too_many_arguments)]
pub fn evaluate(
    engine: &mut dyn Engine,
    samples: &[Sample],
    task: Task,
    classes: usize,
    reference: Option<&Reference>,
    sink: &dyn Sink,
    stage: &str,
    cancel: &CancelToken,
    keep_outputs: &mut Option<Vec<Vec<f32>>>,
) -> Result<Evaluated, String> {
    let mut row = Row::default();
    let mut class = ClassTally::default();
    let mut seg = SegTally::new(classes.max(1));
    let mut sqnr = Sqnr::default();
    let mut sqnr_images = 0;
    let mut agree = (0u64, 0u64);
    let mut predictions = vec![];
    let mut classes_pred = vec![];
    let mut labels = vec![];
    let mut tops = vec![];
    let mut kept_bytes = 0usize;
    let mut non_finite = crate::report::NonFinite {
        of_images: samples.len(),
        ..Default::default()
    };
    for (i, s) in samples.iter().enumerate() {
        if cancel.is_cancelled() {
            return Err(crate::report::CANCELLED.into());
        }
        sink.progress(stage, i, samples.len());
        let out = engine.run(&s.input).map_err(|e| e.to_string())?;
        let bad = out.data.iter().filter(|v| !v.is_finite()).count() as u64;
        non_finite.values += bad;
        non_finite.images += (bad > 0) as usize;
        let pred: Vec<u8> = match task {
            Task::Classification => {
                let Label::Class(label) = s.label else {
                    return Err("classification needs class labels".into());
                };
                let p = class.add(&out.data, label);
                row.per_image.push((p == label) as u8 as f64);
                if let Some(&rp) = reference.and_then(|r| r.classes.get(i)) {
                    agree.0 += (rp == p) as u64;
                    agree.1 += 1;
                }
                classes_pred.push(p);
                labels.push(label);
                tops.push(ImageTop::from_scores(&out.data, label));
                vec![]
            }
            Task::Segmentation => {
                if out.shape.len() != 4 {
                    return Err(format!(
                        "segmentation expects an [N, C, H, W] output, got {:?}",
                        out.shape
                    ));
                }
                let (c, oh, ow) = (out.shape[1], out.shape[2], out.shape[3]);
                let am = eval::argmax_chw(&out.data, c, oh * ow);
                let Some((gt, mhw)) = &s.gt else {
                    return Err("segmentation needs masks".into());
                };
                let map = s.geometry.pixel_map(*mhw, [oh, ow]);
                let at_mask: Vec<u8> = map
                    .iter()
                    .map(|m| m.map(|j| am[j as usize]).unwrap_or(255))
                    .collect();
                let gt_cropped: Vec<u8> = gt
                    .iter()
                    .zip(&map)
                    .map(|(&g, m)| if m.is_some() { g } else { 255 })
                    .collect();
                row.per_image.push(seg.add(&at_mask, &gt_cropped));
                at_mask
            }
        };
        if let Some(r) = reference {
            // Classifiers counted their agreement above; masks count pixels, ignoring 255.
            if let Some(rp) = r.predictions.get(i).filter(|_| task == Task::Segmentation) {
                agree.0 += pred
                    .iter()
                    .zip(rp)
                    .filter(|(a, b)| a == b && **a != 255)
                    .count() as u64;
                agree.1 += rp.iter().filter(|&&v| v != 255).count() as u64;
            }
            if let Some(ro) = r.outputs.get(i) {
                sqnr.add(ro, &out.data);
                sqnr_images += 1;
            }
        }
        if let Some(k) = keep_outputs.as_mut()
            && kept_bytes + out.data.len() * 4 <= SQNR_BUDGET_BYTES
        {
            kept_bytes += out.data.len() * 4;
            k.push(out.data.clone());
        }
        predictions.push(pred);
    }
    match task {
        Task::Classification => {
            row.top1 = Some(class.top1());
            row.top5 = Some(class.top5());
            row.per_class_accuracy = Some(class.per_class_accuracy());
            row.confusion = Some(Confusion::from_pairs(
                classes,
                labels.iter().copied().zip(classes_pred.iter().copied()),
            ));
        }
        Task::Segmentation => {
            row.miou = Some(seg.miou());
            row.per_class_iou = Some(seg.per_class_iou());
            row.pixel_acc = Some(seg.pixel_accuracy());
        }
    }
    if reference.is_some() {
        row.agreement = (agree.1 > 0).then(|| agree.0 as f64 / agree.1 as f64);
        row.sqnr_db = sqnr
            .db()
            .or((sqnr_images > 0).then_some(f64::INFINITY))
            .filter(|v| v.is_finite());
        row.sqnr_images = Some(sqnr_images);
    }
    non_finite.in_reference_only =
        non_finite.values == 0 && reference.is_some_and(|r| r.non_finite);
    if non_finite.values > 0 || non_finite.in_reference_only {
        // A metric computed from NaN/Inf (an argmax over NaN picks class 0) reads as a result
        // and is not one: every metric of the row is left empty and the row says why.
        void_metrics(&mut row);
        row.non_finite = Some(non_finite);
        tops.clear();
    }
    Ok(Evaluated {
        row,
        predictions,
        classes: classes_pred,
        tops,
    })
}

/// Empties every accuracy metric of `row`, for outputs that held NaN/Inf.
pub(super) fn void_metrics(row: &mut Row) {
    row.top1 = None;
    row.top5 = None;
    row.per_class_accuracy = None;
    row.confusion = None;
    row.miou = None;
    row.per_class_iou = None;
    row.pixel_acc = None;
    row.agreement = None;
    row.sqnr_db = None;
    row.per_image.clear();
}
