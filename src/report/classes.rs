//! Classifier inspection: each engine's confusion matrix (kept sparse), its difference against
//! FP32's, each engine's top-3 with probabilities per image, and the gallery of images an
//! engine flips against FP32 (FP32 right and the engine wrong, or the reverse); with their
//! Markdown sections and CSV forms.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Report, Row};
use crate::backend::Precision;

/// Classes up to which the Markdown report draws whole matrices; past it, the most confused
/// pairs and the largest moves are listed (a 1000 × 1000 grid is unreadable).
pub const GRID_MAX_CLASSES: usize = 30;

/// Images the report's gallery keeps, those with the largest change of the true class's
/// probability first: it travels in the JSON, so it stays bounded on 50 000-image sets.
pub const GALLERY_MAX_IMAGES: usize = 256;

/// Classes each image keeps with its probability (top-3).
pub const TOP_K: usize = 3;

/// An engine's confusion matrix over the evaluation images: rows are the true class, columns
/// the predicted one. Only non-zero cells are kept, so a 1000-class model costs what its
/// mistakes cost, not a million cells.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Confusion {
    /// Classes counted (the matrix is `classes` × `classes`).
    pub classes: usize,
    /// Non-zero cells, `[true class, predicted class, images]`, sorted by true then predicted.
    pub cells: Vec<[u32; 3]>,
}

impl Confusion {
    /// Counts `(true class, predicted class)` pairs. `classes` grows to hold every index seen.
    pub fn from_pairs(classes: usize, pairs: impl IntoIterator<Item = (usize, usize)>) -> Self {
        let mut counts: BTreeMap<(u32, u32), u32> = BTreeMap::new();
        let mut n = classes;
        for (t, p) in pairs {
            n = n.max(t + 1).max(p + 1);
            *counts.entry((t as u32, p as u32)).or_default() += 1;
        }
        Confusion {
            classes: n,
            cells: counts.into_iter().map(|((t, p), c)| [t, p, c]).collect(),
        }
    }

    /// Images of true class `t` predicted as `p`.
    pub fn count(&self, t: usize, p: usize) -> u32 {
        self.cells
            .binary_search_by(|c| (c[0], c[1]).cmp(&(t as u32, p as u32)))
            .map(|i| self.cells[i][2])
            .unwrap_or(0)
    }

    /// Images whose true class is `t`.
    pub fn row_total(&self, t: usize) -> u32 {
        self.cells
            .iter()
            .filter(|c| c[0] as usize == t)
            .map(|c| c[2])
            .sum()
    }

    /// Images of each true class, in one pass over the cells.
    pub fn row_totals(&self) -> Vec<u32> {
        let mut totals = vec![0u32; self.classes];
        for &[t, _, c] in &self.cells {
            totals[t as usize] += c;
        }
        totals
    }

    /// The whole matrix, `dense()[true][predicted]` (for drawing; small class counts only).
    pub fn dense(&self) -> Vec<Vec<u32>> {
        let mut m = vec![vec![0u32; self.classes]; self.classes];
        for &[t, p, c] in &self.cells {
            m[t as usize][p as usize] = c;
        }
        m
    }

    /// This matrix minus `base`'s, non-zero cells only, sorted by true then predicted:
    /// positive where this engine sends more images of the true class to the predicted one.
    pub fn diff(&self, base: &Confusion) -> Vec<(usize, usize, i64)> {
        let mut d: BTreeMap<(usize, usize), i64> = BTreeMap::new();
        for &[t, p, c] in &self.cells {
            *d.entry((t as usize, p as usize)).or_default() += c as i64;
        }
        for &[t, p, c] in &base.cells {
            *d.entry((t as usize, p as usize)).or_default() -= c as i64;
        }
        d.into_iter()
            .filter(|(_, v)| *v != 0)
            .map(|((t, p), v)| (t, p, v))
            .collect()
    }

    /// The `n` off-diagonal cells with the most images, most first (ties: by true, predicted).
    pub fn most_confused(&self, n: usize) -> Vec<[u32; 3]> {
        let mut off: Vec<[u32; 3]> = self
            .cells
            .iter()
            .filter(|c| c[0] != c[1])
            .copied()
            .collect();
        off.sort_by(|a, b| b[2].cmp(&a[2]).then((a[0], a[1]).cmp(&(b[0], b[1]))));
        off.truncate(n);
        off
    }
}

