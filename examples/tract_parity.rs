//! Checks quantscope's CPU kernels on a model nobody here wrote: runs it through quantscope's
//! CPU engine graph (tract plus our rewrites: depthwise conv, fused requantize, Resize, casts)
//! and through tract's own pipeline, on one deterministic input, and prints the largest
//! difference (relative to the output's scale), both times and which of our kernels ran.
//! A Q/DQ file (name containing `int8`) is lowered to integer ops first, as the INT8 engine does.
//!
//! `cargo run --release --example tract_parity -- MODEL.onnx [SIDE]` (input 1 x 3 x SIDE x SIDE,
//! default 224).

use std::collections::BTreeMap;

use anyhow::Context;
use prost::Message;
use quantscope::backend::cpu::{TractModel, lower_qdq};
use tract_onnx::pb;
use tract_onnx::prelude::*;

fn first_f32(out: &[TValue]) -> TractResult<Vec<f32>> {
    Ok(out[0]
        .cast_to::<f32>()?
        .try_as_plain_ram()?
        .as_slice::<f32>()?
        .to_vec())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: tract_parity MODEL.onnx [SIDE]");
        std::process::exit(2);
    };
    if let Err(e) = run(path, args.get(2)) {
        eprintln!("tract_parity: {path}: {e:#}");
        std::process::exit(1);
    }
}

fn run(path: &str, side: Option<&String>) -> TractResult<()> {
    let side: usize = match side {
        None => 224,
        Some(s) => s
            .parse()
            .with_context(|| format!("SIDE `{s}` is not a whole number"))?,
    };
    let bytes = std::fs::read(path).context("reading the model")?;
    let p = pb::ModelProto::decode(bytes.as_slice()).context("not an ONNX model")?;
    let p = if path.contains("int8") {
        lower_qdq(&p)
            .map_err(|e| anyhow::anyhow!("lowering {path}: {e}"))?
            .proto
    } else {
        p
    };
    let shape = [1, 3, side, side];
    let x: Vec<f32> = (0..shape.iter().product::<usize>())
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();

    let ours = TractModel::new(&p, shape, &[])?;
    let start = std::time::Instant::now();
    let a = first_f32(&ours.run_all(&x)?)?;
    let ours_ms = start.elapsed().as_secs_f64() * 1e3;

    let mut m = tract_onnx::onnx().model_for_proto_model(&p)?;
    m.set_input_fact(0, f32::fact(shape).into())?;
    let plan = m.into_optimized()?.into_runnable()?;
    let start = std::time::Instant::now();
    let b = first_f32(&plan.run(tvec!(Tensor::from_shape(&shape, &x)?.into()))?)?;
    let tract_ms = start.elapsed().as_secs_f64() * 1e3;

    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    let err = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    let mut ours_kernels = BTreeMap::new();
    for l in ours.profile(&x, 1)? {
        if l.kernel.contains("quantscope") {
            *ours_kernels.entry(l.kernel).or_insert(0) += 1;
        }
    }
    println!(
        "{path}: max |quantscope - tract| / max |tract| = {:.2e} over {} values; one run {ours_ms:.1} ms (quantscope) vs {tract_ms:.1} ms (tract); our kernels {ours_kernels:?}",
        err / scale,
        a.len()
    );
    Ok(())
}
