//! Image folders and evaluation sets (ImageFolder classification, images/ + masks/
//! segmentation), image and mask decoding; the preprocessing that turns a decoded image into
//! a model input is in `preprocess.rs`, re-exported here.
//! Knows nothing about engines.

mod preprocess;
mod walk;

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};

pub use preprocess::{
    CAFFE_MEAN_BGR_255, ChannelOrder, DEFAULT_PAD_VALUE, Geometry, IMAGENET_MEAN, IMAGENET_STD,
    Interpolation, Normalize, NormalizeSource, Preprocess, Preset, ResizeMode, resize,
};
use walk::check_regular_file;
pub use walk::{MAX_IMAGE_FILE_BYTES, list_images};

use image::{DynamicImage, RgbImage};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{path}: cannot read the folder")]
    Folder {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path}: no images found (looked for jpg, jpeg, png, bmp, webp; {skipped} other entries skipped: other file types, FIFOs/devices, files over 256 MiB, unreadable entries)"
    )]
    NoImages { path: PathBuf, skipped: usize },
    #[error("{path}: cannot decode the image: {reason}")]
    Image { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    Mask { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    Layout { path: PathBuf, reason: String },
    #[error("{path}: cannot use the class names: {reason}")]
    Labels { path: PathBuf, reason: String },
}

const IMAGE_EXTENSIONS: [&str; 5] = ["jpg", "jpeg", "png", "bmp", "webp"];

fn is_image(p: &Path) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| IMAGE_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
}

/// Largest width or height accepted for an image or mask: far above any model input, and
/// small enough that one decoded image cannot exhaust memory.
pub const MAX_IMAGE_SIDE_PX: u32 = 16384;
/// Most memory one image decode may allocate.
const MAX_DECODE_BYTES: u64 = 1024 * 1024 * 1024;

fn decode_limits() -> image::Limits {
    // `image::Limits` is non-exhaustive, so it is built from the default.
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_IMAGE_SIDE_PX);
    limits.max_image_height = Some(MAX_IMAGE_SIDE_PX);
    limits.max_alloc = Some(MAX_DECODE_BYTES);
    limits
}

/// A reader for `path` with its format guessed and decode limits set; refuses FIFOs,
/// devices and huge files before opening them.
fn image_reader(
    path: &Path,
) -> Result<image::ImageReader<std::io::BufReader<std::fs::File>>, DataError> {
    let err = |reason: String| DataError::Image {
        path: path.into(),
        reason,
    };
    check_regular_file(path, MAX_IMAGE_FILE_BYTES).map_err(err)?;
    let mut reader = image::ImageReader::open(path)
        .map_err(|e| err(e.to_string()))?
        .with_guessed_format()
        .map_err(|e| err(e.to_string()))?;
    reader.limits(decode_limits());
    Ok(reader)
}

fn image_error(path: &Path, e: image::ImageError) -> DataError {
    let reason = match e {
        image::ImageError::Limits(e) => format!(
            "{e}: images are limited to {MAX_IMAGE_SIDE_PX}x{MAX_IMAGE_SIDE_PX} pixels and {} MiB decoded; shrink the image or remove it from the folder",
            MAX_DECODE_BYTES / (1024 * 1024)
        ),
        e => e.to_string(),
    };
    DataError::Image {
        path: path.into(),
        reason,
    }
}

/// Height and width of the image at `path`, from its header only (nothing is decoded).
pub fn image_hw(path: &Path) -> Result<[usize; 2], DataError> {
    let (w, h) = image_reader(path)?
        .into_dimensions()
        .map_err(|e| image_error(path, e))?;
    Ok([h as usize, w as usize])
}

pub fn open_rgb(path: &Path) -> Result<RgbImage, DataError> {
    let img = image_reader(path)?
        .decode()
        .map_err(|e| image_error(path, e))?;
    Ok(match img {
        DynamicImage::ImageRgb8(i) => i,
        other => other.to_rgb8(),
    })
}

/// Memory the PNG decoder may use for its own buffers (palette, text and ICC chunks); the
/// output buffer is ours and bounded by [`MAX_IMAGE_SIDE_PX`] before it is allocated.
const MASK_DECODER_BYTES: usize = 64 * 1024 * 1024;

/// The PASCAL VOC colour of class `index` (its devkit's `labelcolormap`): bits 0, 1, 2 of the
/// index go to the top bits of red, green, blue, then bits 3-5 to the next, and so on.
/// Index 255 is (224, 224, 192), VOC's "void" border colour.
pub fn voc_color(index: u8) -> [u8; 3] {
    let mut rgb = [0u8; 3];
    let mut c = index;
    for shift in (0..8).rev() {
        for (ch, v) in rgb.iter_mut().enumerate() {
            *v |= ((c >> ch) & 1) << shift;
        }
        c >>= 3;
    }
    rgb
}

