//! On-disk cache of a built engine's choices (which implementation each convolution uses),
//! keyed by model fingerprint, GPU, precision, batch and input size, so a second build skips
//! the timing. Kernels are not cached (NVRTC compiles them once per process).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Choices {
    pub version: u32,
    /// Conv node name -> implementation key (`ConvImpl::key`): `direct`, `dw` (the depthwise
    /// kernel), `dwr` (the int8 row-window depthwise kernels), `dwt` (the int8 depthwise
    /// kernel through shared memory), `pw` / `pww` (the int8 pointwise kernels), `pwv` (the
    /// int8 GEMV for a few rows), `mma` /
    /// `mma64` (the int8 tensor-core kernel's 128- and 64-pixel tiles), `mmas` / `mmas64`
    /// (the streaming 1x1 tensor-core kernel's), `mmar` (the row-at-a-time one), `wgmma` /
    /// `wgmma64` / `wgmmaw` (Hopper's implicit GEMM kernel in 128 x 64, 64 x 64 and 128 x 128
    /// tiles), `gemm:<i>:<rows|im2col>`,
    /// `gemmf:<i>:<rows|im2col>` (the output written by cuBLASLt's epilogue), `cudnn:<algo>`,
    /// `cudnng:<plan>` (cuDNN graph conv, epilogue fused), and those after `f16+` (an int8
    /// layer run in FP16). A key without its algorithm (`gemmf`, `f16+cudnn`) picks the first
    /// candidate of that family.
    pub convs: BTreeMap<String, String>,
}

/// 2: `gemm8` / `cudnn8` became `gemmf` / `cudnng` (float layers have them too), `dw` came.
/// 3: `dwr` came (a cached choice made without a candidate never tries it: new candidates
/// take a new version, so that engines cached before them are timed again).
/// 4: `mmar` came.
/// 5: `mmas` / `mmas64` came.
/// 6: `cudnng:<i>` indexes cuDNN's heuristic list, not the plans that finalized, so that a
/// known choice finalizes its plan alone.
/// 7: `wgmma`, `wgmma64` and `wgmmaw` came (Hopper's int8 implicit GEMM kernel).
/// 8: `dwt` came (the int8 depthwise kernel through shared memory).
/// 9: hard swish came to the int8 register epilogue, so `mmas`, `mmas64` and `mmar`'s codes
/// take hard-swish layers they did not, and the row depthwise kernel's speed changed.
/// 10: `pwv` came (the int8 GEMV for 1x1 layers of a few rows).
/// 11: `wgs:<blocks>:<stages>` came (Hopper's streaming int8 1x1 kernel on TMA copies), and
/// the split-reduction wgmma keys (`wgmma64:k:8`), which came at 10 without a new version.
/// 12: `wgs` came to regrouped stems (their windows as the kernel's rows).
pub const VERSION: u32 = 12;

/// `~/.cache/quantscope/cuda` (or `$XDG_CACHE_HOME/quantscope/cuda`); QUANTSCOPE_CUDA_CACHE
/// overrides the folder, `QUANTSCOPE_CUDA_CACHE=off` disables the cache.
pub fn cache_dir() -> Option<PathBuf> {
    match std::env::var("QUANTSCOPE_CUDA_CACHE") {
        Ok(v) if v == "off" || v == "0" => return None,
        Ok(v) if !v.is_empty() => return Some(PathBuf::from(v)),
        _ => {}
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("quantscope").join("cuda"))
}

/// File name for one engine: `<fingerprint>-<gpu>-<precision>-b<batch>-<h>x<w>.json`.
pub fn file_name(
    fingerprint: &str,
    gpu: &str,
    precision: &str,
    batch: usize,
    hw: [usize; 2],
) -> String {
    let gpu: String = gpu
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    format!(
        "{fingerprint}-{gpu}-{precision}-b{batch}-{}x{}.json",
        hw[0], hw[1]
    )
}

pub fn load(name: &str) -> Choices {
    let Some(dir) = cache_dir() else {
        return Choices::default();
    };
    std::fs::read_to_string(dir.join(name))
        .ok()
        .and_then(|s| serde_json::from_str::<Choices>(&s).ok())
        .filter(|c| c.version == VERSION)
        .unwrap_or_default()
}

/// Best effort: a cache that cannot be written only costs the next build its timing.
pub fn store(name: &str, c: &Choices) {
    let Some(dir) = cache_dir() else { return };
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    let c = Choices {
        version: VERSION,
        ..c.clone()
    };
    if let Ok(s) = serde_json::to_string_pretty(&c) {
        let tmp = dir.join(format!("{name}.tmp"));
        if std::fs::write(&tmp, s).is_ok() {
            let _ = std::fs::rename(tmp, dir.join(name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_round_trip_and_names_are_safe() {
        let mut c = Choices {
            version: VERSION,
            ..Default::default()
        };
        c.convs.insert("conv1".into(), "cudnn:1".into());
        c.convs.insert("fc".into(), "gemm:0:rows".into());
        let s = serde_json::to_string(&c).expect("ser");
        assert_eq!(serde_json::from_str::<Choices>(&s).expect("de"), c);
        let n = file_name("abcd", "NVIDIA H200 NVL", "int8", 32, [224, 224]);
        assert_eq!(n, "abcd-nvidia_h200_nvl-int8-b32-224x224.json");
    }

    #[test]
    fn cached_keys_name_implementations_or_families() {
        use super::super::engine::ConvImpl;
        let gemm = ConvImpl::Gemm {
            algo: 2,
            im2col: true,
        };
        let gemmf = ConvImpl::GemmFused {
            algo: 0,
            im2col: false,
        };
        let f16 = ConvImpl::AsF16(Box::new(ConvImpl::Cudnn { algo: 6 }));
        assert!(gemm.answers("gemm:2:im2col") && gemm.answers("gemm"));
        assert!(!gemm.answers("gemm:0:im2col") && !gemm.answers("gemmf"));
        assert!(gemmf.answers("gemmf") && !gemmf.answers("gemm"));
        assert!(f16.answers("f16+cudnn") && f16.answers("f16+cudnn:6"));
        assert!(!f16.answers("cudnn") && !ConvImpl::Cudnn { algo: 6 }.answers("f16+cudnn"));
        assert!(ConvImpl::Direct.answers("direct") && !ConvImpl::Direct.answers("bogus"));
        assert!(ConvImpl::Depthwise.answers("dw") && !ConvImpl::Depthwise.answers("direct"));
    }
}
