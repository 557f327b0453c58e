//! Multi-token prediction (spec §7): the MTP ("nextn") block drafts the token after next from the
//! trunk's final-normed hidden state and the token just sampled, for self-speculative decoding.
//!
//! ```text
//! MTP row at position p, fed token x_p and hidden h (h_{p−1} of the trunk, or the block's own y):
//!   e = RMSNorm(E[x_p]; enorm)          g = RMSNorm(h; hnorm)           (zero h for p = 0)
//!   z = eh_proj · [e ; g]                                               [2d] → [d]
//!   z = decoder layer (full attention over the block's own KV cache, RoPE at p)
//!   y = RMSNorm(z; shared_head_norm)    logits = W_out · y  → distribution of x_{p+1}
//! ```
//!
//! The block's KV cache holds a row for every position the trunk has processed (the prompt's too),
//! paired as llama.cpp pairs them: row p = (x_p, h_{p−1}), row 0 with an all-zero h. Rows are
//! collected as the trunk runs and computed in batches ([`FLUSH_ROWS`], or before a draft), so that
//! the block's weights are read once per batch, not once per token.

use anyhow::{bail, Result};

use super::attention::{KvCache, KvType};
use super::weights::{MtpWeights, Weights};
use super::{grow, layer, norm_rows, DeltaMode, LayerState, Model, RopePos};
use crate::kernels::ops::rms_norm;
use crate::kernels::{matmul, Weight};
use crate::quant;

/// Pending rows that trigger a batched MTP pass during plain decoding.
pub const FLUSH_ROWS: usize = 32;

/// The MTP block of one sequence: its KV cache and the rows not yet computed.
#[derive(Clone)]
pub struct MtpState {
    kv: LayerState,
    /// Rows waiting for a batched pass: tokens `[P]` and the hidden states they pair with `[P × d]`.
    pending_tok: Vec<u32>,
    pending_h: Vec<f32>,
    /// h_{pos−1}: the trunk's final-normed hidden state at the last position (zero before any).
    h_last: Vec<f32>,
    buf: Buffers,
}

/// Activation buffers (not state: a clone starts empty).
#[derive(Default)]
struct Buffers {
    /// `[R × 2d]`: `[e ; g]` rows.
    eg: Vec<f32>,
    x: Vec<f32>,
    a: Vec<f32>,
    m: Vec<f32>,
    block: Vec<f32>,
    /// `[R × d]`: the block's outputs y.
    y: Vec<f32>,
    logits: Vec<f32>,
}

impl Clone for Buffers {
    fn clone(&self) -> Buffers {
        Buffers::default()
    }
}

/// The model's MTP weights, or why there are none to use.
pub fn weights<'a>(model: &'a Model<'a>) -> Result<&'a MtpWeights<'a>> {
    match &model.w.mtp {
        Some(Ok(w)) => Ok(w),
        Some(Err(e)) => bail!("the model's MTP block cannot be used: {e}"),
        None => bail!("the model has no MTP block (qwen35.nextn_predict_layers is 0 or absent)"),
    }
}

impl MtpState {
    pub fn new(model: &Model, n_ctx: usize, kv_type: KvType) -> Result<MtpState> {
        weights(model)?;
        let hp = &model.hp;
        let heads = hp.n_head_kv[hp.n_layer];
        Ok(MtpState {
            kv: LayerState::Attention(KvCache::new(kv_type, n_ctx, heads, hp.head_dim)),
            pending_tok: Vec::new(),
            pending_h: Vec::new(),
            h_last: vec![0.0; hp.n_embd],
            buf: Buffers::default(),
        })
    }

    pub(super) fn state(&self) -> &LayerState {
        &self.kv
    }

    fn cache(&mut self) -> &mut KvCache {
        match &mut self.kv {
            LayerState::Attention(c) => c,
            LayerState::DeltaNet(_) => unreachable!("the MTP block is an attention layer"),
        }
    }

