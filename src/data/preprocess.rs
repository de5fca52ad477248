//! Preprocessing: how a decoded image becomes a model input (resize mode, crop ratio,
//! interpolation, letterbox padding, channel order, normalisation), the presets for the common
//! conventions, and the [`Geometry`] that maps model-input pixels back to the original image
//! so segmentation masks stay aligned.

use image::{RgbImage, imageops::FilterType};
use serde::{Deserialize, Serialize};

use super::MAX_IMAGE_SIDE_PX;
use crate::model::{Layout, MetaNormalization};

/// How the image is brought to the model's input size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ResizeMode {
    /// Resize both sides to the input size, ignoring aspect ratio.
    #[default]
    Stretch,
    /// Resize the short side (to `input / crop_pct`, or to `resize_short_px`), then cut the
    /// centre: torchvision's `Resize(N)` + `CenterCrop(input)`, timm's `crop_pct`.
    Crop,
    /// Keep the aspect ratio, fit the long side, pad the rest with `pad_value` (ultralytics'
    /// `LetterBox`, for detectors).
    Letterbox,
}

/// Resampling filter, from the `image` crate. Its resize is the same separable, antialiased
/// (support widened when shrinking), centre-aligned scheme as Pillow's, which torchvision uses
/// on PIL images and (with `antialias=True`) on tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Interpolation {
    /// The source pixel under the output pixel's centre (Pillow's `NEAREST`).
    Nearest,
    /// Triangle filter (Pillow's and torchvision's `BILINEAR`).
    #[default]
    Bilinear,
    /// Catmull-Rom cubic, a = -0.5 (Pillow's `BICUBIC`; timm's `bicubic`).
    Bicubic,
}

impl Interpolation {
    pub const ALL: [Interpolation; 3] = [
        Interpolation::Nearest,
        Interpolation::Bilinear,
        Interpolation::Bicubic,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Interpolation::Nearest => "nearest",
            Interpolation::Bilinear => "bilinear",
            Interpolation::Bicubic => "bicubic",
        }
    }

    fn filter(self) -> FilterType {
        match self {
            Interpolation::Nearest => FilterType::Nearest,
            Interpolation::Bilinear => FilterType::Triangle,
            Interpolation::Bicubic => FilterType::CatmullRom,
        }
    }
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
#[serde(deny_unknown_fields)]
pub enum Normalize {
    /// `(x / 255 - mean) / std`, per channel (in the model's channel order).
    MeanStd { mean: [f32; 3], std: [f32; 3] },
    /// `x * scale + offset` on raw 0..255 values.
    ScaleOffset { scale: f32, offset: f32 },
}

/// ImageNet mean and std (0..1 scale, RGB): torchvision's and timm's defaults.
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];
/// Caffe / Keras `caffe` mode mean in 0..255 units, BGR order.
pub const CAFFE_MEAN_BGR_255: [f32; 3] = [103.939, 116.779, 123.68];

impl Default for Normalize {
    fn default() -> Self {
        Normalize::MeanStd {
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
        }
    }
}

/// Letterbox padding in ultralytics (raw 0..255 value, before normalisation).
pub const DEFAULT_PAD_VALUE: u8 = 114;

/// Everything needed to turn an image file into a model input. Saved in the experiment; a
/// field missing from an older file takes its default, which is the old behaviour.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[serde(deny_unknown_fields)]
pub struct Preprocess {
    pub resize: ResizeMode,
    /// Input height and width; `None` takes the model's own.
    pub size: Option<[usize; 2]>,
    pub channel_order: ChannelOrder,
    pub normalize: Normalize,
    /// Nobody chose `normalize`: a run takes the normalisation from the model's metadata when
    /// the exporter wrote one, else ImageNet mean/std, and says which ([`Preprocess::resolved`]).
    /// New experiments start so; a flag, a preset or an edit in the app turns it off. Missing
    /// from an older file, it is off: that file's `normalize` is what it ran with.
    #[serde(default)]
    pub auto_normalize: bool,
    /// Crop mode: the share of the resized image the centre crop keeps (timm's `crop_pct`):
    /// each side is resized to `floor(input / crop_pct)` before the crop, so 0.875 at 224 is
    /// 256 → 224. 1 resizes the short side straight to the input size.
    pub crop_pct: f64,
    /// Crop mode: resize the short side to this many pixels instead (torchvision's
    /// `Resize(N)`); overrides `crop_pct`.
    pub resize_short_px: Option<usize>,
    pub interpolation: Interpolation,
    /// Letterbox mode: the raw 0..255 value of the padding, on every channel.
    pub pad_value: u8,
}

impl Default for Preprocess {
    fn default() -> Self {
        Preprocess {
            resize: ResizeMode::default(),
            size: None,
            channel_order: ChannelOrder::default(),
            normalize: Normalize::default(),
            auto_normalize: true,
            crop_pct: 1.0,
            resize_short_px: None,
            interpolation: Interpolation::default(),
            pad_value: DEFAULT_PAD_VALUE,
        }
    }
}

