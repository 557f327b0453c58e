//! The vision tower's mmproj GGUF: llama.cpp's `convert_hf_to_gguf.py --mmproj` conversion of
//! transformers' `model.visual.*` (spec §8), `general.architecture = "clip"`, projector `qwen3vl_merger`.
//! Metadata (`clip.*` keys) and every tensor are checked once at load (presence, type, shape); the
//! matrices stay views into the mapping, the small tensors and the patch embedding are copied out as f32.

use std::path::Path;

use anyhow::{bail, ensure, Context, Result};

use crate::gguf::GgufFile;
use crate::kernels::Weight;
use crate::model::weights::Loader;

/// `general.architecture` of an mmproj file.
pub const ARCH: &str = "clip";
/// The projector of the Qwen3-VL / Qwen3.5 vision tower (2×2 patch merger).
pub const PROJECTOR: &str = "qwen3vl_merger";
/// Every LayerNorm of the tower (blocks and merger): transformers hard-codes 1e-6. The file's
/// `clip.vision.attention.layer_norm_epsilon` is not it: the converter copies the text model's RMSNorm
/// eps there (equal for the released models).
pub const LN_EPS: f32 = 1e-6;
/// Base of the 2-D rotary embedding; not in the file (llama.cpp hard-codes it for this projector too).
pub const ROPE_THETA: f64 = 10000.0;
/// RGB input.
pub const IN_CHANNELS: usize = 3;
/// Frames per patch of the Conv3d patch embedding (an image is its frame twice). The file stores the
/// kernel's two temporal slices as `v.patch_embd.weight` and `v.patch_embd.weight.1`.
pub const TEMPORAL_PATCH: usize = 2;

/// What the image preprocessing needs from the file.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageParams {
    /// Patch side in pixels (`clip.vision.patch_size`).
    pub patch_size: usize,
    /// Patches per side of a merged token (`clip.vision.spatial_merge_size`): the grid's sides must be
    /// multiples of it, and `pixel_values` rows come in `merge × merge` blocks.
    pub merge_size: usize,
    pub temporal_patch_size: usize,
    /// Per channel: `pixel_values = (x/255 − mean) / std` (`clip.vision.image_mean` / `image_std`).
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
    /// `clip.vision.image_min_pixels` / `image_max_pixels` when the file has them (llama.cpp's converter
    /// writes neither for this projector; transformers' Qwen3.5 processor uses 65536 and 16777216).
    pub min_pixels: Option<u64>,
    pub max_pixels: Option<u64>,
}

