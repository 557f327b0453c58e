//! Importance matrices, computed as llama.cpp's `llama-imatrix` computes them
//! (`tools/imatrix/imatrix.cpp`) and written in its GGUF (or legacy `.dat`) format.
//!
//! ```text
//! tokens = tokenize(text)                      BOS only if the GGUF asks for it, special text not parsed
//! chunk c = tokens[c·n_ctx .. (c+1)·n_ctx]     first token replaced by BOS if the GGUF adds one
//! for every chunk, from an empty sequence:
//!     for every weight W of blk.* (and output.weight with --process-output), for every input row x:
//!         in_sum2[W][j] += x[j]²,  counts[W] += 1
//! ```
//!
//! The rows are the exact inputs of each weight's product, seen through the matmul observer
//! ([`crate::kernels::observe_matmuls`]); the sums are f32 like llama-imatrix's. llama.cpp leaves out
//! products of fewer than 16 rows, which depends on how it batches chunks ([`collect::Schedule`]).
//! Like llama-imatrix, the perplexity of each chunk's second half is measured on the way.

pub mod collect;
pub mod writer;

use std::cell::RefCell;
use std::rc::Rc;

use anyhow::{bail, ensure, Context, Result};

use crate::kernels::observe_matmuls;
use crate::model::{KvType, Model, Session};
use crate::perplexity::{nll_of, NllSums};
use collect::{Collector, Schedule};

pub use writer::{dat_bytes, write_dat, write_gguf};

/// One weight's entry: `in_sum2` is `[n_mat × n_in]`, `counts` `[n_mat]` (one matrix for dense weights).
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub name: String,
    pub in_sum2: Vec<f32>,
    pub counts: Vec<u64>,
}

/// An importance matrix as llama-imatrix saves it.
#[derive(Clone, Debug, PartialEq)]
pub struct Imatrix {
    /// The calibration files, as named on the command line.
    pub datasets: Vec<String>,
    /// Chunks the sums cover (`max count / chunk_size`).
    pub chunk_count: u32,
    /// Tokens per chunk (`-c`).
    pub chunk_size: u32,
    /// In name order (byte order, as `std::sort` on `std::string`).
    pub entries: Vec<Entry>,
}

/// llama-imatrix's options that change what is computed.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Chunk (context) size, `-c` (512).
    pub n_ctx: usize,
    /// At most this many chunks, `--chunks` (`None`: all).
    pub max_chunks: Option<usize>,
    /// Also collect `output.weight`, `--process-output`.
    pub process_output: bool,
    /// Measure the perplexity on the way (llama-imatrix does unless `--no-ppl`).
    pub compute_ppl: bool,
    /// The KV cache's type (llama-imatrix's `-ctk`/`-ctv`; f16 by default).
    pub kv_type: KvType,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            n_ctx: 512,
            max_chunks: None,
            process_output: false,
            compute_ppl: true,
            kv_type: KvType::default(),
        }
    }
}

/// Told after each chunk.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Chunks done (1-based index of the last one).
    pub chunk: usize,
    pub n_chunk: usize,
    /// Perplexity over the chunks done so far (with `compute_ppl`).
    pub ppl: Option<f64>,
}

/// The chunks llama-imatrix evaluates: checks the text is long enough (two chunks at least).
pub fn n_chunks(n_tokens: usize, opts: &Options) -> Result<usize> {
    ensure!(
        opts.n_ctx >= 4,
        "the chunk size (-c) must be at least 4 tokens, not {}",
        opts.n_ctx
    );
    if n_tokens < 2 * opts.n_ctx {
        bail!(
            "the text tokenizes to only {n_tokens} tokens: a chunk size of {} needs at least {} tokens; \
             use a longer text or a smaller -c",
            opts.n_ctx,
            2 * opts.n_ctx
        );
    }
    let max = n_tokens / opts.n_ctx;
    match opts.max_chunks {
        Some(0) => bail!("--chunks must be at least 1"),
        Some(n) => Ok(n.min(max)),
        None => Ok(max),
    }
}

