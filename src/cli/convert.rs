use std::path::PathBuf;

use deltaq::convert::{convert, convert_mmproj, is_converter_type, ConvertOptions};
use deltaq::quantize::FileType;

#[derive(clap::Args)]
pub struct Args {
    /// Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer.json, ...); never modified
    hf_dir: PathBuf,
    /// Output GGUF file
    #[arg(short, long)]
    output: PathBuf,
    /// Tensor types: f32, f16, bf16, q8_0 as convert_hf_to_gguf.py writes them; any other llama-quantize
    /// type (q4_k_m, q6_k, q4_0, ...) as llama-quantize would make it from the F32 conversion
    #[arg(long, default_value = "f16", value_parser = parse_ftype)]
    outtype: FileType,
    /// Leave out the MTP (multi-token prediction) block
    #[arg(long)]
    no_mtp: bool,
    /// Write the vision tower as an mmproj GGUF (llama.cpp's `--mmproj`) instead of the text model;
    /// outtype f32, f16, bf16 or q8_0
    #[arg(long)]
    mmproj: bool,
    /// general.name (default: from config.json's _name_or_path or the folder name)
    #[arg(long)]
    model_name: Option<String>,
    /// Overwrite an existing output file
    #[arg(long)]
    force: bool,
}

fn parse_ftype(s: &str) -> Result<FileType, String> {
    FileType::from_name(s).ok_or_else(|| {
        let names: Vec<String> = FileType::ALL
            .iter()
            .map(|f| f.name().to_lowercase())
            .collect();
        format!("unknown type '{s}' (one of: {})", names.join(", "))
    })
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let opts = ConvertOptions {
        outtype: a.outtype,
        no_mtp: a.no_mtp,
        model_name: a.model_name,
        overwrite: a.force,
        progress: true,
    };
    let s = if a.mmproj {
        convert_mmproj(&a.hf_dir, &a.output, &opts)?
    } else {
        convert(&a.hf_dir, &a.output, &opts)?
    };
    let w = &s.write;
    eprintln!(
        "wrote {} ({}{}, {} tensors): {:.2} MiB, {:.3} bits per weight, {:.1} s, {:.2} GB/s read, {:.2} GB/s written",
        a.output.display(),
        a.outtype,
        if is_converter_type(a.outtype) { "" } else { " recipe" },
        s.n_tensors,
        w.file_bytes as f64 / (1 << 20) as f64,
        w.bits_per_weight(),
        w.seconds,
        s.input_bytes as f64 / 1e9 / w.seconds.max(1e-9),
        w.file_bytes as f64 / 1e9 / w.seconds.max(1e-9),
    );
    Ok(())
}
