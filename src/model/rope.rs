//! RoPE angles with llama.cpp's frequency scaling (none, linear, YaRN): the GGUF's
//! `qwen35.rope.scaling.*` keys, overridden by llama.cpp's flags (`--rope-scaling`, `--rope-scale`,
//! `--rope-freq-base`, `--yarn-*`), resolved as llama.cpp's context does it (`llama_context`'s
//! constructor) and applied as ggml's `rope_yarn` does (CPU backend).
//!
//! Per rotary pair `i < n_rot/2` at position `p`, with `θ = p · base^(−2i/n_rot)`:
//!
//! ```text
//! θ_interp = freq_scale · θ
//! ramp     = 1 − clamp((i − lo) / max(0.001, hi − lo), 0, 1)      lo, hi: the correction dims
//! θ'       = θ_interp · (1 − ramp·ext) + θ · ramp·ext
//! mscale   = attn_factor · (1 + 0.1 · ln(1 / freq_scale))   if ext ≠ 0, else attn_factor
//! (cos, sin) = (cos θ', sin θ') · mscale
//! ```
//!
//! `corr_dim(β) = n_rot · ln(n_ctx_orig / (2π β)) / (2 ln base)`, `lo = max(0, ⌊corr_dim(β_fast)⌋)`,
//! `hi = min(n_rot − 1, ⌈corr_dim(β_slow)⌉)`. Without scaling (`freq_scale` 1, `ext` 0, `attn_factor`
//! 1) this is plain RoPE bit for bit.

use anyhow::{bail, ensure, Result};

/// How positions are scaled (llama.cpp's `llama_rope_scaling_type`, minus LongRoPE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeScalingType {
    None,
    Linear,
    Yarn,
}

impl RopeScalingType {
    pub const ALL: [RopeScalingType; 3] = [
        RopeScalingType::None,
        RopeScalingType::Linear,
        RopeScalingType::Yarn,
    ];

    pub fn name(self) -> &'static str {
        match self {
            RopeScalingType::None => "none",
            RopeScalingType::Linear => "linear",
            RopeScalingType::Yarn => "yarn",
        }
    }

    pub fn from_name(s: &str) -> Option<RopeScalingType> {
        RopeScalingType::ALL.into_iter().find(|t| t.name() == s)
    }
}

/// The scaling a GGUF file asks for (`{arch}.rope.scaling.*`; all optional).
#[derive(Clone, Debug, PartialEq)]
pub struct RopeScaling {
    /// `rope.scaling.type`; llama.cpp's default when absent is linear (a no-op without a factor).
    pub kind: RopeScalingType,
    /// `rope.scaling.factor` (0: none given).
    pub factor: f32,
    /// `rope.scaling.original_context_length` (0: the training context).
    pub orig_ctx: usize,
    /// `rope.scaling.attn_factor` (1 when absent).
    pub attn_factor: f32,
}

impl Default for RopeScaling {
    fn default() -> RopeScaling {
        RopeScaling {
            kind: RopeScalingType::Linear,
            factor: 0.0,
            orig_ctx: 0,
            attn_factor: 1.0,
        }
    }
}

/// llama.cpp's command-line overrides of the file's RoPE settings (`None`: the file's).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RopeOverrides {
    /// `--rope-scaling {none,linear,yarn}`.
    pub scaling: Option<RopeScalingType>,
    /// `--rope-scale N`: the context is stretched by N (`freq_scale = 1/N`).
    pub scale: Option<f32>,
    /// `--rope-freq-base N`.
    pub freq_base: Option<f32>,
    /// `--yarn-orig-ctx N` (0: the file's).
    pub yarn_orig_ctx: Option<usize>,
    /// `--yarn-ext-factor N` (default: 1 with YaRN, else 0).
    pub yarn_ext_factor: Option<f32>,
    /// `--yarn-beta-fast N` (default 32).
    pub yarn_beta_fast: Option<f32>,
    /// `--yarn-beta-slow N` (default 1).
    pub yarn_beta_slow: Option<f32>,
}

/// The rotary embedding a model runs with: llama.cpp's resolved context parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    /// Rotated dims per head.
    pub n_rot: usize,
    pub kind: RopeScalingType,
    pub freq_base: f32,
    /// `1 / factor`; 1 without scaling.
    pub freq_scale: f32,
    /// The context the model was trained with before scaling (YaRN's correction dims).
    pub n_ctx_orig: usize,
    /// YaRN's extrapolation mix (0: plain interpolation).
    pub ext_factor: f32,
    /// Magnitude factor as passed to ggml's rope (llama.cpp's adjusted `yarn_attn_factor`).
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
}

/// ggml's `ggml_rope_yarn_corr_dim`.
fn corr_dim(n_rot: usize, n_ctx_orig: usize, beta: f32, base: f32) -> f32 {
    n_rot as f32 * (n_ctx_orig as f32 / (beta * 2.0 * std::f32::consts::PI)).ln()
        / (2.0 * base.ln())
}

