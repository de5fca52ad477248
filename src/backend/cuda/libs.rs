//! Finding the CUDA libraries at run time. cudarc opens them by soname (`libcudnn.so.9`,
//! `libcublasLt.so.13`, `libnvrtc.so.13`, `libcuda.so.1`) through `dlopen`, which only looks
//! in the loader's default paths. We look in more places (QUANTSCOPE_CUDA_LIB_DIRS first,
//! then the PyTorch venv's `nvidia/*/lib`, then /usr/local/cuda) and open what we find by
//! absolute path with RTLD_GLOBAL: glibc then answers cudarc's later dlopen by soname with
//! the library already loaded.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One library the backend needs and where it was found (or not).
#[derive(Clone, Debug, PartialEq)]
pub struct Found {
    pub lib: &'static str,
    pub path: Option<PathBuf>,
}

/// The environment variable holding extra library folders, colon-separated.
pub const ENV_DIRS: &str = "QUANTSCOPE_CUDA_LIB_DIRS";

/// The sonames cudarc opens for cuda-13000 and cuDNN 9.
pub const LIBS: [&str; 4] = [
    "libcuda.so.1",
    "libnvrtc.so.13",
    "libcublasLt.so.13",
    "libcudnn.so.9",
];

/// Folders searched, in order: the environment variable, the PyTorch venv's NVIDIA wheels,
/// the CUDA toolkit, LD_LIBRARY_PATH, the usual system folders.
pub fn search_dirs(env_dirs: Option<&str>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = vec![];
    if let Some(e) = env_dirs {
        dirs.extend(e.split(':').filter(|s| !s.is_empty()).map(PathBuf::from));
    }
    for venv in ["/opt/torch/.venv/lib"] {
        if let Ok(rd) = std::fs::read_dir(venv) {
            let mut pys: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
            pys.sort();
            for py in pys {
                let nv = py.join("site-packages/nvidia");
                for sub in [
                    "cudnn/lib",
                    "cu13/lib",
                    "cublas/lib",
                    "cuda_nvrtc/lib",
                    "cuda_runtime/lib",
                ] {
                    dirs.push(nv.join(sub));
                }
            }
        }
    }
    // LD_LIBRARY_PATH after the venv: a complete cuDNN (all sub-libraries of one version)
    // lives there; a lone libcudnn.so.9 elsewhere mixed with them fails with
    // CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH.
    dirs.extend(
        [
            "/usr/local/cuda/lib64",
            "/usr/local/cuda/targets/x86_64-linux/lib",
        ]
        .map(PathBuf::from),
    );
    if let Ok(ld) = std::env::var("LD_LIBRARY_PATH") {
        dirs.extend(ld.split(':').filter(|s| !s.is_empty()).map(PathBuf::from));
    }
    dirs.extend(["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"].map(PathBuf::from));
    dirs.dedup();
    dirs
}

/// Folders holding `cuda_fp16.h` (toolkit, or the venv's NVIDIA wheel), for NVRTC.
pub fn include_dirs() -> Vec<PathBuf> {
    let mut v = vec![];
    let mut cands: Vec<PathBuf> = vec![PathBuf::from("/usr/local/cuda/include")];
    for d in search_dirs(std::env::var(ENV_DIRS).ok().as_deref()) {
        if let Some(parent) = d.parent() {
            cands.push(parent.join("include"));
        }
    }
    for c in cands {
        if c.join("cuda_fp16.h").is_file() && !v.contains(&c) {
            v.push(c);
        }
    }
    v.truncate(1);
    v
}

/// First folder in `dirs` holding `lib`.
pub fn find(lib: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    if lib == "libcudnn.so.9"
        && let Some(d) = dirs
            .iter()
            .find(|d| d.join(lib).is_file() && d.join("libcudnn_cnn.so.9").is_file())
    {
        return Some(d.join(lib));
    }
    dirs.iter().map(|d| d.join(lib)).find(|p| p.is_file())
}

fn open_global(p: &Path) -> Result<(), String> {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    let lib = unsafe { Library::open(Some(p), RTLD_NOW | RTLD_GLOBAL) }
        .map_err(|e| format!("{}: {e}", p.display()))?;
    // Stay loaded for the life of the process: cudarc holds its own handle by soname.
    std::mem::forget(lib);
    Ok(())
}

/// Finds and preloads the libraries once per process. Returns what was found, and the
/// errors of libraries found but not loadable.
pub fn preload() -> &'static (Vec<Found>, Vec<String>) {
    static DONE: OnceLock<(Vec<Found>, Vec<String>)> = OnceLock::new();
    DONE.get_or_init(|| {
        let dirs = search_dirs(std::env::var(ENV_DIRS).ok().as_deref());
        let mut found = vec![];
        let mut errors = vec![];
        let env_set = std::env::var_os(ENV_DIRS).is_some();
        for lib in LIBS {
            // cudarc tries the unversioned name (`libcudnn.so`) first: when the default loader
            // resolves it, that library is the one cudarc will use, so we must not preload
            // sub-libraries of another version next to it (measured on the H200 machine:
            // system cuDNN 9.14 + venv sub-libraries -> SUBLIBRARY_VERSION_MISMATCH).
            let unversioned = lib.split(".so").next().map(|b| format!("{b}.so"));
            if !env_set
                && let Some(u) = &unversioned
                && unsafe { libloading::Library::new(u) }.is_ok()
            {
                found.push(Found {
                    lib,
                    path: Some(PathBuf::from(u)),
                });
                continue;
            }
            let path = find(lib, &dirs);
            if let Some(p) = &path {
                if lib == "libcudnn.so.9" {
                    // cuDNN 9 opens its sub-libraries by name: preload them from its folder.
                    if let Some(dir) = p.parent() {
                        for sub in [
                            "libcudnn_graph.so.9",
                            "libcudnn_engines_runtime_compiled.so.9",
                            "libcudnn_engines_precompiled.so.9",
                            "libcudnn_heuristic.so.9",
                            "libcudnn_ops.so.9",
                            "libcudnn_cnn.so.9",
                            "libcudnn_adv.so.9",
                        ] {
                            let sp = dir.join(sub);
                            if sp.is_file() {
                                let _ = open_global(&sp);
                            }
                        }
                    }
                }
                if let Err(e) = open_global(p) {
                    errors.push(e);
                }
            }
            found.push(Found { lib, path });
        }
        (found, errors)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_dirs_come_first_and_find_checks_files() {
        let tmp = tempfile::tempdir().expect("tmp");
        std::fs::write(tmp.path().join("libcudnn.so.9"), b"not really").expect("write");
        let env = format!("/nonexistent:{}", tmp.path().display());
        let dirs = search_dirs(Some(&env));
        assert_eq!(dirs[0], PathBuf::from("/nonexistent"));
        assert_eq!(dirs[1], tmp.path());
        assert_eq!(
            find("libcudnn.so.9", &dirs),
            Some(tmp.path().join("libcudnn.so.9"))
        );
        assert!(dirs.iter().any(|d| d.ends_with("cuda/lib64")));
    }
}
