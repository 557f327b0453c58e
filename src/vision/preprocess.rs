//! Image preprocessing for the Qwen3.5 vision tower: image file bytes -> `pixel_values`, as the reference
//! Hugging Face processor makes them (`Qwen2VLImageProcessor`, torchvision backend, released settings).
//!
//! ```text
//! bytes  --decode_image-->      RGB8 [H × W × 3]        PNG / JPEG / WebP, size limits, PIL's convert("RGB")
//!        --smart_resize-->      (h, w)                  multiples of patch·merge = 32, min/max pixels
//!        --resize_bicubic_aa--> RGB8 [h × w × 3]        PyTorch's uint8 anti-aliased bicubic (none if same size)
//!        --normalise, patchify--> pixel_values [N × 1536]  N = h/16 · w/16 patches, 2×2-merge-block order
//! ```
//!
//! Public API:
//! - [`decode_image`] / [`decode_image_with_limits`]: file bytes -> [`RgbImage`], with clear errors for
//!   truncated, unsupported, empty or oversized ("decompression bomb") input.
//! - [`PreprocessConfig`]: patch 16, merge 2, temporal 2, mean/std (from the mmproj's
//!   `clip.vision.image_mean` / `image_std`), min/max pixels; [`PreprocessConfig::from_token_limits`] takes
//!   llama.cpp's `--image-min-tokens` / `--image-max-tokens` (one merged token = (16·2)² = 1024 pixels).
//! - [`smart_resize`]: the target size, with Python's round-half-to-even and the aspect-ratio limit (200).
//! - [`resize_bicubic_aa`]: torchvision `resize(BICUBIC, antialias=True)` on uint8, bit-exact arithmetic.
//! - [`preprocess`]: image -> [`Patches`] (`pixel_values [N × 3·2·16·16]`, grid in patches, t = 1);
//!   [`preprocess_bytes`]: decode + preprocess.
//!
//! Token limits: the released Qwen3.5 processor allows 64..16384 merged tokens (min_pixels 65536,
//! max_pixels 16777216). 16384 tokens is a lot of vision-tower work for a CPU, so our default maximum is
//! llama.cpp's for this projector family (`clip.cpp`: `set_limit_image_tokens(8, 4096)`): 4096 tokens =
//! 4194304 pixels. The minimum stays the released 64 tokens (llama.cpp's own default is 8, which changes
//! small images: see the fixture notes). An image that needs at most 4096 tokens is processed exactly as by
//! the released processor; a larger one is scaled down further than the released processor would.

use std::borrow::Cow;
use std::io::Cursor;

use anyhow::{anyhow, bail, ensure, Context, Result};
use image::{DynamicImage, ImageDecoder, ImageReader, Limits};
use rayon::prelude::*;

pub use image::RgbImage;

/// Qwen3.5's vision geometry: 16-pixel patches, 2 × 2 patches per merged token, 2 frames per image.
const QWEN_PATCH: usize = 16;
const QWEN_MERGE: usize = 2;
const QWEN_TEMPORAL: usize = 2;

/// The released Qwen3.5 processor's minimum, in merged tokens (`size.shortest_edge` = 65536 pixels).
pub const DEFAULT_MIN_TOKENS: usize = 64;
/// Our default maximum, in merged tokens: llama.cpp's for Qwen-VL projectors (4194304 pixels).
pub const DEFAULT_MAX_TOKENS: usize = 4096;
/// The released Qwen3.5 processor's maximum, in merged tokens (`size.longest_edge` = 16777216 pixels).
pub const RELEASED_MAX_TOKENS: usize = 16384;
/// Memory guard: the largest resized image [`preprocess`] makes, 2 × the released maximum (33554432
/// pixels, pixel_values of 805 MB). smart_resize can overshoot max_pixels (a side is at least one block)
/// and min_pixels (ceil on both sides), so the ceiling is above the largest allowed limit.
pub const MAX_RESIZED_PIXELS: usize = 2 * RELEASED_MAX_TOKENS * 1024;
/// transformers' `smart_resize` refuses images whose long side is more than 200 times the short one.
pub const MAX_ASPECT_RATIO: f64 = 200.0;

/// How an image becomes patches: the vision tower's geometry, its normalisation and the size limits.
#[derive(Debug, Clone, PartialEq)]
pub struct PreprocessConfig {
    /// Patch side in pixels (16).
    pub patch: usize,
    /// Spatial merge: merge × merge patches make one token (2).
    pub merge: usize,
    /// Temporal patch size: an image is this many identical frames (2).
    pub temporal: usize,
    /// Per-channel mean and std on the 0..1 scale (`clip.vision.image_mean` / `image_std`).
    pub mean: [f32; 3],
    pub std: [f32; 3],
    /// Pixel-count limits of the resized image (smart_resize's min_pixels / max_pixels).
    pub min_pixels: usize,
    pub max_pixels: usize,
}

