//! Helpers shared by the integration tests: small models and image folders made on the fly,
//! so the suite depends on nothing outside the repository.

#![allow(dead_code)]

pub mod cuda;

use std::path::{Path, PathBuf};

use image::{Rgb, RgbImage};
use quantscope::model::testing::values;

/// Writes `n` deterministic noisy images of `size` into `dir` (flat).
pub fn image_folder(dir: &Path, n: usize, size: u32, seed: u64) -> Vec<PathBuf> {
    std::fs::create_dir_all(dir).expect("create image folder");
    (0..n)
        .map(|i| {
            let v = values((size * size * 3) as usize, seed + i as u64);
            let img = RgbImage::from_fn(size, size, |x, y| {
                let k = ((y * size + x) * 3) as usize;
                let f = |c: usize| ((v[k + c] * 0.5 + 0.5) * 200.0 + (x + y) as f32 * 0.2) as u8;
                Rgb([f(0), f(1), f(2)])
            });
            let p = dir.join(format!("img_{i:03}.png"));
            img.save(&p).expect("save image");
            p
        })
        .collect()
}

/// An ImageFolder with `classes` class folders of `per_class` images each.
pub fn image_folder_dataset(root: &Path, classes: usize, per_class: usize, size: u32) {
    for c in 0..classes {
        image_folder(
            &root.join(format!("class_{c}")),
            per_class,
            size,
            1000 * (c as u64 + 1),
        );
    }
}

/// A fresh, empty folder `name` for one test, under this process's root (the first call
/// sweeps the roots earlier test processes left).
pub fn temp_dir(name: &str) -> PathBuf {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(remove_roots_of_exited_tests);
    let d = std::env::temp_dir()
        .join(format!("{TEST_ROOT_PREFIX}{}", std::process::id()))
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// Each test process keeps its folders under one root, `quantscope-test-<pid>` in the system
/// temp folder.
const TEST_ROOT_PREFIX: &str = "quantscope-test-";

/// Removes the roots (and the older `quantscope-test-<name>-<pid>` folders) of test processes
/// that have exited. A test binary has no exit hook and a failing test keeps its files for a
/// look, so each run sweeps what earlier runs left. Linux only (a process is alive while
/// /proc/<pid> exists); elsewhere nothing is removed.
fn remove_roots_of_exited_tests() {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(TEST_ROOT_PREFIX) else {
            continue;
        };
        let pid = rest.rsplit('-').next().unwrap_or_default();
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// True when python3 with onnxruntime is there; in CI its absence is a failure.
pub fn onnxruntime_available() -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import onnxruntime, numpy"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok && std::env::var_os("CI").is_some() {
        panic!("CI must have python3 with onnxruntime and numpy (.ci/run installs them)");
    }
    if !ok {
        eprintln!(
            "skipped: python3 with onnxruntime is not installed (pip install onnxruntime numpy)"
        );
    }
    ok
}

pub fn write_f32(path: &Path, v: &[f32]) {
    std::fs::write(
        path,
        v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
    )
    .expect("write f32");
}

pub fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .expect("read f32")
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// (max |a - b|, max |reference|): the error and the scale it is judged against.
pub fn max_err(a: &[f32], reference: &[f32]) -> (f32, f32) {
    let err = a
        .iter()
        .zip(reference)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    (err, reference.iter().fold(0f32, |m, v| m.max(v.abs())))
}