    /// Rows in the KV cache.
    pub fn len(&self) -> usize {
        match &self.kv {
            LayerState::Attention(c) => c.len(),
            LayerState::DeltaNet(_) => 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.rows() == 0
    }

    /// Rows waiting for a batched pass.
    pub fn pending(&self) -> usize {
        self.pending_tok.len()
    }

    /// Positions that have a row, computed or pending.
    pub fn rows(&self) -> usize {
        self.len() + self.pending()
    }

    pub(super) fn clear(&mut self) {
        self.cache().clear();
        self.pending_tok.clear();
        self.pending_h.clear();
        self.h_last.fill(0.0);
    }

    /// Keeps the rows of positions `< len` (computed ones; nothing may be pending).
    pub(super) fn truncate(&mut self, len: usize) {
        debug_assert_eq!(self.pending(), 0);
        self.cache().truncate(len);
    }

    /// Back to `earlier`, a snapshot of the same sequence (see `Session::rewind_to`).
    pub(super) fn rewind_to(&mut self, earlier: &MtpState) {
        let len = earlier.len();
        self.cache().truncate(len);
        self.pending_tok.clone_from(&earlier.pending_tok);
        self.pending_h.clone_from(&earlier.pending_h);
        self.h_last.copy_from_slice(&earlier.h_last);
    }

    /// The trunk ran `tokens` at positions `pos0..pos0+T` with final-normed hidden rows `h`
    /// (`[T × d]`): queues the rows (x_t, h_{t−1}), skipping positions that already have one, and
    /// keeps h of the last position.
    pub(super) fn push(&mut self, pos0: usize, tokens: &[u32], h: &[f32], d: usize) {
        for (t, &x) in tokens.iter().enumerate() {
            if pos0 + t >= self.rows() {
                self.pending_tok.push(x);
                let prev = if t == 0 {
                    &self.h_last[..]
                } else {
                    &h[(t - 1) * d..][..d]
                };
                self.pending_h.extend_from_slice(prev);
            }
        }
        self.h_last
            .copy_from_slice(&h[(tokens.len() - 1) * d..][..d]);
    }

    /// Computes the pending rows (no logits).
    pub(super) fn flush(&mut self, model: &Model) -> Result<()> {
        if self.pending() == 0 {
            return Ok(());
        }
        let (tok, h) = (
            std::mem::take(&mut self.pending_tok),
            std::mem::take(&mut self.pending_h),
        );
        let done = self.forward(model, &tok, &h).map(|_| ());
        (self.pending_tok, self.pending_h) = (tok, h);
        self.pending_tok.clear();
        self.pending_h.clear();
        done
    }

    /// Computes the pending rows and the row of `first` paired with h_last (the next position), in
    /// one batch; returns that row's output y (`[d]`).
    pub(super) fn first_row(&mut self, model: &Model, first: u32) -> Result<&[f32]> {
        let d = model.hp.n_embd;
        let (mut tok, mut h) = (
            std::mem::take(&mut self.pending_tok),
            std::mem::take(&mut self.pending_h),
        );
        tok.push(first);
        h.extend_from_slice(&self.h_last);
        let done = self.forward(model, &tok, &h).map(|_| ());
        tok.clear();
        h.clear();
        (self.pending_tok, self.pending_h) = (tok, h);
        done?;
        let y = &self.buf.y;
        let r = y.len() / d;
        Ok(&y[(r - 1) * d..][..d])
    }

    /// MTP rows for `tokens` (`[R]`) paired with hidden states `h` (`[R × d]`) at the next `R`
    /// positions of the block's cache; returns their outputs y (`[R × d]`, after `shared_head_norm`).
    pub fn forward(&mut self, model: &Model, tokens: &[u32], h: &[f32]) -> Result<&[f32]> {
        let (hp, w) = (&model.hp, &model.w);
        let mw = weights(model)?;
        let (d, n) = (hp.n_embd, tokens.len());
        assert_eq!(h.len(), n * d, "MTP hidden rows");
        let pos0 = self.len();
        if pos0 + n > self.cache().n_ctx() {
            bail!("context length exceeded in the MTP block ({pos0} + {n} positions)");
        }
        let b = &mut self.buf;
        // [e ; g] rows [R × 2d], then z = eh_proj · [e ; g] [R × d].
        let eg = grow(&mut b.eg, n * 2 * d);
        for ((row, &x), hr) in eg
            .chunks_exact_mut(2 * d)
            .zip(tokens)
            .zip(h.chunks_exact(d))
        {
            let (e, g) = row.split_at_mut(d);
            embed(mw, w, x, e)?;
            rms_norm(e, &mw.enorm, hp.rms_eps);
            g.copy_from_slice(hr);
            rms_norm(g, &mw.hnorm, hp.rms_eps);
        }
        let x = grow(&mut b.x, n * d);
        matmul(&mw.eh_proj, eg, n, x);
        let (a, m) = (grow(&mut b.a, n * d), grow(&mut b.m, n * d));
        layer(
            &mw.layer,
            hp,
            hp.n_layer,
            &mut self.kv,
            DeltaMode::default(),
            pos0,
            RopePos::Text(pos0), // drafting is off in sequences with images: text positions
            x,
            a,
            m,
            &mut b.block,
            None,
        );
        let y = grow(&mut b.y, n * d);
        norm_rows(x, &mw.shared_head_norm, hp.rms_eps, y);
        b.y.truncate(n * d);
        Ok(&self.buf.y)
    }

    /// Logits of an output row `y` (`[d]`) over the first `vocab` tokens of the LM head.
    pub fn logits(&mut self, model: &Model, y: &[f32], vocab: usize) -> Result<&[f32]> {
        let mw = weights(model)?;
        let head = draft_head(mw.head.as_ref().unwrap_or(&model.w.output), vocab);
        let out = grow(&mut self.buf.logits, head.n_out);
        matmul(&head, y, 1, out);
        Ok(out)
    }

    /// The top draft of output row `y` over the first `vocab` tokens and, with `prob`, its softmax
    /// probability (1 otherwise).
    pub(super) fn top(
        &mut self,
        model: &Model,
        y: &[f32],
        vocab: usize,
        prob: bool,
    ) -> Result<(u32, f32)> {
        let l = self.logits(model, y, vocab)?;
        let (best, &max) =
            l.iter().enumerate().fold(
                (0, &f32::NEG_INFINITY),
                |b, (i, v)| if *v > *b.1 { (i, v) } else { b },
            );
        let p = if prob {
            1.0 / l.iter().map(|v| (v - max).exp()).sum::<f32>()
        } else {
            1.0
        };
        Ok((best as u32, p))
    }
}

/// The first `vocab` rows of the LM head (all of them when `vocab` is 0 or too large): the draft
/// vocabulary. Token ids of byte-level BPE vocabularies are in merge order, most frequent pieces
/// first, so a prefix keeps the tokens drafts are mostly made of.
fn draft_head<'a>(head: &Weight<'a>, vocab: usize) -> Weight<'a> {
    let n = if vocab == 0 {
        head.n_out
    } else {
        vocab.min(head.n_out)
    };
    Weight {
        n_out: n,
        data: &head.data[..n * head.row_bytes()],
        ..*head
    }
}

