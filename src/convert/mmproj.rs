//! `deltaq convert --mmproj`: the vision tower of a `Qwen3_5ForConditionalGeneration` checkpoint → the
//! mmproj GGUF that llama.cpp's `convert_hf_to_gguf.py --mmproj` writes for it (its `Qwen3VLVisionModel`:
//! architecture `clip`, projector `qwen3vl_merger`), byte for byte: the same metadata keys, types and
//! order, tensor names, order, shapes, types and data.
//!
//! The tensors stream through the same reader and writer as the text conversion; the only reshaping is
//! the Conv3d patch embedding `[H, C, 2, p, p]`, written as its two temporal slices `[H, C, p, p]`
//! (`v.patch_embd.weight` and `v.patch_embd.weight.1`).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use anyhow::{bail, Context};
use serde_json::{Map, Value};

use super::config::{read_config_json, read_json_object, str_value, SUPPORTED};
use super::safetensors::Checkpoint;
use super::tensors::{ConvTensor, FrameSlice, RowMap, Transform};
use super::{
    default_name, is_converter_type, same_file, size_label, write_sampling, ConvertOptions,
    ConvertSummary,
};
use crate::gguf::{GgufWriter, OwnedValue, ValueType};
use crate::quant::GgmlType;
use crate::quantize::{write_gguf, FileType, Planned};

/// The projector type llama.cpp's runtime (`clip.cpp`) reads for this vision tower.
pub const PROJECTOR_TYPE: &str = "qwen3vl_merger";

/// The vision tower's configuration (`vision_config`, the text model's width and norm epsilon,
/// `preprocessor_config.json`'s normalisation), as the converter reads it.
#[derive(Debug, Clone)]
pub struct VisionConfig {
    /// Blocks (`depth`).
    pub depth: u64,
    /// Width H (`hidden_size`).
    pub n_embd: u64,
    /// MLP width (`intermediate_size`).
    pub n_ff: u64,
    pub n_head: u64,
    pub patch_size: u64,
    pub temporal_patch_size: u64,
    pub spatial_merge_size: u64,
    pub in_channels: u64,
    /// Rows of the learned position table.
    pub n_pos: u64,
    /// `image_size`, or as llama.cpp derives it: sqrt(n_pos) · patch_size.
    pub image_size: u64,
    /// Width of the merger's output (`out_hidden_size`, else the text width).
    pub n_out: u64,
    /// The text model's width (`clip.vision.projection_dim`).
    pub projection_dim: u64,
    /// The text config's `rms_norm_eps`, which llama.cpp writes as the vision LayerNorm epsilon.
    pub layer_norm_eps: f64,
    /// Per block: whether it feeds a deepstack merger.
    pub deepstack: Vec<bool>,
    pub image_mean: OwnedValue,
    pub image_std: OwnedValue,
}

impl VisionConfig {
    /// From a checkpoint folder's `config.json` (its top level `top`) and `preprocessor_config.json`.
    pub fn load(dir: &Path, top: &Map<String, Value>) -> anyhow::Result<VisionConfig> {
        let pre_path = dir.join("preprocessor_config.json");
        if top.get("vision_config").is_some_and(Value::is_object) && !pre_path.is_file() {
            bail!(
                "{} has no preprocessor_config.json (the image mean and std of the mmproj file come from it)",
                dir.display()
            );
        }
        let pre = if pre_path.is_file() {
            read_json_object(&pre_path)?
        } else {
            Map::new()
        };
        VisionConfig::from_json(top, &pre)
            .with_context(|| format!("in {}", dir.join("config.json").display()))
    }

