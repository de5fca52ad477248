//! Runs experiments on a named background thread, fed by bounded channels; the UI polls
//! events tagged with a job id and drops stale ones. A second named thread does the light
//! work the UI must not do itself: inspecting a model, scanning data folders, decoding
//! images for thumbnails and the preprocessing preview, checking backends, file dialogs.

mod io;

use std::path::PathBuf;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};

use crate::backend::BackendKind;
use crate::data::{Preprocess, Selection};
use crate::experiment::Experiment;
use crate::model::{Layout, ModelInfo, Task};
use crate::pipeline::{self, Artifacts, CancelToken, Sink};
use crate::report::{Report, Row};
use crate::sensitivity::{self, SensitivityOptions, SensitivityReport};

pub use io::{CalibScan, DialogKind, EvalScan, FileDialog, PreviewImage};

pub type JobId = u64;

/// What the worker tells the UI.
#[derive(Debug)]
pub enum Event {
    Progress {
        job: JobId,
        stage: String,
        done: usize,
        total: usize,
    },
    Log {
        job: JobId,
        line: String,
    },
    Row {
        job: JobId,
        row: Box<Row>,
    },
    Finished {
        job: JobId,
        report: Box<Report>,
        artifacts: Box<Artifacts>,
    },
    Failed {
        job: JobId,
        error: String,
    },
    /// A per-layer sensitivity analysis finished, or why it failed.
    Sensitivity {
        job: JobId,
        result: Result<Box<SensitivityReport>, String>,
    },
    /// A model's description, or why it could not be read.
    Inspected {
        job: JobId,
        path: PathBuf,
        result: Result<Box<ModelInfo>, String>,
    },
    /// The drawing of `path`'s graph, laid out, or why it could not be made.
    Diagram {
        job: JobId,
        path: PathBuf,
        result: Result<std::sync::Arc<crate::model::diagram::Diagram>, String>,
    },
    /// What the CUDA planner cannot take in `path`'s model, per precision (planned, not
    /// built: no GPU needed); asked after the model's description, as it takes longer.
    CudaCoverage {
        job: JobId,
        path: PathBuf,
        coverage: crate::backend::cuda::Coverage,
    },
    CalibScanned {
        job: JobId,
        result: Result<CalibScan, String>,
    },
    EvalScanned {
        job: JobId,
        result: Result<EvalScan, String>,
    },
    Preview {
        job: JobId,
        result: Result<PreviewImage, String>,
    },
    /// A decoded image (for the mask views), at most `max_side` pixels on its long side.
    Image {
        job: JobId,
        path: PathBuf,
        result: Result<image::RgbImage, String>,
    },
    /// Each backend: the device description, or why it cannot run here.
    Backends {
        job: JobId,
        status: Vec<(BackendKind, Result<String, String>)>,
        /// ONNX Runtime for the CPU engine: its version and library, or why it is not found.
        ort: Result<crate::backend::cpu::onnxruntime::runtime::OrtFound, String>,
    },
    /// Q/DQ models and calibration caches written: the files, or why not.
    Exported {
        job: JobId,
        result: Result<Vec<PathBuf>, String>,
        /// The ONNX Runtime check of each strongly typed model, one line each.
        checks: Vec<String>,
    },
    /// A file dialog's answer. `dialog_ms` tells a cancelled dialog from a missing portal
    /// (which answers `None` at once).
    Picked {
        job: JobId,
        path: Option<PathBuf>,
        dialog_ms: f64,
    },
}

impl Event {
    pub fn job(&self) -> JobId {
        match self {
            Event::Progress { job, .. }
            | Event::Log { job, .. }
            | Event::Row { job, .. }
            | Event::Finished { job, .. }
            | Event::Failed { job, .. }
            | Event::Sensitivity { job, .. }
            | Event::Inspected { job, .. }
            | Event::Diagram { job, .. }
            | Event::CudaCoverage { job, .. }
            | Event::CalibScanned { job, .. }
            | Event::EvalScanned { job, .. }
            | Event::Preview { job, .. }
            | Event::Image { job, .. }
            | Event::Backends { job, .. }
            | Event::Exported { job, .. }
            | Event::Picked { job, .. } => *job,
        }
    }
}

