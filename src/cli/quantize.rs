use std::path::PathBuf;

use deltaq::quantize::{quantize_file, FileType, QuantizeOptions};

#[derive(clap::Args)]
pub struct Args {
    /// Input GGUF file (never modified)
    input: PathBuf,
    /// Output GGUF file
    output: PathBuf,
    /// Target mixture, as llama-quantize names it: Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, Q4_0, Q4_1, Q5_0, Q5_1,
    /// Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M, Q6_K, Q8_0, F16, BF16, F32
    #[arg(value_parser = parse_ftype)]
    ftype: FileType,
    /// Give every quantizable tensor the base type (no per-tensor mixture)
    #[arg(long)]
    pure: bool,
    /// Leave tensors matching PATTERN (substring, or glob with *) unquantized; repeatable
    #[arg(long = "keep-f32", value_name = "PATTERN")]
    keep: Vec<String>,
    /// Overwrite an existing output file
    #[arg(long)]
    force: bool,
}

fn parse_ftype(s: &str) -> Result<FileType, String> {
    FileType::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = FileType::ALL.iter().map(|f| f.name()).collect();
        format!("unknown type '{s}' (one of: {})", names.join(", "))
    })
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let opts = QuantizeOptions {
        ftype: a.ftype,
        pure: a.pure,
        keep: a.keep,
        overwrite: a.force,
        progress: true,
    };
    let s = quantize_file(&a.input, &a.output, &opts)?;
    eprintln!(
        "wrote {} ({}): {:.2} MiB, {:.3} bits per weight, {:.1} s ({:.0} MB/s)",
        a.output.display(),
        a.ftype,
        s.file_bytes as f64 / (1 << 20) as f64,
        s.bits_per_weight(),
        s.seconds,
        s.file_bytes as f64 / 1e6 / s.seconds.max(1e-9)
    );
    Ok(())
}
