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
pub mod mtp;
pub mod prompt;
pub mod rope;
pub mod weights;

use anyhow::{bail, ensure, Result};
use rayon::prelude::*;
use std::ops::Range;

pub use attention::{KvType, RopePos, KV_PAGE};
pub use deltanet::DeltaMode;
pub use hparams::{HParams, LayerKind};
pub use mtp::{DraftSettings, DraftStats, Drafter};
pub use prompt::{ImageEmbd, Prompt, Segment};
pub use rope::{Rope, RopeOverrides, RopeScalingType};
pub use weights::Weights;

use crate::gguf::GgufFile;
use crate::kernels::matmul;
use crate::kernels::ops::rms_norm;
use attention::KvCache;
use deltanet::{Checkpoints, DeltaState};
use mtp::MtpState;

/// Tokens processed per pass through the layers: bounds the scratch memory of long prompts. 256 rather
/// than llama.cpp's 512: the matmuls work in blocks of 64 tokens either way, so the speed is the same
/// (pp512 on the 0.8B, same-run medians within noise) and the scratch peak is half (about 21 MB).
pub const UBATCH: usize = 256;

/// A pass of more tokens than this (a prompt, not a decoding or verification step) frees its ubatch
/// scratch before the output projection: a prompt's buffers (about 24 MB on the 0.8B) would otherwise
/// stay resident for the whole generation, and the output projection is the moment the mapped output
/// matrix's pages all come in, i.e. the process's peak. Decoding steps keep theirs (and allocate
/// nothing).
const RELEASE_ROWS: usize = 16;

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

/// A pass through the trunk: which logits, and whether it is a speculative verification (DeltaNet
/// states saved after every token, final-normed hidden rows kept, the MTP rows left to
/// [`Session::settle`]).
#[derive(Clone, Copy)]
struct Pass {
    logits: Logits,
    verify: bool,
    /// The last ubatch of a long pass: free the scratch once the layers are done ([`RELEASE_ROWS`]).
    release: bool,
}

/// One sequence being decoded. Cloning it snapshots the whole state (KV cache and recurrent states).
#[derive(Clone)]
pub struct Session<'m> {
    model: &'m Model<'m>,
    n_ctx: usize,
    kv_type: KvType,
    /// Positions in the KV cache (tokens fed).
    pos: usize,
    /// RoPE position of the next text token − `pos`: 0 for text; after an image negative (its rows
    /// span fewer positions than tokens; transformers' `rope_deltas`), positive midway through one. KV
    /// truncation of text keeps it valid.
    rope_delta: i64,
    /// The sequence holds image rows: MTP drafting is off (as in llama.cpp) until [`Session::clear`].
    has_image: bool,
    layers: Vec<LayerState>,
    /// Activation buffers, reused from call to call.
    scratch: Scratch,
    /// Delta-rule form for multi-token calls (tests compare the two).
    pub delta_mode: DeltaMode,
    /// The MTP block's state, when drafting is enabled on this session ([`Session::enable_mtp`]).
    mtp: Option<MtpState>,
    /// The verified speculative step whose tokens are not all consumed yet ([`Session::step`]).
    spec: Speculation,
    /// Trunk positions computed so far, rolled-back ones included (tests count them).
    pub evaluated: u64,
}

/// One speculative step, after its verification pass over `[x_n, d_1, …, d_k]` at positions
/// `base..=base+k`: the trunk has run all of them; `next` of the drafts are consumed so far.
#[derive(Default)]
struct Speculation {
    active: bool,
    base: usize,
    /// `[x_n, d_1, …, d_k]`.
    tokens: Vec<u32>,
    next: usize,
    /// `[(k+1) × V]`: the target's logits at each position.
    logits: Vec<f32>,
    /// `[(k+1) × d]`: the trunk's final-normed hidden rows.
    hidden: Vec<f32>,
    /// Per layer: the DeltaNet states after each of the step's tokens.
    ckpt: Vec<Checkpoints>,
    /// Seconds the draft and the verification took.
    secs: f64,
}

