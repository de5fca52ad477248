//! `CudaError`: what can go wrong in the CUDA backend, typed by where it comes from (the
//! planner, a driver or library call, NVRTC, device memory, a step's sizes), and turned into
//! the crate's `BackendError` at the backend's boundary with the same words.

use cudarc::cublaslt::sys as lt;
use cudarc::cudnn::sys as dnn;
use cudarc::driver::{DriverError, sys};

use crate::backend::{BackendError, Precision};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CudaError {
    /// The planner cannot take a node (or several): the reason names them.
    #[error("{0}")]
    Unsupported(String),
    /// A CUDA driver, cuDNN or cuBLASLt call failed: `call` says which and for what.
    #[error("{call}: {status}")]
    Call { call: String, status: String },
    /// NVRTC could not compile the kernels; `log` is its compiler log.
    #[error("NVRTC {stage}: {status}{}", if log.is_empty() { String::new() } else { format!(": {log}") })]
    Nvrtc {
        stage: &'static str,
        status: String,
        log: String,
    },
    /// The device (or a library's allocation on it) ran out of memory.
    #[error("{call}: out of device memory ({status})")]
    OutOfMemory { call: String, status: String },
    /// A step's or a layer's sizes do not fit its tensors or a kernel's limits.
    #[error("{0}")]
    Shape(String),
    /// Something the engine set up itself is missing: a bug, never the model's fault.
    #[error("internal: {0}")]
    Internal(String),
    /// `source` in step `step` (its kind): where in the plan it happened.
    #[error("step `{step}`{}: {source}", kind.map_or(String::new(), |k| format!(" ({k})")))]
    InStep {
        step: String,
        kind: Option<&'static str>,
        source: Box<CudaError>,
    },
}

pub type CudaResult<T> = Result<T, CudaError>;

impl CudaError {
    /// This error as it happened in step `step` (of kind `kind`, where worth saying).
    pub fn in_step(self, step: &str, kind: Option<&'static str>) -> CudaError {
        CudaError::InStep {
            step: step.to_string(),
            kind,
            source: Box::new(self),
        }
    }

    /// The crate's error for a failed build of a `precision` engine, in the same words.
    pub fn at_build(self, precision: Precision) -> BackendError {
        BackendError::Build {
            precision,
            reason: self.to_string(),
        }
    }

    /// The crate's error for a failed run.
    pub fn at_run(self) -> BackendError {
        BackendError::Run(self.to_string())
    }
}

/// A driver call's result, named by `what` (running out of memory said as such).
pub fn drv<T>(r: Result<T, DriverError>, what: &str) -> CudaResult<T> {
    r.map_err(|e| {
        let status = format!("{e:?}");
        if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
            CudaError::OutOfMemory {
                call: what.to_string(),
                status,
            }
        } else {
            CudaError::Call {
                call: what.to_string(),
                status,
            }
        }
    })
}

/// A library status, named by `what`: `Ok` on success, running out of memory said as such.
fn status(
    s: impl std::fmt::Debug,
    success: bool,
    alloc_failed: bool,
    what: &str,
) -> CudaResult<()> {
    let (call, status) = (what.to_string(), format!("{s:?}"));
    match (success, alloc_failed) {
        (true, _) => Ok(()),
        (false, true) => Err(CudaError::OutOfMemory { call, status }),
        (false, false) => Err(CudaError::Call { call, status }),
    }
}

/// A cuDNN status, named by `what`.
pub fn dnn_ok(s: dnn::cudnnStatus_t, what: &str) -> CudaResult<()> {
    use dnn::cudnnStatus_t as S;
    status(
        s,
        s == S::CUDNN_STATUS_SUCCESS,
        s == S::CUDNN_STATUS_ALLOC_FAILED,
        what,
    )
}

/// A cuBLASLt status, named by `what`.
pub fn lt_ok(s: lt::cublasStatus_t, what: &str) -> CudaResult<()> {
    use lt::cublasStatus_t as S;
    status(
        s,
        s == S::CUBLAS_STATUS_SUCCESS,
        s == S::CUBLAS_STATUS_ALLOC_FAILED,
        what,
    )
}

/// A cuBLASLt error from cudarc's safe wrappers, named by `what`.
pub fn lt_err(what: &str) -> impl Fn(cudarc::cublaslt::result::CublasError) -> CudaError + '_ {
    move |e| match lt_ok(e.0, what) {
        Err(err) => err,
        Ok(()) => CudaError::Call {
            call: what.to_string(),
            status: format!("{e}"),
        },
    }
}

/// `Ok` when `ok`, else a shape error saying `why`.
pub fn ensure(ok: bool, why: impl FnOnce() -> String) -> CudaResult<()> {
    if ok {
        Ok(())
    } else {
        Err(CudaError::Shape(why()))
    }
}

/// What the engine set up itself, or an internal error naming what is missing.
pub fn have<T>(v: Option<T>, what: &str) -> CudaResult<T> {
    v.ok_or_else(|| CudaError::Internal(format!("{what} missing")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_as_before() {
        // (A DriverError's text comes from the driver itself, absent here: the variant is
        // built as `drv` builds it.)
        let e = CudaError::OutOfMemory {
            call: "cuMemAlloc".into(),
            status: "CUDA_ERROR_OUT_OF_MEMORY".into(),
        };
        assert_eq!(
            e.to_string(),
            "cuMemAlloc: out of device memory (CUDA_ERROR_OUT_OF_MEMORY)"
        );
        assert!(matches!(
            dnn_ok(dnn::cudnnStatus_t::CUDNN_STATUS_ALLOC_FAILED, "cudnnCreate"),
            Err(CudaError::OutOfMemory { .. })
        ));
        assert_eq!(
            lt_ok(
                lt::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED,
                "cublasLtMatmul"
            )
            .unwrap_err()
            .to_string(),
            "cublasLtMatmul: CUBLAS_STATUS_NOT_SUPPORTED"
        );
        let s = CudaError::Shape("dims [2] hold 2 elements, the output 3".into())
            .in_step("v", Some("View"));
        assert_eq!(
            s.to_string(),
            "step `v` (View): dims [2] hold 2 elements, the output 3"
        );
        let b = s.at_build(Precision::Int8).to_string();
        assert!(b.starts_with("building the"), "{b}");
        assert!(b.contains("step `v` (View)"), "{b}");
        let n = CudaError::Nvrtc {
            stage: "compile",
            status: "NVRTC_ERROR_COMPILATION".into(),
            log: "kernels/pool.cu(3): error".into(),
        };
        assert_eq!(
            n.to_string(),
            "NVRTC compile: NVRTC_ERROR_COMPILATION: kernels/pool.cu(3): error"
        );
    }
}
