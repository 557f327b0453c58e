//! Hyperparameters from GGUF metadata (`qwen35.*` keys, spec §2.1).

use anyhow::{bail, ensure, Context, Result};

use super::rope::{mrope_axis, Rope, RopeOverrides, RopeScaling, RopeScalingType};
use crate::gguf::GgufFile;

pub const ARCH: &str = "qwen35";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Gated full attention with a KV cache.
    Attention,
    /// Gated DeltaNet (linear attention) with conv + delta-rule state.
    DeltaNet,
}

#[derive(Clone, Debug)]
pub struct HParams {
    /// Hidden size `d`.
    pub n_embd: usize,
    /// Decoder layers run in the main pass (`block_count − nextn_predict_layers`).
    pub n_layer: usize,
    /// `block_count`, including MTP blocks.
    pub n_layer_all: usize,
    pub n_ctx_train: usize,
    pub kinds: Vec<LayerKind>,
    /// Per layer, MTP blocks included (`n_layer_all` entries; the keys may be scalars or per-layer
    /// arrays).
    pub n_ff: Vec<usize>,
    pub n_head: Vec<usize>,
    pub n_head_kv: Vec<usize>,
    /// Attention head dim (`key_length` = `value_length`).
    pub head_dim: usize,
    pub rms_eps: f32,
    /// Rotary dims per head (partial NEOX RoPE).
    pub n_rot: usize,
    pub rope_base: f32,
    /// The file's RoPE scaling (`rope.scaling.*`).
    pub rope_scaling: RopeScaling,
    /// The RoPE the model runs with: the file's, or as [`HParams::set_rope`] overrides it.
    pub rope: Rope,
    /// M-RoPE sections `[t, h, w, e]` in rotary pairs (`rope.dimension_sections`, interleaved as
    /// llama.cpp's IMROPE, spec §3.6); `None` for a file without the key, which then takes text only.
    pub rope_sections: Option<[usize; 4]>,
    pub conv_kernel: usize,
    /// DeltaNet key heads `Hk` (`ssm.group_count`).
    pub n_k_heads: usize,
    /// DeltaNet value heads `Hv` (`ssm.time_step_rank`).
    pub n_v_heads: usize,
    /// DeltaNet key head dim `dk` (`ssm.state_size`).
    pub d_k: usize,
    /// DeltaNet value head dim `dv` (`ssm.inner_size / time_step_rank`).
    pub d_v: usize,
}