/// RGB(A) mask pixels mapped to class indices through the VOC palette; a colour outside it is
/// an error that names the colour, where it first appears and how often.
fn voc_indices(pixels: &[u8], stride: usize, w: usize) -> Result<Vec<u8>, String> {
    let palette: std::collections::HashMap<[u8; 3], u8> =
        (0..=255u8).map(|i| (voc_color(i), i)).collect();
    let mut out = Vec::with_capacity(pixels.len() / stride);
    let mut unknown: Option<([u8; 3], usize, usize)> = None;
    // Masks are large runs of one colour: remember the last lookup.
    let mut last: Option<([u8; 3], Option<u8>)> = None;
    for (i, px) in pixels.chunks_exact(stride).enumerate() {
        let rgb = [px[0], px[1], px[2]];
        let id = match last {
            Some((c, id)) if c == rgb => id,
            _ => {
                let id = palette.get(&rgb).copied();
                last = Some((rgb, id));
                id
            }
        };
        match id {
            Some(id) => out.push(id),
            None => match &mut unknown {
                Some((c, _, n)) if *c == rgb => *n += 1,
                Some(_) => {}
                None => unknown = Some((rgb, i, 1)),
            },
        }
    }
    if let Some(([r, g, b], first, n)) = unknown {
        return Err(format!(
            "RGB mask with colour ({r}, {g}, {b}) at pixel (row {}, column {}) ({n}+ pixels), which is not in the PASCAL VOC palette; \
             save masks as palette or grey PNGs holding class indices (255 = ignore), or as RGB in VOC colours",
            first / w.max(1),
            first % w.max(1)
        ));
    }
    Ok(out)
}

