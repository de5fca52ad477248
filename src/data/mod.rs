//! Image folders and evaluation sets (ImageFolder classification, images/ + masks/
//! segmentation) and the preprocessing that turns a decoded image into a model input.
//! Knows nothing about engines.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use image::{DynamicImage, RgbImage, imageops::FilterType};
use serde::{Deserialize, Serialize};

use crate::model::Layout;

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{path}: cannot read the folder")]
    Folder {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path}: no images found (looked for jpg, jpeg, png, bmp, webp; {skipped} other files skipped)"
    )]
    NoImages { path: PathBuf, skipped: usize },
    #[error("{path}: cannot decode the image: {reason}")]
    Image { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    Mask { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    Layout { path: PathBuf, reason: String },
}

const IMAGE_EXTENSIONS: [&str; 5] = ["jpg", "jpeg", "png", "bmp", "webp"];

fn is_image(p: &Path) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| IMAGE_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
}

/// Every image below `dir`, recursively, sorted by path; and how many other files were skipped.
pub fn list_images(dir: &Path) -> Result<(Vec<PathBuf>, usize), DataError> {
    let mut images = vec![];
    let mut skipped = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).map_err(|source| DataError::Folder {
            path: d.clone(),
            source,
        })?;
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if is_image(&p) {
                images.push(p);
            } else {
                skipped += 1;
            }
        }
    }
    images.sort();
    Ok((images, skipped))
}

/// How the image is brought to the model's input size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ResizeMode {
    /// Resize both sides to the input size, ignoring aspect ratio.
    #[default]
    Stretch,
    /// Resize the short side to fit, then cut the centre.
    Crop,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "UPPERCASE")]
pub enum ChannelOrder {
    #[default]
    Rgb,
    Bgr,
}

/// Pixel normalisation. `ScaleOffset { scale: 1, offset: 0 }` keeps raw 0..255 values.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Normalize {
    /// `(x / 255 - mean) / std`, per channel (in the model's channel order).
    MeanStd { mean: [f32; 3], std: [f32; 3] },
    /// `x * scale + offset` on raw 0..255 values.
    ScaleOffset { scale: f32, offset: f32 },
}

impl Default for Normalize {
    fn default() -> Self {
        Normalize::MeanStd {
            mean: [0.485, 0.456, 0.406],
            std: [0.229, 0.224, 0.225],
        }
    }
}

/// Everything needed to turn an image file into a model input. Saved in the experiment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Preprocess {
    pub resize: ResizeMode,
    /// Input height and width; `None` takes the model's own.
    pub size: Option<[usize; 2]>,
    pub channel_order: ChannelOrder,
    pub normalize: Normalize,
}

/// Where a model-input pixel comes from in the original image, so predictions can be
/// compared at mask resolution.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Geometry {
    pub orig_hw: [usize; 2],
    pub input_hw: [usize; 2],
    pub resize: ResizeMode,
}

impl Geometry {
    /// Scale and offset from original pixel coordinates to model-input coordinates.
    fn transform(&self) -> ([f32; 2], [f32; 2]) {
        let [h0, w0] = self.orig_hw.map(|v| v.max(1) as f32);
        let [th, tw] = self.input_hw.map(|v| v as f32);
        match self.resize {
            ResizeMode::Stretch => ([th / h0, tw / w0], [0.0, 0.0]),
            ResizeMode::Crop => {
                let s = (th / h0).max(tw / w0);
                ([s, s], [(h0 * s - th) / 2.0, (w0 * s - tw) / 2.0])
            }
        }
    }