/// The preprocessing conventions users know by name. Applying one sets the resize, crop,
/// interpolation, channel order and normalisation; the input size stays as it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// torchvision ImageNet: RGB, ImageNet mean/std, short side to 256 then centre 224
    /// (crop_pct 0.875), bilinear.
    TorchvisionImagenet,
    /// timm Inception-style: RGB, `(x - 127.5) / 127.5` (mean = std = 0.5), crop_pct 0.875,
    /// bicubic (timm's `inception_v3` configuration).
    TimmInception,
    /// Raw 0..255 RGB values, stretched to the input size, bilinear.
    Raw,
    /// Caffe / Keras `caffe` mode: BGR, subtract the BGR mean 103.939 / 116.779 / 123.68 from
    /// raw 0..255 values, no std; short side to 256 then centre 224 (crop_pct 0.875), bilinear.
    CaffeBgr,
}

impl Preset {
    pub const ALL: [Preset; 4] = [
        Preset::TorchvisionImagenet,
        Preset::TimmInception,
        Preset::Raw,
        Preset::CaffeBgr,
    ];

    /// The name used by `--preset` and shown in the app.
    pub fn name(self) -> &'static str {
        match self {
            Preset::TorchvisionImagenet => "torchvision",
            Preset::TimmInception => "timm-inception",
            Preset::Raw => "raw",
            Preset::CaffeBgr => "caffe",
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Preset::TorchvisionImagenet => {
                "torchvision ImageNet: RGB, ImageNet mean/std, short side 256 to centre 224 (crop 0.875), bilinear"
            }
            Preset::TimmInception => {
                "timm Inception-style: RGB, (x - 127.5) / 127.5, crop 0.875, bicubic"
            }
            Preset::Raw => "raw 0..255 RGB values, stretched to the input size, bilinear",
            Preset::CaffeBgr => {
                "Caffe-style: BGR, x - (103.939, 116.779, 123.68), no std, crop 0.875, bilinear"
            }
        }
    }

    pub fn from_name(name: &str) -> Option<Preset> {
        Preset::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Sets every field the preset defines; `size` is left alone.
    pub fn apply(self, p: &mut Preprocess) {
        let (resize, crop_pct, interpolation, channel_order, normalize) = match self {
            Preset::TorchvisionImagenet => (
                ResizeMode::Crop,
                0.875,
                Interpolation::Bilinear,
                ChannelOrder::Rgb,
                Normalize::default(),
            ),
            Preset::TimmInception => (
                ResizeMode::Crop,
                0.875,
                Interpolation::Bicubic,
                ChannelOrder::Rgb,
                Normalize::MeanStd {
                    mean: [0.5; 3],
                    std: [0.5; 3],
                },
            ),
            Preset::Raw => (
                ResizeMode::Stretch,
                1.0,
                Interpolation::Bilinear,
                ChannelOrder::Rgb,
                Normalize::ScaleOffset {
                    scale: 1.0,
                    offset: 0.0,
                },
            ),
            // (x/255 - m/255) / (1/255) = x - m: mean subtraction in the mean/std form, exact
            // to about 3e-5 in f32.
            Preset::CaffeBgr => (
                ResizeMode::Crop,
                0.875,
                Interpolation::Bilinear,
                ChannelOrder::Bgr,
                Normalize::MeanStd {
                    mean: CAFFE_MEAN_BGR_255.map(|m| m / 255.0),
                    std: [1.0 / 255.0; 3],
                },
            ),
        };
        p.resize = resize;
        p.crop_pct = crop_pct;
        p.resize_short_px = None;
        p.interpolation = interpolation;
        p.channel_order = channel_order;
        p.normalize = normalize;
        p.auto_normalize = false;
    }

    /// The preset whose fields `p` has (ignoring `size` and the unused letterbox padding), if any.
    pub fn matching(p: &Preprocess) -> Option<Preset> {
        Preset::ALL.into_iter().find(|preset| {
            let mut q = p.clone();
            preset.apply(&mut q);
            q.pad_value = p.pad_value;
            q.resize == p.resize
                && q.crop_pct == p.crop_pct
                && q.resize_short_px == p.resize_short_px
                && q.interpolation == p.interpolation
                && q.channel_order == p.channel_order
                && q.normalize == p.normalize
        })
    }
}

/// Where the normalisation a run uses came from.
#[derive(Clone, Debug, PartialEq)]
pub enum NormalizeSource {
    /// Set by the user (flags, preset, the app, a saved experiment).
    Given,
    /// Read from the model's metadata (the keys it was under).
    Metadata(String),
    /// Nobody said: ImageNet mean/std, the torchvision/timm default.
    Assumed,
}

impl Normalize {
    /// The formula with its numbers, e.g. `(x/255 - mean) / std, mean [0.485, 0.456, 0.406],
    /// std [0.229, 0.224, 0.225]`.
    pub fn describe(&self) -> String {
        let v = |a: &[f32; 3]| format!("[{}, {}, {}]", a[0], a[1], a[2]);
        match self {
            Normalize::MeanStd { mean, std } => {
                format!("(x/255 - mean) / std, mean {}, std {}", v(mean), v(std))
            }
            Normalize::ScaleOffset { scale, offset } => {
                format!("x * {scale} + {offset} on 0..255 values")
            }
        }
    }
}

