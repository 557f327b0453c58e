//! Generation on dedicated OS threads (`--parallel` of them), fed by a bounded queue. The HTTP side
//! never runs a forward pass: it submits a [`Job`] and reads [`Event`]s from a channel. A job whose
//! channel is closed (the client went away) stops at the next token.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::cache::{CacheStats, PromptCache};
use super::text::StopMatcher;
use crate::constraint::{Compiler, ConstraintError, Guide, OutputConstraint};
use crate::model::{DraftStats, Drafter, KvType, Model, Prompt, Session};
use crate::sampling::{Sampler, SamplingParams};
use crate::tokenizer::{TokenType, Tokenizer};

/// Prompt tokens fed per call while checking for cancellation.
const FEED_CHUNK: usize = 256;

/// One generation request.
pub struct Job {
    /// The prompt, with its images; cached prefixes are matched on [`Prompt::cache_key`], so an image
    /// part matches only the same image.
    pub prompt: Prompt,
    /// Prompt lengths (besides the whole prompt) after which a snapshot is stored, e.g. the end of
    /// the chat history before the generation prompt.
    pub checkpoints: Vec<usize>,
    pub params: SamplingParams,
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    /// Render control tokens (e.g. `<think>`) in the text.
    pub special: bool,
    /// Report log-probabilities, with this many alternatives per token.
    pub logprobs: Option<usize>,
    pub ignore_eos: bool,
    /// The language the answer must follow.
    pub constraint: Option<OutputConstraint>,
    /// Also snapshot the state after the generated tokens (raw completions, which a client may
    /// continue with prompt + completion).
    pub cache_output: bool,
    pub tx: UnboundedSender<Event>,
}

/// Log-probability of one generated token and its most likely alternatives.
#[derive(Clone, Debug)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// End of text or a stop string.
    Stop,
    /// `max_tokens` or the context size.
    Length,
    /// The client left or the server is shutting down.
    Cancelled,
}

#[derive(Clone, Copy, Debug)]
pub struct Done {
    pub finish: Finish,
    pub prompt_tokens: usize,
    /// Prompt tokens that came from a cached snapshot (not processed).
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub prompt_ms: f64,
    pub gen_ms: f64,
    /// Tokens drafted and accepted (`None`: the server does not draft).
    pub draft: Option<DraftStats>,
}

pub enum Event {
    Text {
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    Done(Done),
    Error(String),
}

/// Counters for `/health`.
#[derive(Default)]
pub struct Counters {
    pub busy: AtomicUsize,
    pub waiting: AtomicUsize,
    pub completed: AtomicU64,
    pub cancelled: AtomicU64,
    pub rejected: AtomicU64,
    pub failed: AtomicU64,
    pub prompt_tokens_processed: AtomicU64,
    pub prompt_tokens_cached: AtomicU64,
    pub generated_tokens: AtomicU64,
}

pub struct Engine {
    pub model: &'static Model<'static>,
    pub tok: &'static Tokenizer,
    pub n_ctx: usize,
    /// KV cache element type of every session.
    pub kv_type: KvType,
    pub parallel: usize,
    pub queue_capacity: usize,
    pub counters: Counters,
    cache: Mutex<PromptCache>,
    tx: SyncSender<Job>,
    /// Set on shutdown: running jobs stop.
    pub stopping: AtomicBool,
    banned: Vec<u32>,
    /// Drafting with the model's MTP block: each request starts from a copy of this.
    drafter: Option<Drafter>,
    /// The vocabulary's token trie for constrained output, built by the first request that has a
    /// constraint (it takes a moment on a large vocabulary; servers that never need it skip it).
    compiler: OnceLock<Result<Compiler, String>>,
}

/// The queue is full.
#[derive(Debug)]
pub struct Busy;

impl Engine {
    /// Starts `parallel` worker threads with a queue of `queue` waiting jobs beyond them.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        model: &'static Model<'static>,
        tok: &'static Tokenizer,
        n_ctx: usize,
        kv_type: KvType,
        parallel: usize,
        queue: usize,
        cache_bytes: usize,
        drafter: Option<Drafter>,
    ) -> Arc<Engine> {
        let (tx, rx) = sync_channel::<Job>(queue);
        let banned = (0..tok.n_vocab() as u32)
            .filter(|&id| tok.token_type(id) == Some(TokenType::Unused))
            .collect();
        let engine = Arc::new(Engine {
            model,
            tok,
            n_ctx,
            kv_type,
            parallel: parallel.max(1),
            queue_capacity: queue,
            counters: Counters::default(),
            cache: Mutex::new(PromptCache::new(cache_bytes)),
            tx,
            stopping: AtomicBool::new(false),
            banned,
            drafter,
            compiler: OnceLock::new(),
        });
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..engine.parallel {
            let (engine, rx) = (engine.clone(), rx.clone());
            std::thread::Builder::new()
                .name(format!("deltaq-slot-{i}"))
                .spawn(move || worker(&engine, &rx))
                .expect("spawning a worker thread");
        }
        engine
    }

