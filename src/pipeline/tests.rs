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
