//! The decoding loop shared by the command line and (later) the server: prompt in, tokens out as text,
//! with timing, and a chat session that reuses the processed history between turns.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;

use crate::chat::{ChatMessage, ChatOptions, ChatTemplate};
use crate::constraint::Guide;
use crate::model::prompt::{prompt_with_media, MEDIA_MARKER};
use crate::model::{DraftStats, Drafter, ImageEmbd, KvType, Model, Prompt, Session};
use crate::sampling::Sampler;
use crate::tokenizer::Tokenizer;

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The model emitted an end-of-generation token.
    EndOfText,
    /// The token limit (`-n`) was reached.
    Length,
    /// The context is full.
    Context,
    /// The caller asked to stop (Ctrl-C).
    Interrupted,
}

/// Token counts and times of one generation.
#[derive(Clone, Copy, Debug)]
pub struct Stats {
    pub prompt_tokens: usize,
    pub prompt_secs: f64,
    pub gen_tokens: usize,
    pub gen_secs: f64,
    pub stop: Stop,
    /// Draft tokens proposed and accepted (all zero without drafting).
    pub draft: DraftStats,
}

impl Stats {
    pub fn prompt_tps(&self) -> f64 {
        self.prompt_tokens as f64 / self.prompt_secs.max(1e-9)
    }
    pub fn gen_tps(&self) -> f64 {
        self.gen_tokens as f64 / self.gen_secs.max(1e-9)
    }
}

/// Feeds `prompt` (the continuation of whatever `session` holds) and samples up to `max_new` tokens
/// (`None`: until end of text or a full context). `on_text` receives the decoded text as it becomes
/// valid UTF-8; `special` decides whether control tokens (e.g. `<think>`) are rendered. With a session
/// that has MTP enabled, `drafter` decides how many tokens each step drafts ([`Session::step`]); the
/// tokens are the same either way.
#[allow(clippy::too_many_arguments)]
pub fn generate(
    session: &mut Session<'_>,
    tok: &Tokenizer,
    sampler: &mut Sampler,
    drafter: &mut Drafter,
    prompt: &[u32],
    max_new: Option<usize>,
    special: bool,
    guide: Option<&mut Guide>,
    interrupt: &AtomicBool,
    on_text: &mut dyn FnMut(&str),
) -> Result<Stats> {
    generate_from(
        session,
        tok,
        sampler,
        drafter,
        Input::Tokens(prompt),
        max_new,
        special,
        guide,
        interrupt,
        on_text,
    )
}

/// [`generate`] from tokens `start..` of `prompt`, which may hold images (the session must hold exactly
/// its first `start` tokens). A session with an image does not draft.
#[allow(clippy::too_many_arguments)]
pub fn generate_prompt(
    session: &mut Session<'_>,
    tok: &Tokenizer,
    sampler: &mut Sampler,
    drafter: &mut Drafter,
    prompt: &Prompt,
    start: usize,
    max_new: Option<usize>,
    special: bool,
    guide: Option<&mut Guide>,
    interrupt: &AtomicBool,
    on_text: &mut dyn FnMut(&str),
) -> Result<Stats> {
    generate_from(
        session,
        tok,
        sampler,
        drafter,
        Input::Prompt(prompt, start),
        max_new,
        special,
        guide,
        interrupt,
        on_text,
    )
}