    pub fn from_json(
        top: &Map<String, Value>,
        preprocessor: &Map<String, Value>,
    ) -> anyhow::Result<VisionConfig> {
        let Some(vision) = top.get("vision_config").filter(|v| !v.is_null()) else {
            bail!("no \"vision_config\": this checkpoint has no vision tower to write an mmproj file from");
        };
        let vision = vision
            .as_object()
            .context("\"vision_config\" is not an object")?;
        // llama.cpp picks the class by the first architecture, which the vision config may override.
        let arch = vision
            .get("architectures")
            .or_else(|| top.get("architectures"))
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            .context("no \"architectures\" entry")?;
        if arch != SUPPORTED[0] {
            bail!(
                "unknown architecture {arch} for --mmproj: deltaq writes the vision tower of {}",
                SUPPORTED[0]
            );
        }
        let text = top.get("text_config").and_then(Value::as_object);
        let v = Fields(vision, "vision_config");
        // Defaults: the ones llama.cpp's converter or transformers' vision config supply.
        let patch_size = v.u64_or("patch_size", 16)?;
        let n_pos = v.u64_or("num_position_embeddings", 2304)?;
        let image_size = match v.u64("image_size")? {
            Some(s) => s,
            None => ((n_pos as f64).sqrt() * patch_size as f64) as u64,
        };
        let temporal_patch_size = v.u64_or("temporal_patch_size", 2)?;
        if temporal_patch_size != 2 {
            bail!("temporal_patch_size is {temporal_patch_size}: llama.cpp's mmproj format splits the patch embedding into exactly 2 frames");
        }
        let depth = v.req("depth")?;
        let mut deepstack = vec![false; depth as usize];
        if let Some(idx) = vision
            .get("deepstack_visual_indexes")
            .filter(|x| !x.is_null())
        {
            let idx = idx
                .as_array()
                .context("vision_config.deepstack_visual_indexes is not an array")?;
            for i in idx {
                match i.as_u64().filter(|&i| i < depth) {
                    Some(i) => deepstack[i as usize] = true,
                    None => bail!("vision_config.deepstack_visual_indexes has {i}, but the vision tower has {depth} blocks"),
                }
            }
        }
        // The text width: the text config's, over the top level's.
        let text_width = text
            .and_then(|t| t.get("hidden_size").or_else(|| t.get("n_embd")))
            .or_else(|| top.get("hidden_size").or_else(|| top.get("n_embd")));
        let projection_dim = match text_width.and_then(Value::as_u64) {
            Some(n) if n > 0 => n,
            _ => bail!("no text hidden_size (text_config.hidden_size) for the projection width"),
        };
        let layer_norm_eps = match text.and_then(|t| t.get("rms_norm_eps")) {
            None => 1e-6,
            Some(e) => e
                .as_f64()
                .with_context(|| format!("text_config.rms_norm_eps is {e}, expected a number"))?,
        };
        let n_embd = v.req("hidden_size")?;
        Ok(VisionConfig {
            depth,
            n_embd,
            n_ff: v.req("intermediate_size")?,
            n_head: v.req("num_heads")?,
            patch_size,
            temporal_patch_size,
            spatial_merge_size: v.u64_or("spatial_merge_size", 2)?,
            in_channels: v.u64_or("in_channels", 3)?,
            n_pos,
            image_size,
            n_out: v.u64_or("out_hidden_size", projection_dim)?,
            projection_dim,
            layer_norm_eps,
            deepstack,
            image_mean: float_array(preprocessor, "image_mean")?,
            image_std: float_array(preprocessor, "image_std")?,
        })
    }

    /// The model part of the metadata (after `general.size_label`), in the order of llama.cpp's
    /// `MmprojModel.set_gguf_parameters` and `Qwen3VLVisionModel.set_gguf_parameters`.
    pub fn write_kv(&self, w: &mut GgufWriter, file_type: u32) {
        let u32v = |v: u64| OwnedValue::U32(v as u32);
        w.set("general.file_type", OwnedValue::U32(file_type));
        w.set("clip.has_vision_encoder", OwnedValue::Bool(true));
        w.set("clip.vision.projection_dim", u32v(self.projection_dim));
        w.set("clip.vision.image_size", u32v(self.image_size));
        w.set("clip.vision.patch_size", u32v(self.patch_size));
        w.set("clip.vision.embedding_length", u32v(self.n_embd));
        w.set("clip.vision.feed_forward_length", u32v(self.n_ff));
        w.set("clip.vision.block_count", u32v(self.depth));
        w.set("clip.vision.attention.head_count", u32v(self.n_head));
        w.set("clip.vision.image_mean", self.image_mean.clone());
        w.set("clip.vision.image_std", self.image_std.clone());
        w.set("clip.projector_type", str_value(PROJECTOR_TYPE));
        w.set("clip.use_gelu", OwnedValue::Bool(true));
        w.set(
            "clip.vision.spatial_merge_size",
            u32v(self.spatial_merge_size),
        );
        w.set(
            "clip.vision.attention.layer_norm_epsilon",
            OwnedValue::F32(self.layer_norm_eps as f32),
        );
        if !self.deepstack.is_empty() {
            let flags = self
                .deepstack
                .iter()
                .map(|&b| OwnedValue::Bool(b))
                .collect();
            w.set(
                "clip.vision.is_deepstack_layers",
                OwnedValue::Array(ValueType::Bool, flags),
            );
        }
    }