impl NormalizeSource {
    /// One line for the log, the report and the app: what the input normalisation is and
    /// where it came from; an assumption says how to change it.
    pub fn describe(&self, n: &Normalize) -> String {
        match self {
            NormalizeSource::Given => format!("input normalisation: {}", n.describe()),
            NormalizeSource::Metadata(keys) => format!(
                "input normalisation from the model's metadata ({keys}): {}",
                n.describe()
            ),
            NormalizeSource::Assumed => format!(
                "input normalisation ASSUMED: ImageNet {} (nothing was given and the model's metadata names none); \
                 if the model was trained otherwise its accuracy reads low: set it with --mean/--std, --scale/--offset or --preset \
                 (timm-inception for (x - 127.5) / 127.5, raw for 0..255)",
                n.describe()
            ),
        }
    }
}

impl Preprocess {
    /// The preprocessing a run uses. With [`Preprocess::auto_normalize`] on, the normalisation
    /// is the model's metadata's, else ImageNet mean/std; otherwise `self` as it is.
    pub fn resolved(&self, meta: Option<&MetaNormalization>) -> (Preprocess, NormalizeSource) {
        if !self.auto_normalize {
            return (self.clone(), NormalizeSource::Given);
        }
        let mut p = self.clone();
        let source = match meta {
            Some(m) => {
                p.normalize = Normalize::MeanStd {
                    mean: m.mean,
                    std: m.std,
                };
                NormalizeSource::Metadata(m.keys.clone())
            }
            None => {
                p.normalize = Normalize::default();
                NormalizeSource::Assumed
            }
        };
        (p, source)
    }
}

/// Smallest |std| accepted: below it, normalised inputs reach magnitudes no model expects.
const MIN_STD: f32 = 1e-6;

/// How an image of `orig_hw` becomes an `input_hw` model input: it is resized to
/// `resized_hw`, then the `input_hw` window whose top-left corner is `origin` (in resized
/// pixels) is taken. A positive origin is a centre crop; a negative one is letterbox padding
/// before the image. Model-input pixels outside the resized image are padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub orig_hw: [usize; 2],
    pub input_hw: [usize; 2],
    pub resized_hw: [usize; 2],
    pub origin: [i64; 2],
}

/// Python's `round` (half to even), as torchvision and ultralytics compute crop and pad offsets.
fn py_round(v: f64) -> i64 {
    v.round_ties_even() as i64
}

impl Geometry {
    /// What happened to the image, in words: "500x375 → resized to 298x224 → centre 224x224"
    /// (height x width), so a run says the geometry it applied.
    pub fn describe(&self, mode: ResizeMode) -> String {
        let hw = |v: [usize; 2]| format!("{}x{}", v[0], v[1]);
        let (orig, resized, input) = (hw(self.orig_hw), hw(self.resized_hw), hw(self.input_hw));
        match mode {
            ResizeMode::Stretch => format!("{orig} → stretched to {input}"),
            ResizeMode::Crop => format!(
                "{orig} → resized to {resized} → centre crop {input} (from row {}, column {})",
                self.origin[0], self.origin[1]
            ),
            ResizeMode::Letterbox => format!(
                "{orig} → resized to {resized} → padded to {input} ({} rows above, {} columns left)",
                -self.origin[0], -self.origin[1]
            ),
        }
    }

    /// Original-image rectangle `[top, left, bottom, right]` (in original pixels, fractional)
    /// that the model input shows; for letterbox it is the whole image.
    pub fn source_box(&self) -> [f64; 4] {
        let [h0, w0] = self.orig_hw.map(|v| v.max(1) as f64);
        let [rh, rw] = self.resized_hw.map(|v| v.max(1) as f64);
        let [th, tw] = self.input_hw.map(|v| v as f64);
        let [oy, ox] = self.origin.map(|v| v as f64);
        let (ky, kx) = (h0 / rh, w0 / rw);
        [
            oy.max(0.0) * ky,
            ox.max(0.0) * kx,
            (oy + th).min(rh) * ky,
            (ox + tw).min(rw) * kx,
        ]
    }

    /// Model-input rows or columns (one axis) for an original-image coordinate, or `None`
    /// when the crop cut it away.
    fn to_input(&self, axis: usize, orig: f64) -> Option<f64> {
        let k = self.resized_hw[axis] as f64 / self.orig_hw[axis].max(1) as f64;
        let r = orig * k;
        let i = r - self.origin[axis] as f64;
        let inside = (0.0..self.resized_hw[axis] as f64).contains(&r)
            && (0.0..self.input_hw[axis] as f64).contains(&i);
        inside.then_some(i)
    }

