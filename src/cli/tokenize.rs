use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use deltaq::gguf::GgufFile;
use deltaq::tokenizer::Tokenizer;

/// Tokenize text with a GGUF file's tokenizer (like llama-tokenize).
#[derive(clap::Args)]
pub struct Args {
    /// GGUF file (only its tokenizer metadata is read)
    #[arg(short = 'm', long = "model")]
    model: PathBuf,
    /// Text to tokenize
    #[arg(conflicts_with = "file", required_unless_present = "file")]
    text: Option<String>,
    /// Read the text from a file instead
    #[arg(short = 'f', long = "file")]
    file: Option<PathBuf>,
    /// Print only the ids, space-separated
    #[arg(long)]
    ids: bool,
    /// Turn special-token text (e.g. "<|im_start|>") into the special tokens
    #[arg(long)]
    special: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let text = match (&a.text, &a.file) {
        (Some(t), _) => t.clone(),
        (None, Some(p)) => {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
        }
        (None, None) => anyhow::bail!("give TEXT or -f FILE"),
    };
    let f = GgufFile::open(&a.model)?;
    let tok = Tokenizer::from_gguf(&f)?;
    let ids = tok.encode(&text, a.special)?;
    let mut out = String::new();
    if a.ids {
        let list: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        writeln!(out, "{}", list.join(" "))?;
    } else {
        for &id in &ids {
            let bytes = tok.token_to_piece(id, true);
            let piece = String::from_utf8_lossy(&bytes);
            writeln!(out, "{id:6} -> '{piece}'")?;
        }
    }
    std::io::stdout().lock().write_all(out.as_bytes())?;
    Ok(())
}