    /// Queues a job, or refuses it when `parallel` jobs run and `queue` wait already.
    pub fn submit(&self, job: Job) -> Result<(), Busy> {
        self.counters.waiting.fetch_add(1, Ordering::SeqCst);
        match self.tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.counters.waiting.fetch_sub(1, Ordering::SeqCst);
                self.counters.rejected.fetch_add(1, Ordering::Relaxed);
                Err(Busy)
            }
        }
    }

    /// Compiles a request's constraint: an invalid or unsupported one is the request's fault.
    pub fn compile_constraint(&self, c: &OutputConstraint) -> Result<Guide, ConstraintError> {
        self.compiler()
            .map_err(ConstraintError::Unavailable)?
            .compile(c)
    }

    fn compiler(&self) -> Result<&Compiler, String> {
        self.compiler
            .get_or_init(|| {
                Compiler::new(self.tok, self.model.n_vocab())
                    .map_err(|e| format!("cannot build the constraint vocabulary: {e:#}"))
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    pub fn cache_stats(&self) -> CacheStats {
        lock(&self.cache).stats()
    }

    fn run(&self, job: &Job) -> Result<Done, String> {
        let t0 = Instant::now();
        let prompt = &job.prompt;
        let mut guide = match &job.constraint {
            None => None,
            Some(c) => {
                let mut g = self.compile_constraint(c).map_err(|e| e.to_string())?;
                // A chat with thinking on: the model thinks freely, the answer is constrained.
                if self.compiler()?.starts_in_thinking(prompt.tokens()) {
                    g.wait_for_thinking();
                }
                Some(g)
            }
        };
        let key = prompt.cache_key();
        let cancelled = || job.tx.is_closed() || self.stopping.load(Ordering::Relaxed);
        let hit = lock(&self.cache).lookup(&key);
        let (mut session, mut pos, mut logits) = match hit {
            Some(h) => ((*h.session).clone(), h.len, h.logits.map(|l| (*l).clone())),
            None => {
                let mut s = Session::with_kv_type(self.model, Some(self.n_ctx), self.kv_type);
                if self.drafter.is_some() {
                    s.enable_mtp().map_err(|e| format!("{e:#}"))?;
                }
                (s, 0, None)
            }
        };
        let cached_tokens = pos;
        let mut checkpoints: Vec<usize> = job
            .checkpoints
            .iter()
            .copied()
            .filter(|&c| c > pos && c < prompt.len())
            .collect();
        checkpoints.sort_unstable();
        checkpoints.dedup();
        let mut cp = checkpoints.into_iter().peekable();
        while pos < prompt.len() {
            if cancelled() {
                return Ok(self.cancelled(job, cached_tokens, 0, t0));
            }
            let mut end = (pos + FEED_CHUNK).min(prompt.len());
            if let Some(&c) = cp.peek() {
                end = end.min(c);
            }
            if end == prompt.len() {
                logits = Some(
                    session
                        .forward_prompt_last(prompt, pos..end)
                        .map_err(|e| e.to_string())?
                        .to_vec(),
                );
            } else {
                session
                    .feed_prompt(prompt, pos..end)
                    .map_err(|e| e.to_string())?;
            }
            pos = end;
            if cp.peek() == Some(&pos) {
                cp.next();
                self.store(&key[..pos], &session, None);
            }
        }
        let Some(mut logits) = logits else {
            return Err("internal error: no logits after the prompt".into());
        };
        self.store(&key, &session, Some(&logits));
        self.counters
            .prompt_tokens_processed
            .fetch_add((prompt.len() - cached_tokens) as u64, Ordering::Relaxed);
        self.counters
            .prompt_tokens_cached
            .fetch_add(cached_tokens as u64, Ordering::Relaxed);
        let prompt_ms = t0.elapsed().as_secs_f64() * 1e3;

        let t1 = Instant::now();
        let mut sampler = Sampler::new(job.params.clone());
        sampler.set_banned(self.banned.clone());
        let mut drafter = self.drafter.clone().unwrap_or_else(Drafter::off);
        for &t in prompt.tokens() {
            sampler.accept(t);
        }
        let mut decoder = self.tok.stream_decoder(job.special);
        let mut stops = StopMatcher::new(job.stop.clone());
        let mut generated: Vec<u32> = Vec::new();
        let mut all_fed = true;
        let mut pending_lp: Vec<TokenLogprob> = Vec::new();
        let finish = loop {
            if cancelled() {
                break Finish::Cancelled;
            }
            if job.max_tokens.is_some_and(|m| generated.len() >= m) {
                break Finish::Length;
            }
            if let Some(g) = &mut guide {
                if g.is_complete() {
                    break Finish::Stop;
                }
                g.mask_logits(&mut logits).map_err(|e| e.to_string())?;
            }
            let id = sampler.sample(&logits);
            if let Some(g) = &mut guide {
                g.advance(id).map_err(|e| e.to_string())?;
            }
            if self.tok.is_eog(id) && !job.ignore_eos {
                break Finish::Stop;
            }
            if let Some(n) = job.logprobs {
                pending_lp.push(logprob_of(&logits, id, n));
            }
            sampler.accept(id);
            generated.push(id);
            let text = decoder.push(self.tok, id);
            let (out, stopped) = stops.push(&text);
            if !out.is_empty() || (!pending_lp.is_empty() && decoder.pending().is_empty()) {
                let ev = Event::Text {
                    text: out,
                    logprobs: std::mem::take(&mut pending_lp),
                };
                if job.tx.send(ev).is_err() {
                    break Finish::Cancelled;
                }
            }
            if stopped {
                all_fed = false;
                break Finish::Stop;
            }
            if session.pos() >= session.n_ctx() {
                all_fed = false;
                break Finish::Length;
            }
            logits.copy_from_slice(session.step(id, &mut drafter).map_err(|e| e.to_string())?);
        };
        // Drafts verified beyond the last token taken are rolled back before the session is kept.
        session.settle().map_err(|e| e.to_string())?;
        if finish != Finish::Cancelled {
            let (rest, _) = stops.push(&decoder.flush());
            let rest = rest + &stops.finish();
            if !rest.is_empty() || !pending_lp.is_empty() {
                let _ = job.tx.send(Event::Text {
                    text: rest,
                    logprobs: std::mem::take(&mut pending_lp),
                });
            }
            if job.cache_output && all_fed && !generated.is_empty() {
                let mut toks = key.clone();
                toks.extend(generated.iter().map(|&t| t as u64));
                self.store(&toks, &session, None);
            }
        }
        self.counters
            .generated_tokens
            .fetch_add(generated.len() as u64, Ordering::Relaxed);
        Ok(Done {
            finish,
            prompt_tokens: prompt.len(),
            cached_tokens,
            completion_tokens: generated.len(),
            prompt_ms,
            gen_ms: t1.elapsed().as_secs_f64() * 1e3,
            draft: self.drafter.as_ref().map(|_| drafter.stats),
        })
    }

    fn cancelled(&self, job: &Job, cached: usize, gen: usize, t0: Instant) -> Done {
        Done {
            finish: Finish::Cancelled,
            prompt_tokens: job.prompt.len(),
            cached_tokens: cached,
            completion_tokens: gen,
            prompt_ms: t0.elapsed().as_secs_f64() * 1e3,
            gen_ms: 0.0,
            draft: None,
        }
    }

    fn store(&self, tokens: &[u64], session: &Session<'static>, logits: Option<&Vec<f32>>) {
        if lock(&self.cache).touch(tokens, logits) {
            return;
        }
        // Clone outside the lock: a snapshot of a big model's long context takes a while to copy.
        let snap = Arc::new(session.clone());
        lock(&self.cache).insert(tokens, snap, logits);
    }
}

/// Locks a mutex, ignoring poisoning (a panicking job must not take the server down with it).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn worker(engine: &Engine, rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = {
            let rx = lock(rx);
            match rx.recv() {
                Ok(j) => j,
                Err(_) => return,
            }
        };
        engine.counters.waiting.fetch_sub(1, Ordering::SeqCst);
        engine.counters.busy.fetch_add(1, Ordering::SeqCst);
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| engine.run(&job)));
        let c = &engine.counters;
        let event = match result {
            Ok(Ok(done)) => {
                match done.finish {
                    Finish::Cancelled => c.cancelled.fetch_add(1, Ordering::Relaxed),
                    _ => c.completed.fetch_add(1, Ordering::Relaxed),
                };
                Event::Done(done)
            }
            Ok(Err(msg)) => {
                c.failed.fetch_add(1, Ordering::Relaxed);
                Event::Error(msg)
            }
            Err(_) => {
                c.failed.fetch_add(1, Ordering::Relaxed);
                Event::Error("internal error while generating".into())
            }
        };
        // The slot is free before the client hears the end: a client that asks /health right
        // after its last event must see its request counted and its slot released.
        c.busy.fetch_sub(1, Ordering::SeqCst);
        let _ = job.tx.send(event);
    }
}

/// Log-softmax of the raw logits at `id`, and the `n` most likely tokens.
fn logprob_of(logits: &[f32], id: u32, n: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let lse = max + sum.ln() as f32;
    let lp = |i: u32| {
        logits
            .get(i as usize)
            .map_or(f32::NEG_INFINITY, |&l| l - lse)
    };
    let mut top: Vec<(u32, f32)> = Vec::new();
    if n > 0 {
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let k = n.min(idx.len());
        if k > 0 && k < idx.len() {
            idx.select_nth_unstable_by(k - 1, |&a, &b| {
                logits[b as usize].total_cmp(&logits[a as usize])
            });
            idx.truncate(k);
        }
        idx.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        top = idx.into_iter().map(|i| (i, lp(i))).collect();
    }
    TokenLogprob {
        id,
        logprob: lp(id),
        top,
    }
}