/// Class probabilities from one image's scores: the scores themselves when they already are a
/// distribution (non-negative, summing to 1 within 1e-3: a model that ends in Softmax), else
/// their softmax (logits).
pub fn probabilities(scores: &[f32]) -> Vec<f32> {
    let sum: f64 = scores.iter().map(|&v| v as f64).sum();
    if scores.iter().all(|&v| v >= 0.0) && (sum - 1.0).abs() <= 1e-3 {
        return scores.to_vec();
    }
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f64> = scores.iter().map(|&v| ((v - max) as f64).exp()).collect();
    let total: f64 = exp.iter().sum::<f64>().max(f64::MIN_POSITIVE);
    exp.iter().map(|&e| (e / total) as f32).collect()
}

/// One engine on one image: its most probable classes and the true class's probability.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ImageTop {
    /// `(class, probability)`, most probable first; at most [`TOP_K`].
    pub top: Vec<(u32, f32)>,
    /// The probability the engine gave the true class.
    pub true_p: f32,
}

impl ImageTop {
    /// From one image's class scores (logits or probabilities) and its true class. Ties go to
    /// the lower class index, as the top-1 metric's argmax does.
    pub fn from_scores(scores: &[f32], label: usize) -> ImageTop {
        let p = probabilities(scores);
        let mut top: Vec<(u32, f32)> = Vec::with_capacity(TOP_K + 1);
        for (c, &v) in p.iter().enumerate() {
            // Insertion into a list of at most TOP_K: no sort of the whole vector.
            let at = top.iter().position(|&(_, q)| v > q).unwrap_or(top.len());
            if at < TOP_K {
                top.insert(at, (c as u32, v));
                top.truncate(TOP_K);
            }
        }
        ImageTop {
            top,
            true_p: p.get(label).copied().unwrap_or(0.0),
        }
    }

    pub fn top1(&self) -> Option<usize> {
        self.top.first().map(|t| t.0 as usize)
    }
}

/// Which way an engine flipped an image against FP32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Flip {
    /// FP32 right, the engine wrong.
    Lost,
    /// FP32 wrong, the engine right.
    Gained,
}

/// An evaluation image that some engine flipped against FP32, with every engine's top-3.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GalleryImage {
    /// Index into `EvalSummary::image_files` (and each row's `per_image`).
    pub image: usize,
    pub true_class: usize,
    /// Each row's top-3 on this image, in the order of `Report::rows`; `None` for a row with
    /// no result (failed, or its outputs held NaN/Inf).
    pub tops: Vec<Option<ImageTop>>,
}

impl GalleryImage {
    fn right(&self, k: usize) -> Option<bool> {
        let t = self.tops.get(k)?.as_ref()?;
        Some(t.top1() == Some(self.true_class))
    }

    /// How row `k` flipped this image against row `fp32`, if it did.
    pub fn flip(&self, fp32: usize, k: usize) -> Option<Flip> {
        match (self.right(fp32)?, self.right(k)?) {
            (true, false) => Some(Flip::Lost),
            (false, true) => Some(Flip::Gained),
            _ => None,
        }
    }

    /// The true class's probability under row `fp32` minus under row `k` (positive: `k` is
    /// less sure of the right answer).
    pub fn drop(&self, fp32: usize, k: usize) -> Option<f32> {
        let a = self.tops.get(fp32)?.as_ref()?;
        let b = self.tops.get(k)?.as_ref()?;
        Some(a.true_p - b.true_p)
    }
}

/// The images some row flips against the `fp32` row, from every row's top-3 per image
/// (`tops[row][image]`, empty for a row with no result) and the true classes. Keeps the
/// [`GALLERY_MAX_IMAGES`] with the largest change of the true class's probability, in image
/// order.
pub fn gallery(fp32: usize, tops: &[Vec<ImageTop>], labels: &[usize]) -> Vec<GalleryImage> {
    if tops.get(fp32).is_none_or(|t| t.len() != labels.len()) {
        return vec![];
    }
    let mut picked: Vec<(f32, GalleryImage)> = vec![];
    for (i, &label) in labels.iter().enumerate() {
        let entry = GalleryImage {
            image: i,
            true_class: label,
            tops: tops
                .iter()
                .map(|t| (t.len() == labels.len()).then(|| t[i].clone()))
                .collect(),
        };
        let change = (0..tops.len())
            .filter(|&k| k != fp32 && entry.flip(fp32, k).is_some())
            .filter_map(|k| entry.drop(fp32, k))
            .map(f32::abs)
            .reduce(f32::max);
        if let Some(c) = change {
            picked.push((c, entry));
        }
    }
    picked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.image.cmp(&b.1.image)));
    picked.truncate(GALLERY_MAX_IMAGES);
    let mut out: Vec<GalleryImage> = picked.into_iter().map(|(_, g)| g).collect();
    out.sort_by_key(|g| g.image);
    out
}