impl Default for PreprocessConfig {
    /// Qwen3.5: patch 16, merge 2, temporal 2, mean = std = 0.5, 64..4096 merged tokens.
    fn default() -> Self {
        let token = (QWEN_PATCH * QWEN_MERGE).pow(2);
        Self {
            patch: QWEN_PATCH,
            merge: QWEN_MERGE,
            temporal: QWEN_TEMPORAL,
            mean: [0.5; 3],
            std: [0.5; 3],
            min_pixels: DEFAULT_MIN_TOKENS * token,
            max_pixels: DEFAULT_MAX_TOKENS * token,
        }
    }
}

impl PreprocessConfig {
    /// Qwen3.5 geometry with limits in merged tokens, as llama.cpp's `--image-min-tokens` /
    /// `--image-max-tokens`: one token = (patch · merge)² = 1024 pixels.
    pub fn from_token_limits(min_tokens: usize, max_tokens: usize) -> Result<Self> {
        let mut cfg = Self::default();
        let token = cfg.pixels_per_token();
        ensure!(
            min_tokens >= 1,
            "the image token minimum must be at least 1"
        );
        ensure!(
            min_tokens <= max_tokens,
            "image token minimum {min_tokens} is above the maximum {max_tokens}"
        );
        cfg.min_pixels = min_tokens
            .checked_mul(token)
            .ok_or_else(|| anyhow!("image token minimum {min_tokens} is too large"))?;
        cfg.max_pixels = max_tokens
            .checked_mul(token)
            .ok_or_else(|| anyhow!("image token maximum {max_tokens} is too large"))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The same configuration with the mmproj's normalisation (`clip.vision.image_mean` / `image_std`).
    pub fn with_mean_std(mut self, mean: [f32; 3], std: [f32; 3]) -> Result<Self> {
        self.mean = mean;
        self.std = std;
        self.validate()?;
        Ok(self)
    }

    /// Side of one merged token in pixels: the resized sides are multiples of it (32).
    pub fn factor(&self) -> usize {
        self.patch * self.merge
    }

    /// Pixels per merged token (1024).
    pub fn pixels_per_token(&self) -> usize {
        self.factor() * self.factor()
    }

    /// Values per patch row of `pixel_values`: channel × temporal × patch × patch (1536).
    pub fn row_len(&self) -> usize {
        3 * self.temporal * self.patch * self.patch
    }

    fn validate(&self) -> Result<()> {
        ensure!(
            self.patch >= 1 && self.merge >= 1 && self.temporal >= 1,
            "patch {}, merge {} and temporal {} must be at least 1",
            self.patch,
            self.merge,
            self.temporal
        );
        ensure!(
            self.min_pixels <= self.max_pixels,
            "min_pixels {} is above max_pixels {}",
            self.min_pixels,
            self.max_pixels
        );
        ensure!(
            self.max_pixels <= MAX_RESIZED_PIXELS / 2,
            "max_pixels {} is above the released processor's maximum of {} ({RELEASED_MAX_TOKENS} tokens)",
            self.max_pixels,
            MAX_RESIZED_PIXELS / 2
        );
        for c in 0..3 {
            ensure!(
                self.mean[c].is_finite() && self.std[c].is_finite() && self.std[c] > 0.0,
                "bad image normalisation for channel {c}: mean {}, std {}",
                self.mean[c],
                self.std[c]
            );
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------------------------------------

/// Limits on what [`decode_image_with_limits`] accepts before it allocates anything large.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Largest width or height in pixels.
    pub max_side: u32,
    /// Largest memory for the decoded image plus its RGB8 copy, in bytes.
    pub max_alloc: u64,
}

impl Default for DecodeLimits {
    /// 16384 pixels a side, 512 MiB.
    fn default() -> Self {
        Self {
            max_side: 16384,
            max_alloc: 512 << 20,
        }
    }
}

/// Decodes a PNG, JPEG or WebP file into RGB8 with the default [`DecodeLimits`].
pub fn decode_image(bytes: &[u8]) -> Result<RgbImage> {
    decode_image_with_limits(bytes, DecodeLimits::default())
}

/// Decodes a PNG, JPEG or WebP file into RGB8, as the reference loads an image
/// (`transformers.image_utils.load_image`: `PIL.Image.open`, `ImageOps.exif_transpose`, `convert("RGB")`):
/// the EXIF orientation is applied and the pixels are converted the way Pillow's `convert("RGB")` does
/// (see [`to_rgb8_like_pillow`]). The header's size is checked against `limits` before decoding.
///
/// PNG and lossless WebP decode to the same pixels as Pillow. JPEG goes through zune-jpeg, not
/// libjpeg-turbo as in Pillow: its IDCT and chroma upsampling may differ by a level here and there, and a
/// CMYK / YCCK JPEG is converted to RGB by zune-jpeg, not by Pillow's `convert("RGB")`.
pub fn decode_image_with_limits(bytes: &[u8], limits: DecodeLimits) -> Result<RgbImage> {
    ensure!(!bytes.is_empty(), "the image file is empty");
    let mut reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .context("reading the image header")?;
    let Some(format) = reader.format() else {
        bail!(
            "unrecognised image format (first bytes {:02x?}); PNG, JPEG and WebP are supported",
            &bytes[..bytes.len().min(8)]
        );
    };
    let mut decoder_limits = Limits::default();
    decoder_limits.max_image_width = Some(limits.max_side);
    decoder_limits.max_image_height = Some(limits.max_side);
    decoder_limits.max_alloc = Some(limits.max_alloc);
    reader.limits(decoder_limits);
    let mut decoder = reader.into_decoder().with_context(|| {
        format!(
            "opening the {format:?} image (limits: {} pixels a side, {} MiB)",
            limits.max_side,
            limits.max_alloc >> 20
        )
    })?;

    let (w, h) = decoder.dimensions();
    ensure!(w > 0 && h > 0, "the {format:?} image is empty ({w}x{h})");
    ensure!(
        w <= limits.max_side && h <= limits.max_side,
        "the {format:?} image is {w}x{h}, above the limit of {} pixels a side",
        limits.max_side
    );
    let need = decoder
        .total_bytes()
        .saturating_add(u64::from(w) * u64::from(h) * 3);
    ensure!(
        need <= limits.max_alloc,
        "decoding the {w}x{h} {format:?} image needs {} MiB, above the limit of {} MiB",
        need >> 20,
        limits.max_alloc >> 20
    );
    // A malformed EXIF block is not worth refusing the image for: Pillow's exif_transpose ignores it too.
    let orientation = decoder
        .orientation()
        .unwrap_or(image::metadata::Orientation::NoTransforms);
    let mut img = DynamicImage::from_decoder(decoder)
        .with_context(|| format!("decoding the {w}x{h} {format:?} image"))?;
    img.apply_orientation(orientation);
    to_rgb8_like_pillow(img)
}

/// Pillow's `convert("RGB")` of what Pillow would have opened: grey is replicated, alpha is dropped (not
/// composited: transformers' `convert_to_rgb` is a plain `image.convert("RGB")`), 16-bit RGB(A) and
/// grey+alpha keep the high byte (Pillow unpacks them as `RGB;16B` / `RGBA;16B` / `LA;16B`), and 16-bit grey
/// (`I;16`) is clipped at 255 (Pillow's `I16_RGB`: values above 255 become 255; not scaled).
pub fn to_rgb8_like_pillow(img: DynamicImage) -> Result<RgbImage> {
    let (w, h) = (img.width(), img.height());
    let rgb: Vec<u8> = match img {
        DynamicImage::ImageRgb8(b) => return Ok(b),
        DynamicImage::ImageRgba8(b) => expand(&b, 4, |p| [p[0], p[1], p[2]]),
        DynamicImage::ImageLuma8(b) => expand(&b, 1, |p| [p[0]; 3]),
        DynamicImage::ImageLumaA8(b) => expand(&b, 2, |p| [p[0]; 3]),
        DynamicImage::ImageLuma16(b) => expand(&b, 1, |p| [p[0].min(255) as u8; 3]),
        DynamicImage::ImageLumaA16(b) => expand(&b, 2, |p| [(p[0] >> 8) as u8; 3]),
        DynamicImage::ImageRgb16(b) => {
            expand(&b, 3, |p| [p[0], p[1], p[2]].map(|v| (v >> 8) as u8))
        }
        DynamicImage::ImageRgba16(b) => {
            expand(&b, 4, |p| [p[0], p[1], p[2]].map(|v| (v >> 8) as u8))
        }
        other => bail!("unsupported pixel format {:?}", other.color()),
    };
    RgbImage::from_raw(w, h, rgb).ok_or_else(|| anyhow!("decoded image {w}x{h} has the wrong size"))
}

/// Maps every `channels`-sample pixel of `src` to RGB8.
fn expand<T: Copy>(src: &[T], channels: usize, f: impl Fn(&[T]) -> [u8; 3]) -> Vec<u8> {
    let mut out = Vec::with_capacity(src.len() / channels * 3);
    for p in src.chunks_exact(channels) {
        out.extend_from_slice(&f(p));
    }
    out
}

// ---------------------------------------------------------------------------------------------------------
// Target size
// ---------------------------------------------------------------------------------------------------------

/// transformers' Qwen2-VL `smart_resize`: (height, width) rounded to multiples of `factor` (Python `round`,
/// i.e. half to even), then scaled down (floor) to at most `max_pixels` or up (ceil) to at least
/// `min_pixels`. The aspect ratio is not kept exactly: the image is stretched to the result. Errors when the
/// long side is more than [`MAX_ASPECT_RATIO`] times the short one, as transformers does.
pub fn smart_resize(
    height: usize,
    width: usize,
    factor: usize,
    min_pixels: usize,
    max_pixels: usize,
) -> Result<(usize, usize)> {
    ensure!(
        height > 0 && width > 0,
        "the image is empty ({width}x{height})"
    );
    ensure!(factor > 0, "smart_resize factor must be positive");
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    let ratio = h.max(w) / h.min(w);
    ensure!(
        ratio <= MAX_ASPECT_RATIO,
        "the image is {width}x{height}: its aspect ratio {ratio:.1} is above {MAX_ASPECT_RATIO} \
         (the processor's limit)"
    );
    let mut h_bar = (h / f).round_ties_even() * f;
    let mut w_bar = (w / f).round_ties_even() * f;
    if h_bar * w_bar > max_pixels as f64 {
        let beta = (h * w / max_pixels as f64).sqrt();
        h_bar = f.max((h / beta / f).floor() * f);
        w_bar = f.max((w / beta / f).floor() * f);
    } else if h_bar * w_bar < min_pixels as f64 {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        h_bar = (h * beta / f).ceil() * f;
        w_bar = (w * beta / f).ceil() * f;
    }
    // Only reachable with min_pixels = 0 and a side below factor / 2: transformers would fail in the resize.
    ensure!(
        h_bar >= f && w_bar >= f,
        "the image is {width}x{height}: it resizes to {w_bar}x{h_bar}, below one {factor}-pixel block"
    );
    Ok((h_bar as usize, w_bar as usize))
}

// ---------------------------------------------------------------------------------------------------------
// Resize: PyTorch's anti-aliased bicubic on uint8 (what torchvision's resize runs for a uint8 tensor)
// ---------------------------------------------------------------------------------------------------------

/// Keys' cubic convolution kernel with a = -0.5 (PyTorch's `aa_filter` for bicubic with antialias, as Pillow).
fn keys_cubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A
    } else {
        0.0
    }
}

/// The resampling of one axis: for output index `i`, `taps[i]` input samples from `first[i]` on, weighted
/// by `weights[i · ksize ..]` in fixed point with `precision` fraction bits.
#[derive(Debug)]
struct AxisFilter {
    first: Vec<usize>,
    taps: Vec<usize>,
    ksize: usize,
    weights: Vec<i16>,
    precision: u32,
}

impl AxisFilter {
    /// PyTorch's `_compute_index_ranges_int16_weights` (antialias, align_corners = False, no explicit
    /// scale): float64 weights normalised per output, then int16 with as many fraction bits as keep
    /// 2·max weight below 2^15 (at most 22).
    fn new(in_size: usize, out_size: usize) -> Self {
        let scale = in_size as f64 / out_size as f64;
        // Downscaling widens the kernel by the scale (anti-aliasing); upscaling keeps the 4-tap kernel.
        let support = if scale >= 1.0 { 2.0 * scale } else { 2.0 };
        let invscale = if scale >= 1.0 { 1.0 / scale } else { 1.0 };
        let ksize = support.ceil() as usize * 2 + 1;

        let mut weights_f64 = vec![0f64; out_size * ksize];
        let mut first = Vec::with_capacity(out_size);
        let mut taps = Vec::with_capacity(out_size);
        let mut max_weight = 0f64;
        for (i, w) in weights_f64.chunks_exact_mut(ksize).enumerate() {
            let center = scale * (i as f64 + 0.5);
            // `as i64` truncates toward zero, as the C++ static_cast does.
            let lo = ((center - support + 0.5) as i64).max(0);
            let hi = ((center + support + 0.5) as i64).min(in_size as i64);
            let n = (hi - lo).clamp(0, ksize as i64) as usize;
            let mut total = 0f64;
            for (j, wj) in w[..n].iter_mut().enumerate() {
                *wj = keys_cubic(((j as i64 + lo) as f64 - center + 0.5) * invscale);
                total += *wj;
            }
            if total != 0.0 {
                for wj in &mut w[..n] {
                    *wj /= total;
                    max_weight = max_weight.max(*wj);
                }
            }
            first.push(lo as usize);
            taps.push(n);
        }

        let mut precision = 0u32;
        while precision < 22 {
            let next = (0.5 + max_weight * (1i64 << (precision + 1)) as f64) as i64;
            if next >= 1 << 15 {
                break;
            }
            precision += 1;
        }
        let one = (1i64 << precision) as f64;
        let weights = weights_f64
            .iter()
            .map(|&w| {
                let v = w * one;
                (if v < 0.0 {
                    (v - 0.5) as i32
                } else {
                    (v + 0.5) as i32
                }) as i16
            })
            .collect();
        Self {
            first,
            taps,
            ksize,
            weights,
            precision,
        }
    }

