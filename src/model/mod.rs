//! The Qwen3.5 (`qwen35`) text decoder: hybrid Gated DeltaNet + gated full attention (spec §3).
//!
//! ```text
//! x = token_embd[tokens]                               [T × d]
//! for each layer il:
//!     x += Mixer_il(RMSNorm(x; attn_norm))             DeltaNet, or attention when (il+1) % 4 == 0
//!     x += SwiGLU_il(RMSNorm(x; post_attention_norm))
//! logits = W_out · RMSNorm(x; output_norm)             [T × V]
//! ```
//!
//! [`Model`] is the read-only weights (views into the GGUF mapping); a [`Session`] is one sequence's state
//! (KV cache, conv and delta-rule states) and is `Clone` for snapshot/restore.

pub mod attention;
pub mod deltanet;
pub mod ffn;
pub mod hparams;
pub mod weights;

use anyhow::{bail, Result};
use rayon::prelude::*;

pub use attention::{KvType, KV_PAGE};
pub use deltanet::DeltaMode;
pub use hparams::{HParams, LayerKind};
pub use weights::Weights;

use crate::gguf::GgufFile;
use crate::kernels::matmul;
use crate::kernels::ops::rms_norm;
use attention::KvCache;
use deltanet::DeltaState;

/// Tokens processed per pass through the layers: bounds the scratch memory of long prompts. 256 rather
/// than llama.cpp's 512: the matmuls work in blocks of 64 tokens either way, so the speed is the same
/// (pp512 on the 0.8B, same-run medians within noise) and the scratch peak is half (about 21 MB).
pub const UBATCH: usize = 256;

pub struct Model<'a> {
    pub hp: HParams,
    pub w: Weights<'a>,
}

impl<'a> Model<'a> {
    /// Reads the hyperparameters and checks every tensor (presence, type, shape); nothing is copied but
    /// the small 1-D tensors.
    pub fn load(f: &'a GgufFile) -> Result<Model<'a>> {
        let hp = HParams::from_gguf(f)?;
        let w = Weights::load(f, &hp)?;
        Ok(Model { hp, w })
    }

    pub fn n_vocab(&self) -> usize {
        self.w.n_vocab()
    }
}

/// Per-layer, per-sequence state.
#[derive(Clone, Debug)]
enum LayerState {
    Attention(KvCache),
    DeltaNet(DeltaState),
}

/// Which positions get logits.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Logits {
    All,
    Last,
    None,
}

/// One sequence being decoded. Cloning it snapshots the whole state (KV cache and recurrent states).
#[derive(Clone)]
pub struct Session<'m> {
    model: &'m Model<'m>,
    n_ctx: usize,
    kv_type: KvType,
    pos: usize,
    layers: Vec<LayerState>,
    /// Activation buffers, reused from call to call.
    scratch: Scratch,
    /// Delta-rule form for multi-token calls (tests compare the two).
    pub delta_mode: DeltaMode,
}