/// The MTP block's input embedding of `token`: its own table if the file has one, else the trunk's.
fn embed(mw: &MtpWeights, w: &Weights, token: u32, out: &mut [f32]) -> Result<()> {
    match &mw.embed {
        Some(e) => {
            let t = token as usize;
            if t >= e.n_out {
                bail!("token id {token} is out of range of the MTP embedding");
            }
            quant::dequantize_row(e.ty, e.row(t), out)
                .map_err(|e| anyhow::anyhow!("reading the MTP embedding: {e}"))
        }
        None => w.embed(token, out),
    }
}

/// Drafts per step when the model has an MTP block and no count is given: 2 where the kernels verify
/// 3 tokens at little more than the cost of 2 (AVX-512: the 16-row Q4_K tiles; on the 2-core Xeon VM of
/// docs/mtp.md a 3-token pass of the 9B costs 1.24× a 1-token step, a 2-token pass 1.12×), else 1.
pub fn default_draft() -> usize {
    match crate::kernels::kernels().isa {
        isa if isa.is_avx512() => 2,
        _ => 1,
    }
}

/// The drafting flags before a model is known (`--draft`, `--draft-p-min`, `--draft-vocab`).
#[derive(Clone, Debug, Default)]
pub struct DraftSettings {
    /// Most drafts per step (`None`: [`default_draft`] when the model has an MTP block; 0: off).
    pub n_max: Option<usize>,
    pub p_min: f32,
    /// Draft vocabulary (`None`: 32768 for vocabularies over 65536 tokens, else all; 0: all).
    pub vocab: Option<usize>,
    /// Draft every step, even while drafting measures slower than plain decoding.
    pub always: bool,
}

impl DraftSettings {
    /// The drafter for `model`, or `None` when drafting is off, with a note when an explicit `--draft`
    /// cannot be honoured (no usable MTP block: plain decoding).
    pub fn drafter(&self, model: &Model) -> (Option<Drafter>, Option<String>) {
        let usable = weights(model);
        let n = match (self.n_max, &usable) {
            (Some(0), _) | (None, Err(_)) => return (None, None),
            (Some(n), Ok(_)) => n,
            (None, Ok(_)) => default_draft(),
            (Some(_), Err(e)) => {
                return (
                    None,
                    Some(format!("--draft ignored: {e:#}; decoding without drafts")),
                )
            }
        };
        let vocab = self.vocab.unwrap_or(default_vocab(model));
        (Some(Drafter::new(n, self.p_min, vocab, !self.always)), None)
    }
}