    /// For each pixel of a `mask_hw` grid over the original image, the index into an
    /// `out_hw` prediction grid (nearest), or `None` where the crop cut that pixel away.
    /// Letterbox padding holds no image pixel, so no mask pixel maps to it: the prediction
    /// there is never evaluated.
    pub fn pixel_map(&self, mask_hw: [usize; 2], out_hw: [usize; 2]) -> Vec<Option<u32>> {
        let [mh, mw] = mask_hw;
        let axis_map = |axis: usize, n: usize| -> Vec<Option<u32>> {
            let k = self.orig_hw[axis] as f64 / n.max(1) as f64;
            let to_out = out_hw[axis] as f64 / self.input_hw[axis].max(1) as f64;
            (0..n)
                .map(|j| {
                    self.to_input(axis, (j as f64 + 0.5) * k)
                        .map(|i| ((i * to_out) as u32).min((out_hw[axis] as u32).saturating_sub(1)))
                })
                .collect()
        };
        let rows = axis_map(0, mh);
        let cols = axis_map(1, mw);
        let mut map = Vec::with_capacity(mh * mw);
        for r in &rows {
            for c in &cols {
                map.push(match (r, c) {
                    (Some(r), Some(c)) => Some(r * out_hw[1] as u32 + c),
                    _ => None,
                });
            }
        }
        map
    }
}

/// Resizes `img` to `hw` per `mode`, with the default settings of that mode (bilinear, crop
/// ratio 1, padding 114). [`Preprocess::resized`] uses every setting.
pub fn resize(img: &RgbImage, hw: [usize; 2], mode: ResizeMode) -> RgbImage {
    Preprocess {
        resize: mode,
        ..Default::default()
    }
    .resized(img, hw)
}

impl Preprocess {
    /// Where the model input's pixels come from for an `orig_hw` image at `input_hw`.
    ///
    /// Crop follows torchvision: the axis the image is shortest along (relative to the
    /// target) is resized exactly to the target, the other to `floor(target * long / short)`;
    /// the crop's top-left is `round((resized - input) / 2)`. Letterbox follows ultralytics:
    /// scale `r = min(input / orig)`, sides `round(orig * r)`, padding above and left
    /// `round(pad / 2 - 0.1)`.
    pub fn geometry(&self, orig_hw: [usize; 2], input_hw: [usize; 2]) -> Geometry {
        let [h0, w0] = orig_hw.map(|v| v.max(1));
        let [th, tw] = input_hw.map(|v| v.max(1));
        let (resized_hw, origin) = match self.resize {
            ResizeMode::Stretch => ([th, tw], [0, 0]),
            ResizeMode::Crop => {
                // The size the image must cover before the crop.
                let [ch, cw] = match self.resize_short_px {
                    Some(n) => [n.max(th), n.max(tw)],
                    None => {
                        let pct = if self.crop_pct > 0.0 && self.crop_pct <= 1.0 {
                            self.crop_pct
                        } else {
                            1.0
                        };
                        input_hw.map(|t| ((t as f64 / pct).floor() as usize).max(t.max(1)))
                    }
                };
                // ch/h0 >= cw/w0: height binds, without float error.
                let (rh, rw) = if ch * w0 >= cw * h0 {
                    (ch, (ch * w0 / h0).max(cw))
                } else {
                    ((cw * h0 / w0).max(ch), cw)
                };
                let oy = py_round((rh - th) as f64 / 2.0);
                let ox = py_round((rw - tw) as f64 / 2.0);
                ([rh, rw], [oy, ox])
            }
            ResizeMode::Letterbox => {
                let (rh, rw) = if th * w0 <= tw * h0 {
                    (
                        th,
                        (py_round(th as f64 * w0 as f64 / h0 as f64) as usize).clamp(1, tw),
                    )
                } else {
                    (
                        (py_round(tw as f64 * h0 as f64 / w0 as f64) as usize).clamp(1, th),
                        tw,
                    )
                };
                let top = py_round((th - rh) as f64 / 2.0 - 0.1);
                let left = py_round((tw - rw) as f64 / 2.0 - 0.1);
                ([rh, rw], [-top, -left])
            }
        };
        Geometry {
            orig_hw,
            input_hw,
            resized_hw,
            origin,
        }
    }

    /// The image as the model sees it before normalisation: resized, cropped or padded to `hw`.
    pub fn resized(&self, img: &RgbImage, hw: [usize; 2]) -> RgbImage {
        let (w0, h0) = img.dimensions();
        let g = self.geometry([h0 as usize, w0 as usize], hw);
        let [rh, rw] = g.resized_hw.map(|v| v as u32);
        let [h, w] = hw.map(|v| v as u32);
        let r = if (rw, rh) == (w0, h0) {
            img.clone()
        } else {
            image::imageops::resize(img, rw, rh, self.interpolation.filter())
        };
        if g.origin == [0, 0] && (rw, rh) == (w, h) {
            return r;
        }
        let mut out = RgbImage::from_pixel(w, h, image::Rgb([self.pad_value; 3]));
        image::imageops::replace(&mut out, &r, -g.origin[1], -g.origin[0]);
        out
    }

