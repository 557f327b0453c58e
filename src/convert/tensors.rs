//! Hugging Face tensor names → GGUF names, the shapes llama.cpp expects, and the transformations its
//! converter applies (spec qwen35 §2.2), done row by row while the tensor is streamed.

use anyhow::{bail, Context};
use rayon::prelude::*;

use super::config::Config;
use super::safetensors::{Checkpoint, Dtype, StTensor};
use crate::quant::GgmlType;
use crate::quantize::TensorSource;

/// An element-wise change of the values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transform {
    None,
    /// RMSNorm weights stored zero-centred by transformers: the GGUF holds `1 + w`.
    AddOne,
    /// `A_log` → `A = -exp(A_log)`.
    NegExp,
}

/// Grouped → tiled order of DeltaNet value heads along one axis, from index `start` on: with
/// `r = Hv / Hk`, position `(j·Hk + g)·block + e` takes the HF position `(g·r + j)·block + e`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadPerm {
    pub start: u64,
    pub block: u64,
    pub hk: u64,
    pub r: u64,
}

impl HeadPerm {
    /// The source index of output index `i`.
    pub fn src(&self, i: u64) -> u64 {
        if i < self.start {
            return i;
        }
        let j = i - self.start;
        let (head, e) = (j / self.block, j % self.block);
        let (jj, g) = (head / self.hk, head % self.hk);
        self.start + (g * self.r + jj) * self.block + e
    }

    fn len(&self) -> u64 {
        self.hk * self.r * self.block
    }
}

/// One temporal slice of a Conv3d kernel `[out, in, frames, kh, kw]`: output row `(o, c, y)` of the
/// `[out, in, kh, kw]` slice `frame` is source row `((o·in + c)·frames + frame)·kh + y` (rows of `kw`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameSlice {
    /// Rows per kernel frame (`kh`).
    pub rows: u64,
    pub frames: u64,
    pub frame: u64,
}

impl FrameSlice {
    /// The source row of output row `i`.
    pub fn src(&self, i: u64) -> u64 {
        let (oc, y) = (i / self.rows, i % self.rows);
        (oc * self.frames + self.frame) * self.rows + y
    }
}

/// Where a tensor's output rows come from, when not in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowMap {
    Heads(HeadPerm),
    Frame(FrameSlice),
}

impl RowMap {
    /// The source row of output row `i`.
    pub fn src(&self, i: u64) -> u64 {
        match self {
            RowMap::Heads(p) => p.src(i),
            RowMap::Frame(f) => f.src(i),
        }
    }
}

/// One output tensor of the conversion.
pub struct ConvTensor<'a> {
    pub ckpt: &'a Checkpoint,
    pub src: StTensor,
    pub dtype: Dtype,
    pub name: String,
    /// ggml order.
    pub ne: Vec<u64>,
    pub transform: Transform,
    /// Where the rows (`ne[1..]` flattened) come from, if not in order.
    pub rows: Option<RowMap>,
    /// Permutation of the elements within each row.
    pub cols: Option<HeadPerm>,
    /// The HF name after llama.cpp's renames (used for its type rules).
    pub hf_name: String,
}

/// What became of one checkpoint tensor.
pub enum Mapped {
    Tensor(Box<Mapping>),
    /// Vision tower / projector: not part of the text GGUF.
    Vision,
    /// MTP block, dropped with `--no-mtp`.
    MtpDropped,
    /// Buffers llama.cpp drops (`rotary_emb.inv_freq` and the like).
    Ignored,
}

pub struct Mapping {
    pub name: String,
    pub hf_name: String,
    /// MTP block index (0-based) if this tensor belongs to one.
    pub mtp: Option<u64>,
}

