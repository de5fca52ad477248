//! Choices that must not follow the last bit of the input: the bundled segmenter run with its
//! normalisation spelt two equivalent ways (`(x/255 - 0.5) / 0.25` and `x * (1/63.75) - 2`,
//! which differ only in float rounding) gets the same INT8 preparation (equalization,
//! centering) and the same bias correction for every method, with the default recipe.

mod common;

use std::path::Path;

use quantscope::backend::Precision;
use quantscope::calib::{Method, StatsCache};
use quantscope::data::{Normalize, Selection};
use quantscope::experiment::Experiment;
use quantscope::pipeline::{self, CancelToken, Sink};
use quantscope::prepare::Recipe;
use quantscope::report::Report;

struct Quiet;
impl Sink for Quiet {
    fn progress(&self, _: &str, _: usize, _: usize) {}
    fn log(&self, _: &str) {}
}

fn run(normalize: Normalize, tag: &str) -> Report {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("sample_models/fashion_scenes_deeplab.ron");
    let mut exp = Experiment::load(&path).expect("sample experiment loads");
    exp.preprocess.normalize = normalize;
    exp.methods = Method::ALL.to_vec();
    exp.precisions = vec![Precision::Fp32, Precision::Int8];
    exp.evaluation.count = Some(6);
    exp.calibration.select = Selection::First(16);
    exp.bench.min_runs = 1;
    exp.bench.min_time_ms = 0.0;
    exp.bench.warmup_runs = 0;
    exp.bench.batch = 1;
    let cache = StatsCache {
        dir: common::temp_dir(&format!("stable-cache-{tag}")),
    };
    pipeline::run_with_cache(&exp, &cache, &Quiet, &CancelToken::default())
        .expect("sample runs")
        .report
}

/// "bias correction max: full" → ("max", "full"), one per method, in order.
fn bias_choices(r: &Report) -> Vec<(String, String)> {
    r.notes
        .iter()
        .filter_map(|n| n.strip_prefix("bias correction "))
        .filter_map(|n| {
            let (method, rest) = n.split_once(": ")?;
            let kind = rest.split_whitespace().next()?;
            Some((method.to_string(), kind.to_string()))
        })
        .collect()
}

#[test]
fn equivalent_normalisations_make_the_same_choices() {
    let mean_std = run(
        Normalize::MeanStd {
            mean: [0.5; 3],
            std: [0.25; 3],
        },
        "mean-std",
    );
    let scale_offset = run(
        Normalize::ScaleOffset {
            scale: 1.0 / 63.75,
            offset: -2.0,
        },
        "scale-offset",
    );
    let exp = Experiment::default();
    assert_eq!(
        Recipe::of(exp.weight_rounding, exp.bias_correction),
        Some(Recipe::Best),
        "the default recipe is the best one"
    );
    assert!(
        mean_std
            .notes
            .iter()
            .any(|n| n.starts_with("INT8 recipe: best, the default")),
        "the report says which recipe ran: {:#?}",
        mean_std.notes
    );
    let choices = bias_choices(&mean_std);
    assert_eq!(
        choices.len(),
        4,
        "one bias correction per method: {choices:?}"
    );
    assert_eq!(choices, bias_choices(&scale_offset));
    assert_eq!(
        serde_json::to_string(&mean_std.centering).unwrap(),
        serde_json::to_string(&scale_offset.centering).unwrap(),
        "centering shifts the same tensors"
    );
    assert_eq!(
        serde_json::to_string(&mean_std.equalization).unwrap(),
        serde_json::to_string(&scale_offset.equalization).unwrap()
    );
    // The two inputs differ by float rounding only, so the INT8 rows read the same.
    for (a, b) in mean_std.rows.iter().zip(&scale_offset.rows) {
        let (a, b) = (a.miou.unwrap_or(0.0), b.miou.unwrap_or(0.0));
        assert!((a - b).abs() <= 0.005, "{a} vs {b}");
    }
}