/// Tokens fed per forward call: the logits of a call (`[T × n_vocab]` f32) stay under about 64 MiB.
fn piece_len(n_vocab: usize) -> usize {
    ((16 << 20) / n_vocab.max(1)).clamp(16, crate::model::UBATCH)
}

/// Computes the importance matrix of `model` over `tokens` (the whole tokenized text; `bos`: the
/// token that replaces each chunk's first when the GGUF adds BOS). Every chunk runs on this thread's
/// session (the products on the rayon pool it is called in). Returns the matrix and the perplexity
/// sums (empty without `compute_ppl`).
pub fn compute(
    model: &Model,
    tokens: &[u32],
    bos: Option<u32>,
    opts: &Options,
    dataset: &str,
    progress: &mut dyn FnMut(Progress),
) -> Result<(Imatrix, NllSums)> {
    let n_chunk = n_chunks(tokens.len(), opts)?;
    let n_ctx = opts.n_ctx;
    let n_vocab = model.n_vocab();
    if let Some(t) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
        bail!("token id {t} is out of range (vocabulary has {n_vocab} entries)");
    }
    let schedule = Schedule::new(n_ctx);
    let collector = Rc::new(RefCell::new(Collector::new(opts.process_output)));
    let seen = Rc::clone(&collector);
    let guard = observe_matmuls(Box::new(move |w, x, n| {
        seen.borrow_mut().observe(w.name, x, n)
    }));

    let first = n_ctx / 2; // llama-imatrix scores logits first..n_ctx-1, predicting first+1..n_ctx
    let piece = piece_len(n_vocab);
    let mut nll = NllSums::default();
    let mut chunk = Vec::with_capacity(n_ctx);
    for c in 0..n_chunk {
        // Chunk c is a sequence of llama-imatrix's batch of chunks group..group+n_seqs.
        let group = c - c % schedule.n_seq;
        let n_seqs = schedule.n_seq.min(n_chunk - group);
        collector.borrow_mut().begin_chunk(schedule.mask(n_seqs));
        chunk.clear();
        chunk.extend_from_slice(&tokens[c * n_ctx..(c + 1) * n_ctx]);
        if let Some(b) = bos {
            chunk[0] = b;
        }
        let mut s = Session::with_kv_type(model, Some(n_ctx), opts.kv_type);
        let mut pos = 0;
        for batch in chunk.chunks(piece) {
            let end = pos + batch.len();
            let scored = opts.compute_ppl && end > first && pos < n_ctx - 1;
            if !(opts.process_output || scored) {
                s.feed(batch).with_context(|| format!("chunk {}", c + 1))?;
            } else {
                let logits = s
                    .forward(batch)
                    .with_context(|| format!("chunk {}", c + 1))?;
                if opts.compute_ppl {
                    for p in first.max(pos)..(n_ctx - 1).min(end) {
                        let row = &logits[(p - pos) * n_vocab..][..n_vocab];
                        let v = nll_of(row, tokens[c * n_ctx + p + 1] as usize);
                        nll.sum += v;
                        nll.sum2 += v * v;
                        nll.count += 1;
                    }
                }
            }
            pos = end;
        }
        collector.borrow().check_finite()?;
        progress(Progress {
            chunk: c + 1,
            n_chunk,
            ppl: opts.compute_ppl.then(|| nll.ppl()),
        });
    }
    drop(guard);

    let stats = Rc::try_unwrap(collector)
        .map_err(|_| anyhow::anyhow!("the matmul observer outlived the computation"))?
        .into_inner()
        .into_stats();
    let max_count = stats.values().map(|s| s.count).max().unwrap_or(0);
    let entries = stats
        .into_iter()
        .map(|(name, s)| Entry {
            name,
            in_sum2: s.sum2,
            counts: vec![s.count],
        })
        .collect();
    let m = Imatrix {
        datasets: vec![dataset.to_string()],
        chunk_count: (max_count / n_ctx as u64) as u32,
        chunk_size: n_ctx as u32,
        entries,
    };
    Ok((m, nll))
}