    /// Output `i`'s input range start and its weights.
    fn taps(&self, i: usize) -> (usize, &[i16]) {
        (
            self.first[i],
            &self.weights[i * self.ksize..][..self.taps[i]],
        )
    }

    /// Fixed point back to uint8: round (the accumulator starts at one half), shift, clamp.
    #[inline]
    fn to_u8(&self, acc: i32) -> u8 {
        (acc >> self.precision).clamp(0, 255) as u8
    }

    #[inline]
    fn half(&self) -> i32 {
        1 << (self.precision - 1)
    }
}

/// Horizontal pass: `[h × w_in × 3]` -> `[h × w_out × 3]`, uint8 out (rounded and clamped).
fn resample_horizontal(src: &[u8], w_in: usize, h: usize, f: &AxisFilter) -> Vec<u8> {
    let w_out = f.first.len();
    let mut out = vec![0u8; h * w_out * 3];
    out.par_chunks_mut(w_out * 3)
        .zip(src.par_chunks(w_in * 3))
        .for_each(|(row, line)| {
            for (x, px) in row.chunks_exact_mut(3).enumerate() {
                let (lo, k) = f.taps(x);
                let mut acc = [f.half(); 3];
                for (s, &w) in line[lo * 3..].chunks_exact(3).zip(k) {
                    for c in 0..3 {
                        acc[c] += i32::from(s[c]) * i32::from(w);
                    }
                }
                for c in 0..3 {
                    px[c] = f.to_u8(acc[c]);
                }
            }
        });
    out
}

/// Vertical pass: `[h_in × w × 3]` -> `[h_out × w × 3]`, uint8 out (rounded and clamped).
fn resample_vertical(src: &[u8], w: usize, f: &AxisFilter) -> Vec<u8> {
    let h_out = f.first.len();
    let line_len = w * 3;
    let mut out = vec![0u8; h_out * line_len];
    out.par_chunks_mut(line_len).enumerate().for_each_init(
        || vec![0i32; line_len],
        |acc, (y, row)| {
            let (lo, k) = f.taps(y);
            acc.fill(f.half());
            for (j, &wj) in k.iter().enumerate() {
                let line = &src[(lo + j) * line_len..][..line_len];
                for (a, &s) in acc.iter_mut().zip(line) {
                    *a += i32::from(s) * i32::from(wj);
                }
            }
            for (o, &a) in row.iter_mut().zip(acc.iter()) {
                *o = f.to_u8(a);
            }
        },
    );
    out
}

/// torchvision `resize(img, [out_h, out_w], BICUBIC, antialias=True)` of a uint8 image, with PyTorch's CPU
/// arithmetic (`upsample_bicubic2d_aa` for uint8, the AVX2 kernel and its generic fallback agree): int16
/// fixed-point weights, int32 sums, the horizontal pass first into a uint8 image, then the vertical pass;
/// a pass whose size does not change is skipped (a copy), so an unchanged size is an exact copy.
pub fn resize_bicubic_aa(img: &RgbImage, out_w: u32, out_h: u32) -> Result<RgbImage> {
    let (w_in, h_in) = (img.width() as usize, img.height() as usize);
    let (w_out, h_out) = (out_w as usize, out_h as usize);
    ensure!(
        w_in > 0 && h_in > 0 && w_out > 0 && h_out > 0,
        "cannot resize {w_in}x{h_in} to {w_out}x{h_out}"
    );
    let mut pixels: Cow<[u8]> = Cow::Borrowed(img.as_raw());
    if w_out != w_in {
        let f = AxisFilter::new(w_in, w_out);
        pixels = Cow::Owned(resample_horizontal(&pixels, w_in, h_in, &f));
    }
    if h_out != h_in {
        let f = AxisFilter::new(h_in, h_out);
        pixels = Cow::Owned(resample_vertical(&pixels, w_out, &f));
    }
    RgbImage::from_raw(out_w, out_h, pixels.into_owned())
        .ok_or_else(|| anyhow!("resized image has the wrong size"))
}

// ---------------------------------------------------------------------------------------------------------
// Patches
// ---------------------------------------------------------------------------------------------------------

/// The vision tower's input for one image.
#[derive(Debug, Clone, PartialEq)]
pub struct Patches {
    /// `[N × row_len]`, N = grid_h · grid_w, rows in 2×2-merge-block order (block row, block column, row in
    /// block, column in block); each row is channel (3) × temporal (2, the same frame twice) × 16 × 16.
    pub pixel_values: Vec<f32>,
    /// Grid in patches (image_grid_thw = [1, grid_h, grid_w]).
    pub grid_h: usize,
    pub grid_w: usize,
    /// Spatial merge (2) and values per row (1536), from the configuration.
    pub merge: usize,
    pub row_len: usize,
}

impl Patches {
    /// Number of patches (rows of `pixel_values`).
    pub fn n_patches(&self) -> usize {
        self.grid_h * self.grid_w
    }