impl Rope {
    /// Plain RoPE: no scaling.
    pub fn plain(n_rot: usize, freq_base: f32, n_ctx_train: usize) -> Rope {
        Rope {
            n_rot,
            kind: RopeScalingType::None,
            freq_base,
            freq_scale: 1.0,
            n_ctx_orig: n_ctx_train,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
        }
    }

    /// The file's settings with `o` applied, resolved as llama.cpp's `llama_context` does for a model
    /// that reads no `yarn_*` keys (qwen35 does not) and has no `yarn_log_multiplier`.
    pub fn resolve(
        n_rot: usize,
        file_base: f32,
        n_ctx_train: usize,
        file: &RopeScaling,
        o: &RopeOverrides,
    ) -> Result<Rope> {
        let positive = |name: &str, v: f32| -> Result<f32> {
            ensure!(
                v.is_finite() && v > 0.0,
                "{name} must be a positive number, not {v}"
            );
            Ok(v)
        };
        let freq_base = positive("the RoPE frequency base", o.freq_base.unwrap_or(file_base))?;
        positive("rope.scaling.attn_factor", file.attn_factor)?;
        ensure!(
            file.factor.is_finite() && file.factor >= 0.0,
            "rope.scaling.factor must be a positive number, not {}",
            file.factor
        );
        let freq_scale = match o.scale {
            Some(n) => 1.0 / positive("--rope-scale", n)?,
            None if file.factor == 0.0 => 1.0,
            None => 1.0 / file.factor,
        };
        let kind = o.scaling.unwrap_or(file.kind);
        let freq_scale = if kind == RopeScalingType::None {
            1.0
        } else {
            freq_scale
        };
        let n_ctx_orig = match (o.yarn_orig_ctx, file.orig_ctx) {
            (Some(n), _) if n > 0 => n,
            (_, n) if n > 0 => n,
            _ => n_ctx_train,
        };
        let finite = |name: &str, v: Option<f32>, default: f32| -> Result<f32> {
            let v = v.unwrap_or(default);
            ensure!(v.is_finite(), "{name} must be a finite number, not {v}");
            Ok(v)
        };
        let ext_default = if kind == RopeScalingType::Yarn {
            1.0
        } else {
            0.0
        };
        let ext_factor = match o.yarn_ext_factor {
            Some(e) if e >= 0.0 => finite("--yarn-ext-factor", Some(e), 0.0)?,
            Some(e) if !e.is_finite() => {
                bail!("--yarn-ext-factor must be a finite number, not {e}")
            }
            _ => ext_default, // negative: not set, as llama.cpp
        };
        let beta_fast = finite("--yarn-beta-fast", o.yarn_beta_fast, 32.0)?;
        let beta_slow = finite("--yarn-beta-slow", o.yarn_beta_slow, 1.0)?;
        let mut attn_factor = 1.0f32;
        if ext_factor != 0.0 {
            let factor = 1.0 / freq_scale;
            let mscale = if factor <= 1.0 {
                1.0
            } else {
                0.1 * factor.ln() + 1.0
            };
            // ggml multiplies by 1 + 0.1·ln(factor) itself: llama.cpp cancels that here.
            attn_factor = mscale * (1.0 / (1.0 + 0.1 * factor.ln()));
        }
        attn_factor *= file.attn_factor;
        Ok(Rope {
            n_rot,
            kind,
            freq_base,
            freq_scale,
            n_ctx_orig,
            ext_factor,
            attn_factor,
            beta_fast,
            beta_slow,
        })
    }

    /// Whether positions are scaled at all (anything but plain RoPE).
    pub fn is_scaled(&self) -> bool {
        self.freq_scale != 1.0 || self.ext_factor != 0.0 || self.attn_factor != 1.0
    }

    /// The longest context this RoPE is meant for: the training context, or the original context
    /// stretched by the scaling factor when that is longer (llama.cpp sets `n_ctx_train` to
    /// `n_ctx_orig / freq_scale` for custom YaRN scaling).
    pub fn max_ctx(&self, n_ctx_train: usize) -> usize {
        if self.freq_scale < 1.0 {
            let stretched = (self.n_ctx_orig as f64 / self.freq_scale as f64).floor() as usize;
            n_ctx_train.max(stretched)
        } else {
            n_ctx_train
        }
    }

    /// YaRN's correction dims `[lo, hi]` (ggml's `ggml_rope_yarn_corr_dims`).
    pub fn corr_dims(&self) -> [f32; 2] {
        let lo = corr_dim(self.n_rot, self.n_ctx_orig, self.beta_fast, self.freq_base).floor();
        let hi = corr_dim(self.n_rot, self.n_ctx_orig, self.beta_slow, self.freq_base).ceil();
        [lo.max(0.0), hi.min(self.n_rot as f32 - 1.0)]
    }