    /// Every tensor of the vision tower: HF name after `visual.` → (GGUF name, PyTorch shape).
    fn expected_tensors(&self) -> HashMap<String, (String, Vec<u64>)> {
        let (h, ff) = (self.n_embd, self.n_ff);
        let merged = h * self.spatial_merge_size * self.spatial_merge_size; // 2×2 patches concatenated
        let mut m = HashMap::new();
        let mut add = |hf: String, gguf: String, shape: Vec<u64>| {
            m.insert(hf, (gguf, shape));
        };
        let linear = |hf: &str, gguf: &str, n_out: u64, n_in: u64| {
            [
                (
                    format!("{hf}.weight"),
                    format!("{gguf}.weight"),
                    vec![n_out, n_in],
                ),
                (format!("{hf}.bias"), format!("{gguf}.bias"), vec![n_out]),
            ]
        };
        for b in 0..self.depth {
            let (hf, g) = (format!("blocks.{b}"), format!("v.blk.{b}"));
            for (hf_part, g_part, n_out, n_in) in [
                ("attn.qkv", "attn_qkv", 3 * h, h),
                ("attn.proj", "attn_out", h, h),
                ("mlp.linear_fc1", "ffn_up", ff, h),
                ("mlp.linear_fc2", "ffn_down", h, ff),
            ] {
                for (a, b, s) in linear(
                    &format!("{hf}.{hf_part}"),
                    &format!("{g}.{g_part}"),
                    n_out,
                    n_in,
                ) {
                    add(a, b, s);
                }
            }
            for (hf_part, g_part) in [("norm1", "ln1"), ("norm2", "ln2")] {
                for p in ["weight", "bias"] {
                    add(
                        format!("{hf}.{hf_part}.{p}"),
                        format!("{g}.{g_part}.{p}"),
                        vec![h],
                    );
                }
            }
        }
        for (a, b, s) in linear("merger.linear_fc1", "mm.0", merged, merged)
            .into_iter()
            .chain(linear("merger.linear_fc2", "mm.2", self.n_out, merged))
        {
            add(a, b, s);
        }
        for p in ["weight", "bias"] {
            add(
                format!("merger.norm.{p}"),
                format!("v.post_ln.{p}"),
                vec![h],
            );
        }
        let (c, t, p) = (self.in_channels, self.temporal_patch_size, self.patch_size);
        add(
            "patch_embed.proj.weight".into(),
            "v.patch_embd.weight".into(),
            vec![h, c, t, p, p],
        );
        add(
            "patch_embed.proj.bias".into(),
            "v.patch_embd.bias".into(),
            vec![h],
        );
        add(
            "pos_embed.weight".into(),
            "v.position_embd.weight".into(),
            vec![self.n_pos, h],
        );
        m
    }
}