impl HParams {
    pub fn from_gguf(f: &GgufFile) -> Result<HParams> {
        let arch = f.get_str("general.architecture")?;
        if arch == crate::vision::mmproj::ARCH {
            bail!("this is an mmproj file (general.architecture '{arch}': a vision tower), not a text model");
        }
        if arch != ARCH {
            bail!("unsupported model architecture '{arch}' (general.architecture): deltaq runs '{ARCH}' only");
        }
        let key = |k: &str| format!("{ARCH}.{k}");
        let req = |k: &str| -> Result<usize> { Ok(f.get_u64(&key(k))? as usize) };
        let opt = |k: &str, default: usize| -> Result<usize> {
            match f.get(&key(k)) {
                None => Ok(default),
                Some(_) => req(k),
            }
        };

        let n_layer_all = req("block_count")?;
        let nextn = opt("nextn_predict_layers", 0)?;
        ensure!(
            nextn < n_layer_all,
            "{} ({nextn}) must be < block_count ({n_layer_all})",
            key("nextn_predict_layers")
        );
        let n_layer = n_layer_all - nextn;

        // Entries for every block, MTP included; an array that covers only the trunk gives the MTP
        // block its last entry.
        let per_layer = |k: &str, default: Option<usize>| -> Result<Vec<usize>> {
            let name = key(k);
            match f.get(&name) {
                None => default
                    .map(|d| vec![d; n_layer_all])
                    .with_context(|| format!("missing metadata key '{name}'")),
                Some(v) => match v.as_array() {
                    Some(a) => {
                        let ints = a.ints().with_context(|| {
                            format!("metadata '{name}' is not an integer array")
                        })?;
                        ensure!(
                            ints.len() >= n_layer.max(1),
                            "metadata '{name}' has {} entries for {n_layer} layers",
                            ints.len()
                        );
                        Ok((0..n_layer_all)
                            .map(|il| ints[il.min(ints.len() - 1)].max(0) as usize)
                            .collect())
                    }
                    None => Ok(vec![req(k)?; n_layer_all]),
                },
            }
        };

        let interval = opt("full_attention_interval", 4)?;
        ensure!(
            interval > 0,
            "{} must be > 0",
            key("full_attention_interval")
        );
        // llama.cpp: recurrent iff il < n_layer && (il+1) % interval != 0, unless `recurrent_layers` says so.
        let kinds = match f.get(&key("attention.recurrent_layers")) {
            Some(v) => {
                let name = key("attention.recurrent_layers");
                let a = v
                    .as_array()
                    .with_context(|| format!("metadata '{name}' is not an array"))?;
                let flags = a
                    .ints()
                    .with_context(|| format!("metadata '{name}' is not a bool/int array"))?;
                ensure!(
                    flags.len() >= n_layer,
                    "metadata '{name}' has {} entries for {n_layer} layers",
                    flags.len()
                );
                flags[..n_layer]
                    .iter()
                    .map(|&r| {
                        if r != 0 {
                            LayerKind::DeltaNet
                        } else {
                            LayerKind::Attention
                        }
                    })
                    .collect()
            }
            None => (0..n_layer)
                .map(|il| {
                    if !(il + 1).is_multiple_of(interval) {
                        LayerKind::DeltaNet
                    } else {
                        LayerKind::Attention
                    }
                })
                .collect(),
        };

        let n_head = per_layer("attention.head_count", None)?;
        let n_head_kv = match f.get(&key("attention.head_count_kv")) {
            None => n_head.clone(),
            Some(_) => per_layer("attention.head_count_kv", None)?,
        };
        let head_dim = req("attention.key_length")?;
        let v_len = req("attention.value_length")?;
        ensure!(
            head_dim == v_len,
            "attention key_length ({head_dim}) != value_length ({v_len})"
        );

        let n_v_heads = req("ssm.time_step_rank")?;
        let inner = req("ssm.inner_size")?;
        ensure!(
            n_v_heads > 0 && inner.is_multiple_of(n_v_heads),
            "ssm.inner_size ({inner}) is not a multiple of ssm.time_step_rank ({n_v_heads})"
        );
        let rope_base = match f.get(&key("rope.freq_base")) {
            None => 10000.0,
            Some(_) => f.get_f32(&key("rope.freq_base"))?,
        };

        let rope_scaling = rope_scaling(f)?;

        let rope_sections = match f.get(&key("rope.dimension_sections")) {
            None => None,
            Some(v) => {
                let name = key("rope.dimension_sections");
                let ints = v
                    .as_array()
                    .and_then(|a| a.ints())
                    .with_context(|| format!("metadata '{name}' is not an integer array"))?;
                ensure!(
                    ints.len() <= 4 && ints.iter().all(|&s| (0..=1 << 16).contains(&s)),
                    "metadata '{name}' must hold at most 4 small non-negative integers, not {ints:?}"
                );
                let mut s = [0; 4];
                for (s, &v) in s.iter_mut().zip(&ints) {
                    *s = v as usize;
                }
                Some(s)
            }
        };

        let n_ctx_train = req("context_length")?;
        let n_rot = req("rope.dimension_count")?;
        let rope = Rope::resolve(
            n_rot,
            rope_base,
            n_ctx_train,
            &rope_scaling,
            &RopeOverrides::default(),
        )
        .context("RoPE settings of the file")?;
        let hp = HParams {
            n_embd: req("embedding_length")?,
            n_layer,
            n_layer_all,
            n_ctx_train,
            kinds,
            n_ff: per_layer("feed_forward_length", None)?,
            n_head,
            n_head_kv,
            head_dim,
            rms_eps: f.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            n_rot,
            rope_base,
            rope_scaling,
            rope,
            rope_sections,
            conv_kernel: req("ssm.conv_kernel")?,
            n_k_heads: req("ssm.group_count")?,
            n_v_heads,
            d_k: req("ssm.state_size")?,
            d_v: inner / n_v_heads,
        };
        hp.validate()?;
        Ok(hp)
    }

    fn validate(&self) -> Result<()> {
        ensure!(
            self.n_layer > 0 && self.n_embd > 0,
            "model has no layers or zero embedding length"
        );
        ensure!(
            self.n_rot.is_multiple_of(2) && self.n_rot <= self.head_dim,
            "rope.dimension_count {} must be even and ≤ head dim {}",
            self.n_rot,
            self.head_dim
        );
        ensure!(self.conv_kernel >= 1, "ssm.conv_kernel must be ≥ 1");
        for il in 0..self.n_layer_all {
            // MTP blocks (il ≥ n_layer) are full attention.
            if il >= self.n_layer || self.kinds[il] == LayerKind::Attention {
                let (h, kv) = (self.n_head[il], self.n_head_kv[il]);
                ensure!(
                    h > 0 && kv > 0 && h.is_multiple_of(kv),
                    "layer {il}: head_count {h} is not a multiple of head_count_kv {kv}"
                );
            }
        }
        if self.kinds.contains(&LayerKind::DeltaNet) {
            ensure!(
                self.n_k_heads > 0 && self.n_v_heads.is_multiple_of(self.n_k_heads),
                "ssm.time_step_rank ({}) is not a multiple of ssm.group_count ({})",
                self.n_v_heads,
                self.n_k_heads
            );
        }
        Ok(())
    }

    /// Whether the file carries a multi-token-prediction block (`nextn_predict_layers` > 0); its layer
    /// index is `n_layer`.
    pub fn has_mtp(&self) -> bool {
        self.n_layer_all > self.n_layer
    }

