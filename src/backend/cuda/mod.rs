//! The CUDA backend (cuDNN + cuBLASLt + NVRTC through cudarc, loaded at run time).
//! Placeholder while the engine builder is written: `check` says it cannot run.

use super::{Backend, BackendError, BackendKind, BuildInput, BuildSpec, Engine};

#[derive(Default)]
pub struct CudaBackend;

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }
    fn check(&self) -> Result<String, String> {
        Err("the CUDA engine builder is not part of this build yet".into())
    }
    fn build(
        &self,
        _input: BuildInput<'_>,
        _spec: BuildSpec,
    ) -> Result<Box<dyn Engine>, BackendError> {
        Err(BackendError::Unavailable {
            backend: "cuda",
            why: self.check().err().unwrap_or_default(),
        })
    }
}