/// A snapshot holds no step in flight ([`Session::settle`] comes first): buffers are not state.
impl Clone for Speculation {
    fn clone(&self) -> Speculation {
        debug_assert!(
            !self.active,
            "a session is cloned with a speculative step in flight"
        );
        Speculation::default()
    }
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
                    hp.n_head_kv[il],
                    hp.head_dim,
                )),
                LayerKind::DeltaNet => LayerState::DeltaNet(DeltaState::new(hp)),
            })
            .collect();
        Session {
            model,
            n_ctx,
            kv_type,
            pos: 0,
            rope_delta: 0,
            has_image: false,
            layers,
            scratch: Scratch::default(),
            delta_mode: DeltaMode::default(),
            mtp: None,
            spec: Speculation::default(),
            evaluated: 0,
        }
    }

    /// Turns on multi-token prediction for this sequence: from now on every pass also fills the MTP
    /// block's KV cache (the prompt's too), so that [`Session::step`] can draft. Only before the first
    /// token: the rows need the trunk's hidden states of every position.
    pub fn enable_mtp(&mut self) -> Result<()> {
        if self.mtp.is_some() {
            return Ok(());
        }
        if self.pos > 0 {
            bail!("drafting must be enabled before the first token of a sequence");
        }
        self.mtp = Some(MtpState::new(self.model, self.n_ctx, self.kv_type)?);
        Ok(())
    }

    /// Whether this session drafts with the MTP block.
    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    /// Whether [`Session::step`] drafts: MTP enabled and no image in the sequence. The MTP block's
    /// rows would need the image's embeddings and positions; llama.cpp too turns drafting off for
    /// sequences with images, and so decoding with images is plain decoding.
    fn drafting(&self) -> bool {
        self.mtp.is_some() && !self.has_image
    }

    /// Whether the sequence holds image rows (fed with [`Session::forward_prompt`] and its siblings).
    pub fn has_image(&self) -> bool {
        self.has_image
    }

    /// Feeds `id`, the token just sampled, and returns the logits for the next position, drafting and
    /// verifying ahead with the MTP block as `drafter` decides (self-speculative decoding, spec §7).
    ///
    /// A step drafts `d_1..d_k` after `id` and runs the trunk once over `[id, d_1, …, d_k]`; the
    /// logits of all those positions are kept. The caller samples from what this returns exactly as
    /// in plain decoding: while its samples equal the drafts, the next calls return the verified
    /// logits without running anything; the first sample that differs rolls the sequence back to the
    /// last token it agreed with (KV caches cut, DeltaNet states restored from the verification's
    /// per-token copies: no token is computed twice) and starts the next step. The output is
    /// therefore exactly plain decoding's; only the work differs. A sequence that holds an image
    /// takes plain steps ([`Session::has_image`]).
    pub fn step(&mut self, id: u32, drafter: &mut Drafter) -> Result<&[f32]> {
        if self.spec.active {
            let la = &mut self.spec;
            if la.next + 1 < la.tokens.len() && la.tokens[la.next + 1] == id {
                la.next += 1;
                drafter.stats.accepted += 1;
                let (v, next) = (self.model.n_vocab(), la.next);
                return Ok(&self.spec.logits[next * v..][..v]);
            }
            self.settle_with(Some(drafter))?;
        }
        // Drafts must leave room for themselves and the token after them.
        let room = self.n_ctx.saturating_sub(self.pos + 1);
        let k = drafter.plan().min(room);
        if k == 0 || !self.drafting() {
            let t0 = std::time::Instant::now();
            self.forward_last_ref(&[id])?;
            drafter.record_plain(t0.elapsed().as_secs_f64());
            return Ok(&self.scratch.logits[..self.model.n_vocab()]);
        }
        let t0 = std::time::Instant::now();
        let drafts = self.draft(id, k, drafter.p_min, drafter.vocab)?;
        if drafts.is_empty() {
            // Nothing confident enough to draft: a plain step (the MTP row of `id` is already in).
            self.forward_last_ref(&[id])?;
            return Ok(&self.scratch.logits[..self.model.n_vocab()]);
        }
        let mut tokens = Vec::with_capacity(drafts.len() + 1);
        tokens.push(id);
        tokens.extend_from_slice(&drafts);
        self.verify(&tokens)?;
        drafter.stats.proposed += drafts.len() as u64;
        drafter.stats.steps += 1;
        self.spec.secs = t0.elapsed().as_secs_f64();
        Ok(&self.spec.logits[..self.model.n_vocab()])
    }

    /// The verification pass of a speculative step: runs `tokens` (`[x_n, d_1, …, d_k]`) through the
    /// trunk keeping every position's logits and the states to roll back to, and returns `x_n`'s
    /// logits; [`Session::step`] consumes the rest. Public for the benchmark of its cost.
    pub fn verify(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        self.settle()?;
        let mut logits = std::mem::take(&mut self.spec.logits);
        logits.clear();
        let base = self.pos;
        let input = Input::text(tokens);
        let done = self.run_pass(input, Logits::All, true, &mut |_, _, _| {}, &mut logits);
        self.spec.logits = logits;
        done?;
        self.spec.tokens.clear();
        self.spec.tokens.extend_from_slice(tokens);
        self.spec.active = true;
        self.spec.base = base;
        self.spec.next = 0;
        self.spec.secs = 0.0;
        Ok(&self.spec.logits[..self.model.n_vocab()])
    }

    /// Goes back to `earlier`, a snapshot (clone) of this same sequence at an earlier position: the
    /// KV caches are cut to its length and the recurrent states copied from it, into this session's
    /// own buffers (nothing is allocated). The tokens after it are forgotten.
    pub fn rewind_to(&mut self, earlier: &Session) -> Result<()> {
        self.spec.active = false;
        if earlier.pos > self.pos || earlier.layers.len() != self.layers.len() {
            bail!("rewind_to: not an earlier state of this sequence");
        }
        for (st, from) in self.layers.iter_mut().zip(&earlier.layers) {
            match (st, from) {
                (LayerState::Attention(kv), LayerState::Attention(_)) => kv.truncate(earlier.pos),
                (LayerState::DeltaNet(d), LayerState::DeltaNet(e)) => {
                    d.conv.copy_from_slice(&e.conv);
                    d.s.copy_from_slice(&e.s);
                }
                _ => bail!("rewind_to: layer kinds differ"),
            }
        }
        match (&mut self.mtp, &earlier.mtp) {
            (Some(m), Some(e)) => m.rewind_to(e),
            (None, None) => {}
            _ => bail!("rewind_to: one of the sessions drafts and the other does not"),
        }
        self.pos = earlier.pos;
        Ok(())
    }

    /// Ends a speculative step in flight: the drafts not consumed are rolled back, so that the session
    /// holds exactly the tokens fed (before a snapshot, or when generation stops). A no-op otherwise.
    pub fn settle(&mut self) -> Result<()> {
        self.settle_with(None)
    }

    fn settle_with(&mut self, drafter: Option<&mut Drafter>) -> Result<()> {
        if !self.spec.active {
            return Ok(());
        }
        self.spec.active = false;
        let hp = &self.model.hp;
        let la = &mut self.spec;
        let (base, a, k) = (la.base, la.next, la.tokens.len() - 1);
        if let Some(dr) = drafter {
            dr.record_spec(a, la.secs);
        }
        // Keep [x_n, d_1..d_a]: positions base..=base+a.
        if a < k {
            for (il, st) in self.layers.iter_mut().enumerate() {
                match st {
                    LayerState::Attention(kv) => kv.truncate(base + a + 1),
                    LayerState::DeltaNet(ds) => la.ckpt[il].restore(ds, a),
                }
            }
        }
        self.pos = base + a + 1;
        if let Some(m) = &mut self.mtp {
            // The draft rows after x_n's (teacher-forced) one go; the accepted tokens' rows are made
            // from the trunk's hidden states.
            m.truncate(base + 1);
            let d = hp.n_embd;
            m.push(base, &la.tokens[..=a], &la.hidden[..(a + 1) * d], d);
        }
        Ok(())
    }

    /// Drafts up to `k` tokens after `first` (the token about to be fed at position `pos`): the MTP row
    /// (`first`, h_{pos−1}) at position `pos`, then rows fed their own drafts and outputs, stopping
    /// early when the top draft probability is below `p_min`. Drafts come from the first `vocab` rows
    /// of the LM head. Leaves the draft rows in the MTP cache (the step's settle cuts them).
    pub fn draft(&mut self, first: u32, k: usize, p_min: f32, vocab: usize) -> Result<Vec<u32>> {
        let model = self.model;
        if self.has_image {
            bail!("no drafting in a sequence with images");
        }
        let Some(m) = &mut self.mtp else {
            bail!("drafting is not enabled on this session");
        };
        debug_assert_eq!(
            m.rows(),
            self.pos,
            "MTP rows and trunk positions out of step"
        );
        let mut drafts = Vec::with_capacity(k);
        let mut h = m.first_row(model, first)?.to_vec();
        for i in 0..k {
            let (d, p) = m.top(model, &h, vocab, p_min > 0.0)?;
            if p < p_min {
                break;
            }
            drafts.push(d);
            if i + 1 < k {
                let y = m.forward(model, &[d], &h)?.to_vec();
                h = y;
            }
        }
        Ok(drafts)
    }

    /// Back to an empty sequence, keeping what was allocated (KV cache pages, activation buffers), as
    /// llama.cpp's `llama_memory_clear` does: the next prompt runs without allocating or faulting in
    /// fresh pages.
    pub fn clear(&mut self) {
        self.spec.active = false;
        if let Some(m) = &mut self.mtp {
            m.clear();
        }
        self.pos = 0;
        self.rope_delta = 0;
        self.has_image = false;
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

    /// Tokens processed so far (a speculative step's drafts count once consumed).
    pub fn pos(&self) -> usize {
        match self.spec.active {
            true => self.spec.base + self.spec.next + 1,
            false => self.pos,
        }
    }

    /// The RoPE position of the next text token: [`Session::pos`] for text, less after an image
    /// (M-RoPE, spec §3.6); generated tokens continue from here.
    pub fn rope_pos(&self) -> usize {
        (self.pos() as i64 + self.rope_delta) as usize
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
        let mtp = self.mtp.as_ref().map(|m| m.state());
        for l in self.layers.iter().chain(mtp) {
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

    /// Feeds tokens `range` of `prompt` (a sequence from its start, with images: the session must hold
    /// exactly its tokens before `range.start`) and returns logits for each: `[T × n_vocab]`. Image
    /// rows take the image's embeddings and M-RoPE positions; text after them continues at the
    /// image's position (spec §3.6).
    pub fn forward_prompt(&mut self, prompt: &Prompt, range: Range<usize>) -> Result<Vec<f32>> {
        let mut logits = Vec::with_capacity(range.len() * self.model.n_vocab());
        self.run_prompt(prompt, range, Logits::All, &mut logits)?;
        Ok(logits)
    }

    /// [`forward_prompt`](Self::forward_prompt) with only the last position's logits (`[n_vocab]`),
    /// kept in the session's buffer until the next call.
    pub fn forward_prompt_last(&mut self, prompt: &Prompt, range: Range<usize>) -> Result<&[f32]> {
        let mut logits = std::mem::take(&mut self.scratch.logits);
        let done = self.run_prompt(prompt, range, Logits::Last, &mut logits);
        self.scratch.logits = logits;
        done?;
        Ok(&self.scratch.logits[..self.model.n_vocab()])
    }

    /// [`forward_prompt`](Self::forward_prompt) without logits.
    pub fn feed_prompt(&mut self, prompt: &Prompt, range: Range<usize>) -> Result<()> {
        self.run_prompt(prompt, range, Logits::None, &mut Vec::new())
    }

    fn run_prompt(
        &mut self,
        prompt: &Prompt,
        range: Range<usize>,
        which: Logits,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        self.settle()?;
        ensure!(
            range.start <= range.end && range.end <= prompt.len(),
            "prompt range {range:?} is outside its {} tokens",
            prompt.len()
        );
        ensure!(
            range.start == self.pos,
            "the session holds {} tokens but the prompt range starts at token {}",
            self.pos,
            range.start
        );
        ensure!(
            self.rope_pos() == prompt.next_position(range.start),
            "the session's positions (next {}) are not those of the prompt's first {} tokens (next {})",
            self.rope_pos(),
            range.start,
            prompt.next_position(range.start)
        );
        let images = prompt.has_image_in(range.clone());
        if images {
            self.model.hp.check_mrope()?;
            let d = self.model.hp.n_embd;
            for (k, (_, im)) in prompt.images().iter().enumerate() {
                ensure!(
                    im.width() == d,
                    "image {k}: embeddings of width {}, the model's is {d}",
                    im.width()
                );
            }
        }
        let input = Input {
            tokens: &prompt.tokens()[range.clone()],
            prompt: images.then_some((prompt, range.start)),
        };
        self.run_pass(input, which, false, &mut |_, _, _| {}, out)
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
        self.settle()?;
        self.run_pass(Input::text(tokens), which, false, observe, out)
    }

    fn run_pass(
        &mut self,
        input: Input,
        which: Logits,
        verify: bool,
        observe: &mut dyn FnMut(usize, usize, &[f32]),
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let tokens = input.tokens;
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
        for i in 0..n_batches {
            let want = match which {
                Logits::Last if i + 1 < n_batches => Logits::None,
                other => other,
            };
            let pass = Pass {
                logits: want,
                verify,
                release: i + 1 == n_batches && tokens.len() > RELEASE_ROWS,
            };
            let batch = input.slice(i * UBATCH, UBATCH);
            self.ubatch(batch, pass, observe, out)?;
        }
        Ok(())
    }

    /// One pass of up to [`UBATCH`] tokens through all layers. Logits: all positions' are appended to
    /// `out` (`[T × V]`); the last position's overwrite its first `V` elements (growing it only once).
    fn ubatch(
        &mut self,
        input: Input,
        pass: Pass,
        observe: &mut dyn FnMut(usize, usize, &[f32]),
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let (hp, w) = (&self.model.hp, &self.model.w);
        let tokens = input.tokens;
        let (d, n_tok, pos0) = (hp.n_embd, tokens.len(), self.pos);
        let s = &mut self.scratch;
        if pass.verify {
            self.spec.ckpt.resize_with(hp.n_layer, Checkpoints::default);
        }

        // Residual stream [T × d]: token embeddings, image rows' from the image.
        let x = grow(&mut s.x, n_tok * d);
        for (r, (row, &t)) in x.chunks_exact_mut(d).zip(tokens).enumerate() {
            match input.embedding(r) {
                Some(e) => row.copy_from_slice(e),
                None => w.embed(t, row)?,
            }
        }
        if input.prompt.is_some() && !self.has_image {
            // The first image of the sequence: no drafting from here on, the MTP rows are not needed.
            self.has_image = true;
            if let Some(m) = &mut self.mtp {
                m.clear();
            }
        }
        let rope_pos = match input.prompt {
            Some((p, at)) => RopePos::Mrope(&p.positions()[at..at + n_tok]),
            None => RopePos::Text((pos0 as i64 + self.rope_delta) as usize),
        };
        let a = grow(&mut s.a, n_tok * d); // normed input [T × d]
        let m = grow(&mut s.m, n_tok * d); // block output [T × d]
        for (il, (lw, st)) in w.layers.iter().zip(&mut self.layers).enumerate() {
            let save = pass.verify.then(|| &mut self.spec.ckpt[il]);
            layer(
                lw,
                hp,
                il,
                st,
                self.delta_mode,
                pos0,
                rope_pos,
                x,
                a,
                m,
                &mut s.block,
                save,
            );
            observe(il, pos0, x);
        }
        self.pos += n_tok;
        self.evaluated += n_tok as u64;
        if let Some((p, at)) = input.prompt {
            self.rope_delta = p.next_position(at + n_tok) as i64 - self.pos as i64;
        }
        let mtp_rows = self.mtp.is_some() && !self.has_image; // [`Session::drafting`]

        // The final-normed hidden rows h_t [T × d] (in a's buffer): all of them when the MTP block or a
        // verification needs them, else only those that get logits.
        let all_rows = pass.verify || mtp_rows;
        let (h_rows, first) = match (pass.logits, all_rows) {
            (_, true) => (n_tok, 0),
            (Logits::All, false) => (n_tok, 0),
            (Logits::Last, false) => (1, n_tok - 1),
            (Logits::None, false) => {
                if pass.release {
                    self.release_scratch();
                }
                return Ok(());
            }
        };
        let hn = &mut a[..h_rows * d];
        norm_rows(
            &x[first * d..][..h_rows * d],
            &w.output_norm,
            hp.rms_eps,
            hn,
        );
        let owned;
        let hn: &[f32] = if pass.release {
            owned = hn.to_vec();
            self.release_scratch();
            &owned
        } else {
            hn
        };
        if pass.verify {
            grow(&mut self.spec.hidden, n_tok * d).copy_from_slice(hn);
        } else if let Some(mtp) = self.mtp.as_mut().filter(|_| mtp_rows) {
            mtp.push(pos0, tokens, hn, d);
        }
        match pass.logits {
            Logits::All => {
                let start = out.len();
                out.resize(start + n_tok * w.output.n_out, 0.0);
                matmul(&w.output, hn, n_tok, &mut out[start..]); // [T × d] → [T × V]
            }
            Logits::Last => {
                let last = &hn[hn.len() - d..];
                matmul(&w.output, last, 1, grow(out, w.output.n_out)); // [d] → [V]
            }
            Logits::None => {}
        }
        if let Some(mtp) = self.mtp.as_mut().filter(|_| mtp_rows) {
            if mtp.pending() >= mtp::FLUSH_ROWS {
                mtp.flush(self.model)?;
            }
        }
        Ok(())
    }
}

impl Session<'_> {
    /// Frees the ubatch scratch (activations, the layers' arena, this thread's quantized
    /// activations) after a long pass; the next call grows what it needs again.
    fn release_scratch(&mut self) {
        let logits = std::mem::take(&mut self.scratch.logits);
        self.scratch = Scratch {
            logits,
            ..Scratch::default()
        };
        crate::kernels::release_act_buffer();
    }
}

/// What a pass feeds: token ids and, for a prompt with images (or text after one), the prompt they are
/// tokens `at..` of, which gives image rows' embeddings and every row's M-RoPE position.
#[derive(Clone, Copy)]
struct Input<'a> {
    tokens: &'a [u32],
    prompt: Option<(&'a Prompt, usize)>,
}

impl<'a> Input<'a> {
    /// Text continuing the sequence (positions follow the session's).
    fn text(tokens: &'a [u32]) -> Input<'a> {
        Input {
            tokens,
            prompt: None,
        }
    }

    /// Up to `len` rows from row `start`.
    fn slice(self, start: usize, len: usize) -> Input<'a> {
        let end = (start + len).min(self.tokens.len());
        Input {
            tokens: &self.tokens[start..end],
            prompt: self.prompt.map(|(p, at)| (p, at + start)),
        }
    }

    /// The embedding that replaces row `r`'s token embedding (image rows).
    fn embedding(&self, r: usize) -> Option<&'a [f32]> {
        self.prompt.and_then(|(p, at)| p.embedding(at + r))
    }
}