impl ImageParams {
    /// Elements of one `pixel_values` row: channel × frame × patch × patch.
    pub fn patch_dim(&self) -> usize {
        IN_CHANNELS * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Pixels per side of one merged token (32 for Qwen3.5): resized images are multiples of it.
    pub fn factor(&self) -> usize {
        self.patch_size * self.merge_size
    }
}

/// The tower's shape (from the `clip.vision.*` keys, checked against the tensors).
#[derive(Clone, Debug)]
pub struct VisionHParams {
    /// Width `D` of the blocks.
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    /// Output width of the merger (`clip.vision.projection_dim`): the text model's embedding width.
    pub n_out: usize,
    /// Side of the learned position table (48: `image_size / patch_size`).
    pub pos_side: usize,
    pub image: ImageParams,
}

impl VisionHParams {
    pub fn from_gguf(f: &GgufFile) -> Result<VisionHParams> {
        check_kind(f)?;
        let req = |k: &str| -> Result<usize> {
            let v = f.get_u64(k)?;
            usize::try_from(v)
                .ok()
                .filter(|&v| v > 0)
                .with_context(|| format!("metadata '{k}' = {v} is out of range"))
        };
        let flag = |k: &str| -> Result<Option<bool>> {
            f.get(k)
                .map(|v| {
                    v.as_bool()
                        .with_context(|| format!("metadata '{k}' is not a bool"))
                })
                .transpose()
        };
        if flag("clip.has_vision_encoder")? == Some(false) {
            bail!("mmproj has no vision encoder (clip.has_vision_encoder = false)");
        }
        if flag("clip.use_gelu")? == Some(false) {
            bail!("clip.use_gelu = false: the Qwen3.5 vision tower uses GELU");
        }
        if let Some(v) = f.get("clip.vision.is_deepstack_layers") {
            let flags = v
                .as_array()
                .and_then(|a| a.ints())
                .context("metadata 'clip.vision.is_deepstack_layers' is not a bool array")?;
            if let Some(i) = flags.iter().position(|&x| x != 0) {
                bail!(
                    "mmproj has DeepStack taps (clip.vision.is_deepstack_layers[{i}] = true): that is a \
                     Qwen3-VL tower, deltaq runs the Qwen3.5 one (no DeepStack)"
                );
            }
        }
        let opt_u64 = |k: &str| -> Result<Option<u64>> {
            f.get(k)
                .map(|_| f.get_u64(k).map_err(anyhow::Error::from))
                .transpose()
        };
        let rgb = |k: &str| -> Result<[f32; 3]> {
            let v = f.get_array(k)?.floats();
            match v.as_deref() {
                Some(&[r, g, b]) => Ok([r as f32, g as f32, b as f32]),
                _ => bail!("metadata '{k}' is not an array of 3 numbers"),
            }
        };

        let n_embd = req("clip.vision.embedding_length")?;
        let n_head = req("clip.vision.attention.head_count")?;
        let patch_size = req("clip.vision.patch_size")?;
        let image_size = req("clip.vision.image_size")?;
        ensure!(
            n_embd.is_multiple_of(n_head),
            "clip.vision.embedding_length {n_embd} is not a multiple of the {n_head} heads"
        );
        let head_dim = n_embd / n_head;
        ensure!(
            head_dim.is_multiple_of(4),
            "vision head dim {head_dim} is not a multiple of 4 (2-D rotary: a quarter of it per axis \
             and direction)"
        );
        ensure!(
            image_size.is_multiple_of(patch_size) && image_size / patch_size >= 2,
            "clip.vision.image_size {image_size} is not a multiple (≥ 2×) of patch_size {patch_size}"
        );
        let image = ImageParams {
            patch_size,
            merge_size: req("clip.vision.spatial_merge_size")?,
            temporal_patch_size: TEMPORAL_PATCH,
            image_mean: rgb("clip.vision.image_mean")?,
            image_std: rgb("clip.vision.image_std")?,
            min_pixels: opt_u64("clip.vision.image_min_pixels")?,
            max_pixels: opt_u64("clip.vision.image_max_pixels")?,
        };
        ensure!(
            image.image_std.iter().all(|s| s.is_finite() && *s != 0.0)
                && image.image_mean.iter().all(|m| m.is_finite()),
            "clip.vision.image_mean / image_std must be finite, std non-zero: {:?} / {:?}",
            image.image_mean,
            image.image_std
        );
        Ok(VisionHParams {
            n_embd,
            n_layer: req("clip.vision.block_count")?,
            n_head,
            head_dim,
            n_ff: req("clip.vision.feed_forward_length")?,
            n_out: req("clip.vision.projection_dim")?,
            pos_side: image_size / patch_size,
            image,
        })
    }

    /// Width of a merged token before the merger's projection: `merge²·D`.
    pub fn merged_dim(&self) -> usize {
        self.image.merge_size * self.image.merge_size * self.n_embd
    }

    /// The merger's output replaces token embeddings, so its width must be the text model's.
    pub fn check_text_model(&self, n_embd_text: usize) -> Result<()> {
        ensure!(
            self.n_out == n_embd_text,
            "the mmproj's vision tower outputs {}-wide embeddings but the text model's are {n_embd_text} \
             wide: the two files are not from the same model",
            self.n_out
        );
        Ok(())
    }
}

/// Opens `path` and checks that it is an mmproj of the Qwen3.5 vision tower (architecture and projector
/// type; [`VisionHParams::from_gguf`] and the weights check the rest).
pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
    let path = path.as_ref();
    let f = GgufFile::open(path)?;
    check_kind(&f).with_context(|| path.display().to_string())?;
    Ok(f)
}

/// Architecture `clip` and projector `qwen3vl_merger` (newer converters may write the projector as
/// `clip.vision.projector_type`).
fn check_kind(f: &GgufFile) -> Result<()> {
    let arch = f.get_str("general.architecture")?;
    if arch != ARCH {
        bail!(
            "not an mmproj file: general.architecture is '{arch}', expected '{ARCH}' (the vision tower \
             file written by convert_hf_to_gguf.py --mmproj)"
        );
    }
    let key = ["clip.vision.projector_type", "clip.projector_type"]
        .into_iter()
        .find(|k| f.get(k).is_some())
        .context("mmproj has no projector type (clip.projector_type)")?;
    let projector = f.get_str(key)?;
    if projector != PROJECTOR {
        bail!(
            "unsupported mmproj projector type '{projector}' ({key}): deltaq runs the Qwen3.5 vision \
             tower ('{PROJECTOR}') only"
        );
    }
    Ok(())
}

/// One transformer block: `x += proj(attn(LN1(x))); x += fc2(gelu_tanh(fc1(LN2(x))))`.
pub struct VisionBlock<'a> {
    pub ln1_w: Vec<f32>,
    pub ln1_b: Vec<f32>,
    /// `{D, 3D}`: q, k, v rows, each head `head_dim` rows.
    pub qkv: Weight<'a>,
    pub qkv_b: Vec<f32>,
    pub out: Weight<'a>,
    pub out_b: Vec<f32>,
    pub ln2_w: Vec<f32>,
    pub ln2_b: Vec<f32>,
    pub fc1: Weight<'a>,
    pub fc1_b: Vec<f32>,
    pub fc2: Weight<'a>,
    pub fc2_b: Vec<f32>,
}

