//! Perplexity and KL divergence, by llama-perplexity's method (`tools/perplexity/perplexity.cpp`).
//!
//! The text is tokenized as a whole (BOS only if the GGUF asks for it) and cut into non-overlapping
//! windows ("chunks") of `n_ctx` tokens; a trailing partial window is dropped. Every window is evaluated
//! from an empty state, and only its second half is scored: the logits at positions
//! `n_ctx/2 .. n_ctx-1` predicting the tokens after them (`n_ctx - 1 - n_ctx/2` tokens per window), so
//! that every scored token has at least half a window of context. PPL = exp(mean NLL); its ± is
//! `ppl · sd(NLL) / sqrt(count - 1)` as llama-perplexity prints it.
//!
//! Several models are evaluated chunk by chunk on the same tokens: for each chunk the base (reference)
//! model runs first and its log-probabilities of the scored positions are kept, then every other model's
//! logits of that chunk are compared with them (KL divergence, same top-1 token), so memory holds one
//! chunk's base log-probabilities whatever the length of the text.

mod plot;

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use rayon::prelude::*;

use crate::model::{KvType, Model, Session};
use crate::tokenizer::Tokenizer;

pub use plot::{label_size, place_labels, plot_svg, PlotPoint, Rect};

/// How the text is cut and evaluated.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Window (context) size in tokens.
    pub n_ctx: usize,
    /// Tokens per forward call within a window (`<= n_ctx`). Batches that hold no scored position are fed
    /// without computing logits, so `n_batch = n_ctx / 2` halves the logits memory.
    pub n_batch: usize,
    /// Evaluate at most this many windows (`None`: all).
    pub max_chunks: Option<usize>,
    /// Element type of the KV cache.
    pub kv_type: KvType,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            n_ctx: 512,
            n_batch: 512,
            max_chunks: None,
            kv_type: KvType::default(),
        }
    }
}

/// The windows a token sequence is cut into, and the KV cache they are evaluated with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    pub n_ctx: usize,
    pub n_batch: usize,
    /// Windows evaluated.
    pub n_chunk: usize,
    /// First scored logit position of a window (`n_ctx / 2`).
    pub first: usize,
    pub kv_type: KvType,
}

impl Plan {
    /// Checks the text is long enough (llama-perplexity needs at least two windows) and the options sane.
    pub fn new(n_tokens: usize, opts: &Options) -> Result<Plan> {
        if opts.n_ctx < 4 {
            bail!(
                "the context size must be at least 4 tokens (got {})",
                opts.n_ctx
            );
        }
        if opts.n_batch == 0 {
            bail!("the batch size must be at least 1");
        }
        if n_tokens < 2 * opts.n_ctx {
            bail!(
                "the text tokenizes to only {n_tokens} tokens: perplexity with a context of {} needs at \
                 least {} tokens (two windows); use a longer text or a smaller -c",
                opts.n_ctx,
                2 * opts.n_ctx
            );
        }
        let max = n_tokens / opts.n_ctx;
        let n_chunk = match opts.max_chunks {
            Some(0) => bail!("--chunks must be at least 1"),
            Some(n) => n.min(max),
            None => max,
        };
        Ok(Plan {
            n_ctx: opts.n_ctx,
            n_batch: opts.n_batch.min(opts.n_ctx),
            n_chunk,
            first: opts.n_ctx / 2,
            kv_type: opts.kv_type,
        })
    }

    /// Scored tokens per window.
    pub fn n_scored(&self) -> usize {
        self.n_ctx - 1 - self.first
    }

    /// Tokens evaluated per model (all windows).
    pub fn n_eval_tokens(&self) -> usize {
        self.n_chunk * self.n_ctx
    }
}

/// Reads an evaluation text: clear errors for an empty file and for bytes that are not UTF-8.
pub fn text_from_bytes(bytes: Vec<u8>, what: &str) -> Result<String> {
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        bail!("{what} is empty: perplexity needs a text to evaluate");
    }
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let line = e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count() + 1;
        anyhow::anyhow!(
            "{what} is not UTF-8 text: invalid byte 0x{:02x} at offset {at} (line {line}); convert it to UTF-8 first",
            e.as_bytes()[at]
        )
    })
}

/// Tokenizes the whole text like llama-perplexity: special-token text is not parsed, BOS/EOS are added
/// only if the GGUF asks for them.
pub fn tokenize(tok: &Tokenizer, text: &str) -> Result<Vec<u32>> {
    Ok(tok.encode_with(text, true, false)?)
}

