//! The rows' latencies timed side by side: each row's engines are timed alone as the row
//! finishes (so a streamed or cancelled row has its numbers), then kept, and once every row is
//! done they take turns ([`bench::measure_side_by_side`]) and the rows' latencies become those
//! turns' medians. Timed one after another, a drift over the run (a GPU's clocks, a
//! neighbour's load) lands on whichever row comes later: on an H200, INT8 rows that ran FP16's
//! kernels layer for layer came out 1.4-3.7 % slower than the FP16 row.

use super::*;
use crate::bench::Contestant;

/// Engines kept for the side-by-side timing in host memory take at most this much together
/// (their weights, activations and workspace), and at most a quarter of what the host has
/// available. Engines on a GPU take at most a quarter of the device memory free to them (what
/// was free once the engine was built, plus what the kept engines and it hold). Past either,
/// an engine is dropped after its own timing and its row keeps that timing.
const HOST_BYTES_LIMIT: u64 = 2 << 30;

/// An engine kept after its row's own timing, the batch it was built for and the memory it
/// holds (on the host, or on the device).
pub(super) struct KeptEngine {
    engine: Box<dyn Engine>,
    batch: usize,
    bytes: Held,
}

/// Bytes a kept engine holds, and where.
#[derive(Clone, Copy)]
enum Held {
    Host(u64),
    Device(u64),
}

/// The engines kept so far.
#[derive(Default)]
pub(super) struct SideBySide {
    /// The engines of the row being made, until it is pushed (with no error).
    pending: Vec<KeptEngine>,
    /// Each pushed row's engines, with the row's index in the report.
    kept: Vec<(usize, KeptEngine)>,
    host_bytes: u64,
    device_bytes: u64,
    /// Engines dropped for memory: their rows keep their own timing.
    left_out: usize,
}

impl SideBySide {
    /// Keeps `engine` (built for `batch`, timed) for the row being made, if memory allows.
    pub(super) fn keep(&mut self, engine: Box<dyn Engine>, batch: usize) {
        let info = engine.info();
        let (bytes, fits) = match (info.device_mem_bytes, info.device_free_bytes) {
            (Some(d), Some(free)) => (
                Held::Device(d),
                // `free` was measured with the kept engines and this one on the device.
                4 * (self.device_bytes + d) <= free + self.device_bytes + d,
            ),
            _ => {
                let h = info.weights_bytes + info.activations_bytes + info.workspace_bytes;
                let limit = crate::host::available_memory_bytes()
                    .map_or(HOST_BYTES_LIMIT, |a| (a / 4).min(HOST_BYTES_LIMIT));
                (Held::Host(h), self.host_bytes + h <= limit)
            }
        };
        if !fits {
            self.left_out += 1;
            return;
        }
        self.count(bytes, true);
        self.pending.push(KeptEngine {
            engine,
            batch,
            bytes,
        });
    }

    fn count(&mut self, bytes: Held, add: bool) {
        let (total, b) = match bytes {
            Held::Host(b) => (&mut self.host_bytes, b),
            Held::Device(b) => (&mut self.device_bytes, b),
        };
        *total = if add {
            *total + b
        } else {
            total.saturating_sub(b)
        };
    }

    /// A new row begins: what an unfinished one left is not any row's.
    pub(super) fn begin_row(&mut self) {
        self.drop_pending();
    }

    /// The row being made was pushed as row `index`; a failed row's engines are dropped.
    pub(super) fn row_pushed(&mut self, index: usize, failed: bool) {
        if failed {
            self.drop_pending();
        } else {
            let pending = std::mem::take(&mut self.pending);
            self.kept.extend(pending.into_iter().map(|k| (index, k)));
        }
    }

    fn drop_pending(&mut self) {
        for k in std::mem::take(&mut self.pending) {
            self.count(k.bytes, false);
        }
    }
}