    /// For each pixel of a `mask_hw` grid over the original image, the index into an
    /// `out_hw` prediction grid (nearest), or `None` where the crop cut that pixel away.
    pub fn pixel_map(&self, mask_hw: [usize; 2], out_hw: [usize; 2]) -> Vec<Option<u32>> {
        let ([sy, sx], [oy, ox]) = self.transform();
        let [mh, mw] = mask_hw;
        let ky = self.orig_hw[0] as f32 / mh as f32;
        let kx = self.orig_hw[1] as f32 / mw as f32;
        let [th, tw] = self.input_hw.map(|v| v as f32);
        let col: Vec<Option<u32>> = (0..mw)
            .map(|x| {
                let xm = (x as f32 + 0.5) * kx * sx - ox;
                (0.0..tw)
                    .contains(&xm)
                    .then(|| ((xm * out_hw[1] as f32 / tw) as u32).min(out_hw[1] as u32 - 1))
            })
            .collect();
        let mut map = Vec::with_capacity(mh * mw);
        for y in 0..mh {
            let ym = (y as f32 + 0.5) * ky * sy - oy;
            let row = (0.0..th)
                .contains(&ym)
                .then(|| ((ym * out_hw[0] as f32 / th) as u32).min(out_hw[0] as u32 - 1));
            for c in &col {
                map.push(match (row, c) {
                    (Some(r), Some(c)) => Some(r * out_hw[1] as u32 + c),
                    _ => None,
                });
            }
        }
        map
    }
}

pub fn open_rgb(path: &Path) -> Result<RgbImage, DataError> {
    let img = image::ImageReader::open(path)
        .map_err(|e| DataError::Image {
            path: path.into(),
            reason: e.to_string(),
        })?
        .with_guessed_format()
        .map_err(|e| DataError::Image {
            path: path.into(),
            reason: e.to_string(),
        })?
        .decode()
        .map_err(|e| DataError::Image {
            path: path.into(),
            reason: e.to_string(),
        })?;
    Ok(match img {
        DynamicImage::ImageRgb8(i) => i,
        other => other.to_rgb8(),
    })
}

/// Resizes `img` to `hw` per `mode`.
pub fn resize(img: &RgbImage, hw: [usize; 2], mode: ResizeMode) -> RgbImage {
    let (w0, h0) = img.dimensions();
    let [h, w] = hw.map(|v| v as u32);
    if (w0, h0) == (w, h) {
        return img.clone();
    }
    match mode {
        ResizeMode::Stretch => image::imageops::resize(img, w, h, FilterType::Triangle),
        ResizeMode::Crop => {
            let s = (h as f32 / h0 as f32).max(w as f32 / w0 as f32);
            let (rw, rh) = (
                ((w0 as f32 * s).round() as u32).max(w),
                ((h0 as f32 * s).round() as u32).max(h),
            );
            let r = image::imageops::resize(img, rw, rh, FilterType::Triangle);
            image::imageops::crop_imm(&r, (rw - w) / 2, (rh - h) / 2, w, h).to_image()
        }
    }
}

impl Preprocess {
    /// Turns an image into one input tensor (`channels x H x W` in `layout` order).
    pub fn apply(
        &self,
        img: &RgbImage,
        hw: [usize; 2],
        channels: usize,
        layout: Layout,
    ) -> Vec<f32> {
        let r = resize(img, hw, self.resize);
        let [h, w] = hw;
        let channels = channels.clamp(1, 3);
        let mut out = vec![0f32; channels * h * w];
        let order: [usize; 3] = match self.channel_order {
            ChannelOrder::Rgb => [0, 1, 2],
            ChannelOrder::Bgr => [2, 1, 0],
        };
        for (x, y, p) in r.enumerate_pixels() {
            let (x, y) = (x as usize, y as usize);
            for c in 0..channels {
                let raw = if channels == 1 {
                    (p[0] as f32 + p[1] as f32 + p[2] as f32) / 3.0
                } else {
                    p[order[c]] as f32
                };
                let v = match self.normalize {
                    Normalize::MeanStd { mean, std } => (raw / 255.0 - mean[c]) / std[c],
                    Normalize::ScaleOffset { scale, offset } => raw * scale + offset,
                };
                let i = match layout {
                    Layout::Nchw => c * h * w + y * w + x,
                    Layout::Nhwc => (y * w + x) * channels + c,
                };
                out[i] = v;
            }
        }
        out
    }
}

