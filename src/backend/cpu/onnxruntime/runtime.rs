//! Finding and loading ONNX Runtime's shared library, once per process: `ORT_DYLIB_PATH`, then
//! the `onnxruntime` Python package's `capi/` folder, then the system's library paths. Also the
//! CPU facts that decide which int8 path is exact here (VNNI or not).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// The oldest ONNX Runtime this build talks to: the C API level `ort` is compiled for
/// (`api-20` in Cargo.toml). An older library is refused at load with its path and version.
pub const MIN_VERSION: &str = "1.20";

/// The one command that gives a machine the fast CPU engine.
pub const INSTALL_HINT: &str = "pip install onnxruntime";

/// Which CPU engine runs the CPU rows and the statistics passes.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum CpuEngineChoice {
    /// ONNX Runtime where its library is found, else tract.
    #[default]
    Auto,
    /// ONNX Runtime, or an error (never a silent fallback).
    Ort,
    /// tract, compiled in: runs without any setup, 2-7x slower than ONNX Runtime.
    Tract,
}

impl CpuEngineChoice {
    pub const ALL: [CpuEngineChoice; 3] = [
        CpuEngineChoice::Auto,
        CpuEngineChoice::Ort,
        CpuEngineChoice::Tract,
    ];
    pub fn name(self) -> &'static str {
        match self {
            CpuEngineChoice::Auto => "auto",
            CpuEngineChoice::Ort => "ort",
            CpuEngineChoice::Tract => "tract",
        }
    }
}

/// The engine a choice resolved to on this machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CpuEngineKind {
    Ort,
    Tract,
}

/// What ran the CPU rows: the report's `cpu_engine`, the CLI header, the GUI's status bar.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CpuEngineInfo {
    /// "onnxruntime" or "tract".
    pub name: String,
    pub version: String,
    /// The shared library loaded (ONNX Runtime only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// The CPU and the instruction-set extensions that decide the int8 path.
    pub isa: String,
    /// Why this engine and not the other, where there was a choice ("ONNX Runtime not found:
    /// ...; `pip install onnxruntime` enables it").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl CpuEngineInfo {
    /// One line: "onnxruntime 1.32.0 (/path/libonnxruntime.so.1.32.0), AMD EPYC, AVX2, no VNNI".
    pub fn summary(&self) -> String {
        let path = self
            .path
            .as_ref()
            .map(|p| format!(" ({})", p.display()))
            .unwrap_or_default();
        let note = self
            .note
            .as_ref()
            .map(|n| format!(". {n}"))
            .unwrap_or_default();
        format!("{} {}{path}, {}{note}", self.name, self.version, self.isa)
    }
}

/// The CPU's int8-relevant extensions, read once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuIsa {
    pub model: String,
    pub x86: bool,
    pub avx2: bool,
    pub avx512: bool,
    /// AVX-512 VNNI or AVX-VNNI: u8 x s8 dot products accumulate in i32 without saturating.
    pub vnni: bool,
    pub amx: bool,
}

impl CpuIsa {
    pub fn get() -> &'static CpuIsa {
        static ISA: OnceLock<CpuIsa> = OnceLock::new();
        ISA.get_or_init(|| {
            CpuIsa::from_cpuinfo(&std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default())
        })
    }

    /// Parses Linux's `/proc/cpuinfo` (first processor's `model name` and `flags`).
    pub fn from_cpuinfo(text: &str) -> CpuIsa {
        let field = |key: &str| {
            text.lines()
                .find(|l| l.split(':').next().is_some_and(|k| k.trim() == key))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_default()
        };
        let flags = field("flags");
        let has = |f: &str| flags.split_whitespace().any(|x| x == f);
        let x86 = cfg!(any(target_arch = "x86_64", target_arch = "x86"));
        let model = match field("model name") {
            m if m.is_empty() => std::env::consts::ARCH.to_string(),
            m => m,
        };
        CpuIsa {
            model,
            x86,
            avx2: has("avx2"),
            avx512: has("avx512f"),
            vnni: has("avx512_vnni") || has("avx_vnni"),
            amx: has("amx_int8"),
        }
    }

    /// Whether ONNX Runtime's fused u8 x s8 kernels are exact here. On x86 without VNNI they
    /// multiply pairs into 16-bit sums that saturate (DeepLab kept about 70 % of FP32 mIoU
    /// instead of 97 %, ../shared/DESIGN.md); elsewhere they accumulate in 32 bits.
    pub fn fused_int8_exact(&self) -> bool {
        !self.x86 || self.vnni
    }

    pub fn summary(&self) -> String {
        let mut ext = vec![];
        if self.x86 {
            if self.avx512 {
                ext.push("AVX-512");
            } else if self.avx2 {
                ext.push("AVX2");
            }
            ext.push(if self.vnni { "VNNI" } else { "no VNNI" });
            if self.amx {
                ext.push("AMX");
            }
        }
        if ext.is_empty() {
            self.model.clone()
        } else {
            format!("{}, {}", self.model, ext.join(", "))
        }
    }
}