fn cell_text(s: &str) -> String {
    s.replace('|', "/")
}

fn csv_text(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "'"))
}

impl Report {
    /// The row of the FP32 reference with a result.
    pub fn fp32_index(&self) -> Option<usize> {
        self.rows
            .iter()
            .position(|r| r.precision == Some(Precision::Fp32) && !r.failed())
    }

    /// A class's name, or `class N` where the report has no names.
    pub fn class_name(&self, c: usize) -> String {
        self.evaluation
            .classes
            .get(c)
            .cloned()
            .unwrap_or_else(|| format!("class {c}"))
    }

    /// The gallery as row `k` sees it against FP32: `(image, flip, drop of the true class's
    /// probability)`, the images it lost first, largest drop first, then those it gained,
    /// largest rise first.
    pub fn flips(&self, k: usize) -> Vec<(&GalleryImage, Flip, f32)> {
        let Some(f) = self.fp32_index().filter(|&f| f != k) else {
            return vec![];
        };
        let mut out: Vec<(&GalleryImage, Flip, f32)> = self
            .gallery
            .iter()
            .filter_map(|g| Some((g, g.flip(f, k)?, g.drop(f, k)?)))
            .collect();
        out.sort_by(|a, b| {
            let side = |x: &(&GalleryImage, Flip, f32)| x.1 == Flip::Gained;
            side(a)
                .cmp(&side(b))
                .then(match a.1 {
                    Flip::Lost => b.2.total_cmp(&a.2),
                    Flip::Gained => a.2.total_cmp(&b.2),
                })
                .then(a.0.image.cmp(&b.0.image))
        });
        out
    }

    /// How many evaluation images row `k` flips against FP32, (lost, gained), from each row's
    /// per-image correctness: every image, where the gallery keeps at most
    /// [`GALLERY_MAX_IMAGES`].
    pub fn flip_counts(&self, k: usize) -> Option<(usize, usize)> {
        let f = self.fp32_index().filter(|&f| f != k)?;
        let (a, b) = (&self.rows[f].per_image, &self.rows.get(k)?.per_image);
        if a.is_empty() || a.len() != b.len() || self.rows[k].failed() {
            return None;
        }
        let right = |v: f64| v >= 0.5;
        let lost = a
            .iter()
            .zip(b)
            .filter(|(x, y)| right(**x) && !right(**y))
            .count();
        let gained = a
            .iter()
            .zip(b)
            .filter(|(x, y)| !right(**x) && right(**y))
            .count();
        Some((lost, gained))
    }

    /// [`Report::flips`] of row `k`, narrowed to one confusion cell when given: the images of
    /// true class `t` that `k` predicts as `p`.
    pub fn flips_in(
        &self,
        k: usize,
        cell: Option<(usize, usize)>,
    ) -> Vec<(&GalleryImage, Flip, f32)> {
        let mut out = self.flips(k);
        if let Some((t, p)) = cell {
            out.retain(|(g, _, _)| {
                g.true_class == t
                    && g.tops
                        .get(k)
                        .and_then(Option::as_ref)
                        .and_then(ImageTop::top1)
                        == Some(p)
            });
        }
        out
    }