    /// Whether image positions can be applied: the sections give every rotary pair one of the t, h, w
    /// axes, so that llama.cpp's IMROPE rule and transformers' interleaved M-RoPE agree. Text alone
    /// never needs this (its three axes are equal), so a file that fails it still runs text.
    pub fn check_mrope(&self) -> Result<()> {
        let Some(s) = self.rope_sections else {
            bail!(
                "the model has no {ARCH}.rope.dimension_sections (M-RoPE): it takes no image input"
            );
        };
        let pairs = self.n_rot / 2;
        let covered = (0..pairs).all(|i| match i % 3 {
            0 => i < 3 * s[0],
            1 => i < 3 * s[1],
            _ => i < 3 * s[2],
        });
        ensure!(
            s.iter().sum::<usize>() == pairs && covered,
            "{ARCH}.rope.dimension_sections {s:?} do not interleave t, h, w over the {pairs} rotary pairs \
             (rope.dimension_count {}): image positions are not supported for this model",
            self.n_rot
        );
        Ok(())
    }

    /// The position axis (0 = t, 1 = h, 2 = w) of rotary pair `i` under interleaved M-RoPE: h for
    /// `i % 3 == 1` below `3·sections[1]`, w for `i % 3 == 2` below `3·sections[2]`, else t
    /// (transformers' `apply_interleaved_mrope`; equal to llama.cpp's rule once
    /// [`check_mrope`](Self::check_mrope) holds).
    pub fn rope_axis(&self, i: usize) -> usize {
        mrope_axis(self.rope_sections, i)
    }

    /// Applies llama.cpp's RoPE flags over the file's settings.
    pub fn set_rope(&mut self, o: &RopeOverrides) -> Result<()> {
        self.rope = Rope::resolve(
            self.n_rot,
            self.rope_base,
            self.n_ctx_train,
            &self.rope_scaling,
            o,
        )?;
        Ok(())
    }

    /// An error unless the KV cache can be stored as `ty`: block types need head dims that are whole
    /// blocks.
    pub fn check_kv_type(&self, ty: super::KvType) -> Result<()> {
        ensure!(
            self.head_dim.is_multiple_of(ty.block()),
            "a {ty} KV cache stores blocks of {} values, but the model's attention head dim is {}",
            ty.block(),
            self.head_dim
        );
        Ok(())
    }

    /// The longest context the model runs: the training context, longer only with RoPE scaling.
    pub fn max_ctx(&self) -> usize {
        self.rope.max_ctx(self.n_ctx_train)
    }

    /// An error unless a context of `n_ctx` tokens is within [`HParams::max_ctx`].
    pub fn check_ctx(&self, n_ctx: usize) -> Result<()> {
        let max = self.max_ctx();
        if n_ctx <= max {
            return Ok(());
        }
        let train = self.n_ctx_train;
        if max > train {
            bail!(
                "context size {n_ctx} is longer than the model's training context ({train} tokens) \
                 stretched by the RoPE scaling ({max} tokens)"
            );
        }
        bail!(
            "context size {n_ctx} is longer than the model's training context ({train} tokens); a \
             longer context needs RoPE scaling, e.g. --rope-scaling yarn --rope-scale {}",
            n_ctx.div_ceil(train)
        );
    }

    /// DeltaNet conv channels: q and k (`Hk·dk` each) then v (`Hv·dv`).
    pub fn conv_channels(&self) -> usize {
        2 * self.n_k_heads * self.d_k + self.n_v_heads * self.d_v
    }
}

/// The file's `{ARCH}.rope.scaling.*` keys, as llama.cpp reads them (the factor also under the old
/// `rope.scale_linear`).
fn rope_scaling(f: &GgufFile) -> Result<RopeScaling> {
    let key = |k: &str| format!("{ARCH}.rope.{k}");
    let f32_key = |k: &str| -> Result<Option<f32>> {
        let name = key(k);
        match f.get(&name) {
            None => Ok(None),
            Some(_) => Ok(Some(f.get_f32(&name)?)),
        }
    };
    let mut s = RopeScaling::default();
    let type_key = key("scaling.type");
    if f.get(&type_key).is_some() {
        let name = f.get_str(&type_key)?;
        s.kind = RopeScalingType::from_name(name).with_context(|| {
            format!(
                "unsupported RoPE scaling '{name}' ({type_key}): deltaq runs none, linear and yarn"
            )
        })?;
    }
    if let Some(v) = f32_key("scaling.factor")?.or(f32_key("scale_linear")?) {
        s.factor = v;
    }
    if let Some(v) = f32_key("scaling.attn_factor")? {
        s.attn_factor = v;
    }
    let orig = key("scaling.original_context_length");
    if f.get(&orig).is_some() {
        s.orig_ctx = f.get_u64(&orig)? as usize;
    }
    Ok(s)
}