/// Fails unless two models can be compared token for token (same vocabulary).
pub fn check_same_vocab(a: &Tokenizer, b: &Tokenizer, a_name: &str, b_name: &str) -> Result<()> {
    if a.n_vocab() != b.n_vocab() {
        bail!(
            "{a_name} and {b_name} have different vocabularies ({} vs {} tokens): they cannot be compared on \
             the same tokens",
            a.n_vocab(),
            b.n_vocab()
        );
    }
    if let Some(id) = (0..a.n_vocab() as u32).find(|&i| a.token_text(i) != b.token_text(i)) {
        bail!(
            "{a_name} and {b_name} have different vocabularies (token {id} is {:?} vs {:?}): they cannot be \
             compared on the same tokens",
            a.token_text(id).unwrap_or(""),
            b.token_text(id).unwrap_or("")
        );
    }
    Ok(())
}

/// `log p(tok)`, with llama-perplexity's arithmetic: f32 max, f64 sum of f32 `exp(l - max)`.
pub(crate) fn nll_of(row: &[f32], tok: usize) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&l| (l - max).exp() as f64).sum();
    -((row[tok] - max) as f64 - sum.ln())
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// Log-softmax of one row, in place (f64 normaliser).
fn log_softmax_in_place(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let lse = max as f64 + sum.ln();
    for v in row {
        *v = (*v as f64 - lse) as f32;
    }
}

/// Running negative log-likelihood sums of one model.
#[derive(Clone, Debug, Default)]
pub struct NllSums {
    pub sum: f64,
    pub sum2: f64,
    pub count: usize,
}

impl NllSums {
    fn add(&mut self, v: f64) {
        self.sum += v;
        self.sum2 += v * v;
        self.count += 1;
    }

    /// exp(mean NLL).
    pub fn ppl(&self) -> f64 {
        (self.sum / self.count.max(1) as f64).exp()
    }

    /// (mean, standard error of the mean) of the NLL.
    pub fn mean_and_err(&self) -> (f64, f64) {
        mean_and_err(self.sum, self.sum2, self.count)
    }

    /// llama-perplexity's "+/-": ppl · sqrt(var(NLL) / (count - 1)).
    pub fn ppl_err(&self) -> f64 {
        self.ppl() * self.mean_and_err().1
    }
}

