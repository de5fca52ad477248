//! Mask overlays: the image with the FP32 mask, each INT8 mask and their disagreement drawn
//! over it, side by side in one PNG per image.

use std::path::{Path, PathBuf};

use image::{Rgb, RgbImage};

/// A distinct colour per class (the PASCAL VOC palette); 255 (ignore) is white.
pub fn class_color(c: u8) -> [u8; 3] {
    if c == 255 {
        return [255, 255, 255];
    }
    let (mut r, mut g, mut b) = (0u8, 0u8, 0u8);
    let mut c = c as u32;
    for shift in (0..8).rev() {
        r |= ((c & 1) as u8) << shift;
        g |= (((c >> 1) & 1) as u8) << shift;
        b |= (((c >> 2) & 1) as u8) << shift;
        c >>= 3;
        if c == 0 {
            break;
        }
    }
    [r, g, b]
}

/// `img` with `mask` blended over it at `alpha` (class 0 = background stays clear).
pub fn overlay_png(img: &RgbImage, mask: &[u8], alpha: f32) -> RgbImage {
    let mut out = img.clone();
    for (i, p) in out.pixels_mut().enumerate() {
        let c = mask.get(i).copied().unwrap_or(0);
        if c == 0 || c == 255 {
            continue;
        }
        let col = class_color(c);
        for k in 0..3 {
            p[k] = (p[k] as f32 * (1.0 - alpha) + col[k] as f32 * alpha) as u8;
        }
    }
    out
}

/// Writes `<dir>/<stem>.png`: image + FP32 overlay, then each other engine's overlay with
/// the pixels where it disagrees with FP32 in red. Returns the files written.
pub fn write_mask_overlays(
    dir: &Path,
    stem: &str,
    image: &RgbImage,
    fp32: &[u8],
    others: &[(String, &[u8])],
) -> std::io::Result<PathBuf> {
    let (w, h) = image.dimensions();
    let panels = 2 + others.len() as u32;
    let mut canvas = RgbImage::from_pixel(w * panels, h, Rgb([0, 0, 0]));
    image::imageops::replace(&mut canvas, image, 0, 0);
    image::imageops::replace(&mut canvas, &overlay_png(image, fp32, 0.55), w as i64, 0);
    for (k, (_, mask)) in others.iter().enumerate() {
        let mut o = overlay_png(image, mask, 0.55);
        for (i, p) in o.pixels_mut().enumerate() {
            if mask.get(i) != fp32.get(i) {
                *p = Rgb([255, 0, 0]);
            }
        }
        image::imageops::replace(&mut canvas, &o, (w * (2 + k as u32)) as i64, 0);
    }
    let path = dir.join(format!("{stem}.png"));
    crate::files::write_png(&path, &canvas.into()).map_err(std::io::Error::other)?;
    Ok(path)
}