    /// Refuses settings that would silently turn every input into NaN, infinity or garbage
    /// (a NaN mean, a zero std, a 0-pixel size, a crop ratio outside (0, 1]). The message
    /// names the value and its flag.
    pub fn validate(&self) -> Result<(), String> {
        fn finite(flag: &str, v: &[f32]) -> Result<(), String> {
            match v.iter().find(|x| !x.is_finite()) {
                Some(x) => Err(format!(
                    "{flag}: {x} is not a finite number; give plain numbers"
                )),
                None => Ok(()),
            }
        }
        match self.normalize {
            Normalize::MeanStd { mean, std } => {
                finite("--mean", &mean)?;
                finite("--std", &std)?;
                // Dividing by a (near-)zero std blows every input up to infinity.
                if let Some(s) = std.iter().find(|s| s.abs() < MIN_STD) {
                    return Err(format!(
                        "--std: {s} is zero or too close to it (|std| must be at least {MIN_STD}); inputs would be divided by it"
                    ));
                }
            }
            Normalize::ScaleOffset { scale, offset } => {
                finite("--scale", &[scale])?;
                finite("--offset", &[offset])?;
                // A zero scale feeds every image as the same constant: every metric would be
                // the model's answer to a blank input.
                if scale.abs() < MIN_STD {
                    return Err(format!(
                        "--scale: {scale} makes every input the constant {offset}; give the factor that maps 0..255 to the model's range (1/255 = 0.0039215686 for 0..1)"
                    ));
                }
            }
        }
        let max = MAX_IMAGE_SIDE_PX as usize;
        if let Some(hw) = self.size
            && let Some(v) = hw.iter().find(|v| !(1..=max).contains(*v))
        {
            return Err(format!(
                "--size: {v} pixels is out of range for {}x{}; each side must be 1..={max}",
                hw[0], hw[1]
            ));
        }
        if !(self.crop_pct > 0.0 && self.crop_pct <= 1.0) {
            return Err(format!(
                "--crop-pct: {} is outside (0, 1]; it is the share of the resized image the centre crop keeps (0.875 resizes to 256 and crops 224; 1 resizes the short side straight to the input)",
                self.crop_pct
            ));
        }
        if let Some(n) = self.resize_short_px
            && !(1..=max).contains(&n)
        {
            return Err(format!(
                "--resize-short: {n} pixels is out of range; it must be 1..={max}"
            ));
        }
        if let Some(hw) = self.size {
            self.check_input_hw(hw)?;
        }
        Ok(())
    }

    /// Checks the settings against the input size in force (the model's, when `size` is
    /// unset): a short side smaller than the crop cannot be centre-cropped, and a crop ratio
    /// this small would resize past the image size limit.
    pub fn check_input_hw(&self, hw: [usize; 2]) -> Result<(), String> {
        if self.resize != ResizeMode::Crop {
            return Ok(());
        }
        let [h, w] = hw;
        if let Some(n) = self.resize_short_px
            && n < h.max(w)
        {
            return Err(format!(
                "--resize-short: {n} pixels is smaller than the {h}x{w} input, so the centre crop would not fit; give at least {} (256 for a 224 input is the ImageNet convention)",
                h.max(w)
            ));
        }
        let max = MAX_IMAGE_SIDE_PX as f64;
        if self.resize_short_px.is_none() && h.max(w) as f64 / self.crop_pct > max {
            return Err(format!(
                "--crop-pct: {} at a {h}x{w} input resizes to more than {max} pixels; use a ratio nearer 1",
                self.crop_pct
            ));
        }
        Ok(())
    }