/// llama.cpp's `TextModel.filter_tensors` for multimodal parts.
fn is_multimodal(name: &str) -> bool {
    const PREFIXES: [&str; 10] = [
        "mlp",
        "vit.",
        "vpm.",
        "siglip2.",
        "conformer.",
        "merger.",
        "resampler.",
        "sound_encoder.",
        "sound_projection.",
        "speech_embeddings.",
    ];
    const PARTS: [&str; 17] = [
        "visual.",
        "vision.",
        "audio.",
        "talker.",
        "vision_",
        "audio_",
        "token2wav.",
        "code2wav.",
        "projector.",
        "pre_mm_projector_norm",
        "image_newline",
        "view_seperator",
        "patch_embed",
        "patch_embedding",
        "patch_merger.",
        "patch_merge_mlp.",
        "model.connector.",
    ];
    PREFIXES.iter().any(|p| name.starts_with(p)) || PARTS.iter().any(|p| name.contains(p))
}

/// HF name → GGUF name, following llama.cpp's renames (`language_model.` stripped, `mtp.*` moved to
/// layer `n_layer + i`, `dt_bias` → `dt_proj.bias`).
pub fn map_name(name: &str, n_layer: u64, no_mtp: bool) -> anyhow::Result<Mapped> {
    if is_multimodal(name) {
        return Ok(Mapped::Vision);
    }
    let mut name = name.replace("language_model.", "");
    if let Some(rest) = name.strip_prefix("model.mtp.") {
        name = format!("mtp.{rest}");
    }
    let mut mtp = None;
    if let Some(rest) = name.strip_prefix("mtp.") {
        if no_mtp {
            return Ok(Mapped::MtpDropped);
        }
        let parts: Vec<&str> = rest.splitn(3, '.').collect();
        if parts.len() == 3 && parts[0] == "layers" && parts[1].bytes().all(|b| b.is_ascii_digit())
        {
            let i: u64 = parts[1].parse()?;
            mtp = Some(i);
            name = format!("model.layers.{}.{}", n_layer + i, parts[2]);
        } else if let [head, param] = rest.splitn(2, '.').collect::<Vec<_>>()[..] {
            let new = match head {
                "fc" => "eh_proj",
                "pre_fc_norm_embedding" => "enorm",
                "pre_fc_norm_hidden" => "hnorm",
                "norm" => "shared_head.norm",
                _ => bail!("cannot map MTP tensor '{name}'"),
            };
            mtp = Some(0);
            name = format!("model.layers.{n_layer}.{new}.{param}");
        }
    }
    if name.ends_with(".attention.masked_bias")
        || name.ends_with(".attention.bias")
        || name.ends_with(".rotary_emb.inv_freq")
    {
        return Ok(Mapped::Ignored);
    }
    if let Some(base) = name.strip_suffix(".dt_bias") {
        name = format!("{base}.dt_proj.bias");
    }
    let gguf = gguf_name(&name).with_context(|| format!("cannot map tensor '{name}'"))?;
    Ok(Mapped::Tensor(Box::new(Mapping {
        name: gguf,
        hf_name: name,
        mtp,
    })))
}

