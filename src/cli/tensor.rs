use std::path::PathBuf;

use anyhow::Context;
use deltaq::gguf::GgufFile;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF file
    file: PathBuf,
    /// Tensor name, e.g. blk.0.attn_qkv.weight
    name: String,
    /// Output .npy file (float32, PyTorch shape order: ne reversed)
    #[arg(short, long)]
    output: PathBuf,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let f = GgufFile::open(&a.file)?;
    let (t, data) = f.tensor_by_name(&a.name)?;
    if !t.ty.can_dequantize() {
        anyhow::bail!(
            "tensor '{}' has type {}, which deltaq cannot dequantize",
            t.name,
            t.ty
        );
    }
    let mut out = vec![0f32; t.n_elements() as usize];
    deltaq::quant::dequantize_row(t.ty, data, &mut out)
        .with_context(|| format!("dequantizing '{}'", t.name))?;
    let shape = t.torch_shape();
    deltaq::npy::write_f32(&a.output, &shape, &out)
        .with_context(|| format!("writing {}", a.output.display()))?;
    eprintln!(
        "wrote {} {:?} ({}) to {}",
        t.name,
        shape,
        t.ty,
        a.output.display()
    );
    Ok(())
}