/// Decodes a palette or grey PNG holding class indices (255 = ignore), or an RGB(A) PNG in
/// PASCAL VOC colours (the VOC devkit's `SegmentationClass` files as many tools save them).
pub fn read_mask(path: &Path) -> Result<(Vec<u8>, [usize; 2]), DataError> {
    let err = |reason: String| DataError::Mask {
        path: path.into(),
        reason,
    };
    check_regular_file(path, MAX_IMAGE_FILE_BYTES).map_err(err)?;
    let file = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
    let mut dec = png::Decoder::new_with_limits(
        std::io::BufReader::new(file),
        png::Limits {
            bytes: MASK_DECODER_BYTES,
        },
    );
    dec.set_transformations(png::Transformations::IDENTITY);
    let mut reader = dec
        .read_info()
        .map_err(|e| err(format!("not a readable PNG: {e}")))?;
    // Everything is checked from the header before the output buffer is allocated, so a
    // forged header cannot make us allocate gigabytes.
    let (w, h) = reader.info().size();
    if w > MAX_IMAGE_SIDE_PX || h > MAX_IMAGE_SIDE_PX {
        return Err(err(format!(
            "mask is {w}x{h} pixels, over the {MAX_IMAGE_SIDE_PX}x{MAX_IMAGE_SIDE_PX} limit; shrink it to its image's size"
        )));
    }
    let (color, depth) = reader.output_color_type();
    let bits = depth as usize;
    let stride = match color {
        png::ColorType::Indexed | png::ColorType::Grayscale => 1,
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        other => {
            return Err(err(format!(
                "mask is {other:?}; expected a palette or grey PNG holding class indices, or RGB in VOC colours"
            )));
        }
    };
    if bits > 8 {
        return Err(err(format!(
            "{bits}-bit mask; expected 8-bit class indices or 8-bit RGB"
        )));
    }
    let mut buf = vec![
        0;
        reader
            .output_buffer_size()
            .ok_or_else(|| err("image too large".into()))?
    ];
    let frame = reader
        .next_frame(&mut buf)
        .map_err(|e| err(format!("not a readable PNG: {e}")))?;
    let (w, h) = (frame.width as usize, frame.height as usize);
    let line = frame.line_size;
    if stride > 1 {
        // 8-bit colour: rows are exactly w * stride bytes.
        let n = w * h * stride;
        if line != w * stride || buf.len() < n {
            return Err(err(format!(
                "malformed PNG: {w}x{h} RGB rows of {line} bytes in a {} byte frame",
                buf.len()
            )));
        }
        return voc_indices(&buf[..n], stride, w)
            .map(|m| (m, [h, w]))
            .map_err(err);
    }
    // The decoder promises these, but a malformed file must give an error, never a panic.
    let fits = bits.is_power_of_two()
        && line.checked_mul(8).is_some_and(|l| l >= w * bits)
        && line.checked_mul(h).is_some_and(|n| n <= buf.len());
    if !fits {
        return Err(err(format!(
            "malformed PNG: {w}x{h} at {bits} bits does not fit rows of {line} bytes in a {} byte frame",
            buf.len()
        )));
    }
    let mut out = Vec::with_capacity(w * h);
    let value_mask = ((1u16 << bits) - 1) as u8;
    for row in buf.chunks_exact(line.max(1)).take(h) {
        for x in 0..w {
            let bit = x * bits;
            let byte = row.get(bit / 8).copied().unwrap_or(0);
            let shift = 8 - bits - (bit % 8);
            out.push((byte >> shift) & value_mask);
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
    /// Refuses `EveryNth(0)`, which `pick` would otherwise quietly treat as "every image".
    pub fn validate(&self) -> Result<(), String> {
        match self {
            Selection::EveryNth(0) => {
                Err("--calib-every must be ≥ 1 (0 would take no step)".into())
            }
            Selection::First(0) => Err(
                "--calib-count must be ≥ 1 (0 would calibrate on no image); leave it out to use every image".into(),
            ),
            _ => Ok(()),
        }
    }

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
    /// Class names in model output order (from folder names or a class-name file).
    pub classes: Vec<String>,
    pub kind: crate::model::Task,
    /// Where the class order came from, for messages.
    pub classes_from: ClassSource,
}

/// Where an evaluation set's class order (classification) or class names (segmentation) came
/// from.
#[derive(Clone, Debug, PartialEq, Default)]
pub enum ClassSource {
    /// Sorted class-folder names (classification) or no names at all (segmentation).
    #[default]
    Folders,
    /// A class-name file: folders are matched to its lines by name, and line k is output k.
    File(PathBuf),
    /// Sorted folder order, with display names from a file whose lines are not the folder
    /// names (e.g. ImageNet's `n01440764` folders and a "tench, goldfish…" list).
    NamesOnly(PathBuf),
}

impl ClassSource {
    /// One line saying where the classes came from.
    pub fn describe(&self) -> String {
        match self {
            ClassSource::Folders => "class order: sorted folder names".into(),
            ClassSource::File(p) => format!(
                "class order: {} (folders matched by name, line k = output k)",
                p.display()
            ),
            ClassSource::NamesOnly(p) => format!(
                "class order: sorted folder names; display names from {} (its lines are not the folder names)",
                p.display()
            ),
        }
    }
}

/// A class-name file to apply to an evaluation set, and whether the user named it
/// (`--labels`, the app's labels field) or it was found beside the model.
#[derive(Clone, Copy, Debug)]
pub struct LabelsFile<'a> {
    pub path: &'a Path,
    pub explicit: bool,
}

/// Largest class-name file accepted; real ones hold at most a few thousand short lines.
const MAX_LABELS_FILE_BYTES: u64 = 1024 * 1024;

/// Class names from a `labels.txt`-style file: one per line, blank lines ignored.
/// Refuses a file over 1 MiB, an empty list and duplicate names (a duplicate would make
/// two output indices claim the same folder).
pub fn read_labels_checked(path: &Path) -> Result<Vec<String>, DataError> {
    let err = |reason: String| DataError::Labels {
        path: path.into(),
        reason,
    };
    check_regular_file(path, MAX_LABELS_FILE_BYTES).map_err(err)?;
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    // Editors on Windows start UTF-8 files with a byte-order mark; it is not part of the
    // first class name.
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let v: Vec<String> = text
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    if v.is_empty() {
        return Err(err(
            "no class names; list one per line in the model's output order".into(),
        ));
    }
    let mut seen = std::collections::HashMap::new();
    for (i, name) in v.iter().enumerate() {
        if let Some(first) = seen.insert(name.as_str(), i) {
            return Err(err(format!(
                "`{name}` is listed twice (entries {} and {}); each class must appear once, in output order",
                first + 1,
                i + 1
            )));
        }
    }
    Ok(v)
}

/// [`read_labels_checked`] for callers that report their own error.
pub fn read_labels(path: &Path) -> Option<Vec<String>> {
    read_labels_checked(path).ok()
}

/// `root/labels.txt` if present; an error if present but unusable, so that a broken file
/// is not silently replaced by folder order.
fn root_labels(root: &Path) -> Result<Option<Vec<String>>, DataError> {
    let path = root.join("labels.txt");
    // `symlink_metadata`, so a dangling link named labels.txt is reported, not ignored.
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(None);
    }
    read_labels_checked(&path).map(Some)
}

/// At most 5 names for an error message, with a count of the rest.
fn first_five(names: &[String]) -> String {
    let mut s = names.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > 5 {
        s.push_str(&format!(" and {} more", names.len() - 5));
    }
    s
}

impl EvalSet {
    /// Opens `root` as a segmentation set if it has `images/` and `masks/`, else as ImageFolder.
    pub fn open(root: &Path, exclude: &HashSet<PathBuf>) -> Result<EvalSet, DataError> {
        Self::open_labelled(root, exclude, None)
    }