fn gguf_name(name: &str) -> Option<String> {
    match name {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (bid, rest) = rest.split_once('.')?;
    if !bid.bytes().all(|b| b.is_ascii_digit()) || bid.is_empty() {
        return None;
    }
    let (base, suffix) = if let Some(b) = rest.strip_suffix(".weight") {
        (b, ".weight")
    } else if let Some(b) = rest.strip_suffix(".bias") {
        (b, ".bias")
    } else {
        (rest, "")
    };
    let new = match base {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "post_attention_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        "linear_attn.in_proj_qkv" => "attn_qkv",
        "linear_attn.in_proj_z" => "attn_gate",
        "linear_attn.in_proj_a" => "ssm_alpha",
        "linear_attn.in_proj_b" => "ssm_beta",
        "linear_attn.A_log" => "ssm_a",
        "linear_attn.dt_proj" => "ssm_dt",
        "linear_attn.conv1d" => "ssm_conv1d",
        "linear_attn.norm" => "ssm_norm",
        "linear_attn.out_proj" => "ssm_out",
        "eh_proj" => "nextn.eh_proj",
        "enorm" => "nextn.enorm",
        "hnorm" => "nextn.hnorm",
        "shared_head.norm" => "nextn.shared_head_norm",
        "shared_head.head" => "nextn.shared_head_head",
        "embed_tokens" => "nextn.embed_tokens",
        _ => return None,
    };
    Some(format!("blk.{bid}.{new}{suffix}"))
}

impl<'a> ConvTensor<'a> {
    /// Builds the output tensor for a mapped checkpoint tensor: GGUF shape, transformation, head
    /// reordering, and a check of the shape against the config.
    pub fn new(
        ckpt: &'a Checkpoint,
        src: &StTensor,
        m: &Mapping,
        cfg: &Config,
    ) -> anyhow::Result<ConvTensor<'a>> {
        let dtype = src.dtype()?;
        let hf = m.hf_name.as_str();
        let mut shape = src.shape.clone();
        if hf.contains("conv1d") {
            shape.retain(|&d| d != 1); // llama.cpp squeezes [C, 1, K] to [C, K]
        }
        if shape.is_empty() {
            shape.push(1);
        }
        let ne: Vec<u64> = shape.iter().rev().copied().collect();
        let expected = expected_ne(&m.name, cfg);
        if let Some(want) = &expected {
            if *want != ne {
                bail!(
                    "tensor '{}' ({}) has shape {:?}, but config.json implies {:?}",
                    src.name,
                    m.name,
                    src.shape,
                    want.iter().rev().collect::<Vec<_>>()
                );
            }
        }
        let transform = if hf.ends_with(".A_log") {
            Transform::NegExp
        } else if hf.ends_with("norm.weight") && !hf.ends_with("linear_attn.norm.weight") {
            Transform::AddOne
        } else {
            Transform::None
        };
        let (mut rows, mut cols) = (None, None);
        if cfg.hk != cfg.hv && hf.contains("linear_attn.") {
            let perm = |start, block| HeadPerm {
                start,
                block,
                hk: cfg.hk,
                r: cfg.hv / cfg.hk,
            };
            let qk = 2 * cfg.hk * cfg.dk;
            if hf.contains(".in_proj_qkv.") || hf.contains(".conv1d") {
                rows = Some(perm(qk, cfg.dv));
            } else if hf.contains(".in_proj_z.") {
                rows = Some(perm(0, cfg.dv));
            } else if hf.contains(".in_proj_b.") || hf.contains(".in_proj_a.") {
                rows = Some(perm(0, 1));
            } else if hf.contains(".A_log") || hf.contains(".dt_bias") || hf.contains(".dt_proj") {
                if ne.len() == 1 {
                    cols = Some(perm(0, 1));
                } else {
                    bail!(
                        "tensor '{}': expected a vector of {} values",
                        src.name,
                        cfg.hv
                    );
                }
            } else if hf.contains(".out_proj.") {
                cols = Some(perm(0, cfg.dv));
            }
            // Without a config-derived shape check these could run off the tensor.
            let n_rows: u64 = ne[1..].iter().product();
            if let Some(p) = rows {
                if p.start + p.len() != n_rows {
                    bail!(
                        "tensor '{}': {n_rows} rows do not fit {} value heads of {}",
                        src.name,
                        cfg.hv,
                        p.block
                    );
                }
            }
            if let Some(p) = cols {
                if p.start + p.len() != ne[0] {
                    bail!(
                        "tensor '{}': {} columns do not fit {} value heads of {}",
                        src.name,
                        ne[0],
                        cfg.hv,
                        p.block
                    );
                }
            }
        }
        Ok(ConvTensor {
            ckpt,
            src: src.clone(),
            dtype,
            name: m.name.clone(),
            ne,
            transform,
            rows: rows.map(RowMap::Heads),
            cols,
            hf_name: m.hf_name.clone(),
        })
    }

    /// The type llama.cpp's converter gives this tensor for an F32/F16/BF16/Q8_0 `--outtype`
    /// (`ModelBase.prepare_tensors`).
    pub fn converter_type(&self, wanted: GgmlType) -> GgmlType {
        let n_dims = self.ne.len();
        let forced_f32 = n_dims <= 1
            || self.name.ends_with("_norm.weight")
            || self.name.contains(".ssm_conv1d.")
            || !self.name.ends_with(".weight");
        if forced_f32 {
            return GgmlType::F32;
        }
        if !self.ne[0].is_multiple_of(wanted.block_size() as u64) {
            return GgmlType::F16; // gguf-py's QuantError fallback
        }
        wanted
    }

    fn src_row_bytes(&self) -> u64 {
        self.ne[0] * self.dtype.size() as u64
    }
}