/// Decodes a palette or grey PNG holding class indices (255 = ignore).
pub fn read_mask(path: &Path) -> Result<(Vec<u8>, [usize; 2]), DataError> {
    let err = |reason: String| DataError::Mask {
        path: path.into(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
    let mut dec = png::Decoder::new(std::io::BufReader::new(file));
    dec.set_transformations(png::Transformations::IDENTITY);
    let mut reader = dec
        .read_info()
        .map_err(|e| err(format!("not a readable PNG: {e}")))?;
    let mut buf = vec![
        0;
        reader
            .output_buffer_size()
            .ok_or_else(|| err("image too large".into()))?
    ];
    let frame = reader
        .next_frame(&mut buf)
        .map_err(|e| err(e.to_string()))?;
    let (w, h) = (frame.width as usize, frame.height as usize);
    match frame.color_type {
        png::ColorType::Indexed | png::ColorType::Grayscale => {}
        other => {
            return Err(err(format!(
                "mask is {other:?}; expected a palette or grey PNG holding class indices"
            )));
        }
    }
    let bits = frame.bit_depth as usize;
    if bits > 8 {
        return Err(err(format!(
            "{bits}-bit mask; expected 8-bit class indices"
        )));
    }
    let mut out = Vec::with_capacity(w * h);
    for y in 0..h {
        let row = &buf[y * frame.line_size..(y + 1) * frame.line_size];
        for x in 0..w {
            let bit = x * bits;
            let byte = row[bit / 8];
            let shift = 8 - bits - (bit % 8);
            out.push((byte >> shift) & ((1u16 << bits) - 1) as u8);
        }
    }
    Ok((out, [h, w]))
}

/// Which calibration images to use out of a folder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Selection {
    /// Every image.
    #[default]
    All,
    /// The first N in sorted order.
    First(usize),
    /// Every k-th image in sorted order (0, k, 2k, ...).
    EveryNth(usize),
}

impl Selection {
    pub fn pick(&self, mut items: Vec<PathBuf>) -> Vec<PathBuf> {
        match *self {
            Selection::All => items,
            Selection::First(n) => {
                items.truncate(n);
                items
            }
            Selection::EveryNth(k) => items.into_iter().step_by(k.max(1)).collect(),
        }
    }
}

/// One labelled evaluation item.
#[derive(Clone, Debug, PartialEq)]
pub enum Label {
    Class(usize),
    Mask(PathBuf),
}

#[derive(Clone, Debug, PartialEq)]
pub struct EvalItem {
    pub image: PathBuf,
    pub label: Label,
}

#[derive(Clone, Debug, PartialEq)]
pub struct EvalSet {
    pub root: PathBuf,
    pub items: Vec<EvalItem>,
    /// Class names in model output order (from folder names or labels.txt).
    pub classes: Vec<String>,
    pub kind: crate::model::Task,
}

/// Class names from a `labels.txt`-style file: one per line, blank lines ignored.
pub fn read_labels(path: &Path) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(path).ok()?;
    let v: Vec<String> = text
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    (!v.is_empty()).then_some(v)
}

impl EvalSet {
    /// Opens `root` as a segmentation set if it has `images/` and `masks/`, else as ImageFolder.
    pub fn open(root: &Path, exclude: &HashSet<PathBuf>) -> Result<EvalSet, DataError> {
        if root.join("images").is_dir() && root.join("masks").is_dir() {
            Self::open_segmentation(root, exclude)
        } else {
            Self::open_image_folder(root, exclude)
        }
    }

    fn open_segmentation(root: &Path, exclude: &HashSet<PathBuf>) -> Result<EvalSet, DataError> {
        let (images, skipped) = list_images(&root.join("images"))?;
        let mut items = vec![];
        let mut missing = vec![];
        for img in images {
            if exclude.contains(&canonical(&img)) {
                continue;
            }
            let stem = img.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
            let mask = root.join("masks").join(format!("{stem}.png"));
            if mask.is_file() {
                items.push(EvalItem {
                    image: img,
                    label: Label::Mask(mask),
                });
            } else {
                missing.push(stem.to_string());
            }
        }
        if items.is_empty() {
            return Err(DataError::Layout {
                path: root.into(),
                reason: format!(
                    "no image in images/ has a mask of the same stem in masks/ ({} without a mask, {skipped} non-images)",
                    missing.len()
                ),
            });
        }
        let classes = read_labels(&root.join("labels.txt")).unwrap_or_default();
        Ok(EvalSet {
            root: root.into(),
            items,
            classes,
            kind: crate::model::Task::Segmentation,
        })
    }

