//! `deltaq imatrix`: llama-imatrix's importance matrix of a model over a calibration text, for
//! `llama-quantize --imatrix` (and `deltaq quantize`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use deltaq::gguf::GgufFile;
use deltaq::imatrix::{self, Options};
use deltaq::model::{KvType, Model};
use deltaq::perplexity as ppl;
use deltaq::tokenizer::Tokenizer;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    /// GGUF (general.type = imatrix), as llama-imatrix writes by default
    Gguf,
    /// llama-imatrix's legacy binary format
    Dat,
}

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model file
    #[arg(short = 'm', long = "model", value_name = "FILE")]
    model: PathBuf,
    /// Calibration text (UTF-8); its name, as given, is recorded as the dataset
    #[arg(short = 'f', long = "file", value_name = "TEXT")]
    text: PathBuf,
    /// Output file
    #[arg(
        short = 'o',
        long = "output-file",
        value_name = "FILE",
        default_value = "imatrix.gguf"
    )]
    output: PathBuf,
    /// Chunk size: the text is cut into chunks of this many tokens, each evaluated from an empty state
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    ctx_size: usize,
    /// Process only the first N chunks (default: all)
    #[arg(long, value_name = "N")]
    chunks: Option<usize>,
    /// Threads (default: all cores)
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// Also collect the output (LM head) tensor, output.weight (a tied head is never collected)
    #[arg(long = "process-output")]
    process_output: bool,
    /// Output format
    #[arg(long = "output-format", value_enum, default_value_t = Format::Gguf)]
    output_format: Format,
    /// KV cache type (llama-imatrix's -ctk/-ctv, one flag for both): f16, f32, q8_0, q4_0. Attention
    /// with f32 keeps llama-imatrix's own f16 rounding of queries and weights out of a comparison
    #[arg(long = "kv-type", value_name = "TYPE", default_value = "f16", value_parser = super::parse_kv_type)]
    kv_type: KvType,
    /// Do not compute the perplexity of the chunks on the way
    #[arg(long = "no-ppl")]
    no_ppl: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let bytes = std::fs::read(&a.text).with_context(|| format!("reading {}", a.text.display()))?;
    let text = ppl::text_from_bytes(bytes, &a.text.display().to_string())?;
    let f = GgufFile::open(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
    let tok = Tokenizer::from_gguf(&f)
        .with_context(|| format!("reading the tokenizer of {}", a.model.display()))?;
    let model = Model::load(&f).with_context(|| format!("loading {}", a.model.display()))?;
    model.hp.check_ctx(a.ctx_size)?;
    model.hp.check_kv_type(a.kv_type)?;
    if a.output_format == Format::Gguf && a.output.extension().is_none_or(|e| e != "gguf") {
        eprintln!(
            "warning: writing the GGUF format to {}, whose name does not end in .gguf (use \
             --output-format dat for the legacy format)",
            a.output.display()
        );
    }

    let t0 = Instant::now();
    let tokens = ppl::tokenize(&tok, &text)?;
    let bos = if tok.add_bos() { tok.bos() } else { None };
    let opts = Options {
        n_ctx: a.ctx_size,
        max_chunks: a.chunks,
        process_output: a.process_output,
        compute_ppl: !a.no_ppl,
        kv_type: a.kv_type,
    };
    let n_chunk = imatrix::n_chunks(tokens.len(), &opts)
        .with_context(|| format!("{} is too short", a.text.display()))?;
    eprintln!(
        "{}: {} tokens (tokenized in {:.1} ms), {n_chunk} chunks of {} tokens",
        a.text.display(),
        tokens.len(),
        t0.elapsed().as_secs_f64() * 1e3,
        a.ctx_size
    );

    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads.unwrap_or(0))
        .build()?;
    let bar = indicatif::ProgressBar::new(n_chunk as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {pos}/{len} chunks ETA {eta:>4} {wide_msg}",
        )
        .expect("valid template"),
    );
    // llama-imatrix's running perplexity, "[chunk]ppl," eight chunks to a line.
    let mut line = String::new();
    let mut progress = |p: imatrix::Progress| {
        bar.inc(1);
        let Some(v) = p.ppl else { return };
        let item = format!("[{}]{v:.4},", p.chunk);
        if bar.is_hidden() {
            eprint!("{item}");
        } else {
            line.push_str(&item);
            if p.chunk.is_multiple_of(8) || p.chunk == p.n_chunk {
                bar.println(std::mem::take(&mut line));
            }
        }
        bar.set_message(format!("ppl {v:.4}"));
    };
    let dataset = a.text.to_string_lossy().into_owned();
    let t1 = Instant::now();
    let (m, nll) =
        pool.install(|| imatrix::compute(&model, &tokens, bos, &opts, &dataset, &mut progress))?;
    let secs = t1.elapsed().as_secs_f64();
    bar.finish_and_clear();
    if bar.is_hidden() && !a.no_ppl {
        eprintln!();
    }
    if !a.no_ppl {
        eprintln!(
            "Final estimate: PPL = {:.4} +/- {:.5}",
            nll.ppl(),
            nll.ppl_err()
        );
    }
    match a.output_format {
        Format::Gguf => imatrix::write_gguf(&m, &a.output)?,
        Format::Dat => imatrix::write_dat(&m, &a.output)?,
    }
    eprintln!(
        "wrote {}: {} tensors, {} chunks of {} tokens, {:.1} s ({:.0} tokens/s)",
        a.output.display(),
        m.entries.len(),
        m.chunk_count,
        m.chunk_size,
        secs,
        (n_chunk * a.ctx_size) as f64 / secs.max(1e-9)
    );
    Ok(())
}
