//! Runs experiments on a named background thread, fed by bounded channels; the UI polls
//! events tagged with a job id and drops stale ones.

use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, bounded};

use crate::experiment::Experiment;
use crate::pipeline::{self, Artifacts, CancelToken, Sink};
use crate::report::{Report, Row};

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
}

impl Event {
    pub fn job(&self) -> JobId {
        match self {
            Event::Progress { job, .. }
            | Event::Log { job, .. }
            | Event::Row { job, .. }
            | Event::Finished { job, .. }
            | Event::Failed { job, .. } => *job,
        }
    }
}

enum Request {
    Run {
        job: JobId,
        experiment: Box<Experiment>,
        cancel: CancelToken,
    },
}

/// Handle the UI keeps: submit jobs, cancel them, drain events.
pub struct Worker {
    requests: Sender<Request>,
    pub events: Receiver<Event>,
    next_job: JobId,
    current: Option<(JobId, CancelToken)>,
    _thread: JoinHandle<()>,
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
        let (ev_tx, ev_rx) = bounded::<Event>(256);
        let thread = std::thread::Builder::new()
            .name("quantscope-worker".into())
            .spawn(move || {
                for Request::Run {
                    job,
                    experiment,
                    cancel,
                } in req_rx
                {
                    let sink = ChannelSink {
                        job,
                        tx: ev_tx.clone(),
                    };
                    let ev = match pipeline::run(&experiment, &sink, &cancel) {
                        Ok(out) => Event::Finished {
                            job,
                            report: Box::new(out.report),
                            artifacts: Box::new(out.artifacts),
                        },
                        Err(e) => Event::Failed {
                            job,
                            error: format!("{e:#}"),
                        },
                    };
                    let _ = ev_tx.send(ev);
                }
            })?;
        Ok(Worker {
            requests: req_tx,
            events: ev_rx,
            next_job: 1,
            current: None,
            _thread: thread,
        })
    }

    /// Starts `experiment`, cancelling the job in flight. Returns the new job's id.
    pub fn submit(&mut self, experiment: Experiment) -> JobId {
        self.cancel();
        let job = self.next_job;
        self.next_job += 1;
        let cancel = CancelToken::default();
        self.current = Some((job, cancel.clone()));
        let _ = self.requests.try_send(Request::Run {
            job,
            experiment: Box::new(experiment),
            cancel,
        });
        job
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