    /// The Markdown sections of a classifier's report: FP32's confusion matrix, what each other
    /// engine moves against it, and the images each engine flips. Empty for other tasks.
    pub fn classes_markdown(&self) -> String {
        let mut s = String::new();
        let Some(f) = self.fp32_index() else {
            return s;
        };
        let Some(base) = self.rows[f].confusion.as_ref() else {
            return s;
        };
        let name = |c: usize| cell_text(&self.class_name(c));
        let others: Vec<(usize, &Row, &Confusion)> = self
            .rows
            .iter()
            .enumerate()
            .filter(|(k, r)| *k != f && !r.failed())
            .filter_map(|(k, r)| Some((k, r, r.confusion.as_ref()?)))
            .collect();
        let n = base.classes;
        if n <= GRID_MAX_CLASSES {
            s.push_str(
                "\n## Confusion matrix, FP32\n\nRows: true class; columns: predicted class; images.\n\n",
            );
            s.push_str(&grid_header(n, &name));
            for t in 0..n {
                let cells: Vec<String> = (0..n).map(|p| base.count(t, p).to_string()).collect();
                s.push_str(&format!("| **{}** | {} |\n", name(t), cells.join(" | ")));
            }
            for (_, r, c) in &others {
                let d = c.diff(base);
                s.push_str(&format!(
                    "\n## {} minus FP32\n\nWhere it sends images that FP32 does not: + more images in the cell, − fewer; blank: the same.\n\n",
                    r.label()
                ));
                if d.is_empty() {
                    s.push_str("Same confusion matrix as FP32.\n");
                    continue;
                }
                s.push_str(&grid_header(n, &name));
                for t in 0..n {
                    let cells: Vec<String> = (0..n)
                        .map(|p| match c.count(t, p) as i64 - base.count(t, p) as i64 {
                            0 => String::new(),
                            v => format!("{v:+}"),
                        })
                        .collect();
                    s.push_str(&format!("| **{}** | {} |\n", name(t), cells.join(" | ")));
                }
            }
        } else {
            s.push_str("\n## Most confused classes, FP32\n\n| true class | predicted | images |\n|---|---|---|\n");
            for [t, p, c] in base.most_confused(20) {
                s.push_str(&format!(
                    "| {} | {} | {c} |\n",
                    name(t as usize),
                    name(p as usize)
                ));
            }
            for (_, r, c) in &others {
                let mut d = c.diff(base);
                d.sort_by(|a, b| b.2.abs().cmp(&a.2.abs()).then((a.0, a.1).cmp(&(b.0, b.1))));
                s.push_str(&format!(
                    "\n## Largest moves of {} against FP32\n\n| true class | predicted | FP32 images | engine images | Δ |\n|---|---|---|---|---|\n",
                    r.label()
                ));
                for (t, p, v) in d.into_iter().take(20) {
                    s.push_str(&format!(
                        "| {} | {} | {} | {} | {v:+} |\n",
                        name(t),
                        name(p),
                        base.count(t, p),
                        c.count(t, p)
                    ));
                }
            }
        }
        let listed = 10;
        let mut gallery = String::new();
        for (k, r, _) in &others {
            let flips = self.flips(*k);
            if flips.is_empty() {
                continue;
            }
            let kept = flips.iter().filter(|x| x.1 == Flip::Lost).count();
            let (lost, gained) = self.flip_counts(*k).unwrap_or((kept, flips.len() - kept));
            gallery.push_str(&format!(
                "\n### {}: {lost} lost, {gained} gained\n\n| image | true class | FP32 top-1 (p) | engine top-1 (p) | p(true) FP32 → engine | drop |\n|---|---|---|---|---|---|\n",
                r.label(),
            ));
            let shown = flips
                .iter()
                .filter(|x| x.1 == Flip::Lost)
                .take(listed)
                .chain(
                    flips
                        .iter()
                        .filter(|x| x.1 == Flip::Gained)
                        .take(listed / 2),
                );
            for (g, _, drop) in shown {
                let top1 = |k: usize| {
                    g.tops
                        .get(k)
                        .and_then(|t| t.as_ref()?.top.first().copied())
                        .map(|(c, p)| format!("{} ({p:.2})", name(c as usize)))
                        .unwrap_or_else(|| "–".into())
                };
                let tp = |k: usize| {
                    g.tops
                        .get(k)
                        .and_then(|t| t.as_ref())
                        .map(|t| t.true_p)
                        .unwrap_or(0.0)
                };
                gallery.push_str(&format!(
                    "| {} | {} | {} | {} | {:.2} → {:.2} | {drop:+.2} |\n",
                    self.image_name(g.image),
                    name(g.true_class),
                    top1(f),
                    top1(*k),
                    tp(f),
                    tp(*k)
                ));
            }
            if kept > listed {
                gallery.push_str(&format!(
                    "\n{} more lost images in the JSON report's `gallery`.\n",
                    kept - listed
                ));
            }
        }
        if !gallery.is_empty() {
            s.push_str(&format!(
                "\n## Images that flipped against FP32\n\nFP32 right and the engine wrong (lost), largest drop of the true class's probability first; then the reverse (gained). The JSON report's `gallery` holds every engine's top-3 for each (at most {GALLERY_MAX_IMAGES} images).\n"
            ));
            s.push_str(&gallery);
        }
        s
    }