/// The GGUF shape (ggml order) config.json implies for a tensor, where it is fixed.
fn expected_ne(name: &str, c: &Config) -> Option<Vec<u64>> {
    let d = c.n_embd;
    let kind = match name.strip_prefix("blk.") {
        Some(r) => r.split_once('.')?.1,
        None => name,
    };
    let q_out = c.n_head * c.head_dim * 2; // joint query + gate
    let kv = c.n_head_kv * c.head_dim;
    let conv = 2 * c.hk * c.dk + c.hv * c.dv;
    let v = match kind {
        "token_embd.weight" | "output.weight" => return c.vocab_size.map(|n| vec![d, n]),
        "output_norm.weight"
        | "attn_norm.weight"
        | "post_attention_norm.weight"
        | "nextn.enorm.weight"
        | "nextn.hnorm.weight"
        | "nextn.shared_head_norm.weight" => vec![d],
        "attn_q.weight" => vec![d, q_out],
        "attn_k.weight" | "attn_v.weight" => vec![d, kv],
        "attn_output.weight" => vec![c.n_head * c.head_dim, d],
        "attn_q_norm.weight" | "attn_k_norm.weight" => vec![c.head_dim],
        "ffn_gate.weight" | "ffn_up.weight" => vec![d, c.n_ff],
        "ffn_down.weight" => vec![c.n_ff, d],
        "attn_qkv.weight" => vec![d, conv],
        "attn_gate.weight" => vec![d, c.hv * c.dv],
        "ssm_alpha.weight" | "ssm_beta.weight" => vec![d, c.hv],
        "ssm_a" | "ssm_dt.bias" => vec![c.hv],
        "ssm_conv1d.weight" => vec![c.conv_kernel, conv],
        "ssm_norm.weight" => vec![c.dv],
        "ssm_out.weight" => vec![c.hv * c.dv, d],
        "nextn.eh_proj.weight" => vec![2 * d, d],
        _ => return None,
    };
    Some(v)
}

impl TensorSource for ConvTensor<'_> {
    fn name(&self) -> &str {
        &self.name
    }

    fn ne(&self) -> &[u64] {
        &self.ne
    }

    fn stored(&self) -> (GgmlType, Option<&[u8]>) {
        // Data is read through short-lived windows (bounded memory), never borrowed whole.
        let ty = match self.dtype {
            Dtype::F32 => GgmlType::F32,
            Dtype::F16 => GgmlType::F16,
            Dtype::BF16 => GgmlType::BF16,
        };
        (ty, None)
    }

    fn read_rows(&self, first: u64, out: &mut [f32]) -> anyhow::Result<()> {
        let row_len = self.ne[0] as usize;
        let n = (out.len() / row_len) as u64;
        if n == 0 {
            return Ok(());
        }
        // Source rows of this window: contiguous unless the rows are permuted.
        let (lo, hi) = match self.rows {
            None => (first, first + n),
            Some(p) => (first..first + n)
                .map(|r| p.src(r))
                .fold((u64::MAX, 0), |(lo, hi), s| (lo.min(s), hi.max(s + 1))),
        };
        let rb = self.src_row_bytes();
        let map = self.ckpt.map(&self.src, lo * rb, (hi - lo) * rb)?;
        let bytes: &[u8] = &map;
        let dtype = self.dtype;
        let (rows, cols, transform) = (self.rows, self.cols, self.transform);
        out.par_chunks_mut(row_len).enumerate().for_each_init(
            || vec![0f32; if cols.is_some() { row_len } else { 0 }],
            |scratch, (i, o)| {
                let r = first + i as u64;
                let s = rows.map_or(r, |p| p.src(r)) - lo;
                let src = &bytes[(s * rb) as usize..((s + 1) * rb) as usize];
                match cols {
                    None => dtype.to_f32(src, o),
                    Some(p) => {
                        dtype.to_f32(src, scratch);
                        for (c, v) in o.iter_mut().enumerate() {
                            *v = scratch[p.src(c as u64) as usize];
                        }
                    }
                }
                apply(transform, dtype, o);
            },
        );
        Ok(())
    }
}

