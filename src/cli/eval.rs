use std::path::PathBuf;

use anyhow::{bail, Context};
use deltaq::gguf::GgufFile;
use deltaq::model::{KvType, Model, Session};

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model file
    #[arg(short = 'm', long)]
    model: PathBuf,
    /// Token ids, separated by spaces or commas
    #[arg(long)]
    tokens: String,
    /// Output .npy file: float32 logits [n_tokens, n_vocab]
    #[arg(short, long)]
    output: PathBuf,
    /// Feed the tokens one at a time (recurrent path) instead of as one batch
    #[arg(long)]
    step: bool,
    /// Context size (default: the model's training context)
    #[arg(short = 'c', long = "ctx-size")]
    ctx_size: Option<usize>,
    /// Threads (default: all cores)
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// KV cache element type for keys and values: f16 (half the memory, as llama.cpp) or f32 (exact)
    #[arg(long = "kv-type", value_name = "TYPE", default_value = "f16", value_parser = super::parse_kv_type)]
    kv_type: KvType,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let tokens: Vec<u32> = a
        .tokens
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().with_context(|| format!("bad token id '{s}'")))
        .collect::<anyhow::Result<_>>()?;
    if tokens.is_empty() {
        bail!("--tokens is empty");
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads.unwrap_or(0))
        .build()?;
    let f = GgufFile::open(&a.model)?;
    let model = Model::load(&f).with_context(|| format!("loading {}", a.model.display()))?;
    let n_vocab = model.n_vocab();

    let started = std::time::Instant::now();
    let logits = pool.install(|| -> anyhow::Result<Vec<f32>> {
        let mut s = Session::with_kv_type(&model, a.ctx_size, a.kv_type);
        if a.step {
            let mut all = Vec::with_capacity(tokens.len() * n_vocab);
            for &t in &tokens {
                all.extend(s.forward(&[t])?);
            }
            Ok(all)
        } else {
            s.forward(&tokens)
        }
    })?;
    let secs = started.elapsed().as_secs_f64();

    for (p, (row, tok)) in logits.chunks_exact(n_vocab).zip(&tokens).enumerate() {
        let mut idx: Vec<usize> = (0..n_vocab).collect();
        idx.sort_by(|&i, &j| row[j].total_cmp(&row[i]));
        let top: Vec<String> = idx
            .iter()
            .take(5)
            .map(|&i| format!("{i} {:.5}", row[i]))
            .collect();
        println!("{p:4} [{tok:6}]  {}", top.join("  "));
    }
    deltaq::npy::write_f32(&a.output, &[tokens.len() as u64, n_vocab as u64], &logits)
        .with_context(|| format!("writing {}", a.output.display()))?;
    eprintln!(
        "{} tokens in {:.3} s ({:.1} tok/s, {}), logits [{}, {n_vocab}] written to {}",
        tokens.len(),
        secs,
        tokens.len() as f64 / secs,
        if a.step { "one at a time" } else { "one batch" },
        tokens.len(),
        a.output.display()
    );
    Ok(())
}
