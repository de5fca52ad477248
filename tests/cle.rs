//! Cross-layer equalization and activation centering end to end on the bundled segmenter:
//! with `cle: On` the INT8 engines are built from the equalized model and the report says what
//! was equalized, while the FP32 row stays the original model's; with `Off` nothing is
//! equalized; `Auto` leaves this model (no depthwise conv) alone. Centering shifts its one
//! ReLU read by a 1x1 conv, and the export carries the float model the cache belongs to.

mod common;

use std::path::Path;

use quantscope::backend::Precision;
use quantscope::calib::{Method, StatsCache};
use quantscope::data::Selection;
use quantscope::experiment::Experiment;
use quantscope::pipeline::{self, CancelToken, Sink};
use quantscope::prepare::center::CenterSetting;
use quantscope::prepare::cle::CleSetting;
use quantscope::report::Report;

struct Quiet;
impl Sink for Quiet {
    fn progress(&self, _: &str, _: usize, _: usize) {}
    fn log(&self, _: &str) {}
}

fn run(cle: CleSetting) -> Report {
    run_with(cle, CenterSetting::On, None)
}

fn run_with(cle: CleSetting, center: CenterSetting, qdq_dir: Option<&Path>) -> Report {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("sample_models/fashion_scenes_deeplab.ron");
    let mut exp = Experiment::load(&path).expect("sample experiment loads");
    exp.cle = cle;
    exp.center = center;
    exp.output.qdq_dir = qdq_dir.map(Path::to_path_buf);
    exp.methods = vec![Method::Max];
    exp.precisions = vec![Precision::Fp32, Precision::Int8];
    exp.evaluation.count = Some(6);
    exp.calibration.select = Selection::First(16);
    exp.bench.min_runs = 1;
    exp.bench.min_time_ms = 0.0;
    exp.bench.warmup_runs = 0;
    exp.bench.batch = 1;
    let cache = StatsCache {
        dir: common::temp_dir(&format!("cle-cache-{cle}-{center}")),
    };
    let out = pipeline::run_with_cache(&exp, &cache, &Quiet, &CancelToken::default())
        .expect("sample runs");
    let json = out.report.to_json();
    let back: Report = serde_json::from_str(&json).expect("report JSON parses");
    back
}

#[test]
fn cle_on_equalizes_the_int8_model_and_reports_it() {
    let on = run(CleSetting::On);
    let eq = on
        .equalization
        .as_ref()
        .expect("the report says what CLE did");
    assert!(eq.applied, "{eq:?}");
    assert!(!eq.pairs.is_empty());
    assert!(eq.spread_after < eq.spread_before, "{eq:?}");
    assert!(
        on.notes
            .iter()
            .any(|n| n.contains("cross-layer equalization (on)")),
        "{:?}",
        on.notes
    );
    for r in &on.rows {
        assert!(r.error.is_none(), "{}: {:?}", r.label(), r.error);
    }
    let int8 = on
        .rows
        .iter()
        .find(|r| r.precision == Some(Precision::Int8))
        .expect("int8 row");
    assert!(
        int8.agreement.unwrap_or(0.0) >= 0.9,
        "INT8 after CLE agrees with FP32 on {:?} of pixels",
        int8.agreement
    );

    let off_dir = common::temp_dir("cle-off-qdq");
    let off = run_with(CleSetting::Off, CenterSetting::On, Some(&off_dir));
    let eq_off = off.equalization.as_ref().expect("reported when off too");
    assert!(!eq_off.applied);
    assert_eq!(
        eq_off.pairs, eq.pairs,
        "off lists the same equalizable pairs"
    );
    // The FP32 row is the original model's either way.
    assert_eq!(
        on.fp32().and_then(|r| r.miou),
        off.fp32().and_then(|r| r.miou)
    );
    // The INT8 engines differ: CLE changed what was quantized.
    let i_off = off
        .rows
        .iter()
        .find(|r| r.precision == Some(Precision::Int8))
        .expect("int8 row");
    assert_ne!(int8.sqnr_db, i_off.sqnr_db);

    // auto: the segmenter has conv pairs but no depthwise conv, so it is left alone and the
    // report says why.
    let auto_dir = common::temp_dir("cle-auto-qdq");
    let auto = run_with(CleSetting::Auto, CenterSetting::On, Some(&auto_dir));
    let eq_auto = auto.equalization.as_ref().expect("reported");
    assert!(!eq_auto.applied, "{eq_auto:?}");
    assert!(
        eq_auto.decision.contains("no depthwise"),
        "{}",
        eq_auto.decision
    );
    // The INT8 model auto quantized is off's, byte for byte.
    let qdq = |dir: &Path| -> Vec<(String, Vec<u8>)> {
        let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
            .expect("export folder")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "onnx"))
            .map(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read(&p).expect("exported model"))
            })
            .collect();
        files.sort();
        files
    };
    let (a, o) = (qdq(&auto_dir), qdq(&off_dir));
    assert!(!a.is_empty(), "auto exported its Q/DQ models");
    assert_eq!(
        a.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        o.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    for ((name, x), (_, y)) in a.iter().zip(&o) {
        assert!(x == y, "{name} differs between auto and off");
    }
    // The same model gives the same SQNR, to the last bits ONNX Runtime's two CPU forms of
    // it round differently: the INT8 engine runs whichever form timed faster in that build.
    for (x, y) in auto.rows.iter().zip(&off.rows) {
        match (x.sqnr_db, y.sqnr_db) {
            (Some(x), Some(y)) => assert!((x - y).abs() < 0.05, "{x} vs {y} dB"),
            (x, y) => assert_eq!(x, y),
        }
    }
}

#[test]
fn centering_shifts_the_relu_read_by_a_1x1_conv_and_exports_its_float_model() {
    let dir = common::temp_dir("center-export");
    let on = run_with(CleSetting::Off, CenterSetting::On, Some(&dir));
    let c = on
        .centering
        .as_ref()
        .expect("the report says what centering did");
    assert_eq!(c.centered.len(), 1, "{c:?}");
    assert!(c.centered[0].shift > 0.0, "{c:?}");
    assert!(
        on.notes.iter().any(|n| n.contains("activation centering")),
        "{:?}",
        on.notes
    );
    let int8 = on
        .rows
        .iter()
        .find(|r| r.precision == Some(Precision::Int8))
        .expect("int8 row");
    assert!(int8.error.is_none(), "{:?}", int8.error);
    assert!(
        int8.agreement.unwrap_or(0.0) >= 0.95,
        "{:?}",
        int8.agreement
    );
    // The cache's ranges are the centered tensor's: the implicit line gets the prepared graph.
    assert!(
        dir.join("fashion_scenes_deeplab_fp32_for_cache.onnx")
            .exists(),
        "the float model the cache belongs to is written"
    );
    let off = run_with(CleSetting::Off, CenterSetting::Off, None);
    assert!(off.centering.as_ref().is_some_and(|c| !c.applied()));
    assert_eq!(
        on.fp32().and_then(|r| r.miou),
        off.fp32().and_then(|r| r.miou)
    );
}