pub struct VisionWeights<'a> {
    /// The Conv3d as one `[D × patch_dim]` matrix whose columns follow `pixel_values` rows
    /// (channel, frame, y, x): the file's two temporal halves interleaved per channel, as f32.
    pub patch: Vec<f32>,
    pub patch_b: Vec<f32>,
    /// `[pos_side² × D]`, row-major over the 48 × 48 grid.
    pub pos_table: Vec<f32>,
    pub blocks: Vec<VisionBlock<'a>>,
    /// The merger's LayerNorm (`merger.norm`), applied to every patch before the 2×2 concatenation.
    pub post_ln_w: Vec<f32>,
    pub post_ln_b: Vec<f32>,
    /// `{merge²·D, merge²·D}` then (exact GELU) `{merge²·D, n_out}`.
    pub mm0: Weight<'a>,
    pub mm0_b: Vec<f32>,
    pub mm2: Weight<'a>,
    pub mm2_b: Vec<f32>,
}

impl<'a> VisionWeights<'a> {
    pub fn load(f: &'a GgufFile, hp: &VisionHParams) -> Result<VisionWeights<'a>> {
        let l = Loader { f, what: "mmproj" };
        let (d, ff, p) = (hp.n_embd, hp.n_ff, hp.image.patch_size);
        let mut blocks = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let n = |s: &str| format!("v.blk.{il}.{s}");
            blocks.push(VisionBlock {
                ln1_w: l.vector(&n("ln1.weight"), &[d])?,
                ln1_b: l.vector(&n("ln1.bias"), &[d])?,
                qkv: l.matrix(&n("attn_qkv.weight"), d, 3 * d)?,
                qkv_b: l.vector(&n("attn_qkv.bias"), &[3 * d])?,
                out: l.matrix(&n("attn_out.weight"), d, d)?,
                out_b: l.vector(&n("attn_out.bias"), &[d])?,
                ln2_w: l.vector(&n("ln2.weight"), &[d])?,
                ln2_b: l.vector(&n("ln2.bias"), &[d])?,
                fc1: l.matrix(&n("ffn_up.weight"), d, ff)?,
                fc1_b: l.vector(&n("ffn_up.bias"), &[ff])?,
                fc2: l.matrix(&n("ffn_down.weight"), ff, d)?,
                fc2_b: l.vector(&n("ffn_down.bias"), &[d])?,
            });
        }
        if let Some(t) = f.tensor(&format!("v.blk.{}.ln1.weight", hp.n_layer)) {
            bail!(
                "mmproj has tensor '{}' beyond clip.vision.block_count = {}",
                t.name,
                hp.n_layer
            );
        }

        // Conv3d kernel [D, C, T, p, p] as two [D, C, p, p] halves (ggml ne = {p, p, C, D}).
        let halves = [
            l.vector("v.patch_embd.weight", &[p, p, IN_CHANNELS, d])?,
            l.vector("v.patch_embd.weight.1", &[p, p, IN_CHANNELS, d])?,
        ];
        let pp = p * p;
        let patch: Vec<f32> = (0..d * IN_CHANNELS)
            .flat_map(|oc| halves.iter().flat_map(move |h| &h[oc * pp..(oc + 1) * pp]))
            .copied()
            .collect();

        let merged = hp.merged_dim();
        Ok(VisionWeights {
            patch,
            patch_b: l.vector("v.patch_embd.bias", &[d])?,
            pos_table: l.vector("v.position_embd.weight", &[d, hp.pos_side * hp.pos_side])?,
            blocks,
            post_ln_w: l.vector("v.post_ln.weight", &[d])?,
            post_ln_b: l.vector("v.post_ln.bias", &[d])?,
            mm0: l.matrix("mm.0.weight", merged, merged)?,
            mm0_b: l.vector("mm.0.bias", &[merged])?,
            mm2: l.matrix("mm.2.weight", merged, hp.n_out)?,
            mm2_b: l.vector("mm.2.bias", &[hp.n_out])?,
        })
    }

    /// The patch embedding as a matrix for `matmul`: `{patch_dim, D}`, F32.
    pub fn patch_matrix(&self, hp: &VisionHParams) -> Weight<'_> {
        Weight {
            name: "v.patch_embd.weight",
            ty: crate::quant::GgmlType::F32,
            n_in: hp.image.patch_dim(),
            n_out: hp.n_embd,
            data: bytemuck::cast_slice(&self.patch),
        }
    }
}
