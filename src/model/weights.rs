//! The model's tensors, checked once at load: presence, type and shape (spec §2.3). Matrices stay views into
//! the GGUF mapping; the small 1-D tensors (norms, decay, conv taps) are copied out as f32.

use anyhow::{bail, Context, Result};

use super::hparams::{HParams, LayerKind};
use crate::gguf::GgufFile;
use crate::kernels::fgemm::transpose;
use crate::kernels::{can_multiply, Weight};
use crate::quant;

pub struct AttentionWeights<'a> {
    /// `{d, 2·H·hd}`: per head, `hd` query rows then `hd` gate rows.
    pub wq: Weight<'a>,
    pub wk: Weight<'a>,
    pub wv: Weight<'a>,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub wo: Weight<'a>,
}

pub struct DeltaNetWeights<'a> {
    /// `{d, C}`: q (`Hk·dk`), k (`Hk·dk`), v (`Hv·dv`) channels.
    pub wqkv: Weight<'a>,
    /// `{d, Hv·dv}`: the output gate z.
    pub wz: Weight<'a>,
    pub wbeta: Weight<'a>,
    pub walpha: Weight<'a>,
    /// `[K][C]`: tap `j` (oldest first) of every channel, transposed from the GGUF's `[C][K]` at load so
    /// that the conv runs over contiguous channels.
    pub conv: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// `−exp(A_log)`, already negative.
    pub a: Vec<f32>,
    /// `dv` weights shared by all heads (no +1 offset).
    pub norm: Vec<f32>,
    pub wout: Weight<'a>,
}

pub enum Mixer<'a> {
    Attention(AttentionWeights<'a>),
    DeltaNet(DeltaNetWeights<'a>),
}

pub struct LayerWeights<'a> {
    pub attn_norm: Vec<f32>,
    pub mixer: Mixer<'a>,
    /// The pre-FFN norm.
    pub post_norm: Vec<f32>,
    pub ffn_gate: Weight<'a>,
    pub ffn_up: Weight<'a>,
    pub ffn_down: Weight<'a>,
}

pub struct Weights<'a> {
    pub token_embd: Weight<'a>,
    pub output_norm: Vec<f32>,
    /// `output.weight`, or `token_embd.weight` when the embeddings are tied.
    pub output: Weight<'a>,
    pub layers: Vec<LayerWeights<'a>>,
    /// The multi-token-prediction block, when the file has one (`Err`: present but unusable, with
    /// the reason).
    pub mtp: Option<std::result::Result<MtpWeights<'a>, String>>,
}

/// The MTP ("nextn") block at layer index `n_layer` (spec §7): a full-attention decoder layer fed
/// `eh_proj · [enorm(embed(x)) ; hnorm(h)]`, whose output goes through `shared_head_norm` and the LM
/// head. Views into the mapping like the trunk's matrices: its pages are read only when it runs.
pub struct MtpWeights<'a> {
    /// `{2d, d}`: input `[embedding half ; hidden half]`.
    pub eh_proj: Weight<'a>,
    pub enorm: Vec<f32>,
    pub hnorm: Vec<f32>,
    /// The decoder layer (always full attention).
    pub layer: LayerWeights<'a>,
    pub shared_head_norm: Vec<f32>,
    /// `nextn.embed_tokens` if the file has its own (Qwen3.5 files do not: `token_embd`).
    pub embed: Option<Weight<'a>>,
    /// `nextn.shared_head_head` if the file has its own (Qwen3.5: the trunk's LM head).
    pub head: Option<Weight<'a>>,
}