/// Converts the vision tower of the checkpoint in `dir` to an mmproj GGUF at `output` (atomically;
/// the input is only read). `opts.no_mtp` does not apply; the outtype must be one the converter
/// writes itself (F32, F16, BF16, Q8_0).
pub fn convert_mmproj(
    dir: &Path,
    output: &Path,
    opts: &ConvertOptions,
) -> anyhow::Result<ConvertSummary> {
    if !is_converter_type(opts.outtype) {
        bail!(
            "--mmproj writes f32, f16, bf16 or q8_0 (llama.cpp's converter types), not {}",
            opts.outtype.name().to_lowercase()
        );
    }
    let top = read_config_json(dir)?;
    let vcfg = VisionConfig::load(dir, &top)?;
    let ckpt = Checkpoint::open(dir)?;
    for (p, _) in &ckpt.files {
        if same_file(p, output) {
            bail!("the output would overwrite the input {}", p.display());
        }
    }

    // Map the vision tensors, in the converter's order (the checkpoint's sorted names).
    let expected = vcfg.expected_tensors();
    let mut found: HashSet<&str> = HashSet::new();
    let mut out: Vec<ConvTensor<'_>> = Vec::new();
    let mut input_bytes = 0;
    for t in &ckpt.tensors {
        let Some(rest) = vision_part(&t.name) else {
            continue; // text model, MTP, lm_head
        };
        if [
            ".attention.masked_bias",
            ".attention.bias",
            ".rotary_emb.inv_freq",
        ]
        .iter()
        .any(|s| t.name.ends_with(s))
        {
            continue;
        }
        if rest.starts_with("deepstack_merger_list.") {
            bail!(
                "tensor '{}': deepstack mergers are not supported (Qwen3.5 has none)",
                t.name
            );
        }
        let Some((gguf, shape)) = expected.get(rest) else {
            bail!(
                "cannot map vision tensor '{}' (a Qwen3.5 vision tower of {} blocks has no such tensor)",
                t.name,
                vcfg.depth
            );
        };
        if t.shape != *shape {
            bail!(
                "tensor '{}' has shape {:?}, but config.json implies {shape:?}",
                t.name,
                t.shape
            );
        }
        found.insert(rest);
        input_bytes += t.nbytes;
        let dtype = t.dtype()?;
        let tensor = |name: String, ne: Vec<u64>, rows: Option<RowMap>| ConvTensor {
            ckpt: &ckpt,
            src: t.clone(),
            dtype,
            name,
            ne,
            transform: Transform::None,
            rows,
            cols: None,
            hf_name: t.name.clone(),
        };
        if rest == "patch_embed.proj.weight" {
            // Conv3d [H, C, T, p, p] → T Conv2d kernels [H, C, p, p] (ggml ne [p, p, C, H]).
            let ne = vec![shape[4], shape[3], shape[1], shape[0]];
            for frame in 0..shape[2] {
                let name = match frame {
                    0 => gguf.clone(),
                    f => format!("{gguf}.{f}"),
                };
                let slice = FrameSlice {
                    rows: shape[3],
                    frames: shape[2],
                    frame,
                };
                out.push(tensor(name, ne.clone(), Some(RowMap::Frame(slice))));
            }
        } else {
            out.push(tensor(
                gguf.clone(),
                shape.iter().rev().copied().collect(),
                None,
            ));
        }
    }
    let mut missing: Vec<&str> = expected
        .keys()
        .map(String::as_str)
        .filter(|k| !found.contains(k))
        .collect();
    if !missing.is_empty() {
        missing.sort();
        let n = missing.len();
        missing.truncate(10);
        bail!(
            "{n} vision tensor(s) missing from the checkpoint in {}: model.visual.{}{}",
            dir.display(),
            missing.join(", model.visual."),
            if n > 10 { ", ..." } else { "" }
        );
    }

    // Metadata, in the converter's order.
    let mut hparams = top.clone();
    if let Some(t) = top.get("text_config").and_then(Value::as_object) {
        hparams.extend(t.clone());
    }
    let n_params: u64 = out.iter().map(|t| t.ne.iter().product::<u64>()).sum();
    let mut w = GgufWriter::new();
    w.set("general.architecture", str_value("clip"));
    w.set("general.type", str_value("mmproj"));
    write_sampling(dir, &mut w)?;
    let name = match &opts.model_name {
        Some(n) => n.clone(),
        None => default_name(dir, &hparams),
    };
    w.set("general.name", str_value(&name));
    w.set("general.size_label", str_value(&size_label(n_params)));
    vcfg.write_kv(&mut w, opts.outtype.id());
    w.set("general.quantization_version", OwnedValue::U32(2));

    let n_tensors = out.len();
    let plan: Vec<Planned<'_>> = out
        .into_iter()
        .map(|t| Planned {
            ty: mmproj_type(&t.name, &t.ne, opts.outtype),
            source: Box::new(t),
        })
        .collect();
    let write = write_gguf(output, w, &plan, opts.overwrite, opts.progress)
        .with_context(|| format!("writing {}", output.display()))?;
    Ok(ConvertSummary {
        write,
        input_bytes,
        n_tensors,
        skipped_vision: 0,
        dropped_mtp: 0,
    })
}

/// The part of a vision tensor's name after `visual.` (llama.cpp renames `model.visual.` to `visual.`
/// and keeps only those).
fn vision_part(name: &str) -> Option<&str> {
    name.strip_prefix("model.visual.")
        .or_else(|| name.strip_prefix("visual."))
}

/// The type llama.cpp's converter gives an mmproj tensor (`ModelBase.prepare_tensors` with
/// `MmprojModel.tensor_force_quant`): vectors, norms, biases and the position table stay F32; the patch
/// embedding is F16 in an F16 file and F32 otherwise (never BF16 or Q8_0); Q8_0 falls back to F16 for
/// rows that are not whole blocks.
pub fn mmproj_type(name: &str, ne: &[u64], outtype: FileType) -> GgmlType {
    if ne.len() <= 1 || name.ends_with("_norm.weight") {
        return GgmlType::F32;
    }
    if name.contains(".patch_embd.weight") {
        return if outtype == FileType::F16 {
            GgmlType::F16
        } else {
            GgmlType::F32
        };
    }
    if name == "v.position_embd.weight" || !name.ends_with(".weight") {
        return GgmlType::F32;
    }
    let wanted = outtype.default_type();
    if !ne[0].is_multiple_of(wanted.block_size() as u64) {
        return GgmlType::F16; // gguf-py's QuantError fallback
    }
    wanted
}

