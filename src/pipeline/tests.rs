//! Unit tests of the pipeline's evaluation and agreement arithmetic.

use super::*;
use crate::backend::{BackendError, EngineInfo, Output};

/// Answers image k with a one-hot logit at `classes[k]`.
struct OneHot {
    info: EngineInfo,
    classes: Vec<usize>,
    width: usize,
    next: usize,
}

impl Engine for OneHot {
    fn info(&self) -> &EngineInfo {
        &self.info
    }
    fn batch(&self) -> usize {
        1
    }
    fn run(&mut self, _input: &[f32]) -> Result<Output, BackendError> {
        let mut data = vec![0.0; self.width];
        data[self.classes[self.next]] = 1.0;
        self.next += 1;
        Ok(Output {
            shape: vec![1, self.width],
            data,
        })
    }
}

struct Quiet;
impl Sink for Quiet {
    fn progress(&self, _: &str, _: usize, _: usize) {}
    fn log(&self, _: &str) {}
}

fn sample(label: usize) -> Sample {
    Sample {
        input: vec![0.0],
        label: Label::Class(label),
        gt: None,
        geometry: Geometry {
            orig_hw: [1, 1],
            input_hw: [1, 1],
            resized_hw: [1, 1],
            origin: [0, 0],
        },
    }
}

fn run(classes: &[usize], reference: Option<&Reference>) -> Evaluated {
    let mut e = OneHot {
        info: EngineInfo::default(),
        classes: classes.to_vec(),
        width: 1000,
        next: 0,
    };
    let samples: Vec<Sample> = classes.iter().map(|&c| sample(c)).collect();
    evaluate(
        &mut e,
        &samples,
        Task::Classification,
        1000,
        reference,
        &Quiet,
        "test",
        &CancelToken::default(),
        &mut None,
    )
    .expect("evaluate")
}

/// Agreement of a 1000-class model counts every image, with the full class index (it used
/// to keep `min(class, 255)` in a byte and skip 255, so most ImageNet classes fell out).
#[test]
fn classifier_agreement_counts_every_class_index() {
    let fp32 = run(&[700, 300, 999, 12], None);
    assert_eq!(fp32.classes, [700, 300, 999, 12]);
    let reference = Reference {
        predictions: fp32.predictions,
        classes: fp32.classes,
        outputs: vec![],
        non_finite: false,
    };
    // 300 → 301 and 999 → 998 both sit above 255 and differ; 700 and 12 agree.
    let int8 = run(&[700, 301, 998, 12], Some(&reference));
    assert_eq!(int8.row.agreement, Some(0.5));
    let same = run(&[700, 300, 999, 12], Some(&reference));
    assert_eq!(same.row.agreement, Some(1.0));
}

/// A 1000-class evaluation keeps each image's top-3 and the true class's probability (never
/// the whole score vector) and a sparse confusion matrix: one cell per (true, predicted) pair.
#[test]
fn classifier_keeps_top3_and_a_sparse_confusion_matrix() {
    // The engine answers 700, 301, 998, 12 for images labelled 700, 300, 999, 12.
    let mut e = OneHot {
        info: EngineInfo::default(),
        classes: vec![700, 301, 998, 12],
        width: 1000,
        next: 0,
    };
    let samples: Vec<Sample> = [700, 300, 999, 12].into_iter().map(sample).collect();
    let ev = evaluate(
        &mut e,
        &samples,
        Task::Classification,
        1000,
        None,
        &Quiet,
        "test",
        &CancelToken::default(),
        &mut None,
    )
    .expect("evaluate");
    assert_eq!(ev.tops.len(), 4);
    for (t, (pred, label)) in ev
        .tops
        .iter()
        .zip([(700u32, 700), (301, 300), (998, 999), (12, 12)])
    {
        assert_eq!(t.top.len(), 3, "{t:?}");
        // A one-hot output already is a distribution: its probabilities are its values.
        assert_eq!(t.top[0], (pred, 1.0), "{t:?}");
        assert_eq!(t.true_p, if pred == label { 1.0 } else { 0.0 }, "{t:?}");
    }
    let confusion = ev.row.confusion.expect("confusion");
    assert_eq!(confusion.classes, 1000);
    assert_eq!(
        confusion.cells,
        vec![[12, 12, 1], [300, 301, 1], [700, 700, 1], [999, 998, 1]]
    );
}