    fn open_image_folder(root: &Path, exclude: &HashSet<PathBuf>) -> Result<EvalSet, DataError> {
        let entries = std::fs::read_dir(root).map_err(|source| DataError::Folder {
            path: root.into(),
            source,
        })?;
        let mut dirs: Vec<String> = entries
            .flatten()
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().to_str().map(String::from))
            .collect();
        dirs.sort();
        let classes = match read_labels(&root.join("labels.txt")) {
            Some(order) => {
                if let Some(d) = dirs.iter().find(|d| !order.contains(d)) {
                    return Err(DataError::Layout {
                        path: root.join("labels.txt"),
                        reason: format!("folder `{d}` is not listed in labels.txt"),
                    });
                }
                order
            }
            None => dirs.clone(),
        };
        if classes.is_empty() {
            return Err(DataError::Layout {
                path: root.into(),
                reason: "expected class folders (<class>/<image>) or images/ + masks/".into(),
            });
        }
        let mut per_class = vec![];
        for (ci, c) in classes.iter().enumerate() {
            let dir = root.join(c);
            if !dir.is_dir() {
                per_class.push(vec![]);
                continue;
            }
            let (imgs, _) = list_images(&dir)?;
            per_class.push(
                imgs.into_iter()
                    .filter(|p| !exclude.contains(&canonical(p)))
                    .map(|p| EvalItem {
                        image: p,
                        label: Label::Class(ci),
                    })
                    .collect::<Vec<_>>(),
            );
        }
        // Round-robin over classes so that the first N items are balanced.
        let mut items = vec![];
        let longest = per_class.iter().map(|v| v.len()).max().unwrap_or(0);
        for i in 0..longest {
            for v in &per_class {
                if let Some(it) = v.get(i) {
                    items.push(it.clone());
                }
            }
        }
        if items.is_empty() {
            return Err(DataError::NoImages {
                path: root.into(),
                skipped: 0,
            });
        }
        Ok(EvalSet {
            root: root.into(),
            items,
            classes,
            kind: crate::model::Task::Classification,
        })
    }
}

pub fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stretch_pixel_map_is_nearest() {
        let g = Geometry {
            orig_hw: [4, 4],
            input_hw: [2, 2],
            resize: ResizeMode::Stretch,
        };
        let m = g.pixel_map([4, 4], [2, 2]);
        assert_eq!(m[0], Some(0));
        assert_eq!(m[3], Some(1));
        assert_eq!(m[15], Some(3));
    }

    #[test]
    fn crop_pixel_map_drops_the_cut_sides() {
        // 4 tall, 8 wide, cropped to 4x4: the outer two columns each side are cut.
        let g = Geometry {
            orig_hw: [4, 8],
            input_hw: [4, 4],
            resize: ResizeMode::Crop,
        };
        let m = g.pixel_map([4, 8], [4, 4]);
        assert_eq!(m[0], None);
        assert_eq!(m[1], None);
        assert_eq!(m[2], Some(0));
        assert_eq!(m[7], None);
    }

    #[test]
    fn raw_pixels_are_expressible() {
        let img = RgbImage::from_pixel(2, 2, image::Rgb([10, 20, 30]));
        let p = Preprocess {
            normalize: Normalize::ScaleOffset {
                scale: 1.0,
                offset: 0.0,
            },
            channel_order: ChannelOrder::Bgr,
            ..Default::default()
        };
        let v = p.apply(&img, [2, 2], 3, Layout::Nchw);
        assert_eq!(&v[0..4], &[30.0; 4]);
        assert_eq!(&v[8..12], &[10.0; 4]);
        let v = p.apply(&img, [2, 2], 3, Layout::Nhwc);
        assert_eq!(&v[0..3], &[30.0, 20.0, 10.0]);
    }
}