/// `preprocessor_config.json`'s `image_mean` / `image_std` as gguf-py stores a Python list: an array
/// typed by its first element (float → F32, int → I32).
fn float_array(pre: &Map<String, Value>, key: &str) -> anyhow::Result<OwnedValue> {
    let a = pre
        .get(key)
        .with_context(|| format!("preprocessor_config.json has no \"{key}\""))?
        .as_array()
        .filter(|a| !a.is_empty())
        .with_context(|| format!("preprocessor_config.json: \"{key}\" is not a list of numbers"))?;
    let bad = || anyhow::anyhow!("preprocessor_config.json: \"{key}\" is not a list of numbers");
    if a[0].is_f64() {
        let v = a
            .iter()
            .map(|x| {
                x.as_f64()
                    .map(|f| OwnedValue::F32(f as f32))
                    .ok_or_else(bad)
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(OwnedValue::Array(ValueType::F32, v))
    } else {
        let v = a
            .iter()
            .map(|x| {
                x.as_i64()
                    .and_then(|i| i32::try_from(i).ok())
                    .map(OwnedValue::I32)
                    .ok_or_else(bad)
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(OwnedValue::Array(ValueType::I32, v))
    }
}

/// Typed look-ups in one config object.
struct Fields<'a>(&'a Map<String, Value>, &'a str);

impl Fields<'_> {
    fn u64(&self, key: &str) -> anyhow::Result<Option<u64>> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|&n| n <= u32::MAX as u64)
                .map(Some)
                .with_context(|| {
                    format!("{}.{key} is {v}, expected a non-negative integer", self.1)
                }),
        }
    }

    fn u64_or(&self, key: &str, default: u64) -> anyhow::Result<u64> {
        Ok(self.u64(key)?.unwrap_or(default))
    }

    fn req(&self, key: &str) -> anyhow::Result<u64> {
        self.u64(key)?
            .with_context(|| format!("{}.{key} is missing", self.1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_follow_the_converter() {
        let w2 = [64u64, 192];
        let patch = [16u64, 16, 3, 64];
        for (ft, weight, patch_ty) in [
            (FileType::F32, GgmlType::F32, GgmlType::F32),
            (FileType::F16, GgmlType::F16, GgmlType::F16),
            (FileType::BF16, GgmlType::BF16, GgmlType::F32),
            (FileType::Q8_0, GgmlType::Q8_0, GgmlType::F32),
        ] {
            assert_eq!(mmproj_type("v.blk.0.attn_qkv.weight", &w2, ft), weight);
            assert_eq!(mmproj_type("v.patch_embd.weight", &patch, ft), patch_ty);
            assert_eq!(mmproj_type("v.patch_embd.weight.1", &patch, ft), patch_ty);
            assert_eq!(mmproj_type("v.patch_embd.bias", &[64], ft), GgmlType::F32);
            assert_eq!(mmproj_type("v.blk.0.ln1.weight", &[64], ft), GgmlType::F32);
            assert_eq!(
                mmproj_type("v.position_embd.weight", &[64, 2304], ft),
                GgmlType::F32
            );
        }
        // Q8_0 rows that are not whole blocks fall back to F16.
        assert_eq!(
            mmproj_type("mm.0.weight", &[48, 8], FileType::Q8_0),
            GgmlType::F16
        );
    }

    #[test]
    fn image_size_and_defaults() {
        let top: Map<String, Value> = serde_json::from_value(serde_json::json!({
            "architectures": ["Qwen3_5ForConditionalGeneration"],
            "text_config": {"hidden_size": 256},
            "vision_config": {"depth": 2, "hidden_size": 64, "intermediate_size": 256, "num_heads": 4,
                              "deepstack_visual_indexes": [1]}
        }))
        .unwrap();
        let pre: Map<String, Value> = serde_json::from_value(
            serde_json::json!({"image_mean": [0.5, 0.5, 0.5], "image_std": [1, 1, 1]}),
        )
        .unwrap();
        let v = VisionConfig::from_json(&top, &pre).unwrap();
        assert_eq!(v.image_size, 768); // sqrt(2304) · 16
        assert_eq!(v.deepstack, [false, true]);
        assert_eq!(v.layer_norm_eps, 1e-6);
        assert_eq!(v.n_out, 256);
        assert!(matches!(v.image_std, OwnedValue::Array(ValueType::I32, _)));

        let mut bad = top.clone();
        bad.remove("vision_config");
        let e = VisionConfig::from_json(&bad, &pre).unwrap_err();
        assert!(e.to_string().contains("vision_config"), "{e}");
    }
}
