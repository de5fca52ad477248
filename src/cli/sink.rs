//! Where a command-line run reports: a progress bar on stderr (a plain progress line every few
//! seconds where stderr is not a terminal), log lines above it, one line per finished row.

use std::sync::Mutex;

use indicatif::{ProgressBar, ProgressStyle};

use crate::pipeline::Sink;
use crate::report::Row;

/// Progress bar on stderr, log lines above it.
pub struct CliSink {
    bar: ProgressBar,
    stage: Mutex<String>,
    /// Where stderr is not a terminal (a log file, CI), the bar is hidden: a plain line then says
    /// where the run is, at most every [`PLAIN_PROGRESS_EVERY`]. `None` on a terminal.
    plain: Option<Mutex<std::time::Instant>>,
}

/// How often a redirected run prints a plain progress line.
const PLAIN_PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

impl CliSink {
    pub fn new() -> Self {
        let bar = ProgressBar::new(1);
        bar.set_style(
            ProgressStyle::with_template("{msg:32} [{bar:30}] {pos}/{len} ({eta} left)")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        use std::io::IsTerminal;
        CliSink {
            bar,
            stage: Mutex::new(String::new()),
            plain: (!std::io::stderr().is_terminal())
                .then(|| Mutex::new(std::time::Instant::now())),
        }
    }
}

impl CliSink {
    /// Takes the bar off the terminal, before the result table is printed.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Default for CliSink {
    fn default() -> Self {
        Self::new()
    }
}

impl Sink for CliSink {
    fn progress(&self, stage: &str, done: usize, total: usize) {
        if let Some(Ok(mut last)) = self.plain.as_ref().map(|m| m.lock())
            && last.elapsed() >= PLAIN_PROGRESS_EVERY
        {
            *last = std::time::Instant::now();
            eprintln!("progress: {stage} {done}/{total}");
        }
        if let Ok(mut s) = self.stage.lock()
            && *s != stage
        {
            *s = stage.to_string();
            self.bar.reset();
            self.bar.set_message(stage.to_string());
        }
        self.bar.set_length(total.max(1) as u64);
        self.bar.set_position(done as u64);
    }
    fn log(&self, line: &str) {
        self.bar.suspend(|| eprintln!("{line}"));
    }
    fn row(&self, row: &Row) {
        let m = row
            .metric()
            .map(|v| format!("{:.2} %", v * 100.0))
            .unwrap_or_else(|| "–".into());
        let l = row
            .latency_ms
            .map(|l| format!("{:.2} ms", l.median))
            .unwrap_or_else(|| "–".into());
        match (&row.error, &row.non_finite) {
            (Some(e), _) => self.log(&format!("{:<16} error: {e}", row.label())),
            (None, Some(n)) => self.log(&format!("{:<16} {}", row.label(), n.reason())),
            (None, None) => self.log(&format!(
                "{:<16} metric {m:>9}  latency {l:>10}",
                row.label()
            )),
        }
    }
}
