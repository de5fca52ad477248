//! quantscope: calibrate, quantize and compare FP32 / FP16 / INT8 engines for ONNX vision
//! models. Data flows one way through typed stages:
//!
//! ```text
//! model (ONNX -> Model) -> calib (Stats -> Ranges) -> quant (QuantPlan -> QdqModel)
//!        \-> backend (Backend::build -> Engine) -> eval / bench -> report (Report)
//! ```
//!
//! | module | owns |
//! |---|---|
//! | [`model`] | reading ONNX, graph preparation (BN folding), op census, task detection, the drawing of the graph (`diagram`) |
//! | [`data`] | image folders, evaluation layouts, preprocessing |
//! | [`calib`] | histograms and the four amax methods, the statistics cache |
//! | [`precision`] | `Precision` (FP32 / FP16 / INT8 / FP8), shared by `quant` and `backend` |
//! | [`fp16_guard`] | the layers FP16 keeps in FP32 because their calibrated ranges leave FP16's |
//! | [`quant`] | Q/DQ placement (TensorRT rules), Q/DQ ONNX and calibration cache |
//! | [`prepare`] | the INT8 preparation: CLE, activation centering, GPTQ, bias correction (per-layer or full, chosen by output SQNR) |
//! | [`backend`] | `Backend` / `Engine`; `cpu` (ONNX Runtime or tract) and `cuda` |
//! | [`eval`], [`bench`], [`report`] | metrics, timing and memory, output formats |
//! | [`experiment`], [`pipeline`], [`worker`] | what to run, running it, running it off the UI thread |
//! | [`timing`] | latency statistics (median, p90, p99) from timed samples |
//! | [`decide`] | choices made by measuring: a default, replaced only by a margin beyond noise |
//! | [`layerwise`] | per-layer isolation of quantization error (sensitivity, per-layer bias correction) |
//! | [`guard`] | the panic boundary around engines and worker jobs |
//! | [`host`] | what the machine has to give (memory available) |
//! | [`export`] | strongly typed FP16 / mixed / INT8 exports, trtexec lines, ONNX Runtime checks |
//! | [`files`] | atomic output writes; refusing an output that is an input |
//! | [`ui`] | the desktop workbench |
//! | [`cli`] | the command line |

pub mod backend;
pub mod bench;
pub mod calib;
pub mod cli;
pub mod data;
pub mod decide;
pub mod eval;
pub mod experiment;
pub mod export;
pub mod files;
pub mod fp16_guard;
pub mod fp16_regions;
pub mod guard;
pub mod host;
pub mod layerwise;
pub mod model;
pub mod pipeline;
pub mod precision;
pub mod prepare;
pub mod quant;
pub mod report;
pub mod sensitivity;
pub mod timing;
pub mod ui;
pub mod worker;