impl<'m> Session<'m> {
    /// A new, empty sequence of at most `n_ctx` tokens (`None`: the model's training context), with the
    /// default (F16) KV cache.
    pub fn new(model: &'m Model<'m>, n_ctx: Option<usize>) -> Session<'m> {
        Session::with_kv_type(model, n_ctx, KvType::default())
    }

    /// [`Session::new`] with the KV cache stored as `kv_type`. The cache grows page by page
    /// ([`KV_PAGE`] positions) as tokens come and never holds room for more than `n_ctx` positions.
    pub fn with_kv_type(
        model: &'m Model<'m>,
        n_ctx: Option<usize>,
        kv_type: KvType,
    ) -> Session<'m> {
        let hp = &model.hp;
        let n_ctx = n_ctx.unwrap_or(hp.n_ctx_train);
        let layers = hp
            .kinds
            .iter()
            .enumerate()
            .map(|(il, k)| match k {
                LayerKind::Attention => LayerState::Attention(KvCache::new(
                    kv_type,
                    n_ctx,
                    hp.n_head_kv[il] * hp.head_dim,
                )),
                LayerKind::DeltaNet => LayerState::DeltaNet(DeltaState::new(hp)),
            })
            .collect();
        Session {
            model,
            n_ctx,
            kv_type,
            pos: 0,
            layers,
            scratch: Scratch::default(),
            delta_mode: DeltaMode::default(),
        }
    }

    /// Back to an empty sequence, keeping what was allocated (KV cache pages, activation buffers), as
    /// llama.cpp's `llama_memory_clear` does: the next prompt runs without allocating or faulting in
    /// fresh pages.
    pub fn clear(&mut self) {
        self.pos = 0;
        for l in &mut self.layers {
            match l {
                LayerState::Attention(c) => c.clear(),
                LayerState::DeltaNet(d) => {
                    d.conv.fill(0.0);
                    d.s.fill(0.0);
                }
            }
        }
    }

    /// Tokens processed so far.
    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// The element type of the KV cache.
    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    /// Bytes held by the state (KV cache as allocated, conv and recurrent states): what a snapshot
    /// costs.
    pub fn state_bytes(&self) -> usize {
        let (kv, rec) = self.state_parts();
        kv + rec
    }

    /// [`Session::state_bytes`] split into (KV cache as allocated, recurrent conv + delta-rule states).
    /// The KV cache grows with the tokens processed (a page of [`KV_PAGE`] positions at a time; a
    /// clone holds only the positions in use); the recurrent states are fixed.
    pub fn state_parts(&self) -> (usize, usize) {
        fn bytes<T>(v: &Vec<T>) -> usize {
            v.capacity() * std::mem::size_of::<T>()
        }
        let (mut kv, mut rec) = (0, 0);
        for l in &self.layers {
            match l {
                LayerState::Attention(c) => kv += c.bytes(),
                LayerState::DeltaNet(d) => rec += bytes(&d.conv) + bytes(&d.s),
            }
        }
        (kv, rec)
    }

    /// Feeds `tokens` (the continuation of the sequence) and returns logits for each: `[T × n_vocab]`.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.forward_observed(tokens, &mut |_, _, _| {})
    }

    /// Like [`forward`](Self::forward) but computes only the last position's logits: `[n_vocab]`.
    pub fn forward_last(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.forward_last_ref(tokens).map(<[f32]>::to_vec)
    }

    /// [`forward_last`](Self::forward_last) without allocating: the logits `[n_vocab]` stay in the
    /// session's buffer until the next call.
    pub fn forward_last_ref(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        let mut logits = std::mem::take(&mut self.scratch.logits);
        let done = self.run(tokens, Logits::Last, &mut |_, _, _| {}, &mut logits);
        self.scratch.logits = logits;
        done?;
        Ok(&self.scratch.logits[..self.model.n_vocab()])
    }

    /// Feeds `tokens` without computing logits (e.g. chat history before a snapshot).
    pub fn feed(&mut self, tokens: &[u32]) -> Result<()> {
        self.run(tokens, Logits::None, &mut |_, _, _| {}, &mut Vec::new())
    }

    /// [`forward`](Self::forward), calling `observe(layer, pos0, x)` with the residual stream `x`
    /// (`[n × d]` for positions `pos0..pos0+n`) after every layer.
    pub fn forward_observed(
        &mut self,
        tokens: &[u32],
        observe: &mut dyn FnMut(usize, usize, &[f32]),
    ) -> Result<Vec<f32>> {
        let mut logits = Vec::with_capacity(tokens.len() * self.model.n_vocab());
        self.run(tokens, Logits::All, observe, &mut logits)?;
        Ok(logits)
    }

    /// Runs `tokens` through the model a ubatch at a time; logits go to `out` as [`Session::ubatch`]
    /// writes them.
    fn run(
        &mut self,
        tokens: &[u32],
        which: Logits,
        observe: &mut dyn FnMut(usize, usize, &[f32]),
        out: &mut Vec<f32>,
    ) -> Result<()> {
        if tokens.is_empty() {
            bail!("no tokens to evaluate");
        }
        if self.pos + tokens.len() > self.n_ctx {
            bail!(
                "context length exceeded: {} tokens already in the sequence + {} new > context size {}",
                self.pos,
                tokens.len(),
                self.n_ctx
            );
        }
        let n_vocab = self.model.n_vocab();
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            bail!("token id {t} is out of range (vocabulary has {n_vocab} entries)");
        }
        let n_batches = tokens.len().div_ceil(UBATCH);
        for (i, batch) in tokens.chunks(UBATCH).enumerate() {
            let want = match which {
                Logits::Last if i + 1 < n_batches => Logits::None,
                other => other,
            };
            self.ubatch(batch, want, observe, out)?;
        }
        Ok(())
    }

    /// One pass of up to [`UBATCH`] tokens through all layers. Logits: all positions' are appended to
    /// `out` (`[T × V]`); the last position's overwrite its first `V` elements (growing it only once).
    fn ubatch(
        &mut self,
        tokens: &[u32],
        which: Logits,
        observe: &mut dyn FnMut(usize, usize, &[f32]),
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let (hp, w) = (&self.model.hp, &self.model.w);
        let (d, n_tok, pos0) = (hp.n_embd, tokens.len(), self.pos);
        let s = &mut self.scratch;

        let x = grow(&mut s.x, n_tok * d); // residual stream [T × d]
        for (row, &t) in x.chunks_exact_mut(d).zip(tokens) {
            w.embed(t, row)?;
        }
        let a = grow(&mut s.a, n_tok * d); // normed input [T × d]
        let m = grow(&mut s.m, n_tok * d); // block output [T × d]
        for (il, (lw, st)) in w.layers.iter().zip(&mut self.layers).enumerate() {
            norm_rows(x, &lw.attn_norm, hp.rms_eps, a);
            match (&lw.mixer, st) {
                (weights::Mixer::Attention(aw), LayerState::Attention(kv)) => {
                    attention::forward(aw, hp, il, kv, pos0, a, m, &mut s.block)
                }
                (weights::Mixer::DeltaNet(dw), LayerState::DeltaNet(ds)) => {
                    deltanet::forward(dw, hp, ds, self.delta_mode, a, m, &mut s.block)
                }
                _ => unreachable!("layer states are built from the same layer kinds"),
            }
            add(x, m, d);
            norm_rows(x, &lw.post_norm, hp.rms_eps, a);
            ffn::forward(lw, a, n_tok, m, &mut s.block);
            add(x, m, d);
            observe(il, pos0, x);
        }
        self.pos += n_tok;

        let (h, logits) = match which {
            Logits::All => {
                let start = out.len();
                out.resize(start + n_tok * w.output.n_out, 0.0);
                (&x[..], &mut out[start..]) // [T × d] → [T × V]
            }
            Logits::Last => (&x[(n_tok - 1) * d..], grow(out, w.output.n_out)), // [d] → [V]
            Logits::None => return Ok(()),
        };
        let n_out = h.len() / d;
        let hn = &mut a[..h.len()]; // the normed rows, in a's buffer
        norm_rows(h, &w.output_norm, hp.rms_eps, hn);
        matmul(&w.output, hn, n_out, logits);
        Ok(())
    }
}