enum Request {
    Run {
        job: JobId,
        experiment: Box<Experiment>,
        cancel: CancelToken,
    },
    Sensitivity {
        job: JobId,
        experiment: Box<Experiment>,
        options: Box<SensitivityOptions>,
        cancel: CancelToken,
    },
}

/// Light requests, answered by the I/O thread.
#[derive(Debug, Clone)]
pub enum IoRequest {
    Inspect {
        path: PathBuf,
    },
    CudaCoverage {
        path: PathBuf,
    },
    /// The Graph tab's drawing of the model, laid out (a ViT-B/16 takes a moment).
    Diagram {
        path: PathBuf,
    },
    ScanCalib {
        dir: PathBuf,
        select: Selection,
        thumbs: usize,
        thumb_px: u32,
    },
    ScanEval {
        dir: PathBuf,
        task: Option<Task>,
        /// The experiment's class-name file, and whether the user named it (it then defines
        /// the class order over the folder's `labels.txt`) or it was found beside the model.
        labels: Option<(PathBuf, bool)>,
    },
    Preview {
        image: PathBuf,
        preprocess: Preprocess,
        hw: [usize; 2],
        channels: usize,
        layout: Layout,
    },
    Image {
        path: PathBuf,
        max_side: u32,
    },
    CheckBackends,
    Dialog(FileDialog),
    /// Write each INT8 engine's Q/DQ ONNX model and TensorRT calibration cache into `dir`.
    ExportQdq {
        dir: PathBuf,
        model: PathBuf,
        qdq: Vec<crate::pipeline::QdqArtifact>,
        check: ExportCheck,
    },
}

/// What the ONNX Runtime check of a window export runs on: the run's input size, and one of its
/// evaluation images (a constant input where it had none) preprocessed as the run did.
#[derive(Clone, Debug)]
pub struct ExportCheck {
    pub hw: [usize; 2],
    pub image: Option<PathBuf>,
    pub preprocess: crate::data::Preprocess,
    /// The run's FP16 overflow guard lists: the exports keep the same layers in FP32.
    pub fp16_guard: crate::fp16_guard::Guards,
}

/// Why a request could not be queued.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the worker is busy; try again")]
    Busy,
    #[error("the worker thread has stopped")]
    Stopped,
}

/// Handle the UI keeps: submit jobs, cancel them, drain events.
pub struct Worker {
    requests: Sender<Request>,
    io_requests: Sender<(JobId, IoRequest)>,
    pub events: Receiver<Event>,
    next_job: JobId,
    current: Option<(JobId, CancelToken)>,
    _threads: [JoinHandle<()>; 2],
}

struct ChannelSink {
    job: JobId,
    tx: Sender<Event>,
}

impl Sink for ChannelSink {
    fn progress(&self, stage: &str, done: usize, total: usize) {
        // Progress is droppable: never block the pipeline on a slow UI.
        let _ = self.tx.try_send(Event::Progress {
            job: self.job,
            stage: stage.into(),
            done,
            total,
        });
    }
    fn log(&self, line: &str) {
        let _ = self.tx.send(Event::Log {
            job: self.job,
            line: line.into(),
        });
    }
    fn row(&self, row: &Row) {
        let _ = self.tx.send(Event::Row {
            job: self.job,
            row: Box::new(row.clone()),
        });
    }
}