/// ONNX Runtime as found here: what the GUI's status bar and CPU engine combo show.
#[derive(Clone, Debug, PartialEq)]
pub struct OrtFound {
    pub version: String,
    pub path: PathBuf,
}

/// ONNX Runtime, loaded.
pub struct Runtime {
    pub path: PathBuf,
    pub version: String,
    pub env: ort::environment::Environment,
}

/// The library, loaded once per process; the error says where it looked and what to do.
pub fn runtime() -> Result<&'static Runtime, String> {
    static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();
    RUNTIME.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Runtime, String> {
    let candidates = candidates();
    if candidates.is_empty() {
        return Err(format!(
            "ONNX Runtime not found (looked at ORT_DYLIB_PATH, the `onnxruntime` Python package \
             and the system's library paths); `{INSTALL_HINT}` enables it"
        ));
    }
    let mut tried = vec![];
    for path in candidates {
        // A path (not a bare name for the loader to search) that is not there.
        if path.components().count() > 1 && !path.exists() {
            tried.push(format!("{}: no such file", path.display()));
            continue;
        }
        match load_from(&path) {
            Ok(rt) => return Ok(rt),
            Err(e) => tried.push(e),
        }
    }
    Err(format!("{}; `{INSTALL_HINT}` enables it", tried.join("; ")))
}

/// Loads `path`, refusing a library that is not ONNX Runtime or older than [`MIN_VERSION`].
/// ONNX Runtime can be loaded once per process: after a success, this is not called again.
fn load_from(path: &Path) -> Result<Runtime, String> {
    // ort reads the version string before it asks for the API table, so a library of another
    // ABI is refused here, with its path and version, not used.
    let builder = ort::init_from(path).map_err(|e| match e {
        ort::LoadDynamicError::BadVersion { version_str, path } => format!(
            "{}: ONNX Runtime {version_str} is older than {MIN_VERSION}, the oldest this \
             quantscope talks to; `pip install -U onnxruntime`",
            path.display()
        ),
        ort::LoadDynamicError::MissingApi { path } => format!(
            "{}: not an ONNX Runtime library (it has no `OrtGetApiBase`)",
            path.display()
        ),
        other => format!("{other}"),
    })?;
    let version = version_of(path);
    let env = builder.with_name("quantscope").build().map_err(|e| {
        format!(
            "{}: creating the ONNX Runtime environment: {e}",
            path.display()
        )
    })?;
    Ok(Runtime {
        path: std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()),
        version,
        env,
    })
}

/// The version the loaded library reports (it is loaded: `ort` checked it).
fn version_of(path: &Path) -> String {
    // SAFETY: ort has loaded and checked this library; OrtGetApiBase takes no arguments and
    // GetVersionString returns a static NUL-terminated string.
    let read = || -> Option<String> {
        let lib = unsafe { libloading::Library::new(path) }.ok()?;
        let get: libloading::Symbol<unsafe extern "C" fn() -> *const ort::sys::OrtApiBase> =
            unsafe { lib.get(b"OrtGetApiBase") }.ok()?;
        let base = unsafe { get() };
        if base.is_null() {
            return None;
        }
        let s = unsafe { ((*base).GetVersionString)() };
        if s.is_null() {
            return None;
        }
        Some(
            unsafe { std::ffi::CStr::from_ptr(s) }
                .to_string_lossy()
                .into_owned(),
        )
    };
    read().unwrap_or_else(|| "unknown version".into())
}

/// Where to look, in order: `ORT_DYLIB_PATH` (alone, when set: the user named it), the Python
/// package's `capi/` folder, then the bare names the dynamic loader resolves from the system's
/// library paths.
fn candidates() -> Vec<PathBuf> {
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH").filter(|p| !p.is_empty()) {
        return vec![PathBuf::from(p)];
    }
    let mut out: Vec<PathBuf> = python_package_libraries();
    for dir in [
        "/usr/local/lib",
        "/usr/lib",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
    ] {
        out.extend(libraries_in(Path::new(dir)));
    }
    out.push(PathBuf::from("libonnxruntime.so"));
    out.push(PathBuf::from("libonnxruntime.so.1"));
    out.dedup();
    out
}

/// `libonnxruntime.so*` files in `dir`, newest version first.
fn libraries_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return vec![];
    };
    let mut libs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libonnxruntime.so") || n == "libonnxruntime.dylib")
        })
        .collect();
    libs.sort_by_key(|p| std::cmp::Reverse(version_key(p)));
    libs
}