    /// [`EvalSet::open`] with a class-name file in force.
    ///
    /// Classification: a file the user named defines the class order (line k is output k;
    /// every class folder must be one of its lines), over a `labels.txt` inside the folder.
    /// A file found beside the model defines it too when the folder has no `labels.txt` and
    /// every folder is one of its lines. A file none of whose lines is a folder name, with one
    /// line per folder, only names the classes in sorted folder order (ImageNet's wnid
    /// folders), and the set says so; a file found beside the model that fits neither way is
    /// not used. Segmentation: masks hold output indices, so the file only names them.
    pub fn open_labelled(
        root: &Path,
        exclude: &HashSet<PathBuf>,
        labels: Option<LabelsFile<'_>>,
    ) -> Result<EvalSet, DataError> {
        let names = labels
            .map(|l| read_labels_checked(l.path).map(|n| (l, n)))
            .transpose()?;
        if root.join("images").is_dir() && root.join("masks").is_dir() {
            let mut set = Self::open_segmentation(root, exclude)?;
            // The folder's own labels.txt wins over a file found beside the model.
            if let Some((l, n)) = names.filter(|(l, _)| l.explicit || set.classes.is_empty()) {
                set.classes = n;
                set.classes_from = ClassSource::File(l.path.into());
            }
            return Ok(set);
        }
        let Some((l, n)) = names else {
            return Self::open_image_folder(root, exclude, None);
        };
        let dirs = class_folders(root)?;
        let matching = dirs.iter().filter(|d| n.contains(d)).count();
        let has_labels_txt = std::fs::symlink_metadata(root.join("labels.txt")).is_ok();
        // No folder is one of its lines but there is one line per folder: the lines name the
        // sorted folders (ImageNet's `n01440764` folders and a "tench, goldfish…" list).
        if matching == 0 && n.len() == dirs.len() {
            let mut set = Self::open_image_folder(root, exclude, None)?;
            if l.explicit || !has_labels_txt {
                set.classes = n;
                set.classes_from = ClassSource::NamesOnly(l.path.into());
            }
            return Ok(set);
        }
        let defines_order = if l.explicit {
            // Every folder must then be listed; the open says which one is not.
            true
        } else {
            !has_labels_txt && matching == dirs.len()
        };
        let order = defines_order.then(|| (l.path.to_path_buf(), n));
        Self::open_image_folder(root, exclude, order)
    }

