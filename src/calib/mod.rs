//! Calibration statistics: one FP32 pass collects a growing |x| histogram per quantized
//! tensor; every method's ranges are then computed from the same statistics, so switching
//! method needs no new pass. Statistics are cached on disk by (model, images, preprocessing).

mod histogram;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use histogram::{Histogram, Method};

/// Statistics of one calibration pass.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// What the statistics were collected from (see [`cache_key`]).
    pub key: String,
    pub images: usize,
    pub tensors: BTreeMap<String, Histogram>,
}

/// amax per activation tensor, by one method.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ranges {
    pub method: Method,
    pub percentile: f64,
    pub amax: BTreeMap<String, f32>,
    /// Per quantized node, a shift added to its float bias (per output channel) so that its
    /// quantized output has the FP32 output's mean: empirical bias correction. Empty when
    /// not computed.
    #[serde(default)]
    pub bias_correction: BTreeMap<String, Vec<f32>>,
}

impl Stats {
    pub fn new(key: String, tensors: &[String]) -> Stats {
        Stats {
            key,
            images: 0,
            tensors: tensors
                .iter()
                .map(|t| (t.clone(), Histogram::default()))
                .collect(),
        }
    }

    /// Adds one image's activations, in the order of `names`.
    /// Each tensor's histogram is its own, so they are filled in parallel (a ResNet-50 image's
    /// 50-odd tensors are 10 M values): the same statistics as one after the other.
    pub fn add<T: AsRef<[f32]> + Sync>(&mut self, names: &[String], values: &[T]) {
        use rayon::prelude::*;
        let index: std::collections::HashMap<&str, usize> = names
            .iter()
            .enumerate()
            .map(|(k, n)| (n.as_str(), k))
            .collect();
        self.tensors.par_iter_mut().for_each(|(n, h)| {
            if let Some(v) = index.get(n.as_str()).and_then(|&k| values.get(k)) {
                h.add(v.as_ref());
            }
        });
        self.images += 1;
    }

    /// Ranges by `method`, the tensors split over the machine's cores (entropy and MSE are
    /// quadratic in the bin count).
    pub fn ranges(&self, method: Method, percentile: f64) -> Ranges {
        let items: Vec<(&String, &Histogram)> = self.tensors.iter().collect();
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(8);
        let chunk = items.len().div_ceil(threads).max(1);
        let amax = std::thread::scope(|s| {
            let handles: Vec<_> = items
                .chunks(chunk)
                .map(|c| {
                    s.spawn(move || {
                        c.iter()
                            .map(|(n, h)| ((*n).clone(), h.amax_for(method, percentile)))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_default())
                .collect()
        });
        Ranges {
            method,
            percentile,
            amax,
            bias_correction: BTreeMap::new(),
        }
    }
}

/// A key naming a calibration pass: model, tensors, image files (path, size, mtime),
/// preprocessing and input size. Any change gives a new key and so a new pass.
pub fn cache_key(
    model_fingerprint: &str,
    tensors: &[String],
    images: &[PathBuf],
    preprocess: &str,
) -> String {
    let mut h = blake3::Hasher::new();
    h.update(model_fingerprint.as_bytes());
    for t in tensors {
        h.update(t.as_bytes());
        h.update(b"\0");
    }
    for p in images {
        // Keyed by the file, not its spelling: `calib/x.png` and `/abs/calib/x.png` share
        // statistics.
        let p = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
        h.update(p.to_string_lossy().as_bytes());
        let p = &p;
        if let Ok(m) = std::fs::metadata(p) {
            h.update(&m.len().to_le_bytes());
            if let Ok(t) = m.modified().and_then(|t| {
                t.duration_since(std::time::UNIX_EPOCH)
                    .map_err(std::io::Error::other)
            }) {
                h.update(&t.as_nanos().to_le_bytes());
            }
        }
    }
    h.update(preprocess.as_bytes());
    h.finalize().to_hex()[..24].to_string()
}

/// Where statistics are kept between runs.
#[derive(Clone, Debug)]
pub struct StatsCache {
    pub dir: PathBuf,
}

impl StatsCache {
    /// `$QUANTSCOPE_CACHE`, else `$XDG_CACHE_HOME/quantscope`, else `~/.cache/quantscope`.
    pub fn default_dir() -> PathBuf {
        if let Some(d) = std::env::var_os("QUANTSCOPE_CACHE") {
            return PathBuf::from(d);
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(std::env::temp_dir);
        base.join("quantscope")
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join("stats").join(format!("{key}.json"))
    }

    /// Cached statistics for `key`: `Ok(None)` on a miss; `Err` when a file is there but damaged
    /// or edited (its checksum does not match its content), so the caller says so and
    /// recomputes.
    pub fn load(&self, key: &str) -> Result<Option<Stats>, String> {
        let path = self.path(key);
        let Ok(bytes) = crate::files::read_input(&path, 1 << 30) else {
            return Ok(None);
        };
        let bad = |why: &str| format!("{}: {why}; recomputing the statistics", path.display());
        let sealed: Sealed = serde_json::from_slice(&bytes).map_err(|_| bad("unreadable"))?;
        if sealed.checksum != checksum(&sealed.stats) {
            return Err(bad(
                "its checksum does not match its content (edited or damaged)",
            ));
        }
        Ok(Some(sealed.stats).filter(|s| s.key == key))
    }

    /// Writes `stats` with a checksum of its content, atomically.
    pub fn store(&self, stats: &Stats) -> Result<PathBuf, crate::files::OutputError> {
        let p = self.path(&stats.key);
        let sealed = Sealed {
            checksum: checksum(stats),
            stats: stats.clone(),
        };
        let bytes = serde_json::to_vec(&sealed).unwrap_or_default();
        crate::files::write(&p, bytes)?;
        Ok(p)
    }
}

/// The cache file: statistics and a BLAKE3 hash of them, so an edited file is noticed.
#[derive(Serialize, Deserialize)]
struct Sealed {
    checksum: String,
    stats: Stats,
}

fn checksum(stats: &Stats) -> String {
    blake3::hash(&serde_json::to_vec(stats).unwrap_or_default())
        .to_hex()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edited_cache_is_refused_and_a_sound_one_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = StatsCache {
            dir: dir.path().into(),
        };
        let mut stats = Stats::new("k1".into(), &["t".to_string()]);
        stats.add(&["t".to_string()], &[vec![0.5f32, -2.0]]);
        let p = cache.store(&stats).expect("store");
        assert_eq!(cache.load("k1"), Ok(Some(stats.clone())));
        assert_eq!(cache.load("other"), Ok(None));
        let text = std::fs::read_to_string(&p).expect("read");
        std::fs::write(&p, text.replacen("\"images\":1", "\"images\":7", 1)).expect("edit");
        let e = cache.load("k1").unwrap_err();
        assert!(e.contains("checksum"), "{e}");
    }
}
