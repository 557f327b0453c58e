use std::path::PathBuf;

use anyhow::{bail, Context};
use deltaq::gguf::GgufFile;
use deltaq::model::prompt::image_chat_prompt;
use deltaq::model::{KvType, Model, Prompt, Session};
use deltaq::tokenizer::Tokenizer;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model file
    #[arg(short = 'm', long)]
    model: PathBuf,
    /// Token ids, separated by spaces or commas
    #[arg(long, required_unless_present = "chat", conflicts_with = "chat")]
    tokens: Option<String>,
    /// A user message: evaluates the one-turn chat prompt
    /// `<|im_start|>user\n{images}TEXT<|im_end|>\n<|im_start|>assistant\n` (llama-mtmd-cli's), with the
    /// --image files first
    #[arg(long, value_name = "TEXT")]
    chat: Option<String>,
    /// Output .npy file: float32 logits [n_tokens, n_vocab]
    #[arg(short, long)]
    output: PathBuf,
    /// Also write the prompt's token ids (int32 [n_tokens], image rows as <|image_pad|>) as .npy
    #[arg(long = "ids-out", value_name = "FILE")]
    ids_out: Option<PathBuf>,
    /// Feed the tokens one at a time (recurrent path) instead of as one batch
    #[arg(long)]
    step: bool,
    /// Context size (default: the model's training context)
    #[arg(short = 'c', long = "ctx-size")]
    ctx_size: Option<usize>,
    /// Threads (default: all cores)
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// KV cache type for keys and values: f16 (as llama.cpp), f32 (exact), q8_0 or q4_0 (blocks of 32)
    #[arg(long = "kv-type", value_name = "TYPE", default_value = "f16", value_parser = super::parse_kv_type)]
    kv_type: KvType,
    #[command(flatten)]
    images: super::ImageArgs,
    #[command(flatten)]
    rope: super::RopeArgs,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.chat.is_none() && !a.images.image.is_empty() {
        bail!("--image goes with --chat (the prompt the image is put in)");
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads.unwrap_or(0))
        .build()?;
    let f = GgufFile::open(&a.model)?;
    let mut model = Model::load(&f).with_context(|| format!("loading {}", a.model.display()))?;
    a.rope.apply(&mut model)?;
    model.hp.check_kv_type(a.kv_type)?;
    if let Some(c) = a.ctx_size {
        model.hp.check_ctx(c)?;
    }
    let n_vocab = model.n_vocab();
    let mmproj = a.images.open_mmproj()?;
    let prompt = match (&a.tokens, &a.chat) {
        (Some(t), _) => {
            let tokens: Vec<u32> = t
                .split(|c: char| c.is_whitespace() || c == ',')
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().with_context(|| format!("bad token id '{s}'")))
                .collect::<anyhow::Result<_>>()?;
            Prompt::text(tokens)?
        }
        (None, Some(text)) => {
            let tok = Tokenizer::from_gguf(&f)
                .with_context(|| format!("tokenizer of {}", a.model.display()))?;
            let images = match &mmproj {
                Some(m) => {
                    let enc = a.images.encoder(m, model.hp.n_embd)?;
                    pool.install(|| super::encode_image_files(&enc, &a.images.image))?
                }
                None => Vec::new(),
            };
            image_chat_prompt(&tok, text, images)?
        }
        (None, None) => bail!("give --tokens or --chat"),
    };
    let tokens = prompt.tokens();
    if tokens.is_empty() {
        bail!("--tokens is empty");
    }

    let started = std::time::Instant::now();
    let logits = pool.install(|| -> anyhow::Result<Vec<f32>> {
        let mut s = Session::with_kv_type(&model, a.ctx_size, a.kv_type);
        if a.step {
            let mut all = Vec::with_capacity(tokens.len() * n_vocab);
            for i in 0..tokens.len() {
                all.extend(s.forward_prompt(&prompt, i..i + 1)?);
            }
            Ok(all)
        } else {
            s.forward_prompt(&prompt, 0..tokens.len())
        }
    })?;
    let secs = started.elapsed().as_secs_f64();

    for (p, (row, tok)) in logits.chunks_exact(n_vocab).zip(tokens).enumerate() {
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
    if let Some(p) = &a.ids_out {
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        deltaq::npy::write_i32(p, &[ids.len() as u64], &ids)
            .with_context(|| format!("writing {}", p.display()))?;
    }
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