    /// An evaluation image's file name (`image N` where the report has none).
    pub fn image_name(&self, i: usize) -> String {
        self.evaluation
            .image_files
            .get(i)
            .and_then(|f| f.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| format!("image {i}"))
    }

    /// Every engine's confusion matrix as CSV, one line per cell where the engine or FP32 has
    /// images: `engine,true_class,true_name,predicted_class,predicted_name,images,fp32_images,delta`
    /// (long form, so 1000-class models stay readable in a spreadsheet or pandas).
    pub fn confusion_csv(&self) -> String {
        let mut s = String::from(
            "engine,true_class,true_name,predicted_class,predicted_name,images,fp32_images,delta\n",
        );
        let base = self
            .fp32_index()
            .and_then(|f| self.rows[f].confusion.as_ref());
        for r in self.rows.iter().filter(|r| !r.failed()) {
            let Some(c) = &r.confusion else { continue };
            let mut cells: Vec<(usize, usize)> = c
                .cells
                .iter()
                .chain(base.map(|b| b.cells.as_slice()).unwrap_or_default())
                .map(|x| (x[0] as usize, x[1] as usize))
                .collect();
            cells.sort_unstable();
            cells.dedup();
            for (t, p) in cells {
                let (own, fp32) = (c.count(t, p), base.map(|b| b.count(t, p)).unwrap_or(0));
                s.push_str(&format!(
                    "{},{t},{},{p},{},{own},{fp32},{}\n",
                    csv_text(&r.label()),
                    csv_text(&self.class_name(t)),
                    csv_text(&self.class_name(p)),
                    own as i64 - fp32 as i64
                ));
            }
        }
        s
    }