/// What a generation feeds first.
enum Input<'p> {
    Tokens(&'p [u32]),
    /// Tokens `start..` of a prompt with images.
    Prompt(&'p Prompt, usize),
}

#[allow(clippy::too_many_arguments)]
fn generate_from(
    session: &mut Session<'_>,
    tok: &Tokenizer,
    sampler: &mut Sampler,
    drafter: &mut Drafter,
    input: Input<'_>,
    max_new: Option<usize>,
    special: bool,
    mut guide: Option<&mut Guide>,
    interrupt: &AtomicBool,
    on_text: &mut dyn FnMut(&str),
) -> Result<Stats> {
    let t0 = Instant::now();
    let fed = match input {
        Input::Tokens(t) => t,
        Input::Prompt(p, start) => p.tokens().get(start..).unwrap_or_default(),
    };
    for &t in fed {
        sampler.accept(t);
    }
    let prompt_tokens = fed.len();
    let mut logits = match input {
        Input::Tokens(t) => session.forward_last_ref(t)?,
        Input::Prompt(p, start) => session.forward_prompt_last(p, start..p.len())?,
    };
    let prompt_secs = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    let mut decoder = tok.stream_decoder(special);
    let mut n = 0;
    // The constrained copy of the logits (the session's stay as they are).
    let mut masked: Vec<f32> = Vec::new();
    let stop = loop {
        if interrupt.load(Ordering::Relaxed) {
            break Stop::Interrupted;
        }
        if max_new.is_some_and(|m| n >= m) {
            break Stop::Length;
        }
        let id = match guide.as_deref_mut() {
            None => sampler.sample(logits),
            Some(g) if g.is_complete() => break Stop::EndOfText,
            Some(g) => {
                masked.clear();
                masked.extend_from_slice(logits);
                g.mask_logits(&mut masked)?;
                let id = sampler.sample(&masked);
                g.advance(id)?;
                id
            }
        };
        if tok.is_eog(id) {
            break Stop::EndOfText;
        }
        sampler.accept(id);
        n += 1;
        let text = decoder.push(tok, id);
        if !text.is_empty() {
            on_text(&text);
        }
        if session.pos() >= session.n_ctx() {
            break Stop::Context;
        }
        logits = session.step(id, drafter)?;
    };
    session.settle()?;
    let rest = decoder.flush();
    if !rest.is_empty() {
        on_text(&rest);
    }
    Ok(Stats {
        prompt_tokens,
        prompt_secs,
        gen_tokens: n,
        gen_secs: t1.elapsed().as_secs_f64(),
        stop,
        draft: drafter.stats,
    })
}

/// A multi-turn chat over one model. The history up to the end of the last user message is kept as a
/// session snapshot, so a new turn only processes what is new (the template re-renders earlier
/// assistant turns without their thinking, so the state after generation cannot be reused as is).
pub struct Chat<'m> {
    model: &'m Model<'m>,
    n_ctx: Option<usize>,
    template: ChatTemplate,
    pub messages: Vec<ChatMessage>,
    pub enable_thinking: Option<bool>,
    /// KV cache element type of the chat's sessions (set before the first turn).
    pub kv_type: KvType,
    /// Whether the chat's sessions fill the MTP block's cache for drafting (set before the first turn).
    pub mtp: bool,
    cached: Option<(Vec<u32>, Session<'m>)>,
    /// Every image of the conversation so far, in order (each user message's before its text).
    images: Vec<Arc<ImageEmbd>>,
    /// Prompt-path snapshot: the history's cache key and the session after it.
    cached_prompt: Option<(Vec<u64>, Session<'m>)>,
}

impl<'m> Chat<'m> {
    pub fn new(model: &'m Model<'m>, n_ctx: Option<usize>, template: ChatTemplate) -> Chat<'m> {
        Chat {
            model,
            n_ctx,
            template,
            messages: Vec::new(),
            enable_thinking: None,
            kv_type: KvType::default(),
            mtp: false,
            cached: None,
            images: Vec::new(),
            cached_prompt: None,
        }
    }

    /// Adds the user's message and returns a session positioned after the history plus the tokens of
    /// the generation prompt still to be fed.
    pub fn prepare(&mut self, tok: &Tokenizer, user: &str) -> Result<(Session<'m>, Vec<u32>)> {
        self.messages.push(ChatMessage::user(user));
        let (hist_text, full_text) = self.render()?;
        let (hist_text, gen_text) = match full_text.strip_prefix(hist_text.as_str()) {
            Some(gen) => (hist_text.clone(), gen.to_string()),
            None => (String::new(), full_text.clone()),
        };
        let hist = tok.encode(&hist_text, true)?;
        let gen = tok.encode(&gen_text, true)?;

        let session = match self.cached.take() {
            Some((toks, s)) if hist.starts_with(&toks) => {
                let mut s = s;
                if hist.len() > toks.len() {
                    s.feed(&hist[toks.len()..])?;
                }
                s
            }
            _ => {
                let mut s = Session::with_kv_type(self.model, self.n_ctx, self.kv_type);
                if self.mtp {
                    s.enable_mtp()?;
                }
                if !hist.is_empty() {
                    s.feed(&hist)?;
                }
                s
            }
        };
        self.cached = Some((hist, session.clone()));
        Ok((session, gen))
    }

    /// Whether the conversation holds images (then every turn goes through [`Chat::prepare_images`]).
    pub fn has_images(&self) -> bool {
        !self.images.is_empty()
    }

    /// [`Chat::prepare`] for a message with `images` (put before its text), or any message of a
    /// conversation that holds images: returns a session positioned after the history, the whole
    /// prompt and the index its generation prompt starts at. On error the message is not added.
    pub fn prepare_images(
        &mut self,
        tok: &Tokenizer,
        user: &str,
        images: Vec<Arc<ImageEmbd>>,
    ) -> Result<(Session<'m>, Prompt, usize)> {
        let content = MEDIA_MARKER.repeat(images.len()) + user;
        let n_before = self.images.len();
        self.messages.push(ChatMessage::user(&content));
        self.images.extend(images);
        let built = self.build_image_prompt(tok);
        if built.is_err() {
            self.messages.pop();
            self.images.truncate(n_before);
        }
        built
    }

    fn build_image_prompt(&mut self, tok: &Tokenizer) -> Result<(Session<'m>, Prompt, usize)> {
        let (hist_text, full_text) = self.render()?;
        let prompt = prompt_with_media(tok, &full_text, self.images.clone())?;
        let key = prompt.cache_key();
        // The history's end, if its tokens are a prefix of the whole prompt's.
        let hist_len = if full_text.starts_with(&hist_text) && !hist_text.is_empty() {
            let n = hist_text.matches(MEDIA_MARKER).count();
            let hist = prompt_with_media(tok, &hist_text, self.images[..n].to_vec())?;
            let hk = hist.cache_key();
            if key.starts_with(&hk) {
                hk.len()
            } else {
                0
            }
        } else {
            0
        };
        let session = match self.cached_prompt.take() {
            Some((k, s)) if key[..hist_len].starts_with(&k) => {
                let mut s = s;
                if hist_len > k.len() {
                    s.feed_prompt(&prompt, k.len()..hist_len)?;
                }
                s
            }
            _ => {
                let mut s = Session::with_kv_type(self.model, self.n_ctx, self.kv_type);
                if hist_len > 0 {
                    s.feed_prompt(&prompt, 0..hist_len)?;
                }
                s
            }
        };
        // (No MTP: a sequence with an image does not draft.)
        self.cached_prompt = Some((key[..hist_len].to_vec(), session.clone()));
        Ok((session, prompt, hist_len))
    }

    /// The conversation rendered without and with the generation prompt: the history a snapshot
    /// keeps, and the whole prompt of the turn.
    fn render(&self) -> Result<(String, String)> {
        let history = ChatOptions {
            add_generation_prompt: false,
            enable_thinking: self.enable_thinking,
            extra: Vec::new(),
        };
        let full = ChatOptions {
            add_generation_prompt: true,
            ..history.clone()
        };
        Ok((
            self.template.render(&self.messages, &history)?,
            self.template.render(&self.messages, &full)?,
        ))
    }

    /// Records the assistant's reply (thinking and answer separated) in the history.
    pub fn add_reply(&mut self, answer: &str, thinking: &str) {
        let mut m = ChatMessage::assistant(answer);
        if !thinking.trim().is_empty() {
            m = m.with_reasoning(thinking);
        }
        self.messages.push(m);
    }
}