    /// Number of merged tokens (`<|image_pad|>` tokens in the prompt).
    pub fn n_merged_tokens(&self) -> usize {
        self.n_patches() / (self.merge * self.merge)
    }

    /// Merged-token grid (rows, cols): the M-RoPE height and width extents.
    pub fn merged_grid(&self) -> (usize, usize) {
        (self.grid_h / self.merge, self.grid_w / self.merge)
    }

    /// transformers' `image_grid_thw`.
    pub fn grid_thw(&self) -> [usize; 3] {
        [1, self.grid_h, self.grid_w]
    }

    /// Row `i` of `pixel_values`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.pixel_values[i * self.row_len..][..self.row_len]
    }
}

/// Image -> vision-tower input: smart_resize to multiples of 32 within the pixel limits, the torchvision
/// bicubic resize when the size changes, normalisation in float32 and the patch layout (see [`Patches`]).
pub fn preprocess(img: &RgbImage, cfg: &PreprocessConfig) -> Result<Patches> {
    cfg.validate()?;
    let (h, w) = (img.height() as usize, img.width() as usize);
    let (rh, rw) = smart_resize(h, w, cfg.factor(), cfg.min_pixels, cfg.max_pixels)?;
    ensure!(
        rh * rw <= MAX_RESIZED_PIXELS,
        "the {w}x{h} image would be resized to {rw}x{rh}, above the ceiling of {MAX_RESIZED_PIXELS} pixels"
    );
    let resized = if (rh, rw) == (h, w) {
        Cow::Borrowed(img)
    } else {
        let (rw32, rh32) = (u32::try_from(rw), u32::try_from(rh));
        let (Ok(rw32), Ok(rh32)) = (rw32, rh32) else {
            bail!("resized size {rw}x{rh} is too large");
        };
        Cow::Owned(resize_bicubic_aa(img, rw32, rh32)?)
    };
    Ok(patchify(&resized, cfg))
}