/// A session's activation buffers for one ubatch, grown to the largest ubatch seen and then reused,
/// so that decoding allocates nothing (`logits`: one row, for [`Session::forward_last_ref`]). A clone (a
/// snapshot) starts empty: buffers are not state.
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    a: Vec<f32>,
    m: Vec<f32>,
    logits: Vec<f32>,
    /// One arena that the mixer and the FFN of a layer carve their buffers from in turn (they never
    /// run at the same time), so the peak is the largest block's need, not the sum of all blocks'.
    block: Vec<f32>,
}

impl Clone for Scratch {
    fn clone(&self) -> Scratch {
        Scratch::default()
    }
}

/// The first `len` elements of `buf`, growing it (zero-filled, once) if it is shorter. It never shrinks,
/// and the contents are left as they are: callers overwrite what they read.
pub(crate) fn grow(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    &mut buf[..len]
}

/// Splits the first `Σ lens` elements of `arena` (grown as by [`grow`]) into consecutive buffers of
/// the given lengths.
pub(crate) fn carve<const N: usize>(arena: &mut Vec<f32>, lens: [usize; N]) -> [&mut [f32]; N] {
    let mut rest = grow(arena, lens.iter().sum());
    lens.map(|n| {
        let (buf, tail) = std::mem::take(&mut rest).split_at_mut(n);
        rest = tail;
        buf
    })
}

/// Runs `f(t, row)` for every row `t` of `x` (`[n × len]`): in parallel when there are several rows (a
/// prompt), inline for one (decode, where a fork/join would cost more than the row).
pub(crate) fn for_rows<T: Send>(
    x: &mut [T],
    len: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    if x.len() <= len {
        x.chunks_exact_mut(len)
            .enumerate()
            .for_each(|(t, r)| f(t, r));
    } else {
        x.par_chunks_mut(len).enumerate().for_each(|(t, r)| f(t, r));
    }
}

fn norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for_rows(out, d, |t, row| {
        row.copy_from_slice(&x[t * d..][..d]);
        rms_norm(row, w, eps);
    });
}

/// `x += y` for `[T × d]` rows.
fn add(x: &mut [f32], y: &[f32], d: usize) {
    for_rows(x, d, |t, row| {
        for (x, y) in row.iter_mut().zip(&y[t * d..][..d]) {
            *x += y;
        }
    });
}