impl<'a> MtpWeights<'a> {
    fn load(l: &Loader<'a>, hp: &HParams) -> Result<MtpWeights<'a>> {
        let (il, d) = (hp.n_layer, hp.n_embd);
        let n = |s: &str| format!("blk.{il}.{s}");
        let optional = |s: &str| -> Result<Option<Weight<'a>>> {
            let name = n(s);
            match l.f.tensor(&name) {
                None => Ok(None),
                Some(t) => {
                    let n_vocab = t.ne.get(1).copied().unwrap_or(0) as usize;
                    l.matrix(&name, d, n_vocab).map(Some)
                }
            }
        };
        Ok(MtpWeights {
            eh_proj: l.matrix(&n("nextn.eh_proj.weight"), 2 * d, d)?,
            enorm: l.vector(&n("nextn.enorm.weight"), &[d])?,
            hnorm: l.vector(&n("nextn.hnorm.weight"), &[d])?,
            layer: load_layer(l, hp, il, LayerKind::Attention)?,
            shared_head_norm: l.vector(&n("nextn.shared_head_norm.weight"), &[d])?,
            embed: optional("nextn.embed_tokens.weight")?,
            head: optional("nextn.shared_head_head.weight")?,
        })
    }
}

/// Decoder layer `il` of the given kind: its mixer, norms and FFN.
fn load_layer<'a>(
    l: &Loader<'a>,
    hp: &HParams,
    il: usize,
    kind: LayerKind,
) -> Result<LayerWeights<'a>> {
    let d = hp.n_embd;
    let n = |s: &str| format!("blk.{il}.{s}");
    let mixer = match kind {
        LayerKind::Attention => {
            let (h, kv, hd) = (hp.n_head[il], hp.n_head_kv[il], hp.head_dim);
            Mixer::Attention(AttentionWeights {
                wq: l.matrix(&n("attn_q.weight"), d, 2 * h * hd)?,
                wk: l.matrix(&n("attn_k.weight"), d, kv * hd)?,
                wv: l.matrix(&n("attn_v.weight"), d, kv * hd)?,
                q_norm: l.vector(&n("attn_q_norm.weight"), &[hd])?,
                k_norm: l.vector(&n("attn_k_norm.weight"), &[hd])?,
                wo: l.matrix(&n("attn_output.weight"), h * hd, d)?,
            })
        }
        LayerKind::DeltaNet => {
            let (hv, c) = (hp.n_v_heads, hp.conv_channels());
            let inner = hv * hp.d_v;
            Mixer::DeltaNet(DeltaNetWeights {
                wqkv: l.matrix(&n("attn_qkv.weight"), d, c)?,
                wz: l.matrix(&n("attn_gate.weight"), d, inner)?,
                wbeta: l.matrix(&n("ssm_beta.weight"), d, hv)?,
                walpha: l.matrix(&n("ssm_alpha.weight"), d, hv)?,
                conv: {
                    let taps = l.vector(&n("ssm_conv1d.weight"), &[hp.conv_kernel, c])?;
                    let mut t = vec![0f32; taps.len()];
                    transpose(&taps, c, hp.conv_kernel, &mut t);
                    t
                },
                dt_bias: l.vector(&n("ssm_dt.bias"), &[hv])?,
                a: l.vector(&n("ssm_a"), &[hv])?,
                norm: l.vector(&n("ssm_norm.weight"), &[hp.d_v])?,
                wout: l.matrix(&n("ssm_out.weight"), inner, d)?,
            })
        }
    };
    let ff = hp.n_ff[il];
    Ok(LayerWeights {
        attn_norm: l.vector(&n("attn_norm.weight"), &[d])?,
        mixer,
        post_norm: l.vector(&n("post_attention_norm.weight"), &[d])?,
        ffn_gate: l.matrix(&n("ffn_gate.weight"), d, ff)?,
        ffn_up: l.matrix(&n("ffn_up.weight"), d, ff)?,
        ffn_down: l.matrix(&n("ffn_down.weight"), ff, d)?,
    })
}

/// Looks tensors up and checks them, naming the tensor in every error (also used for the vision
/// tower's mmproj file).
pub(crate) struct Loader<'a> {
    pub f: &'a GgufFile,
    /// What the file is, for "... is missing tensor" ("model", "mmproj").
    pub what: &'static str,
}