fn mean_and_err(sum: f64, sum2: f64, count: usize) -> (f64, f64) {
    if count == 0 {
        return (0.0, 0.0);
    }
    let n = count as f64;
    let mean = sum / n;
    let var = sum2 / n - mean * mean;
    let err = if count > 1 && var > 0.0 {
        (var / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    (mean, err)
}

/// Statistics of one model against the base, per scored token.
#[derive(Clone, Debug, Default)]
struct Versus {
    kl: Vec<f32>,
    kl_sum: f64,
    kl_sum2: f64,
    same_top: usize,
    /// Σ nll·nll_base, for the uncertainty of the perplexity ratio.
    nll_nll_base: f64,
}

/// The result for one model.
#[derive(Clone, Debug)]
pub struct Scores {
    pub nll: NllSums,
    /// Perplexity after each chunk.
    pub running: Vec<f64>,
    /// Forward-pass seconds (the scoring is not included).
    pub eval_seconds: f64,
    pub eval_tokens: usize,
    /// Against the base model (`None` for the base itself).
    pub kl: Option<KlStats>,
}

impl Scores {
    pub fn ppl(&self) -> f64 {
        self.nll.ppl()
    }
    pub fn ppl_err(&self) -> f64 {
        self.nll.ppl_err()
    }
    pub fn tokens_per_second(&self) -> f64 {
        self.eval_tokens as f64 / self.eval_seconds.max(1e-9)
    }
}

/// KL divergence (nats) from the base model's next-token distribution, and top-1 agreement.
#[derive(Clone, Debug, PartialEq)]
pub struct KlStats {
    pub mean: f64,
    pub mean_err: f64,
    pub median: f64,
    pub p99: f64,
    pub max: f64,
    /// Share (0..1) of positions whose most likely token is the base's.
    pub same_top: f64,
    /// PPL / PPL(base) - 1, and its uncertainty (correlated, as llama-perplexity computes it).
    pub ppl_ratio_minus_1: f64,
    pub ppl_ratio_err: f64,
}

impl KlStats {
    /// The base compared with itself.
    pub fn identity() -> KlStats {
        KlStats {
            mean: 0.0,
            mean_err: 0.0,
            median: 0.0,
            p99: 0.0,
            max: 0.0,
            same_top: 1.0,
            ppl_ratio_minus_1: 0.0,
            ppl_ratio_err: 0.0,
        }
    }
}

/// llama-perplexity's percentile: linear interpolation in the sorted values.
fn percentile(sorted: &[f32], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    if fraction <= 0.0 {
        return sorted[0] as f64;
    }
    if fraction >= 1.0 {
        return sorted[sorted.len() - 1] as f64;
    }
    let p = fraction * (sorted.len() - 1) as f64;
    let ip = p as usize;
    let f = p - ip as f64;
    let hi = sorted[(ip + 1).min(sorted.len() - 1)] as f64;
    (1.0 - f) * sorted[ip] as f64 + f * hi
}

fn median(sorted: &[f32]) -> f64 {
    let n = sorted.len();
    match n {
        0 => 0.0,
        _ if n.is_multiple_of(2) => 0.5 * (sorted[n / 2] as f64 + sorted[n / 2 - 1] as f64),
        _ => sorted[n / 2] as f64,
    }
}

/// What the progress callback is told after each (chunk, model).
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub chunk: usize,
    pub n_chunk: usize,
    pub model: usize,
    /// Perplexity of this model over the chunks done so far.
    pub ppl: f64,
}

/// Runs one window through a model; returns the logits of the scored positions
/// (`plan.first .. n_ctx - 1`, `[n_scored × n_vocab]`) and the forward-pass seconds.
pub fn eval_window(model: &Model, window: &[u32], plan: &Plan) -> Result<(Vec<f32>, f64)> {
    debug_assert_eq!(window.len(), plan.n_ctx);
    let n_vocab = model.n_vocab();
    let last = plan.n_ctx - 1; // the last position's logits predict past the window: not needed
    let mut s = Session::with_kv_type(model, Some(plan.n_ctx), plan.kv_type);
    let mut out = Vec::with_capacity(plan.n_scored() * n_vocab);
    let t0 = Instant::now();
    let mut pos = 0;
    for batch in window.chunks(plan.n_batch) {
        let end = pos + batch.len();
        if end <= plan.first {
            s.feed(batch)?;
        } else {
            let logits = s.forward(batch)?;
            let from = plan.first.max(pos) - pos;
            let to = last.min(end) - pos;
            if to > from {
                out.extend_from_slice(&logits[from * n_vocab..to * n_vocab]);
            }
        }
        pos = end;
    }
    Ok((out, t0.elapsed().as_secs_f64()))
}

/// Writes the base model's log-probabilities in llama-perplexity's `--kl-divergence-base` format, so that
/// `llama-perplexity --kl-divergence` can compare other files against them.
pub struct LogitsWriter<W: Write> {
    out: W,
    n_vocab: usize,
}

impl<W: Write> LogitsWriter<W> {
    /// Header: `_logits_`, n_ctx, n_vocab, n_chunk (i32), then the tokens of all windows (i32).
    pub fn new(mut out: W, plan: &Plan, n_vocab: usize, tokens: &[u32]) -> Result<LogitsWriter<W>> {
        out.write_all(b"_logits_")?;
        for v in [plan.n_ctx, n_vocab, plan.n_chunk] {
            out.write_all(&(v as i32).to_le_bytes())?;
        }
        for &t in &tokens[..plan.n_eval_tokens()] {
            out.write_all(&(t as i32).to_le_bytes())?;
        }
        Ok(LogitsWriter { out, n_vocab })
    }

    /// One row per scored position: scale and minimum log-prob (f32), then the log-probs as u16 levels
    /// over the 16 nats below the maximum, padded to an even count.
    pub fn write_rows(&mut self, logits: &[f32]) -> Result<()> {
        let n_vocab = self.n_vocab;
        let nv = 2 * n_vocab.div_ceil(2) + 4;
        let mut buf = Vec::with_capacity(logits.len() / n_vocab * nv * 2);
        for row in logits.chunks_exact(n_vocab) {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let min = row
                .iter()
                .copied()
                .fold(f32::INFINITY, f32::min)
                .max(max - 16.0);
            let sum: f64 = row.iter().map(|&l| (l - max).exp() as f64).sum();
            let lse = sum.ln() as f32;
            let min_log_prob = min - max - lse;
            let scale = (max - min) / 65535.0;
            buf.extend_from_slice(&scale.to_le_bytes());
            buf.extend_from_slice(&min_log_prob.to_le_bytes());
            for &l in row {
                let q = if scale != 0.0 && l > min {
                    ((l - min) / scale).round_ties_even() as u16
                } else {
                    0
                };
                buf.extend_from_slice(&q.to_le_bytes());
            }
            buf.resize(buf.len() + (nv - 4 - n_vocab) * 2, 0);
        }
        self.out.write_all(&buf)?;
        Ok(())
    }

    pub fn finish(mut self) -> Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Receives the base model's scored logits of one window.
pub type SaveFn<'a> = dyn FnMut(&[f32]) -> Result<()> + Send + 'a;

/// Evaluates `models` on `tokens` window by window; `models[base]` is the reference for KL divergence
/// (when there are several). `save` receives the base model's scored logits of every window in order.
pub fn evaluate(
    models: &[&Model],
    base: usize,
    tokens: &[u32],
    plan: &Plan,
    progress: &mut (dyn FnMut(Progress) + Send),
    save: Option<&mut SaveFn<'_>>,
) -> Result<Vec<Scores>> {
    let kv_types = vec![plan.kv_type; models.len()];
    evaluate_kv(models, &kv_types, base, tokens, plan, progress, save)
}

/// [`evaluate`] with model `i` run with a KV cache of `kv_types[i]` (the same model several times
/// compares KV cache types).
pub fn evaluate_kv(
    models: &[&Model],
    kv_types: &[KvType],
    base: usize,
    tokens: &[u32],
    plan: &Plan,
    progress: &mut (dyn FnMut(Progress) + Send),
    mut save: Option<&mut SaveFn<'_>>,
) -> Result<Vec<Scores>> {
    if kv_types.len() != models.len() {
        bail!(
            "{} KV cache types for {} models",
            kv_types.len(),
            models.len()
        );
    }
    if models.is_empty() {
        bail!("no model to evaluate");
    }
    if base >= models.len() {
        bail!("base model index {base} out of range");
    }
    let n_vocab = models[base].n_vocab();
    for (i, m) in models.iter().enumerate() {
        if m.n_vocab() != n_vocab {
            bail!(
                "model {} has {} logits per token but the base model has {n_vocab}: different vocabularies",
                i + 1,
                m.n_vocab()
            );
        }
    }
    if let Some(t) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
        bail!("token id {t} is out of range (vocabulary has {n_vocab} entries)");
    }
    let n_scored = plan.n_scored();
    let compare = models.len() > 1;
    let mut sums = vec![NllSums::default(); models.len()];
    let mut running = vec![Vec::with_capacity(plan.n_chunk); models.len()];
    let mut seconds = vec![0.0; models.len()];
    let mut vs = vec![Versus::default(); models.len()];
    let mut base_nll = NllSums::default();
    // Order: the base first in every chunk, then the others.
    let order: Vec<usize> = std::iter::once(base)
        .chain((0..models.len()).filter(|&i| i != base))
        .collect();

    for c in 0..plan.n_chunk {
        let window = &tokens[c * plan.n_ctx..(c + 1) * plan.n_ctx];
        let targets = &window[plan.first + 1..];
        // The base's log-probs, argmax and NLL of this chunk.
        let mut base_lp: Vec<f32> = Vec::new();
        let mut base_top: Vec<usize> = Vec::new();
        let mut base_nlls: Vec<f64> = Vec::new();
        for &mi in &order {
            let run = Plan {
                kv_type: kv_types[mi],
                ..*plan
            };
            let (mut logits, secs) = eval_window(models[mi], window, &run)
                .with_context(|| format!("model {}, chunk {}", mi + 1, c + 1))?;
            seconds[mi] += secs;
            debug_assert_eq!(logits.len(), n_scored * n_vocab);
            let nlls: Vec<f64> = logits
                .par_chunks_exact(n_vocab)
                .zip(targets.par_iter())
                .map(|(row, &t)| nll_of(row, t as usize))
                .collect();
            for &v in &nlls {
                sums[mi].add(v);
            }
            running[mi].push(sums[mi].ppl());
            if mi == base {
                if let Some(save) = save.as_mut() {
                    save(&logits)?;
                }
                if compare {
                    base_top = logits.par_chunks_exact(n_vocab).map(argmax).collect();
                    logits
                        .par_chunks_exact_mut(n_vocab)
                        .for_each(log_softmax_in_place);
                    base_lp = logits;
                    for &v in &nlls {
                        base_nll.add(v);
                    }
                    base_nlls = nlls;
                }
            } else {
                let rows: Vec<(f64, bool)> = logits
                    .par_chunks_exact_mut(n_vocab)
                    .zip(base_lp.par_chunks_exact(n_vocab))
                    .zip(base_top.par_iter())
                    .map(|((row, lb), &tb)| {
                        let top = argmax(row);
                        log_softmax_in_place(row);
                        let kl: f64 = lb
                            .iter()
                            .zip(row.iter())
                            .map(|(&b, &q)| (b as f64).exp() * (b as f64 - q as f64))
                            .sum();
                        (kl.max(0.0), top == tb)
                    })
                    .collect();
                let v = &mut vs[mi];
                for ((kl, same), (&nll, &nb)) in rows.into_iter().zip(nlls.iter().zip(&base_nlls)) {
                    v.kl.push(kl as f32);
                    v.kl_sum += kl;
                    v.kl_sum2 += kl * kl;
                    v.same_top += same as usize;
                    v.nll_nll_base += nll * nb;
                }
            }
            progress(Progress {
                chunk: c + 1,
                n_chunk: plan.n_chunk,
                model: mi,
                ppl: sums[mi].ppl(),
            });
        }
    }

    let mut out = Vec::with_capacity(models.len());
    for (mi, ((nll, running), (secs, mut v))) in sums
        .into_iter()
        .zip(running)
        .zip(seconds.into_iter().zip(vs))
        .enumerate()
    {
        let kl = if !compare {
            None
        } else if mi == base {
            Some(KlStats::identity())
        } else {
            let n = v.kl.len();
            v.kl.sort_by(f32::total_cmp);
            let (mean, mean_err) = mean_and_err(v.kl_sum, v.kl_sum2, n);
            // ln(PPL/PPL_base) and its uncertainty with the covariance of the two NLL series.
            let (m_q, e_q) = nll.mean_and_err();
            let (m_b, e_b) = base_nll.mean_and_err();
            let nf = n as f64;
            let cov = (v.nll_nll_base / nf - m_q * m_b) / (nf - 1.0).max(1.0);
            let log_ratio = m_q - m_b;
            let log_ratio_err = (e_q * e_q + e_b * e_b - 2.0 * cov).max(0.0).sqrt();
            let ratio = log_ratio.exp();
            Some(KlStats {
                mean,
                mean_err,
                median: median(&v.kl),
                p99: percentile(&v.kl, 0.99),
                max: v.kl.last().copied().unwrap_or(0.0) as f64,
                same_top: v.same_top as f64 / n.max(1) as f64,
                ppl_ratio_minus_1: ratio - 1.0,
                ppl_ratio_err: ratio * log_ratio_err,
            })
        };
        out.push(Scores {
            nll,
            running,
            eval_seconds: secs,
            eval_tokens: plan.n_eval_tokens(),
            kl,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_checks_length() {
        let o = Options {
            n_ctx: 512,
            n_batch: 512,
            max_chunks: None,
            kv_type: KvType::F16,
        };
        let e = Plan::new(1000, &o).unwrap_err().to_string();
        assert!(e.contains("1024"), "{e}");
        let p = Plan::new(24154, &o).unwrap();
        assert_eq!((p.n_chunk, p.first, p.n_scored()), (47, 256, 255));
        let p = Plan::new(
            24154,
            &Options {
                max_chunks: Some(3),
                ..o
            },
        )
        .unwrap();
        assert_eq!(p.n_chunk, 3);
    }

    #[test]
    fn percentile_like_llama() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(median(&v), 2.5);
        assert!((percentile(&v, 0.5) - 2.5).abs() < 1e-12);
        assert_eq!(percentile(&v, 1.0), 4.0);
    }

    #[test]
    fn text_errors() {
        assert!(text_from_bytes(b"  \n".to_vec(), "x")
            .unwrap_err()
            .to_string()
            .contains("empty"));
        let e = text_from_bytes(b"ab\n\xffc".to_vec(), "x")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("UTF-8") && e.contains("offset 3") && e.contains("line 2"),
            "{e}"
        );
    }
}