    /// The gallery as CSV, one line per image and engine that flipped it against FP32:
    /// the image, its true class, the flip, the true class's probability under both, and each
    /// engine's top-3 with probabilities.
    pub fn gallery_csv(&self) -> String {
        let mut s = String::from(
            "image,file,true_class,true_name,engine,flip,fp32_true_p,engine_true_p,drop,fp32_top3,engine_top3\n",
        );
        let Some(f) = self.fp32_index() else {
            return s;
        };
        let top3 = |t: Option<&ImageTop>| {
            t.map(|t| {
                t.top
                    .iter()
                    .map(|&(c, p)| format!("{} {p:.4}", self.class_name(c as usize)))
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_default()
        };
        for (k, r) in self.rows.iter().enumerate() {
            for (g, flip, drop) in self.flips(k) {
                let (a, b) = (
                    g.tops.get(f).and_then(Option::as_ref),
                    g.tops.get(k).and_then(Option::as_ref),
                );
                s.push_str(&format!(
                    "{},{},{},{},{},{},{:.4},{:.4},{drop:.4},{},{}\n",
                    g.image,
                    csv_text(
                        &self
                            .evaluation
                            .image_files
                            .get(g.image)
                            .map(|p| p.display().to_string())
                            .unwrap_or_default()
                    ),
                    g.true_class,
                    csv_text(&self.class_name(g.true_class)),
                    csv_text(&r.label()),
                    match flip {
                        Flip::Lost => "lost",
                        Flip::Gained => "gained",
                    },
                    a.map(|t| t.true_p).unwrap_or(0.0),
                    b.map(|t| t.true_p).unwrap_or(0.0),
                    csv_text(&top3(a)),
                    csv_text(&top3(b)),
                ));
            }
        }
        s
    }
}

/// The header of an n × n Markdown grid with class names on the columns.
fn grid_header(n: usize, name: &dyn Fn(usize) -> String) -> String {
    let cols: Vec<String> = (0..n).map(name).collect();
    format!(
        "| true \\ predicted | {} |\n|---|{}\n",
        cols.join(" | "),
        "---|".repeat(n)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confusion_counts_cells_and_differences() {
        let fp32 = Confusion::from_pairs(3, [(0, 0), (0, 0), (1, 1), (1, 2), (2, 2)]);
        assert_eq!(fp32.classes, 3);
        assert_eq!(fp32.cells, vec![[0, 0, 2], [1, 1, 1], [1, 2, 1], [2, 2, 1]]);
        assert_eq!((fp32.count(1, 2), fp32.count(2, 1)), (1, 0));
        assert_eq!(fp32.row_total(1), 2);
        assert_eq!(fp32.row_totals(), vec![2, 2, 1]);
        assert_eq!(fp32.dense()[0], vec![2, 0, 0]);
        // INT8 moves one class-0 image into class 2 and fixes the class-1 image.
        let int8 = Confusion::from_pairs(3, [(0, 0), (0, 2), (1, 1), (1, 1), (2, 2)]);
        assert_eq!(
            int8.diff(&fp32),
            vec![(0, 0, -1), (0, 2, 1), (1, 1, 1), (1, 2, -1)]
        );
        assert_eq!(int8.most_confused(5), vec![[0, 2, 1]]);
        // A prediction past the named classes widens the matrix rather than being lost.
        assert_eq!(Confusion::from_pairs(2, [(0, 4)]).classes, 5);
    }

    #[test]
    fn probabilities_are_softmax_unless_already_a_distribution() {
        let p = probabilities(&[0.0, 0.0_f32.ln_1p(), 2.0_f32.ln()]);
        assert!(
            (p[2] - 0.5).abs() < 1e-6 && (p[0] - 0.25).abs() < 1e-6,
            "{p:?}"
        );
        assert_eq!(probabilities(&[0.1, 0.7, 0.2]), vec![0.1, 0.7, 0.2]);
        // Non-negative but not summing to 1: scores, so softmax.
        let q = probabilities(&[1.0, 1.0]);
        assert_eq!(q, vec![0.5, 0.5]);
        let t = ImageTop::from_scores(&[0.05, 0.5, 0.1, 0.3, 0.05], 3);
        assert_eq!(t.top, vec![(1, 0.5), (3, 0.3), (2, 0.1)]);
        assert_eq!((t.true_p, t.top1()), (0.3, Some(1)));
        // Ties keep the lower index first, as the top-1 argmax does.
        assert_eq!(ImageTop::from_scores(&[0.5, 0.5], 0).top1(), Some(0));
    }

    fn top(c: u32, p: f32, true_p: f32) -> ImageTop {
        ImageTop {
            top: vec![(c, p)],
            true_p,
        }
    }

    /// Images flipped either way are kept with every row's top-k; unchanged ones are not; the
    /// engine's view lists losses by largest drop, then gains by largest rise.
    #[test]
    fn gallery_keeps_flips_sorted_by_the_drop() {
        let labels = [0, 1, 1, 2];
        let fp32 = vec![
            top(0, 0.9, 0.9),
            top(1, 0.6, 0.6),
            top(1, 0.8, 0.8),
            top(0, 0.5, 0.3),
        ];
        let int8 = vec![
            top(0, 0.85, 0.85), // still right
            top(2, 0.5, 0.4),   // lost, drop 0.2
            top(0, 0.7, 0.1),   // lost, drop 0.7
            top(2, 0.6, 0.6),   // gained, rise 0.3
        ];
        let g = gallery(0, &[fp32, int8, vec![]], &labels);
        assert_eq!(g.iter().map(|g| g.image).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(g[0].tops.len(), 3);
        assert_eq!(g[0].tops[2], None, "a row with no result");
        let mut r = Report {
            rows: vec![
                Row {
                    precision: Some(Precision::Fp32),
                    ..Default::default()
                },
                Row {
                    precision: Some(Precision::Int8),
                    ..Default::default()
                },
            ],
            gallery: g,
            ..Default::default()
        };
        r.evaluation.classes = vec!["cat".into(), "dog".into(), "bird".into()];
        let flips: Vec<(usize, Flip)> = r.flips(1).iter().map(|x| (x.0.image, x.1)).collect();
        assert_eq!(flips, [(2, Flip::Lost), (1, Flip::Lost), (3, Flip::Gained)]);
        assert!((r.flips(1)[0].2 - 0.7).abs() < 1e-6);
        // Counted over every image from the rows' per-image correctness, not the gallery.
        r.rows[0].per_image = vec![1.0, 1.0, 1.0, 0.0, 1.0];
        r.rows[1].per_image = vec![1.0, 0.0, 0.0, 1.0, 0.0];
        assert_eq!(r.flip_counts(1), Some((3, 1)));
        assert_eq!(r.flip_counts(0), None);
        assert!(r.flips(0).is_empty(), "FP32 against itself");
        // Narrowed to a cell: dogs the engine calls birds.
        let cell: Vec<usize> = r
            .flips_in(1, Some((1, 2)))
            .iter()
            .map(|x| x.0.image)
            .collect();
        assert_eq!(cell, [1]);
        let csv = r.gallery_csv();
        assert!(
            csv.contains(
                "2,\"\",1,\"dog\",\"int8\",lost,0.8000,0.1000,0.7000,\"dog 0.8000\",\"cat 0.7000\""
            ),
            "{csv}"
        );
    }

    #[test]
    fn markdown_and_csv_carry_the_matrices() {
        let row = |p: Precision, pairs: &[(usize, usize)]| Row {
            precision: Some(p),
            method: (p == Precision::Int8).then_some(crate::calib::Method::Max),
            confusion: Some(Confusion::from_pairs(2, pairs.iter().copied())),
            ..Default::default()
        };
        let mut r = Report {
            rows: vec![
                row(Precision::Fp32, &[(0, 0), (0, 0), (1, 1)]),
                row(Precision::Int8, &[(0, 0), (0, 1), (1, 1)]),
            ],
            ..Default::default()
        };
        r.evaluation.classes = vec!["cat".into(), "dog".into()];
        let md = r.classes_markdown();
        assert!(md.contains("| true \\ predicted | cat | dog |"), "{md}");
        assert!(md.contains("| **cat** | 2 | 0 |"), "{md}");
        assert!(md.contains("## int8 max minus FP32"), "{md}");
        assert!(md.contains("| **cat** | -1 | +1 |"), "{md}");
        let csv = r.confusion_csv();
        assert!(
            csv.contains("\"int8 max\",0,\"cat\",1,\"dog\",1,0,1\n"),
            "{csv}"
        );
        assert!(
            csv.contains("\"int8 max\",0,\"cat\",0,\"cat\",1,2,-1\n"),
            "{csv}"
        );
        assert!(
            csv.contains("\"fp32\",0,\"cat\",0,\"cat\",2,2,0\n"),
            "{csv}"
        );
    }

    /// Past GRID_MAX_CLASSES the Markdown lists pairs, not grids; the terminal's table leaves
    /// the sections out and says where they are.
    #[test]
    fn many_classes_are_listed_as_pairs() {
        let n = 40;
        let pairs = |extra: &[(usize, usize, usize)]| {
            let mut v: Vec<(usize, usize)> = (0..n).map(|c| (c, c)).collect();
            for &(t, p, k) in extra {
                v.extend(std::iter::repeat_n((t, p), k));
            }
            v
        };
        let row = |p: Precision, extra: &[(usize, usize, usize)]| Row {
            precision: Some(p),
            method: (p == Precision::Int8).then_some(crate::calib::Method::Max),
            confusion: Some(Confusion::from_pairs(n, pairs(extra))),
            ..Default::default()
        };
        let mut r = Report {
            rows: vec![
                row(Precision::Fp32, &[(5, 7, 3)]),
                row(Precision::Int8, &[(5, 7, 5), (12, 3, 2)]),
            ],
            ..Default::default()
        };
        r.evaluation.classes = (0..n).map(|c| format!("c{c}")).collect();
        let md = r.to_markdown();
        assert!(!md.contains("| true \\ predicted |"), "{md}");
        assert!(md.contains("## Most confused classes, FP32"), "{md}");
        assert!(md.contains("| c5 | c7 | 3 |"), "{md}");
        assert!(
            md.contains("## Largest moves of int8 max against FP32"),
            "{md}"
        );
        // Largest move first: +2 for both cells, ties by true class.
        assert!(
            md.contains("| c5 | c7 | 3 | 5 | +2 |\n| c12 | c3 | 0 | 2 | +2 |"),
            "{md}"
        );
        let terminal = r.to_terminal_markdown();
        assert!(!terminal.contains("Most confused"), "{terminal}");
        assert!(terminal.contains("--confusion-csv"), "{terminal}");
    }
}