/// The draft vocabulary when `--draft-vocab` is not given: 32768 tokens of vocabularies over 65536,
/// else all (0).
pub fn default_vocab(model: &Model) -> usize {
    if model.n_vocab() > 65536 {
        32768
    } else {
        0
    }
}

/// How a sequence drafts: the settings (`--draft`, `--draft-p-min`, `--draft-vocab`), the counts
/// `run` and the server report, and the switch that turns drafting off while it does not pay.
#[derive(Clone, Debug)]
pub struct Drafter {
    /// Most drafts per step (0: plain decoding).
    pub n_max: usize,
    /// Stop drafting when the top draft probability is below this.
    pub p_min: f32,
    /// Draft vocabulary: the first `vocab` token ids (0: all).
    pub vocab: usize,
    /// Turn drafting off while it measures slower than plain decoding, and probe again later.
    pub adaptive: bool,
    pub stats: DraftStats,
    steps: u64,
    /// Seconds of a plain step (running mean), and how many were measured.
    t_plain: f64,
    n_plain: u32,
    /// Plain-step equivalents per second of drafting over the current probe: Σ (a+1)·t_plain / Σ secs.
    probe_gain: f64,
    probe_secs: f64,
    probe_steps: u32,
    off_until: u64,
    backoff: u64,
}

/// Draft counts of a generation (llama.cpp's `draft_n` / `draft_n_accepted`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DraftStats {
    pub proposed: u64,
    pub accepted: u64,
    /// Speculative steps (verification passes).
    pub steps: u64,
}

impl DraftStats {
    pub fn acceptance(&self) -> f64 {
        self.accepted as f64 / (self.proposed as f64).max(1.0)
    }
}

/// Plain steps measured before the first speculative one, speculative steps per probe, and the first
/// pause after a probe that did not pay (doubling up to [`MAX_BACKOFF`]). With drafts that never pass,
/// 256 tokens then spend 9 steps drafting.
const PLAIN_WARMUP: u32 = 2;
const PROBE_STEPS: u32 = 3;
const MIN_BACKOFF: u64 = 64;
const MAX_BACKOFF: u64 = 512;

impl Drafter {
    pub fn new(n_max: usize, p_min: f32, vocab: usize, adaptive: bool) -> Drafter {
        Drafter {
            n_max,
            p_min,
            vocab,
            adaptive,
            stats: DraftStats::default(),
            steps: 0,
            t_plain: 0.0,
            n_plain: 0,
            probe_gain: 0.0,
            probe_secs: 0.0,
            probe_steps: 0,
            off_until: 0,
            backoff: MIN_BACKOFF,
        }
    }

    /// No drafting.
    pub fn off() -> Drafter {
        Drafter::new(0, 0.0, 0, false)
    }

    /// Drafts for the next step (0: a plain step).
    pub fn plan(&mut self) -> usize {
        self.steps += 1;
        if self.n_max == 0 {
            return 0;
        }
        if self.adaptive && (self.n_plain < PLAIN_WARMUP || self.steps < self.off_until) {
            return 0;
        }
        self.n_max
    }

    pub(super) fn record_plain(&mut self, secs: f64) {
        self.n_plain += 1;
        // The mean of the recent plain steps (the first ones fault pages in: weigh them out).
        let w = if self.n_plain <= PLAIN_WARMUP {
            1.0
        } else {
            0.2
        };
        self.t_plain += w * (secs - self.t_plain);
    }

    /// A speculative step ended with `accepted` of its drafts taken, after `secs` of drafting and
    /// verification (its counts are kept as the step runs).
    pub(super) fn record_spec(&mut self, accepted: usize, secs: f64) {
        if !self.adaptive {
            return;
        }
        self.probe_gain += (accepted + 1) as f64 * self.t_plain;
        self.probe_secs += secs;
        self.probe_steps += 1;
        if self.probe_steps < PROBE_STEPS {
            return;
        }
        if self.probe_gain < self.probe_secs {
            // Slower than plain decoding: off for a while, longer each time it still does not pay.
            self.off_until = self.steps + self.backoff;
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        } else {
            self.backoff = MIN_BACKOFF;
        }
        (self.probe_gain, self.probe_secs, self.probe_steps) = (0.0, 0.0, 0);
    }
}