    fn open_segmentation(root: &Path, exclude: &HashSet<PathBuf>) -> Result<EvalSet, DataError> {
        let images_dir = root.join("images");
        let (images, skipped) = list_images(&images_dir)?;
        let mut items = vec![];
        let mut missing = vec![];
        let mut excluded = 0;
        for img in images {
            if exclude.contains(&canonical(&img)) {
                excluded += 1;
                continue;
            }
            let stem = img.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
            let mask = root.join("masks").join(format!("{stem}.png"));
            // Anything present counts as the mask; `read_mask` then says why a FIFO or a
            // folder in its place is unusable, which is clearer than "missing".
            if std::fs::symlink_metadata(&mask).is_ok() {
                items.push(EvalItem {
                    image: img,
                    label: Label::Mask(mask),
                });
            } else {
                let name = img.strip_prefix(&images_dir).unwrap_or(&img);
                missing.push(name.display().to_string());
            }
        }
        if items.is_empty() && missing.is_empty() && excluded > 0 {
            return Err(every_image_excluded(root, excluded));
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
        // Scoring only the images that have masks would quietly evaluate a different set
        // than the user pointed at.
        if !missing.is_empty() {
            return Err(DataError::Layout {
                path: root.into(),
                reason: format!(
                    "{} of {} images in images/ have no mask masks/<stem>.png: {}; add the masks or remove those images",
                    missing.len(),
                    missing.len() + items.len(),
                    first_five(&missing)
                ),
            });
        }
        let labels_txt = root.join("labels.txt");
        let (classes, classes_from) = match root_labels(root)? {
            Some(names) => (names, ClassSource::File(labels_txt)),
            None => (vec![], ClassSource::Folders),
        };
        Ok(EvalSet {
            root: root.into(),
            items,
            classes,
            kind: crate::model::Task::Segmentation,
            classes_from,
        })
    }

    /// `order`: a class-name file that defines the output order; `None` takes `labels.txt` in
    /// `root`, else the sorted folder names.
    fn open_image_folder(
        root: &Path,
        exclude: &HashSet<PathBuf>,
        order: Option<(PathBuf, Vec<String>)>,
    ) -> Result<EvalSet, DataError> {
        let dirs = class_folders(root)?;
        let order = match order {
            Some(o) => Some(o),
            None => root_labels(root)?.map(|n| (root.join("labels.txt"), n)),
        };
        let (classes, classes_from) = match order {
            Some((path, order)) => {
                if let Some(d) = dirs.iter().find(|d| !order.contains(d)) {
                    let file = path
                        .file_name()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .into_owned();
                    return Err(DataError::Layout {
                        path,
                        reason: format!(
                            "folder `{d}` of {} is not listed in {file}; class folders are matched to its lines by name (line k is output k): list every folder, or drop the file to use sorted folder order",
                            root.display()
                        ),
                    });
                }
                (order, ClassSource::File(path))
            }
            None => (dirs.clone(), ClassSource::Folders),
        };
        if classes.is_empty() {
            return Err(DataError::Layout {
                path: root.into(),
                reason: "expected class folders (<class>/<image>) or images/ + masks/".into(),
            });
        }
        let mut per_class = vec![];
        let mut excluded = 0;
        for (ci, c) in classes.iter().enumerate() {
            let dir = root.join(c);
            if !dir.is_dir() {
                per_class.push(vec![]);
                continue;
            }
            let (imgs, _) = list_images(&dir)?;
            let before = imgs.len();
            let kept: Vec<PathBuf> = imgs
                .into_iter()
                .filter(|p| !exclude.contains(&canonical(p)))
                .collect();
            excluded += before - kept.len();
            per_class.push(
                kept.into_iter()
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
        if items.is_empty() && excluded > 0 {
            return Err(every_image_excluded(root, excluded));
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
            classes_from,
        })
    }
}

impl EvalSet {
    /// Checks the labels against the model once its class count is known (`classes` = the
    /// model's output channels; 0 = unknown, which skips what depends on it). Catches the
    /// mismatches that would otherwise produce a plausible-looking but meaningless score.
    ///
    /// Classification: the set's class count must equal `classes`. Segmentation: every mask
    /// must have its image's size and hold only ids below `classes` or `ignore`; this reads
    /// every mask and every image header.
    pub fn check_labels(&self, classes: usize, ignore: u8) -> Result<(), DataError> {
        match self.kind {
            crate::model::Task::Classification => self.check_class_count(classes),
            crate::model::Task::Segmentation => self.check_masks(classes, ignore),
        }
    }

    fn check_class_count(&self, classes: usize) -> Result<(), DataError> {
        let n = self.classes.len();
        if classes == 0 || n == classes {
            return Ok(());
        }
        // Say where the class list came from, so the fix points at the right thing.
        Err(match &self.classes_from {
            ClassSource::File(path) => DataError::Layout {
                path: path.clone(),
                reason: format!(
                    "{} lists {n} classes but the model outputs {classes} classes; list exactly the model's classes in output order (folders are matched by name)",
                    path.file_name().unwrap_or_default().to_string_lossy()
                ),
            },
            ClassSource::Folders | ClassSource::NamesOnly(_) => DataError::Layout {
                path: self.root.clone(),
                reason: format!(
                    "the folder has {n} class folders but the model outputs {classes} classes; add a labels.txt (or pass --labels FILE) that lists the model's classes in output order (folders are matched by name)"
                ),
            },
        })
    }

    fn check_masks(&self, classes: usize, ignore: u8) -> Result<(), DataError> {
        let mut first_bad: Option<PathBuf> = None;
        let mut wrong_size = vec![];
        let mut bad_id_files = vec![];
        let mut bad_ids = BTreeSet::new();
        for it in &self.items {
            let Label::Mask(m) = &it.label else { continue };
            let (mask, mask_hw) = read_mask(m)?;
            let image_hw = image_hw(&it.image)?;
            let name = m
                .strip_prefix(&self.root)
                .unwrap_or(m)
                .display()
                .to_string();
            let mut bad = false;
            if mask_hw != image_hw {
                wrong_size.push(format!(
                    "{name} ({}x{} mask, {}x{} image)",
                    mask_hw[0], mask_hw[1], image_hw[0], image_hw[1]
                ));
                bad = true;
            }
            if classes > 0 {
                // A presence table, not a set per pixel: masks can have millions of pixels.
                let mut present = [false; 256];
                for &v in &mask {
                    present[v as usize] = true;
                }
                let ids: Vec<u8> = (0..=255u8)
                    .filter(|&v| present[v as usize] && v != ignore && v as usize >= classes)
                    .collect();
                if !ids.is_empty() {
                    bad_ids.extend(ids);
                    bad_id_files.push(name);
                    bad = true;
                }
            }
            if bad && first_bad.is_none() {
                first_bad = Some(m.clone());
            }
        }
        let Some(path) = first_bad else {
            return Ok(());
        };
        let mut problems = vec![];
        if !wrong_size.is_empty() {
            problems.push(format!(
                "{} masks differ in size from their image (height x width): {}; masks must have their image's size",
                wrong_size.len(),
                first_five(&wrong_size)
            ));
        }
        if !bad_id_files.is_empty() {
            let ids = bad_ids
                .iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join(", ");
            problems.push(format!(
                "{} masks hold class ids the model does not have (ids {ids} ≥ {classes} classes ({ignore} is ignore)): {}; relabel those pixels to {ignore} or use a model with more classes",
                bad_id_files.len(),
                first_five(&bad_id_files)
            ));
        }
        Err(DataError::Mask {
            path,
            reason: problems.join("; and "),
        })
    }
}

/// Sorted names of the sub-folders of `root`: the class list when there is no labels.txt.
fn class_folders(root: &Path) -> Result<Vec<String>, DataError> {
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
    Ok(dirs)
}

/// Every evaluation image is also a calibration image and "skip calibration images" left none.
fn every_image_excluded(root: &Path, excluded: usize) -> DataError {
    DataError::Layout {
        path: root.into(),
        reason: format!(
            "all {excluded} images are also calibration images, and \"Skip calibration images\" (GUI; --eval-skip-calib on the command line) left none to evaluate; turn it off or evaluate on other images"
        ),
    }
}

pub fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_png(path: &Path, hw: [u32; 2]) {
        RgbImage::from_pixel(hw[1], hw[0], image::Rgb([1, 2, 3]))
            .save(path)
            .expect("write png");
    }

    fn write_mask(path: &Path, hw: [u32; 2], ids: &[u8]) {
        let file = std::fs::File::create(path).expect("create");
        let mut enc = png::Encoder::new(file, hw[1], hw[0]);
        enc.set_color(png::ColorType::Grayscale);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().expect("header");
        let data: Vec<u8> = (0..hw[0] * hw[1])
            .map(|i| ids[i as usize % ids.len()])
            .collect();
        w.write_image_data(&data).expect("data");
    }

    /// images/ + masks/ with one 4x4 image `a` and the given mask.
    fn seg_set(mask_hw: [u32; 2], ids: &[u8]) -> (tempfile::TempDir, EvalSet) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        std::fs::create_dir(root.join("images")).expect("mkdir");
        std::fs::create_dir(root.join("masks")).expect("mkdir");
        write_png(&root.join("images/a.png"), [4, 4]);
        write_mask(&root.join("masks/a.png"), mask_hw, ids);
        let set = EvalSet::open(root, &HashSet::new()).expect("open");
        (tmp, set)
    }