    /// Cosines and sines (`[n_rot/2]` each) of the angles of pair `i` at position `pos_of(i)` (M-RoPE:
    /// each pair takes one axis of a multi-dimensional position), scaled as the module describes.
    /// Angles in f64 so large positions keep their precision; equal positions give equal values bit
    /// for bit.
    pub fn cos_sin_by(&self, pos_of: impl Fn(usize) -> usize) -> (Vec<f32>, Vec<f32>) {
        let n_rot = self.n_rot;
        let [lo, hi] = self.corr_dims();
        let ext = self.ext_factor as f64;
        let mut mscale = self.attn_factor;
        if self.ext_factor != 0.0 {
            mscale *= 1.0 + 0.1 * (1.0 / self.freq_scale).ln();
        }
        let (mscale, freq_scale) = (mscale as f64, self.freq_scale as f64);
        (0..n_rot / 2)
            .map(|i| {
                let extrap =
                    pos_of(i) as f64 * (self.freq_base as f64).powf(-2.0 * i as f64 / n_rot as f64);
                let mut theta = freq_scale * extrap;
                if ext != 0.0 {
                    let y = (i as f32 - lo) / (hi - lo).max(0.001);
                    let mix = (1.0 - y.clamp(0.0, 1.0)) as f64 * ext;
                    theta = theta * (1.0 - mix) + extrap * mix;
                }
                let (sin, cos) = theta.sin_cos();
                ((cos * mscale) as f32, (sin * mscale) as f32)
            })
            .unzip()
    }

    /// [`Rope::cos_sin_by`] at one position on every axis (text).
    pub fn cos_sin(&self, pos: usize) -> (Vec<f32>, Vec<f32>) {
        self.cos_sin_by(|_| pos)
    }
}

/// The position axis (0 = t, 1 = h, 2 = w) of rotary pair `i` under interleaved M-RoPE with
/// `sections` `[t, h, w, e]`: h for `i % 3 == 1` below `3·sections[1]`, w for `i % 3 == 2` below
/// `3·sections[2]`, else t (transformers' `apply_interleaved_mrope`).
pub fn mrope_axis(sections: Option<[usize; 4]>, i: usize) -> usize {
    match sections {
        Some(s) if i % 3 == 1 && i < 3 * s[1] => 1,
        Some(s) if i % 3 == 2 && i < 3 * s[2] => 2,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::ops::rope_cos_sin;

    /// Plain RoPE through the scaling code is the kernel's angle table bit for bit.
    #[test]
    fn unscaled_is_plain_rope() {
        let r = Rope::resolve(
            64,
            1e7,
            262_144,
            &RopeScaling::default(),
            &Default::default(),
        )
        .unwrap();
        assert!(!r.is_scaled());
        assert_eq!(r.max_ctx(262_144), 262_144);
        for pos in [0, 1, 777, 262_143, 5_000_000] {
            assert_eq!(r.cos_sin(pos), rope_cos_sin(pos, 64, 1e7));
        }
        // YaRN with factor 1 changes nothing either (its magnitude factor is exactly 1).
        let o = RopeOverrides {
            scaling: Some(RopeScalingType::Yarn),
            ..Default::default()
        };
        let y = Rope::resolve(64, 1e7, 262_144, &RopeScaling::default(), &o).unwrap();
        assert_eq!(y.cos_sin(12_345), rope_cos_sin(12_345, 64, 1e7));
    }

    /// llama.cpp's resolution: YaRN's ext factor defaults to 1, the magnitude boost is cancelled in
    /// `attn_factor` (ggml applies it), `none` drops the factor, linear has no boost, and the longest
    /// context is the original one times the factor.
    #[test]
    fn resolution_follows_llama_context() {
        let file = RopeScaling::default();
        let yarn = |scale| RopeOverrides {
            scaling: Some(RopeScalingType::Yarn),
            scale: Some(scale),
            ..Default::default()
        };
        let r = Rope::resolve(64, 1e7, 262_144, &file, &yarn(4.0)).unwrap();
        assert_eq!((r.freq_scale, r.ext_factor), (0.25, 1.0));
        assert!((r.attn_factor - 1.0).abs() < 1e-7, "{}", r.attn_factor);
        assert_eq!(r.max_ctx(262_144), 1_048_576);
        assert_eq!(r.corr_dims(), [14.0, 22.0]);
        let none = RopeOverrides {
            scaling: Some(RopeScalingType::None),
            scale: Some(4.0),
            ..Default::default()
        };
        let r = Rope::resolve(64, 1e7, 262_144, &file, &none).unwrap();
        assert!(!r.is_scaled());
        let r = Rope::resolve(
            64,
            1e7,
            4096,
            &file,
            &RopeOverrides {
                scale: Some(2.0),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            (r.kind, r.freq_scale, r.ext_factor),
            (RopeScalingType::Linear, 0.5, 0.0)
        );
        assert_eq!(r.max_ctx(4096), 8192);
        for bad in [0.0, -2.0, f32::NAN] {
            let e = Rope::resolve(64, 1e7, 4096, &file, &yarn(bad)).unwrap_err();
            assert!(e.to_string().contains("--rope-scale"), "{e}");
        }
    }
}
