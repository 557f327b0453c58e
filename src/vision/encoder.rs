//! Image file bytes to the embeddings a prompt takes: preprocessing with the mmproj's settings (or the
//! caller's token limits) and the vision tower, checked against the text model's width.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};

use super::preprocess::{
    preprocess_bytes, PreprocessConfig, DEFAULT_MAX_TOKENS, DEFAULT_MIN_TOKENS,
};
use super::tower::{VisionModel, VisionScratch};
use crate::gguf::GgufFile;
use crate::model::prompt::{content_id, ImageEmbd};

/// The vision tower of an mmproj file with its preprocessing settings.
pub struct ImageEncoder<'a> {
    pub model: VisionModel<'a>,
    pub cfg: PreprocessConfig,
}

/// One encoded image and where its time went.
pub struct Encoded {
    pub image: Arc<ImageEmbd>,
    /// Decoding and preprocessing, then the tower, in seconds.
    pub preprocess_secs: f64,
    pub encode_secs: f64,
}

impl<'a> ImageEncoder<'a> {
    /// The tower of `mmproj` for a text model of width `n_embd_text`. The resize limits, in merged tokens
    /// (one token = 32 × 32 pixels), are `min_tokens` / `max_tokens` when given, else the file's
    /// `clip.vision.image_min_pixels` / `image_max_pixels`, else 64 and 4096; mean and std come from the
    /// file.
    pub fn new(
        mmproj: &'a GgufFile,
        n_embd_text: usize,
        min_tokens: Option<usize>,
        max_tokens: Option<usize>,
    ) -> Result<ImageEncoder<'a>> {
        let model = VisionModel::load(mmproj).context("loading the mmproj's vision tower")?;
        model.check_text_model(n_embd_text)?;
        let im = &model.hp.image;
        let geometry = PreprocessConfig::default();
        anyhow::ensure!(
            (im.patch_size, im.merge_size, im.temporal_patch_size)
                == (geometry.patch, geometry.merge, geometry.temporal),
            "the mmproj's patch {} / merge {} / temporal {} are not Qwen3.5's ({} / {} / {})",
            im.patch_size,
            im.merge_size,
            im.temporal_patch_size,
            geometry.patch,
            geometry.merge,
            geometry.temporal
        );
        let token = geometry.pixels_per_token() as u64;
        let from_file = |px: Option<u64>| px.map(|p| p.div_ceil(token) as usize);
        let min = min_tokens
            .or(from_file(im.min_pixels))
            .unwrap_or(DEFAULT_MIN_TOKENS);
        let max = max_tokens
            .or(from_file(im.max_pixels))
            .unwrap_or(DEFAULT_MAX_TOKENS.max(min));
        let cfg = PreprocessConfig::from_token_limits(min, max)
            .context("image token limits")?
            .with_mean_std(im.image_mean, im.image_std)
            .context("the mmproj's image mean / std")?;
        Ok(ImageEncoder { model, cfg })
    }

    /// Decodes, preprocesses and encodes one image file's bytes. The image's identity for prompt
    /// caching is [`content_id`] of the bytes.
    pub fn encode_bytes(&self, bytes: &[u8], scratch: &mut VisionScratch) -> Result<Encoded> {
        let t0 = Instant::now();
        let patches = preprocess_bytes(bytes, &self.cfg)?;
        let t1 = Instant::now();
        let embd = self.model.encode(
            &patches.pixel_values,
            patches.grid_h,
            patches.grid_w,
            scratch,
        )?;
        let (rows, cols) = patches.merged_grid();
        let image = ImageEmbd::new(embd, rows, cols)?.with_id(content_id(bytes));
        Ok(Encoded {
            image: Arc::new(image),
            preprocess_secs: (t1 - t0).as_secs_f64(),
            encode_secs: t1.elapsed().as_secs_f64(),
        })
    }
}