    #[test]
    fn missing_mask_is_an_error_naming_the_file() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        std::fs::create_dir(root.join("images")).expect("mkdir");
        std::fs::create_dir(root.join("masks")).expect("mkdir");
        write_png(&root.join("images/a.png"), [4, 4]);
        write_png(&root.join("images/b.png"), [4, 4]);
        write_mask(&root.join("masks/a.png"), [4, 4], &[0]);
        let err = EvalSet::open(root, &HashSet::new()).expect_err("b has no mask");
        let msg = err.to_string();
        assert!(matches!(err, DataError::Layout { .. }), "{msg}");
        assert!(
            msg.contains("1 of 2 images") && msg.contains("b.png"),
            "{msg}"
        );
        assert!(!msg.contains("a.png"), "{msg}");
    }

    #[test]
    fn check_labels_refuses_a_mask_of_another_size() {
        let (_tmp, set) = seg_set([2, 2], &[0]);
        let msg = set
            .check_labels(21, 255)
            .expect_err("2x2 mask, 4x4 image")
            .to_string();
        assert!(
            msg.contains("masks/a.png") && msg.contains("2x2 mask, 4x4 image"),
            "{msg}"
        );
    }

    #[test]
    fn check_labels_refuses_out_of_range_ids() {
        let (_tmp, set) = seg_set([4, 4], &[0, 3, 40, 255]);
        let msg = set
            .check_labels(3, 255)
            .expect_err("3 and 40 >= 3")
            .to_string();
        assert!(
            msg.contains("ids 3, 40 ≥ 3 classes (255 is ignore)"),
            "{msg}"
        );
        assert!(msg.contains("masks/a.png"), "{msg}");
        // In range once the model has enough classes; 255 is ignore, not a class.
        set.check_labels(41, 255).expect("all ids < 41");
        // 0 = class count unknown: only the size is checked.
        set.check_labels(0, 255).expect("no id check");
    }

    #[test]
    fn class_count_mismatch_is_an_error() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        for c in ["cat", "dog"] {
            std::fs::create_dir(root.join(c)).expect("mkdir");
            write_png(&root.join(c).join("1.png"), [2, 2]);
        }
        let set = EvalSet::open(root, &HashSet::new()).expect("open");
        let msg = set
            .check_labels(3, 255)
            .expect_err("2 folders, 3 outputs")
            .to_string();
        assert!(
            msg.contains("2 class folders")
                && msg.contains("outputs 3")
                && msg.contains("labels.txt"),
            "{msg}"
        );
        set.check_labels(2, 255).expect("2 folders, 2 outputs");

        // With labels.txt its length counts; a class without a folder is fine.
        std::fs::write(root.join("labels.txt"), "bird\ncat\ndog\n").expect("write");
        let set = EvalSet::open(root, &HashSet::new()).expect("open");
        set.check_labels(3, 255).expect("labels.txt lists 3");
        let msg = set
            .check_labels(2, 255)
            .expect_err("3 labels, 2 outputs")
            .to_string();
        assert!(msg.contains("labels.txt lists 3"), "{msg}");
    }

    #[test]
    fn voc_palette_matches_the_devkit() {
        assert_eq!(voc_color(0), [0, 0, 0]);
        assert_eq!(voc_color(1), [128, 0, 0]);
        assert_eq!(voc_color(2), [0, 128, 0]);
        assert_eq!(voc_color(15), [192, 128, 128]); // person
        assert_eq!(voc_color(20), [0, 64, 128]); // tv/monitor
        assert_eq!(voc_color(255), [224, 224, 192]); // void
    }

    fn write_rgb_mask(path: &Path, hw: [u32; 2], colors: &[[u8; 3]]) {
        let img = RgbImage::from_fn(hw[1], hw[0], |x, y| {
            image::Rgb(colors[(y * hw[1] + x) as usize % colors.len()])
        });
        img.save(path).expect("write rgb mask");
    }

    #[test]
    fn rgb_masks_in_voc_colours_decode_to_class_indices() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("m.png");
        let ids = [0u8, 15, 255, 1, 20, 15];
        let colors: Vec<[u8; 3]> = ids.iter().map(|&i| voc_color(i)).collect();
        write_rgb_mask(&path, [2, 3], &colors);
        let (mask, hw) = read_mask(&path).expect("VOC colours");
        assert_eq!(hw, [2, 3]);
        assert_eq!(mask, ids);

        // A colour outside the palette is named, with where it first appears.
        write_rgb_mask(
            &path,
            [2, 3],
            &[[0, 0, 0], [0, 0, 0], [0, 0, 0], [10, 20, 30]],
        );
        let msg = read_mask(&path).expect_err("not VOC").to_string();
        assert!(
            msg.contains("m.png")
                && msg.contains("(10, 20, 30)")
                && msg.contains("row 1, column 0"),
            "{msg}"
        );
    }

    /// cat/ and dog/ with one image each.
    fn cat_dog() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().expect("tempdir");
        for c in ["cat", "dog"] {
            std::fs::create_dir(tmp.path().join(c)).expect("mkdir");
            write_png(&tmp.path().join(c).join("1.png"), [2, 2]);
        }
        tmp
    }

    fn class_of(set: &EvalSet, folder: &str) -> usize {
        let it = set
            .items
            .iter()
            .find(|i| i.image.parent().and_then(|p| p.file_name()) == Some(folder.as_ref()))
            .expect("item");
        match it.label {
            Label::Class(c) => c,
            Label::Mask(_) => panic!("not a class"),
        }
    }

    #[test]
    fn a_labels_file_the_user_names_defines_the_class_order() {
        let tmp = cat_dog();
        let root = tmp.path();
        let labels = root.join("my_labels.txt");
        std::fs::write(&labels, "dog\nbird\ncat\n").expect("write");
        // Sorted folders would make cat 0 and dog 1.
        let plain = EvalSet::open(root, &HashSet::new()).expect("open");
        assert_eq!((class_of(&plain, "cat"), class_of(&plain, "dog")), (0, 1));
        let given = LabelsFile {
            path: &labels,
            explicit: true,
        };
        let set = EvalSet::open_labelled(root, &HashSet::new(), Some(given)).expect("open");
        assert_eq!(set.classes, ["dog", "bird", "cat"]);
        assert_eq!((class_of(&set, "cat"), class_of(&set, "dog")), (2, 0));
        assert_eq!(set.classes_from, ClassSource::File(labels.clone()));
        // It wins over the folder's own labels.txt.
        std::fs::write(root.join("labels.txt"), "cat\ndog\n").expect("write");
        let set = EvalSet::open_labelled(root, &HashSet::new(), Some(given)).expect("open");
        assert_eq!(class_of(&set, "dog"), 0);
        // Its length is what the model's class count is checked against.
        set.check_labels(3, 255).expect("3 names, 3 outputs");
        let msg = set
            .check_labels(1000, 255)
            .expect_err("3 vs 1000")
            .to_string();
        assert!(
            msg.contains("my_labels.txt lists 3 classes") && msg.contains("outputs 1000"),
            "{msg}"
        );
        // Lines that are no folder's name, one per folder, name the sorted folders, and the
        // set says so.
        std::fs::write(&labels, "Cat\nDog\n").expect("write");
        let set = EvalSet::open_labelled(root, &HashSet::new(), Some(given)).expect("open");
        assert_eq!((class_of(&set, "cat"), class_of(&set, "dog")), (0, 1));
        assert_eq!(set.classes_from, ClassSource::NamesOnly(labels.clone()));
        // A folder it does not list is refused, naming the folder and the file.
        std::fs::write(&labels, "dog\nbird\n").expect("write");
        let msg = EvalSet::open_labelled(root, &HashSet::new(), Some(given))
            .expect_err("cat missing")
            .to_string();
        assert!(
            msg.contains("`cat`") && msg.contains("my_labels.txt"),
            "{msg}"
        );
    }

    #[test]
    fn a_labels_file_beside_the_model_orders_matching_folders_and_only_names_others() {
        let tmp = cat_dog();
        let root = tmp.path();
        let beside = tmp.path().join("model.labels.txt");
        let found = LabelsFile {
            path: &beside,
            explicit: false,
        };
        // Its lines are the folder names: it defines the order.
        std::fs::write(&beside, "dog\ncat\n").expect("write");
        let set = EvalSet::open_labelled(root, &HashSet::new(), Some(found)).expect("open");
        assert_eq!(class_of(&set, "dog"), 0);
        // ImageNet-style: folders are ids, the file holds readable names; sorted folder
        // order stands and the names label it.
        std::fs::write(&beside, "Cat\nDog\n").expect("write");
        let set = EvalSet::open_labelled(root, &HashSet::new(), Some(found)).expect("open");
        assert_eq!((class_of(&set, "cat"), class_of(&set, "dog")), (0, 1));
        assert_eq!(set.classes, ["Cat", "Dog"]);
        assert_eq!(set.classes_from, ClassSource::NamesOnly(beside.clone()));
        // The folder's own labels.txt wins over a file found beside the model.
        std::fs::write(root.join("labels.txt"), "dog\ncat\n").expect("write");
        let set = EvalSet::open_labelled(root, &HashSet::new(), Some(found)).expect("open");
        assert_eq!(set.classes, ["dog", "cat"]);
    }

    #[test]
    fn labels_with_duplicates_are_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        std::fs::create_dir(root.join("cat")).expect("mkdir");
        write_png(&root.join("cat/1.png"), [2, 2]);
        std::fs::write(root.join("labels.txt"), "cat\ndog\ncat\n").expect("write");
        let msg = EvalSet::open(root, &HashSet::new())
            .expect_err("cat twice")
            .to_string();
        assert!(msg.contains("`cat` is listed twice"), "{msg}");
        assert_eq!(read_labels(&root.join("labels.txt")), None);
    }

    #[test]
    fn fifo_and_huge_files_are_refused_without_opening() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let big = tmp.path().join("big.png");
        std::fs::File::create(&big)
            .expect("create")
            .set_len(MAX_IMAGE_FILE_BYTES + 1)
            .expect("set_len");
        let msg = open_rgb(&big).expect_err("over the cap").to_string();
        assert!(msg.contains("256 MiB limit"), "{msg}");
        let msg = read_mask(&big).expect_err("over the cap").to_string();
        assert!(msg.contains("256 MiB limit"), "{msg}");

        let fifo = tmp.path().join("x.png");
        if !walk::tests::mkfifo(&fifo) {
            return;
        }
        // Opening a FIFO blocks until a writer appears: without the check these hang.
        let f = fifo.clone();
        let msg = walk::tests::within(10, move || open_rgb(&f).map(|_| ()))
            .expect_err("fifo")
            .to_string();
        assert!(msg.contains("not a regular file"), "{msg}");
        let f = fifo.clone();
        let msg = walk::tests::within(10, move || read_mask(&f).map(|_| ()))
            .expect_err("fifo")
            .to_string();
        assert!(msg.contains("not a regular file"), "{msg}");
    }

    #[test]
    fn mask_dimensions_are_capped_before_allocating() {
        // A header claiming 20000x20000 with a token IDAT: the size check must fire first.
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("m.png");
        let file = std::fs::File::create(&path).expect("create");
        let mut enc = png::Encoder::new(file, 20_000, 20_000);
        enc.set_color(png::ColorType::Grayscale);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().expect("header");
        w.write_chunk(
            png::chunk::IDAT,
            &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
        )
        .expect("idat");
        drop(w);
        let msg = read_mask(&path).expect_err("too large").to_string();
        assert!(
            msg.contains("20000x20000") && msg.contains("16384"),
            "{msg}"
        );
    }

    #[test]
    fn every_0th_is_refused() {
        assert!(Selection::EveryNth(0).validate().is_err());
        Selection::EveryNth(1).validate().expect("every image");
    }
}
