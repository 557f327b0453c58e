use std::path::PathBuf;

use deltaq::quant::GgmlType;
use deltaq::quantize::{
    quantize_file, quantize_file_to_bpw, tensor_type_from_name, FileType, ImatrixOptions,
    QuantizeOptions, TensorTypeOverride,
};

#[derive(clap::Args)]
pub struct Args {
    /// Input GGUF file (never modified)
    input: PathBuf,
    /// Output GGUF file
    output: PathBuf,
    /// Target mixture, as llama-quantize names it: Q2_K, Q2_K_S, Q3_K_S, Q3_K_M, Q3_K_L, Q4_0, Q4_1, Q5_0,
    /// Q5_1, Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M, Q6_K, Q8_0, F16, BF16, F32, and (with --imatrix for most)
    /// IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ2_M, IQ3_XXS, IQ3_XS, IQ3_S, IQ3_M, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0.
    /// Not given with --target-bpw, which chooses the types itself
    #[arg(value_parser = parse_ftype, required_unless_present = "target_bpw")]
    ftype: Option<FileType>,
    /// Choose a type per tensor (IQ1_S … Q8_0) so that the file has at most N bits per weight and the
    /// least importance-weighted error (deltaq's own recipe, best with --imatrix). Bits per weight as the
    /// perplexity table counts them: all tensor data (norms included) × 8 / all weights
    #[arg(long, value_name = "N", conflicts_with_all = ["ftype", "pure"])]
    target_bpw: Option<f64>,
    /// Give every quantizable tensor the base type (no per-tensor mixture)
    #[arg(long)]
    pure: bool,
    /// Leave tensors matching PATTERN (substring, or glob with *) unquantized; repeatable
    #[arg(long = "keep-f32", value_name = "PATTERN")]
    keep: Vec<String>,
    /// Importance matrix (llama-imatrix's GGUF or legacy .dat file) to weight the quantization error by
    #[arg(long, value_name = "FILE")]
    imatrix: Option<PathBuf>,
    /// Use the importance matrix only for tensors whose name contains NAME; repeatable
    #[arg(
        long = "include-weights",
        value_name = "NAME",
        requires = "imatrix",
        conflicts_with = "exclude"
    )]
    include: Vec<String>,
    /// Do not use the importance matrix for tensors whose name contains NAME; repeatable
    #[arg(long = "exclude-weights", value_name = "NAME", requires = "imatrix")]
    exclude: Vec<String>,
    /// Type of token_embd.weight, whatever the mixture (a ggml type name: q4_K, Q8_0, ...)
    #[arg(long, value_name = "TYPE", value_parser = parse_ggml_type)]
    token_embedding_type: Option<GgmlType>,
    /// Type of output.weight, whatever the mixture
    #[arg(long, value_name = "TYPE", value_parser = parse_ggml_type)]
    output_tensor_type: Option<GgmlType>,
    /// Give tensors whose name matches the regular expression PATTERN (lower-cased) this ggml type
    /// instead of the mixture's choice, as llama-quantize's option; repeatable, the first match wins.
    /// E.g. --tensor-type 'blk\.24\.=q4_K' for a multi-token-prediction block that no imatrix covers
    #[arg(
        long = "tensor-type",
        value_name = "PATTERN=TYPE",
        conflicts_with = "target_bpw"
    )]
    tensor_type: Vec<String>,
    /// Read PATTERN=TYPE entries (separated by white space) from FILE, after the --tensor-type ones
    #[arg(long, value_name = "FILE", conflicts_with = "target_bpw")]
    tensor_type_file: Option<PathBuf>,
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

fn parse_ggml_type(s: &str) -> Result<GgmlType, String> {
    tensor_type_from_name(s).ok_or_else(|| format!("unknown tensor type '{s}'"))
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let mut tensor_types = a
        .tensor_type
        .iter()
        .map(|s| TensorTypeOverride::parse(s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if let Some(path) = &a.tensor_type_file {
        tensor_types.extend(TensorTypeOverride::parse_file(path)?);
    }
    let opts = QuantizeOptions {
        ftype: a.ftype.unwrap_or(FileType::F32),
        pure: a.pure,
        keep: a.keep,
        overwrite: a.force,
        progress: true,
        imatrix: a.imatrix.map(|path| ImatrixOptions {
            path,
            include: a.include,
            exclude: a.exclude,
        }),
        token_embedding_type: a.token_embedding_type,
        output_tensor_type: a.output_tensor_type,
        tensor_types,
    };
    let (s, what) = match a.target_bpw {
        Some(target) => {
            let r = quantize_file_to_bpw(&a.input, &a.output, target, &opts)?;
            let mut counts: Vec<(GgmlType, usize)> = Vec::new();
            for &(_, t) in &r.types {
                match counts.iter_mut().find(|(u, _)| *u == t) {
                    Some(c) => c.1 += 1,
                    None => counts.push((t, 1)),
                }
            }
            counts.sort_by_key(|c| std::cmp::Reverse(c.1));
            let mix: Vec<String> = counts.iter().map(|(t, n)| format!("{n} {t}")).collect();
            eprintln!("tensor types: {}", mix.join(", "));
            let what = format!("target {target} bpw, file type {}", r.file_type);
            (r.summary, what)
        }
        None => {
            let s = quantize_file(&a.input, &a.output, &opts)?;
            (s, opts.ftype.to_string())
        }
    };
    eprintln!(
        "wrote {} ({}): {:.2} MiB, {:.3} bits per weight, {:.1} s ({:.0} MB/s)",
        a.output.display(),
        what,
        s.file_bytes as f64 / (1 << 20) as f64,
        s.bits_per_weight(),
        s.seconds,
        s.file_bytes as f64 / 1e6 / s.seconds.max(1e-9)
    );
    Ok(())
}