impl Worker {
    pub fn spawn() -> std::io::Result<Worker> {
        let (req_tx, req_rx) = bounded::<Request>(4);
        let (io_tx, io_rx) = bounded::<(JobId, IoRequest)>(32);
        let (ev_tx, ev_rx) = bounded::<Event>(256);
        let run_events = ev_tx.clone();
        let thread = std::thread::Builder::new()
            .name("quantscope-worker".into())
            .spawn(move || {
                for req in req_rx {
                    let ev = match req {
                        Request::Run {
                            job,
                            experiment,
                            cancel,
                        } => {
                            let sink = ChannelSink {
                                job,
                                tx: run_events.clone(),
                            };
                            // A panic anywhere in the run becomes a failed job: the UI
                            // returns to idle and this thread takes the next job.
                            let ran = crate::guard::catch("running the experiment", || {
                                pipeline::run(&experiment, &sink, &cancel)
                                    .map_err(|e| format!("{e:#}"))
                            });
                            match ran.and_then(|r| r) {
                                Ok(out) => {
                                    for e in &out.output_errors {
                                        sink.log(&format!("could not write an output: {e}"));
                                    }
                                    Event::Finished {
                                        job,
                                        report: Box::new(out.report),
                                        artifacts: Box::new(out.artifacts),
                                    }
                                }
                                Err(error) => Event::Failed { job, error },
                            }
                        }
                        Request::Sensitivity {
                            job,
                            experiment,
                            options,
                            cancel,
                        } => {
                            let sink = ChannelSink {
                                job,
                                tx: run_events.clone(),
                            };
                            let ran = crate::guard::catch("analysing layers", || {
                                sensitivity::run(&experiment, &options, &sink, &cancel)
                                    .map(|(report, _qdq)| Box::new(report))
                                    .map_err(|e| format!("{e:#}"))
                            });
                            Event::Sensitivity {
                                job,
                                result: ran.and_then(|r| r),
                            }
                        }
                    };
                    let _ = run_events.send(ev);
                }
            })?;
        let io_thread = std::thread::Builder::new()
            .name("quantscope-io".into())
            .spawn(move || {
                for (job, req) in io_rx {
                    let ev = io::answer_guarded(job, req);
                    if ev_tx.send(ev).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Worker {
            requests: req_tx,
            io_requests: io_tx,
            events: ev_rx,
            next_job: 1,
            current: None,
            _threads: [thread, io_thread],
        })
    }

    fn next_id(&mut self) -> JobId {
        let job = self.next_job;
        self.next_job += 1;
        job
    }

    /// Starts `experiment`, cancelling the job in flight. Returns the new job's id.
    pub fn submit(&mut self, experiment: Experiment) -> JobId {
        self.cancel();
        let job = self.next_id();
        let cancel = CancelToken::default();
        self.current = Some((job, cancel.clone()));
        let _ = self.requests.try_send(Request::Run {
            job,
            experiment: Box::new(experiment),
            cancel,
        });
        job
    }

    /// Starts a per-layer sensitivity analysis of `experiment`, cancelling the job in
    /// flight. Returns the new job's id.
    pub fn submit_sensitivity(
        &mut self,
        experiment: Experiment,
        options: SensitivityOptions,
    ) -> JobId {
        self.cancel();
        let job = self.next_id();
        let cancel = CancelToken::default();
        self.current = Some((job, cancel.clone()));
        let _ = self.requests.try_send(Request::Sensitivity {
            job,
            experiment: Box::new(experiment),
            options: Box::new(options),
            cancel,
        });
        job
    }

    /// Queues a light request on the I/O thread without waiting. Returns its job id.
    pub fn request(&mut self, req: IoRequest) -> Result<JobId, SubmitError> {
        let job = self.next_id();
        match self.io_requests.try_send((job, req)) {
            Ok(()) => Ok(job),
            Err(TrySendError::Full(_)) => Err(SubmitError::Busy),
            Err(TrySendError::Disconnected(_)) => Err(SubmitError::Stopped),
        }
    }

    pub fn cancel(&mut self) {
        if let Some((_, c)) = &self.current {
            c.cancel();
        }
    }

    pub fn current_job(&self) -> Option<JobId> {
        self.current.as_ref().map(|c| c.0)
    }
}