impl<'a> Loader<'a> {
    pub fn get(&self, name: &str, ne: &[usize]) -> Result<(&'a crate::gguf::TensorInfo, &'a [u8])> {
        let (t, data) = self
            .f
            .tensor_by_name(name)
            .with_context(|| format!("{} is missing tensor '{name}'", self.what))?;
        let want: Vec<u64> = ne.iter().map(|&n| n as u64).collect();
        // ggml drops trailing 1-sized dims; compare with them stripped.
        let strip = |v: &[u64]| -> Vec<u64> {
            let mut v = v.to_vec();
            while v.len() > 1 && v.last() == Some(&1) {
                v.pop();
            }
            v
        };
        if strip(&t.ne) != strip(&want) {
            bail!("tensor '{name}' has shape {:?}, expected {:?}", t.ne, want);
        }
        Ok((t, data))
    }

    /// A matrix `{n_in, n_out}` the matmul kernels can multiply.
    pub fn matrix(&self, name: &str, n_in: usize, n_out: usize) -> Result<Weight<'a>> {
        let (t, data) = self.get(name, &[n_in, n_out])?;
        can_multiply(t.ty, n_in).map_err(|e| anyhow::anyhow!("tensor '{name}' {e}"))?;
        Ok(Weight {
            name: &t.name,
            ty: t.ty,
            n_in,
            n_out,
            data,
        })
    }

    /// A small tensor copied out as f32 (any type with a dequantizer; in practice F32).
    pub fn vector(&self, name: &str, ne: &[usize]) -> Result<Vec<f32>> {
        let (t, data) = self.get(name, ne)?;
        if !t.ty.can_dequantize() {
            bail!(
                "tensor '{name}' has type {}, which deltaq cannot read",
                t.ty
            );
        }
        let mut out = vec![0f32; t.n_elements() as usize];
        quant::dequantize_row(t.ty, data, &mut out)
            .with_context(|| format!("reading tensor '{name}'"))?;
        Ok(out)
    }
}

impl<'a> Weights<'a> {
    pub fn load(f: &'a GgufFile, hp: &HParams) -> Result<Weights<'a>> {
        let l = Loader { f, what: "model" };
        let d = hp.n_embd;
        let (embd, _) = f
            .tensor_by_name("token_embd.weight")
            .context("model is missing tensor 'token_embd.weight'")?;
        let n_vocab = embd.ne.get(1).copied().unwrap_or(0) as usize;
        let token_embd = l.matrix("token_embd.weight", d, n_vocab)?;
        if !token_embd.ty.can_dequantize() {
            bail!(
                "tensor 'token_embd.weight' has type {}, which deltaq cannot read",
                token_embd.ty
            );
        }
        let output = match f.tensor("output.weight") {
            Some(_) => l.matrix("output.weight", d, n_vocab)?,
            None => token_embd,
        };
        let layers = (0..hp.n_layer)
            .map(|il| load_layer(&l, hp, il, hp.kinds[il]))
            .collect::<Result<Vec<_>>>()?;
        // A broken MTP block does not stop the trunk from running: drafting is then unavailable and
        // says why.
        let mtp = if hp.has_mtp() {
            Some(MtpWeights::load(&l, hp).map_err(|e| format!("{e:#}")))
        } else {
            None
        };
        Ok(Weights {
            token_embd,
            output_norm: l.vector("output_norm.weight", &[d])?,
            output,
            layers,
            mtp,
        })
    }

    pub fn n_vocab(&self) -> usize {
        self.token_embd.n_out
    }

    /// Embedding row of `token` (one row dequantized; the table is never expanded).
    pub fn embed(&self, token: u32, out: &mut [f32]) -> Result<()> {
        let t = token as usize;
        if t >= self.n_vocab() {
            bail!(
                "token id {token} is out of range (vocabulary has {} entries)",
                self.n_vocab()
            );
        }
        quant::dequantize_row(self.token_embd.ty, self.token_embd.row(t), out)
            .context("reading token_embd.weight")?;
        Ok(())
    }
}
