//! The bundled sample experiments run end to end on the CPU backend with small counts, and
//! their results stay near what was measured (sample_models/README.md): FP32 accuracy and
//! mIoU above a floor, INT8 agreeing with FP32, the JSON report complete.

mod common;

use std::path::Path;

use quantscope::backend::Precision;
use quantscope::calib::StatsCache;
use quantscope::data::Selection;
use quantscope::experiment::Experiment;
use quantscope::pipeline::{self, CancelToken, Sink};
use quantscope::report::Report;

struct Quiet;
impl Sink for Quiet {
    fn progress(&self, _: &str, _: usize, _: usize) {}
    fn log(&self, _: &str) {}
}

fn run_sample(name: &str, eval_count: usize) -> Report {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("sample_models")
        .join(format!("{name}.ron"));
    let mut exp = Experiment::load(&path).expect("sample experiment loads");
    exp.evaluation.count = Some(eval_count);
    exp.calibration.select = Selection::First(64);
    exp.bench.min_runs = 2;
    exp.bench.min_time_ms = 0.0;
    exp.bench.warmup_runs = 1;
    exp.bench.batch = 2;
    let cache = StatsCache {
        dir: common::temp_dir(&format!("cache-{name}")),
    };
    let out = pipeline::run_with_cache(&exp, &cache, &Quiet, &CancelToken::default())
        .expect("sample runs");
    // The JSON report is complete: it round-trips and has every row.
    let json = out.report.to_json();
    let back: Report = serde_json::from_str(&json).expect("report JSON parses");
    assert_eq!(back.rows.len(), 6, "fp32, fp16 and four INT8 methods");
    // Each row's engines (batch 1 and 2) were timed again, taking turns with the others'.
    assert!(
        back.notes
            .iter()
            .any(|n| n.starts_with("Latencies were timed side by side: the 12 engines of 6 rows")),
        "{:?}",
        back.notes
    );
    for r in &back.rows {
        assert!(r.error.is_none(), "{}: {:?}", r.label(), r.error);
        assert!(
            r.latency_batch_ms.is_some_and(|l| l.runs >= 2),
            "{}",
            r.label()
        );
        assert!(
            r.latency_ms.is_some_and(|l| l.median > 0.0)
                && r.memory_bytes.is_some()
                && r.build_ms.is_some()
        );
    }
    back
}

#[test]
fn fashion_classifier_sample() {
    let r = run_sample("fashion_resnet", 200);
    let fp32 = r.fp32().expect("fp32 row");
    // Measured 94.4 % on all 1,000 evaluation images (94.7 % on the full test split).
    assert!(
        fp32.top1.unwrap_or(0.0) >= 0.90,
        "FP32 top-1 {:?}",
        fp32.top1
    );
    let int8: Vec<_> = r
        .rows
        .iter()
        .filter(|x| x.precision == Some(Precision::Int8))
        .collect();
    let best = int8.iter().filter_map(|x| x.agreement).fold(0.0, f64::max);
    assert!(best >= 0.97, "best INT8 agreement with FP32 {best}");
    for x in &int8 {
        // Entropy clips the input at the background value (README): it agrees least.
        assert!(
            x.agreement.unwrap_or(0.0) >= 0.70,
            "{} agreement {:?}",
            x.label(),
            x.agreement
        );
        assert_eq!(x.int8_nodes, Some(22));
    }
}

#[test]
fn fashion_scenes_segmenter_sample() {
    let r = run_sample("fashion_scenes_deeplab", 40);
    let fp32 = r.fp32().expect("fp32 row");
    // Measured 0.807 mIoU on all 240 evaluation scenes.
    assert!(
        fp32.miou.unwrap_or(0.0) >= 0.72,
        "FP32 mIoU {:?}",
        fp32.miou
    );
    assert_eq!(r.evaluation.classes.len(), 11);
    for x in r
        .rows
        .iter()
        .filter(|x| x.precision == Some(Precision::Int8))
    {
        assert!(
            x.agreement.unwrap_or(0.0) >= 0.98,
            "{} pixel agreement {:?}",
            x.label(),
            x.agreement
        );
        assert!(
            x.miou.unwrap_or(0.0) >= fp32.miou.unwrap_or(1.0) - 0.02,
            "{} mIoU {:?}",
            x.label(),
            x.miou
        );
    }
}
