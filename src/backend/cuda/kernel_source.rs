//! The NVRTC program of the CUDA kernels: the files of `kernels/` put together in one string.

/// `kernels/` as one program, in the order its definitions need: the headers first, then
/// the kernel files, a family each. The engine compiles it as one NVRTC program and loads
/// every kernel by name from that one module. Each file comes after a `#line 1 "file"`
/// directive, so NVRTC's errors and warnings name the file and its line, and ends with a
/// newline of its own, so the next directive starts a line.
macro_rules! program {
    ($($file:literal),+ $(,)?) => {
        concat!($("#line 1 \"", $file, "\"\n", include_str!(concat!("kernels/", $file)), "\n"),+)
    };
}

pub(crate) const KERNELS: &str = program!(
    "common.cuh",
    "epi_i8.cuh",
    "conv.cu",
    "conv_dw.cu",
    "conv_pw_i8.cu",
    "conv_i8_mma.cu",
    "conv_i8_wgmma.cu",
    "elementwise.cu",
    "movement.cu",
    "norm.cu",
    "matmul.cu",
    "pool.cu",
    "resize.cu",
);