impl Rows<'_> {
    /// Times the kept engines side by side and puts their medians in their rows; nothing to do
    /// with fewer than two rows' engines. The log gives each engine's change from its own
    /// timing, and the report says how the latencies were timed.
    pub(super) fn time_side_by_side(&mut self) {
        let mut sbs = std::mem::take(&mut *self.ctx.side_by_side.borrow_mut());
        let rows: HashSet<usize> = sbs.kept.iter().map(|(i, _)| *i).collect();
        if rows.len() < 2 || self.ctx.cancel.is_cancelled() {
            return;
        }
        let single = &self.ctx.bench_input;
        let batched = match sbs.kept.iter().any(|(_, k)| k.batch > 1) {
            true => self.ctx.batched_input(),
            false => vec![],
        };
        let mut contestants: Vec<Contestant<'_>> = sbs
            .kept
            .iter_mut()
            .map(|(_, k)| Contestant {
                input: if k.batch == 1 { single } else { &batched },
                engine: k.engine.as_mut(),
            })
            .collect();
        let stage = "timing the rows side by side";
        let sink = self.ctx.sink;
        let cancel = self.ctx.cancel;
        let timed = crate::guard::catch(stage, || {
            bench::measure_side_by_side(
                &mut contestants,
                self.ctx.bench_spec,
                &|| !cancel.is_cancelled(),
                &|done, total| sink.progress(stage, done, total),
            )
        });
        drop(contestants);
        let results = match timed {
            Ok(r) if !cancel.is_cancelled() => r,
            Ok(_) => return,
            Err(e) => {
                sink.log(&format!("{e}; every row keeps its own timing"));
                return;
            }
        };
        let mut changes = vec![];
        for ((i, k), r) in sbs.kept.iter().zip(results) {
            let row = &mut self.report.rows[*i];
            let what = match k.batch {
                1 => row.label(),
                n => format!("{} at batch {n}", row.label()),
            };
            let l = match r {
                Ok(l) if l.runs > 0 => l,
                Ok(_) => continue,
                Err(e) => {
                    sink.log(&format!(
                        "{what}: not timed side by side ({e}); its own timing stands"
                    ));
                    continue;
                }
            };
            let (latency, throughput) = match k.batch {
                1 => (&mut row.latency_ms, &mut row.throughput_ips),
                _ => (&mut row.latency_batch_ms, &mut row.throughput_batch_ips),
            };
            if let Some(alone) = latency {
                changes.push(format!("{what} {:.3} → {:.3} ms", alone.median, l.median));
            }
            *latency = Some(l);
            *throughput = (l.median > 0.0).then(|| k.batch as f64 * 1e3 / l.median);
        }
        let left_out = match sbs.left_out {
            0 => String::new(),
            n => format!(
                " {n} engine(s) were not kept for it (the kept engines would have held more than \
                 {} MiB of host memory, or a quarter of the GPU's free memory): their rows keep \
                 their own timing.",
                HOST_BYTES_LIMIT >> 20
            ),
        };
        let note = format!(
            "Latencies were timed side by side: the {} engines of {} rows took turns of about \
             {:.0} ms (the first run of each not counted) until each had its runs and time, so \
             a drift over the run weighs on every row alike.{left_out}",
            sbs.kept.len(),
            rows.len(),
            bench::TURN_MS,
        );
        sink.log(&format!(
            "timed side by side (median alone → side by side): {}",
            changes.join("; ")
        ));
        self.report.notes.push(note);
        sbs.kept.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{BackendError, EngineInfo, Output};

    struct Held(EngineInfo);
    impl Engine for Held {
        fn info(&self) -> &EngineInfo {
            &self.0
        }
        fn batch(&self) -> usize {
            1
        }
        fn run(&mut self, _: &[f32]) -> Result<Output, BackendError> {
            unreachable!("only kept")
        }
    }

    fn on_gpu(bytes: u64, free: u64) -> Box<dyn Engine> {
        Box::new(Held(EngineInfo {
            device_mem_bytes: Some(bytes),
            device_free_bytes: Some(free),
            // Host-side figures of a GPU engine do not count against the host's limit.
            weights_bytes: 1 << 40,
            ..Default::default()
        }))
    }

    #[test]
    fn gpu_engines_are_kept_up_to_a_quarter_of_the_free_device_memory() {
        let mut s = SideBySide::default();
        // 100 units free at first; each kept engine holds 10 of them (a quarter is 25).
        s.begin_row();
        s.keep(on_gpu(10, 90), 1);
        s.keep(on_gpu(10, 80), 8);
        s.row_pushed(0, false);
        // A failed row's engines are dropped and their memory no longer counted.
        s.begin_row();
        s.keep(on_gpu(5, 75), 1);
        assert_eq!(s.device_bytes, 25);
        s.row_pushed(1, true);
        assert_eq!(s.device_bytes, 20);
        // A third engine of 10 would hold 30 of the 100.
        s.begin_row();
        s.keep(on_gpu(10, 70), 1);
        s.keep(on_gpu(4, 76), 8);
        s.row_pushed(2, false);
        assert_eq!((s.left_out, s.device_bytes, s.host_bytes), (1, 24, 0));
        assert_eq!(
            s.kept
                .iter()
                .map(|(i, k)| (*i, k.batch))
                .collect::<Vec<_>>(),
            [(0, 1), (0, 8), (2, 8)]
        );
    }
}