/// (major, minor, patch) from a file name like `libonnxruntime.so.1.32.0`.
fn version_key(p: &Path) -> Vec<u32> {
    p.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.split_once(".so."))
        .map(|(_, v)| v.split('.').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_default()
}

/// The `onnxruntime` package's `capi/` libraries for the `python3` (and `python`) on PATH,
/// found without importing the package (`importlib.util.find_spec` reads no module code).
fn python_package_libraries() -> Vec<PathBuf> {
    const FIND: &str = "import importlib.util as u\n\
                        s = u.find_spec('onnxruntime')\n\
                        print(s.submodule_search_locations[0] if s and s.submodule_search_locations else '')";
    let mut out = vec![];
    for python in ["python3", "python"] {
        let Ok(o) = std::process::Command::new(python)
            .args(["-c", FIND])
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
        else {
            continue;
        };
        let dir = String::from_utf8_lossy(&o.stdout).trim().to_string();
        if o.status.success() && !dir.is_empty() {
            out.extend(libraries_in(&Path::new(&dir).join("capi")));
        }
    }
    out
}

/// What ONNX Runtime is here: its version and library, or why it cannot be used.
pub fn found() -> Result<OrtFound, String> {
    runtime().map(|rt| OrtFound {
        version: rt.version.clone(),
        path: rt.path.clone(),
    })
}

/// The engine `choice` resolves to here, with what the report says of it. `Ort` without a
/// usable library is an error naming where it looked; `Auto` falls back to tract with a note.
pub fn resolve(choice: CpuEngineChoice) -> Result<(CpuEngineKind, CpuEngineInfo), String> {
    match (choice, runtime()) {
        (CpuEngineChoice::Tract, _) => Ok(tract_info(None)),
        (CpuEngineChoice::Ort, Err(why)) => Err(format!(
            "--cpu-engine ort: {why} (or set ORT_DYLIB_PATH to a libonnxruntime.so, \
             {MIN_VERSION} or newer); `--cpu-engine tract` runs everywhere"
        )),
        _ => Ok(resolve_auto()),
    }
}

/// `auto`: ONNX Runtime where it loads, else tract with the reason; it always resolves.
pub fn resolve_auto() -> (CpuEngineKind, CpuEngineInfo) {
    match runtime() {
        Ok(rt) => (
            CpuEngineKind::Ort,
            CpuEngineInfo {
                name: "onnxruntime".into(),
                version: rt.version.clone(),
                path: Some(rt.path.clone()),
                isa: CpuIsa::get().summary(),
                note: (!CpuIsa::get().fused_int8_exact()).then(|| {
                    "INT8 runs as exact fake quantization (no graph optimisation), not on ONNX \
                     Runtime's fused u8 x s8 kernels, which saturate on x86 without VNNI"
                        .to_string()
                }),
            },
        ),
        Err(why) => tract_info(Some(format!(
            "ONNX Runtime, the fast CPU engine, is off: {why}"
        ))),
    }
}

fn tract_info(note: Option<String>) -> (CpuEngineKind, CpuEngineInfo) {
    (
        CpuEngineKind::Tract,
        CpuEngineInfo {
            name: "tract".into(),
            version: TRACT_VERSION.into(),
            path: None,
            isa: CpuIsa::get().summary(),
            note,
        },
    )
}

/// tract's version, as Cargo.lock pins it.
pub const TRACT_VERSION: &str = "0.23";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vnni_decides_the_exact_int8_path() {
        let amd = CpuIsa::from_cpuinfo("model name\t: AMD EPYC\nflags\t\t: fpu avx2 fma\n");
        assert!(amd.avx2 && !amd.vnni);
        assert_eq!(
            amd.x86,
            cfg!(any(target_arch = "x86_64", target_arch = "x86"))
        );
        if amd.x86 {
            assert!(!amd.fused_int8_exact());
            assert_eq!(amd.summary(), "AMD EPYC, AVX2, no VNNI");
        }
        let xeon = CpuIsa::from_cpuinfo(
            "model name\t: Intel(R) Xeon(R)\nflags\t\t: avx2 avx512f avx512_vnni amx_tile amx_int8\n",
        );
        assert!(xeon.vnni && xeon.amx && xeon.fused_int8_exact());
    }

    #[test]
    fn library_files_sort_newest_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        for n in [
            "libonnxruntime.so.1.9.0",
            "libonnxruntime.so.1.32.0",
            "libonnxruntime_providers_shared.so",
            "other.so",
        ] {
            std::fs::write(dir.path().join(n), b"").expect("write");
        }
        let found: Vec<String> = libraries_in(dir.path())
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            found,
            ["libonnxruntime.so.1.32.0", "libonnxruntime.so.1.9.0"]
        );
    }
}