/// One decoder layer over `T` rows of the residual stream `x` (`[T × d]`, updated in place) at KV
/// indices `pos0..pos0+T` and RoPE positions `rope_pos`; `a`, `m` are `[T × d]` buffers. With `save`, a
/// DeltaNet layer keeps its state after every token.
#[allow(clippy::too_many_arguments)]
fn layer(
    lw: &weights::LayerWeights,
    hp: &HParams,
    il: usize,
    st: &mut LayerState,
    delta_mode: DeltaMode,
    pos0: usize,
    rope_pos: RopePos,
    x: &mut [f32],
    a: &mut [f32],
    m: &mut [f32],
    block: &mut Vec<f32>,
    save: Option<&mut Checkpoints>,
) {
    let (d, n_tok) = (hp.n_embd, x.len() / hp.n_embd);
    norm_rows(x, &lw.attn_norm, hp.rms_eps, a);
    match (&lw.mixer, st) {
        (weights::Mixer::Attention(aw), LayerState::Attention(kv)) => {
            attention::forward(aw, hp, il, kv, pos0, rope_pos, a, m, block)
        }
        (weights::Mixer::DeltaNet(dw), LayerState::DeltaNet(ds)) => {
            deltanet::forward(dw, hp, ds, delta_mode, a, m, block, save)
        }
        _ => unreachable!("layer states are built from the same layer kinds"),
    }
    add(x, m, d);
    norm_rows(x, &lw.post_norm, hp.rms_eps, a);
    ffn::forward(lw, a, n_tok, m, block);
    add(x, m, d);
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