/// [`decode_image`] then [`preprocess`]: image file bytes -> vision-tower input.
pub fn preprocess_bytes(bytes: &[u8], cfg: &PreprocessConfig) -> Result<Patches> {
    let img = decode_image(bytes)?;
    preprocess(&img, cfg)
}

/// Normalise and lay out a `[h × w × 3]` image whose sides are multiples of patch · merge.
fn patchify(img: &RgbImage, cfg: &PreprocessConfig) -> Patches {
    let (p, m, t) = (cfg.patch, cfg.merge, cfg.temporal);
    let (h, w) = (img.height() as usize, img.width() as usize);
    let (grid_h, grid_w) = (h / p, w / p);
    let blocks_w = grid_w / m;
    let row_len = cfg.row_len();
    let plane = p * p;
    let raw = img.as_raw();
    // transformers fuses rescale (1/255) into normalise: (x - mean·255) / (std·255), all in float32.
    let mean: [f32; 3] = cfg.mean.map(|v| v * 255.0);
    let std: [f32; 3] = cfg.std.map(|v| v * 255.0);

    let mut pixel_values = vec![0f32; grid_h * grid_w * row_len];
    pixel_values
        .par_chunks_mut(m * m * row_len)
        .enumerate()
        .for_each(|(block, rows)| {
            let (block_row, block_col) = (block / blocks_w, block % blocks_w);
            for (k, row) in rows.chunks_exact_mut(row_len).enumerate() {
                let (py, px) = (block_row * m + k / m, block_col * m + k % m);
                for (c, frames) in row.chunks_exact_mut(t * plane).enumerate() {
                    let (first, rest) = frames.split_at_mut(plane);
                    for (y, out) in first.chunks_exact_mut(p).enumerate() {
                        let src = &raw[((py * p + y) * w + px * p) * 3..][..p * 3];
                        for (o, s) in out.iter_mut().zip(src.chunks_exact(3)) {
                            *o = (f32::from(s[c]) - mean[c]) / std[c];
                        }
                    }
                    for frame in rest.chunks_exact_mut(plane) {
                        frame.copy_from_slice(first);
                    }
                }
            }
        });
    Patches {
        pixel_values,
        grid_h,
        grid_w,
        merge: m,
        row_len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smart_resize_rounds_half_to_even() {
        // 48/32 = 1.5 -> 2, 80/32 = 2.5 -> 2; 112/32 = 3.5 -> 4, 144/32 = 4.5 -> 4 (rounding halves away
        // from zero, as f64::round and llama.cpp's std::round do, would give 96 and 160 for the 2.5 and 4.5).
        assert_eq!(smart_resize(48, 80, 32, 0, usize::MAX).unwrap(), (64, 64));
        assert_eq!(
            smart_resize(112, 144, 32, 0, usize::MAX).unwrap(),
            (128, 128)
        );
        // The fixture's img1: 215 x 330 -> 224 x 320 (6.72 -> 7, 10.31 -> 10).
        assert_eq!(
            smart_resize(215, 330, 32, 65536, 16777216).unwrap(),
            (224, 320)
        );
        assert_eq!(
            smart_resize(224, 320, 32, 65536, 16777216).unwrap(),
            (224, 320)
        );
    }

    #[test]
    fn smart_resize_min_and_max_pixels() {
        // The fixture's img2: 60 x 100, below 65536 pixels -> ceil(60·β/32)·32, ceil(100·β/32)·32.
        assert_eq!(
            smart_resize(60, 100, 32, 65536, 16777216).unwrap(),
            (224, 352)
        );
        // A 4000 x 3000 photo with 4096 tokens: β = sqrt(12e6 / 4194304), floor to multiples of 32.
        let (h, w) = smart_resize(3000, 4000, 32, 65536, 4096 * 1024).unwrap();
        assert_eq!((h, w), (1760, 2336));
        assert!(h * w <= 4096 * 1024);
        // The floor never goes below one block (even if that exceeds max_pixels, as transformers).
        assert_eq!(
            smart_resize(40, 4000, 32, 0, 32 * 32 * 4).unwrap(),
            (32, 640)
        );
        // A tiny image grows to min_pixels.
        let (h, w) = smart_resize(1, 1, 32, 65536, 16777216).unwrap();
        assert_eq!((h, w), (256, 256));
    }

    #[test]
    fn smart_resize_refuses_extreme_aspect_ratio_and_empty() {
        assert!(smart_resize(10, 2000, 32, 65536, 16777216).is_ok());
        let e = smart_resize(10, 2001, 32, 65536, 16777216).unwrap_err();
        assert!(e.to_string().contains("aspect ratio"), "{e}");
        assert!(smart_resize(0, 10, 32, 65536, 16777216).is_err());
        assert!(smart_resize(5, 5, 32, 0, 16777216).is_err());
    }

    #[test]
    fn token_limits() {
        let cfg = PreprocessConfig::default();
        assert_eq!((cfg.min_pixels, cfg.max_pixels), (65536, 4194304));
        assert_eq!(cfg.row_len(), 1536);
        let released = PreprocessConfig::from_token_limits(64, RELEASED_MAX_TOKENS).unwrap();
        assert_eq!(released.max_pixels, 16777216);
        assert!(PreprocessConfig::from_token_limits(100, 10).is_err());
        assert!(PreprocessConfig::from_token_limits(0, 10).is_err());
        assert!(PreprocessConfig::from_token_limits(1, usize::MAX).is_err());
        assert!(PreprocessConfig::from_token_limits(64, RELEASED_MAX_TOKENS + 1).is_err());
        assert!(cfg
            .clone()
            .with_mean_std([0.5; 3], [0.5, 0.0, 0.5])
            .is_err());
    }

    #[test]
    fn axis_filter_matches_torch_fixed_point() {
        // Identity-like upscale weights sum to one in fixed point and stay within int16.
        for (i, o) in [(100, 352), (330, 320), (215, 224), (3000, 37), (7, 1)] {
            let f = AxisFilter::new(i, o);
            assert!(f.precision >= 1 && f.precision <= 22);
            for x in 0..o {
                let (lo, k) = f.taps(x);
                assert!(lo + k.len() <= i);
                let sum: i32 = k.iter().map(|&w| i32::from(w)).sum();
                let one = 1i32 << f.precision;
                assert!(
                    (sum - one).abs() <= k.len() as i32,
                    "{i}->{o} x={x}: {sum} vs {one}"
                );
            }
        }
        // Upscaling: 4 taps at most (support 2), precision 14 (max weight near 1 -> 2^15 at 15 bits).
        let f = AxisFilter::new(100, 352);
        assert_eq!(f.ksize, 5);
        assert_eq!(f.precision, 14);
    }

    /// An independent float64 model of the same resize: weights from the kernel over every input index
    /// (no tap ranges), each pass rounded half up and clamped to uint8. The fixed-point result must stay
    /// within 1 level of it (weights quantised to 14..22 bits move a sum by far less than a level, so
    /// only values within a hair of .5 may round the other way).
    fn resize_f64_model(img: &RgbImage, out_w: usize, out_h: usize) -> Vec<u8> {
        let weights = |n_in: usize, n_out: usize| -> Vec<Vec<f64>> {
            let scale = n_in as f64 / n_out as f64;
            let stretch = scale.max(1.0);
            (0..n_out)
                .map(|i| {
                    let center = scale * (i as f64 + 0.5);
                    let w: Vec<f64> = (0..n_in)
                        .map(|j| keys_cubic((j as f64 + 0.5 - center) / stretch))
                        .collect();
                    let total: f64 = w.iter().sum();
                    w.iter().map(|v| v / total).collect()
                })
                .collect()
        };
        let to_u8 = |v: f64| (v + 0.5).floor().clamp(0.0, 255.0) as u8;
        let (w_in, h_in) = (img.width() as usize, img.height() as usize);
        let src = img.as_raw();
        let mut mid = src.to_vec();
        if out_w != w_in {
            let wx = weights(w_in, out_w);
            mid = vec![0; h_in * out_w * 3];
            for y in 0..h_in {
                for x in 0..out_w {
                    for c in 0..3 {
                        let v: f64 = (0..w_in)
                            .map(|j| wx[x][j] * f64::from(src[(y * w_in + j) * 3 + c]))
                            .sum();
                        mid[(y * out_w + x) * 3 + c] = to_u8(v);
                    }
                }
            }
        }
        if out_h == h_in {
            return mid;
        }
        let wy = weights(h_in, out_h);
        let mut out = vec![0; out_h * out_w * 3];
        for y in 0..out_h {
            for x in 0..out_w * 3 {
                let v: f64 = (0..h_in)
                    .map(|j| wy[y][j] * f64::from(mid[j * out_w * 3 + x]))
                    .sum();
                out[y * out_w * 3 + x] = to_u8(v);
            }
        }
        out
    }

    #[test]
    fn resize_agrees_with_a_float64_model() {
        // Hash noise plus gradients and hard edges: overshoot and clamping both happen.
        let img = RgbImage::from_fn(211, 97, |x, y| {
            let noise = (x.wrapping_mul(2654435761) ^ y.wrapping_mul(40503)) >> 7;
            let edge = if (x / 13 + y / 7) % 2 == 0 { 0 } else { 255 };
            image::Rgb([(noise % 256) as u8, edge, (x + 2 * y) as u8])
        });
        // Upscales, small and large downscales (kernel widened up to ~17x); one axis, then both (where a
        // 1-level difference after the first pass can become 2 after the second).
        let cases = [
            (352, 97),
            (500, 97),
            (200, 97),
            (12, 97),
            (211, 224),
            (211, 40),
            (211, 6),
            (352, 224),
            (96, 64),
            (12, 7),
            (3, 3),
        ];
        for (w, h) in cases {
            let ours = resize_bicubic_aa(&img, w, h).unwrap();
            let model = resize_f64_model(&img, w as usize, h as usize);
            let mut max = 0;
            let mut differ = 0;
            for (&a, &b) in ours.as_raw().iter().zip(&model) {
                max = max.max(a.abs_diff(b));
                differ += usize::from(a != b);
            }
            let one_axis = w == img.width() || h == img.height();
            assert!(
                max <= if one_axis { 1 } else { 2 },
                "{w}x{h}: max diff {max}"
            );
            // Measured 0.0 .. 0.4 %; on tiny outputs of the smooth channel up to 10 % (a linear gradient
            // puts many values within 0.005 of a .5 tie, where the int16 weights decide).
            let allowed = if model.len() >= 10_000 { 0.01 } else { 0.15 };
            assert!(
                differ as f64 <= allowed * model.len() as f64,
                "{w}x{h}: {differ} of {} differ",
                model.len()
            );
        }
    }

    #[test]
    fn resize_of_a_flat_image_is_flat_and_same_size_is_a_copy() {
        let img = RgbImage::from_fn(37, 23, |_, _| image::Rgb([10, 128, 250]));
        for (w, h) in [(64, 64), (13, 9), (37, 50), (80, 23)] {
            let r = resize_bicubic_aa(&img, w, h).unwrap();
            assert_eq!(r.dimensions(), (w, h));
            assert!(r.pixels().all(|p| p.0 == [10, 128, 250]), "{w}x{h}");
        }
        let noisy = RgbImage::from_fn(37, 23, |x, y| {
            image::Rgb([(x * 7) as u8, (y * 11) as u8, (x ^ y) as u8])
        });
        assert_eq!(resize_bicubic_aa(&noisy, 37, 23).unwrap(), noisy);
    }

    #[test]
    fn patch_layout_is_merge_block_order() {
        // A 32 x 64 image (grid 4 x 2 patches, 2 x 1 merge blocks) whose pixels encode their position, so
        // every value of pixel_values tells where it came from.
        let (w, h) = (32u32, 64u32);
        let img = RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, 200]));
        let cfg = PreprocessConfig {
            min_pixels: 0,
            ..PreprocessConfig::default()
        };
        let p = preprocess(&img, &cfg).unwrap();
        assert_eq!((p.grid_h, p.grid_w), (4, 2));
        assert_eq!(p.merged_grid(), (2, 1));
        assert_eq!(p.n_merged_tokens(), 2);
        let undo = |v: f32| (v * 127.5 + 127.5).round() as u32;
        for i in 0..p.n_patches() {
            let (block, k) = (i / 4, i % 4);
            let (py, px) = (block * 2 + k / 2, k % 2);
            let row = p.row(i);
            for tt in 0..2 {
                for y in 0..16 {
                    for x in 0..16 {
                        let at = |c: usize| undo(row[(c * 2 + tt) * 256 + y * 16 + x]);
                        assert_eq!(at(0), px as u32 * 16 + x as u32);
                        assert_eq!(at(1), py as u32 * 16 + y as u32);
                        assert_eq!(at(2), 200);
                    }
                }
            }
        }
    }
}