/// The element-wise transformation, with the arithmetic llama.cpp's converter does: in f32 (BF16
/// is widened first), or in f16 for F16 checkpoints (torch keeps F16 tensors F16).
fn apply(t: Transform, dtype: Dtype, x: &mut [f32]) {
    let f = match t {
        Transform::None => return,
        Transform::AddOne => |v: f32| v + 1.0,
        // exp in f64 rounded once: the correctly rounded result, as torch gives for these inputs.
        Transform::NegExp => |v: f32| -((v as f64).exp() as f32),
    };
    for v in x.iter_mut() {
        *v = f(*v);
        if dtype == Dtype::F16 {
            *v = half::f16::from_f32(*v).to_f32();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_perm_is_grouped_to_tiled() {
        // Hk = 2, Hv = 4 (r = 2), blocks of 1: GGUF head h' = j*Hk + g holds HF head g*r + j.
        let p = HeadPerm {
            start: 0,
            block: 1,
            hk: 2,
            r: 2,
        };
        let got: Vec<u64> = (0..4).map(|i| p.src(i)).collect();
        assert_eq!(got, [0, 2, 1, 3]);
        // with an untouched prefix and blocks of 2
        let p = HeadPerm {
            start: 3,
            block: 2,
            hk: 2,
            r: 2,
        };
        let got: Vec<u64> = (0..11).map(|i| p.src(i)).collect();
        assert_eq!(got, [0, 1, 2, 3, 4, 7, 8, 5, 6, 9, 10]);
    }

    #[test]
    fn frame_slice_picks_one_temporal_frame() {
        // Conv3d [out 2, in 1, frames 2, kh 3, kw]: rows (o, c, t, y) in source order.
        let src_row = |o: u64, t: u64, y: u64| (o * 2 + t) * 3 + y;
        for frame in 0..2 {
            let f = FrameSlice {
                rows: 3,
                frames: 2,
                frame,
            };
            let got: Vec<u64> = (0..6).map(|i| f.src(i)).collect();
            let want: Vec<u64> = (0..2)
                .flat_map(|o| (0..3).map(move |y| src_row(o, frame, y)))
                .collect();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn names() {
        let m = |n: &str| match map_name(n, 24, false).unwrap() {
            Mapped::Tensor(m) => m.name,
            _ => "-".into(),
        };
        assert_eq!(
            m("model.language_model.layers.3.linear_attn.dt_bias"),
            "blk.3.ssm_dt.bias"
        );
        assert_eq!(
            m("model.language_model.layers.0.linear_attn.A_log"),
            "blk.0.ssm_a"
        );
        assert_eq!(m("mtp.fc.weight"), "blk.24.nextn.eh_proj.weight");
        assert_eq!(m("mtp.norm.weight"), "blk.24.nextn.shared_head_norm.weight");
        assert_eq!(
            m("mtp.layers.0.self_attn.q_proj.weight"),
            "blk.24.attn_q.weight"
        );
        assert_eq!(m("lm_head.weight"), "output.weight");
        assert_eq!(m("model.visual.blocks.0.attn.qkv.weight"), "-");
        assert!(matches!(
            map_name("mtp.fc.weight", 24, true).unwrap(),
            Mapped::MtpDropped
        ));
        assert!(map_name("model.layers.0.foo.weight", 24, false).is_err());
    }
}