    /// Turns an image into one input tensor (`channels x H x W` in `layout` order).
    pub fn apply(
        &self,
        img: &RgbImage,
        hw: [usize; 2],
        channels: usize,
        layout: Layout,
    ) -> Vec<f32> {
        let r = self.resized(img, hw);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The geometry a run reports, for torchvision's resize 256 / centre 224 on a portrait
    /// image (height 500, width 375) and for a letterbox.
    #[test]
    fn the_applied_geometry_reads_as_it_was_done() {
        let mut p = Preprocess::default();
        Preset::TorchvisionImagenet.apply(&mut p);
        let g = p.geometry([500, 375], [224, 224]);
        assert_eq!(
            g.describe(p.resize),
            "500x375 → resized to 341x256 → centre crop 224x224 (from row 58, column 16)"
        );
        p.resize = ResizeMode::Letterbox;
        let g = p.geometry([100, 200], [64, 64]);
        assert_eq!(
            g.describe(p.resize),
            "100x200 → resized to 32x64 → padded to 64x64 (16 rows above, 0 columns left)"
        );
    }

    #[test]
    fn auto_normalization_takes_the_metadata_else_assumes_imagenet_and_says_so() {
        let meta = MetaNormalization {
            mean: [0.5; 3],
            std: [0.25; 3],
            keys: "mean/std".into(),
        };
        let auto = Preprocess::default();
        assert!(auto.auto_normalize);
        let (p, src) = auto.resolved(Some(&meta));
        assert_eq!(
            p.normalize,
            Normalize::MeanStd {
                mean: [0.5; 3],
                std: [0.25; 3]
            }
        );
        assert!(
            src.describe(&p.normalize)
                .contains("from the model's metadata (mean/std)")
        );
        let (p, src) = auto.resolved(None);
        assert_eq!(p.normalize, Normalize::default());
        assert_eq!(src, NormalizeSource::Assumed);
        let line = src.describe(&p.normalize);
        assert!(
            line.contains("ASSUMED") && line.contains("0.485") && line.contains("--mean"),
            "{line}"
        );
        // What the user set stands, metadata or not; a preset counts as set.
        let mut given = Preprocess {
            normalize: Normalize::ScaleOffset {
                scale: 1.0,
                offset: 0.0,
            },
            auto_normalize: false,
            ..Default::default()
        };
        assert_eq!(given.resolved(Some(&meta)).0, given);
        given.auto_normalize = true;
        Preset::Raw.apply(&mut given);
        assert_eq!(given.resolved(Some(&meta)).1, NormalizeSource::Given);
    }

    /// An experiment saved before `auto_normalize` existed ran with its `normalize`: it keeps it.
    #[test]
    fn older_files_keep_their_normalization() {
        let p: Preprocess =
            ron::from_str("(normalize: MeanStd(mean: (0.5, 0.5, 0.5), std: (0.5, 0.5, 0.5)))")
                .expect("parse");
        assert!(!p.auto_normalize);
        let p: Preprocess = ron::from_str("()").expect("parse");
        assert!(!p.auto_normalize);
    }

    #[test]
    fn stretch_pixel_map_is_nearest() {
        let g = Preprocess::default().geometry([4, 4], [2, 2]);
        let m = g.pixel_map([4, 4], [2, 2]);
        assert_eq!(m[0], Some(0));
        assert_eq!(m[3], Some(1));
        assert_eq!(m[15], Some(3));
    }

    #[test]
    fn crop_pixel_map_drops_the_cut_sides() {
        // 4 tall, 8 wide, cropped to 4x4: the outer two columns each side are cut.
        let g = Preprocess {
            resize: ResizeMode::Crop,
            ..Default::default()
        }
        .geometry([4, 8], [4, 4]);
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

    #[test]
    fn preprocess_validate_refuses_nan_mean_zero_std_and_zero_size() {
        Preprocess::default()
            .validate()
            .expect("defaults are valid");
        let nan_mean = Preprocess {
            normalize: Normalize::MeanStd {
                mean: [0.5, f32::NAN, 0.5],
                std: [0.2; 3],
            },
            ..Default::default()
        };
        let msg = nan_mean.validate().expect_err("NaN mean");
        assert!(msg.starts_with("--mean") && msg.contains("NaN"), "{msg}");
        let zero_std = Preprocess {
            normalize: Normalize::MeanStd {
                mean: [0.5; 3],
                std: [0.2, 0.0, 0.2],
            },
            ..Default::default()
        };
        assert!(
            zero_std
                .validate()
                .expect_err("zero std")
                .starts_with("--std")
        );
        let inf_scale = Preprocess {
            normalize: Normalize::ScaleOffset {
                scale: f32::INFINITY,
                offset: 0.0,
            },
            ..Default::default()
        };
        assert!(
            inf_scale
                .validate()
                .expect_err("inf")
                .starts_with("--scale")
        );
        let zero_size = Preprocess {
            size: Some([224, 0]),
            ..Default::default()
        };
        assert!(
            zero_size
                .validate()
                .expect_err("0 px")
                .starts_with("--size")
        );
    }

    fn crop(pct: f64) -> Preprocess {
        Preprocess {
            resize: ResizeMode::Crop,
            crop_pct: pct,
            ..Default::default()
        }
    }

    #[test]
    fn crop_box_matches_torchvision_resize_256_center_crop_224() {
        // A 500x375 (W x H) photo: torchvision's Resize(256) gives 341x256 (long side
        // int(256 * 500 / 375)), CenterCrop(224) then starts at top round(32 / 2) = 16 and
        // left round(117 / 2) = 58 (half to even).
        let g = crop(0.875).geometry([375, 500], [224, 224]);
        assert_eq!(g.resized_hw, [256, 341]);
        assert_eq!(g.origin, [16, 58]);
        let [t, l, b, r] = g.source_box();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(t, 16.0 * 375.0 / 256.0) && close(b, 240.0 * 375.0 / 256.0));
        assert!(close(l, 58.0 * 500.0 / 341.0) && close(r, 282.0 * 500.0 / 341.0));
        // The same through torchvision's own naming, and for a portrait image.
        let short = Preprocess {
            resize_short_px: Some(256),
            ..crop(1.0)
        };
        assert_eq!(short.geometry([375, 500], [224, 224]), g);
        let p = crop(0.875).geometry([500, 375], [224, 224]);
        assert_eq!((p.resized_hw, p.origin), ([341, 256], [58, 16]));
        // timm: floor(224 / 0.9) = 248 for the short side.
        assert_eq!(
            crop(0.9).geometry([375, 500], [224, 224]).resized_hw[0],
            248
        );
        // crop_pct 1: the short side goes straight to the input size.
        assert_eq!(
            crop(1.0).geometry([375, 500], [224, 224]).resized_hw,
            [224, 298]
        );
    }

    #[test]
    fn cropped_image_is_the_centre_of_the_resized_one() {
        // Left half black, right half white, 40x20: a 16x16 input at crop 0.5 resizes the
        // short side to 32 (64x32) and keeps the centre 16x16, which straddles the edge.
        let img = RgbImage::from_fn(40, 20, |x, _| image::Rgb([if x < 20 { 0 } else { 255 }; 3]));
        let p = Preprocess {
            interpolation: Interpolation::Nearest,
            ..crop(0.5)
        };
        let r = p.resized(&img, [16, 16]);
        assert_eq!(r.dimensions(), (16, 16));
        assert_eq!(r.get_pixel(0, 8)[0], 0);
        assert_eq!(r.get_pixel(15, 8)[0], 255);
        // The stretch default sees the whole image: its far-left pixel is black too, but
        // the crop cut 24 of the 64 resized columns each side away.
        let g = p.geometry([20, 40], [16, 16]);
        assert_eq!((g.resized_hw, g.origin), ([32, 64], [8, 24]));
    }

    #[test]
    fn crop_pixel_map_skips_pixels_outside_the_crop() {
        let g = crop(0.875).geometry([375, 500], [224, 224]);
        let m = g.pixel_map([375, 500], [224, 224]);
        let at = |y: usize, x: usize| m[y * 500 + x];
        // Corners and the outer columns/rows were cut away; the centre is evaluated.
        assert_eq!(at(0, 0), None);
        assert_eq!(at(187, 10), None);
        assert_eq!(at(10, 250), None);
        assert!(at(187, 250).is_some());
        // Kept columns: x with (x + 0.5) * 341 / 500 in [58, 282), i.e. 224 * 500 / 341 ≈ 328.
        let kept_cols = (0..500).filter(|&x| at(187, x).is_some()).count();
        assert!((327..=329).contains(&kept_cols), "{kept_cols}");
        let kept_rows = (0..375).filter(|&y| at(y, 250).is_some()).count();
        assert!((327..=329).contains(&kept_rows), "{kept_rows}");
        // The first kept pixel maps to the first prediction column.
        let first = (0..500)
            .find(|&x| at(187, x).is_some())
            .expect("a kept column");
        assert_eq!(at(187, first).map(|i| i % 224), Some(0));
        // At half the prediction resolution the same pixels are kept.
        let half = g.pixel_map([375, 500], [112, 112]);
        assert_eq!(
            half.iter().filter(|v| v.is_some()).count(),
            m.iter().filter(|v| v.is_some()).count()
        );
    }

    #[test]
    fn letterbox_keeps_the_aspect_and_pads_with_the_stated_value() {
        let p = Preprocess {
            resize: ResizeMode::Letterbox,
            ..Default::default()
        };
        // ultralytics: 500x375 into 640: scale 1.28, 640x480 image, 80 rows above and below.
        let g = p.geometry([375, 500], [640, 640]);
        assert_eq!((g.resized_hw, g.origin), ([480, 640], [-80, 0]));
        // Odd padding: 3 rows over a 9-row input, 1 above (round(1.5 - 0.1)), 2 below.
        let g = p.geometry([6, 9], [9, 9]);
        assert_eq!((g.resized_hw, g.origin), ([6, 9], [-1, 0]));

        let img = RgbImage::from_pixel(50, 25, image::Rgb([200, 10, 30]));
        let r = p.resized(&img, [40, 40]);
        assert_eq!(r.dimensions(), (40, 40));
        assert_eq!(r.get_pixel(20, 0).0, [114; 3]);
        assert_eq!(r.get_pixel(20, 39).0, [114; 3]);
        assert_eq!(r.get_pixel(20, 20).0, [200, 10, 30]);
        let dark = Preprocess {
            pad_value: 0,
            ..p.clone()
        };
        assert_eq!(dark.resized(&img, [40, 40]).get_pixel(0, 0).0, [0; 3]);
        // The padding is normalised like any pixel: raw 114 stays 114.
        let raw = Preprocess {
            normalize: Normalize::ScaleOffset {
                scale: 1.0,
                offset: 0.0,
            },
            ..p.clone()
        };
        let v = raw.apply(&img, [40, 40], 3, Layout::Nchw);
        assert_eq!(v[0], 114.0);
        assert_eq!(v[20 * 40 + 20], 200.0);
    }

    #[test]
    fn letterbox_pixel_map_never_reads_the_padding() {
        let p = Preprocess {
            resize: ResizeMode::Letterbox,
            ..Default::default()
        };
        // A 100x50 (W x H) image in a 64x64 input: content rows 16..48.
        let g = p.geometry([50, 100], [64, 64]);
        assert_eq!((g.resized_hw, g.origin), ([32, 64], [-16, 0]));
        let m = g.pixel_map([50, 100], [64, 64]);
        assert!(
            m.iter().all(|v| v.is_some()),
            "every image pixel is evaluated"
        );
        let rows: BTreeSet<u32> = m.iter().flatten().map(|i| i / 64).collect();
        assert_eq!(rows.first(), Some(&16));
        assert_eq!(rows.last(), Some(&47));
        assert_eq!(rows.len(), 32);
    }

    #[test]
    fn interpolation_choice_changes_the_input() {
        // A fine checkerboard shrunk 7x: nearest keeps hard 0/255 pixels, bilinear and
        // bicubic average them (differently: bicubic's negative lobes).
        let img = RgbImage::from_fn(70, 70, |x, y| {
            image::Rgb([if (x / 2 + y / 3) % 2 == 0 { 0 } else { 255 }; 3])
        });
        let tensor = |i: Interpolation| {
            Preprocess {
                interpolation: i,
                ..Default::default()
            }
            .apply(&img, [10, 10], 3, Layout::Nchw)
        };
        let [n, l, c] = Interpolation::ALL.map(tensor);
        assert_ne!(n, l);
        assert_ne!(l, c);
        assert_ne!(n, c);
        let raw = |v: f32| ((v * IMAGENET_STD[0] + IMAGENET_MEAN[0]) * 255.0).round();
        assert!(n[..100].iter().all(|&v| raw(v) == 0.0 || raw(v) == 255.0));
        assert!(l[..100].iter().any(|&v| raw(v) > 10.0 && raw(v) < 245.0));
        // The default is bilinear, the resampling every earlier version used.
        assert_eq!(Preprocess::default().interpolation, Interpolation::Bilinear);
    }

    #[test]
    fn presets_set_the_conventional_numbers() {
        let mut p = Preprocess {
            size: Some([224, 224]),
            ..Default::default()
        };
        Preset::TorchvisionImagenet.apply(&mut p);
        assert_eq!(p.resize, ResizeMode::Crop);
        assert_eq!(p.crop_pct, 0.875);
        assert_eq!(p.interpolation, Interpolation::Bilinear);
        assert_eq!(p.channel_order, ChannelOrder::Rgb);
        assert_eq!(
            p.normalize,
            Normalize::MeanStd {
                mean: [0.485, 0.456, 0.406],
                std: [0.229, 0.224, 0.225]
            }
        );
        assert_eq!(p.size, Some([224, 224]), "the size is the user's");
        assert_eq!(p.geometry([375, 500], [224, 224]).resized_hw, [256, 341]);
        assert_eq!(Preset::matching(&p), Some(Preset::TorchvisionImagenet));

        // One pixel (R, G, B) = (10, 20, 30) through each convention.
        let img = RgbImage::from_pixel(4, 4, image::Rgb([10, 20, 30]));
        let first = |preset: Preset| {
            let mut p = Preprocess::default();
            preset.apply(&mut p);
            assert_eq!(Preset::matching(&p), Some(preset));
            let v = p.apply(&img, [4, 4], 3, Layout::Nchw);
            [v[0], v[16], v[32]]
        };
        let close =
            |a: [f32; 3], b: [f32; 3], tol: f32| a.iter().zip(b).all(|(x, y)| (x - y).abs() < tol);
        let timm = first(Preset::TimmInception);
        assert!(
            close(timm, [10.0, 20.0, 30.0].map(|x| (x - 127.5) / 127.5), 1e-6),
            "{timm:?}"
        );
        assert_eq!(first(Preset::Raw), [10.0, 20.0, 30.0]);
        let caffe = first(Preset::CaffeBgr);
        assert!(
            close(caffe, [30.0 - 103.939, 20.0 - 116.779, 10.0 - 123.68], 1e-3),
            "{caffe:?}"
        );
        let mut p = Preprocess::default();
        Preset::TimmInception.apply(&mut p);
        assert_eq!(p.interpolation, Interpolation::Bicubic);
        // The defaults (stretch, ImageNet mean/std) are no preset.
        assert_eq!(Preset::matching(&Preprocess::default()), None);
        for preset in Preset::ALL {
            assert_eq!(Preset::from_name(preset.name()), Some(preset));
        }
    }

    #[test]
    fn crop_settings_are_validated_with_the_flag_named() {
        for bad in [0.0, -0.5, 1.01, f64::NAN] {
            let msg = crop(bad).validate().expect_err("outside (0, 1]");
            assert!(
                msg.starts_with("--crop-pct") && msg.contains("(0, 1]"),
                "{msg}"
            );
        }
        crop(1.0).validate().expect("1 is the old crop");
        let short = Preprocess {
            resize_short_px: Some(200),
            ..crop(1.0)
        };
        short
            .validate()
            .expect("no size given: checked against the model's later");
        let msg = short.check_input_hw([224, 224]).expect_err("200 < 224");
        assert!(
            msg.starts_with("--resize-short") && msg.contains("224"),
            "{msg}"
        );
        let with_size = Preprocess {
            size: Some([224, 224]),
            ..short
        };
        assert!(with_size.validate().is_err());
        let msg = crop(0.001)
            .check_input_hw([224, 224])
            .expect_err("224000 px");
        assert!(msg.starts_with("--crop-pct"), "{msg}");
        // Settings of another mode are not checked against the size.
        Preprocess {
            resize_short_px: Some(10),
            ..Default::default()
        }
        .check_input_hw([224, 224])
        .expect("stretch ignores the short side");
    }
}
