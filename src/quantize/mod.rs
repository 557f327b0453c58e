//! Quantizing a model: llama-quantize's recipes, and a streaming writer that turns tensor sources (a GGUF
//! file, or a Hugging Face checkpoint being converted) into a GGUF of the chosen types, a few rows at a
//! time, on all cores, with a progress bar.

mod recipe;

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context};
use rayon::prelude::*;

use crate::gguf::{GgufFile, GgufWriter, OwnedValue, TensorInfo, TensorSpec};
use crate::quant::{dequantize_row, quantize_row, GgmlType};

pub use recipe::{is_quantizable, sort_like_llama_quantize, FileType, Recipe};

/// Bytes of f32 rows held in memory per step: bounds peak memory whatever the tensor size.
const CHUNK_F32_BYTES: usize = 32 << 20;

/// Where a tensor's values come from.
pub trait TensorSource: Sync {
    fn name(&self) -> &str;
    /// ggml order (`ne[0]` contiguous).
    fn ne(&self) -> &[u64];
    /// The stored type, and the stored bytes when they can be copied unchanged.
    fn stored(&self) -> (GgmlType, Option<&[u8]>);
    /// Rows `first..first + out.len() / ne[0]` as f32.
    fn read_rows(&self, first: u64, out: &mut [f32]) -> anyhow::Result<()>;

    fn row_len(&self) -> u64 {
        self.ne()[0]
    }
    fn n_rows(&self) -> u64 {
        self.ne()[1..].iter().product()
    }
}

/// A tensor of an open GGUF file.
pub struct GgufTensor<'a> {
    pub file: &'a GgufFile,
    pub info: &'a TensorInfo,
}

impl TensorSource for GgufTensor<'_> {
    fn name(&self) -> &str {
        &self.info.name
    }
    fn ne(&self) -> &[u64] {
        &self.info.ne
    }
    fn stored(&self) -> (GgmlType, Option<&[u8]>) {
        (self.info.ty, Some(self.file.tensor_data(self.info)))
    }
    fn read_rows(&self, first: u64, out: &mut [f32]) -> anyhow::Result<()> {
        let ty = self.info.ty;
        if !ty.can_dequantize() {
            bail!(
                "tensor '{}' has type {ty}, which deltaq cannot convert",
                self.info.name
            );
        }
        let row_bytes = ty.row_bytes(self.row_len()).expect("validated at open") as usize;
        let data = self.file.tensor_data(self.info);
        let start = first as usize * row_bytes;
        let rows = &data[start..start + out.len() / self.row_len() as usize * row_bytes];
        out.par_chunks_mut(self.row_len() as usize)
            .zip(rows.par_chunks(row_bytes))
            .try_for_each(|(o, r)| dequantize_row(ty, r, o))?;
        Ok(())
    }
}

/// One output tensor: its source and target type.
pub struct Planned<'a> {
    pub source: Box<dyn TensorSource + 'a>,
    pub ty: GgmlType,
}

/// What a write produced.
#[derive(Debug, Clone)]
pub struct Summary {
    pub file_bytes: u64,
    pub tensor_bytes: u64,
    pub n_elements: u64,
    pub seconds: f64,
}

impl Summary {
    pub fn bits_per_weight(&self) -> f64 {
        self.tensor_bytes as f64 * 8.0 / self.n_elements.max(1) as f64
    }
}

/// Writes `plan` (in order) with the metadata already in `writer`, atomically to `path`.
pub fn write_gguf(
    path: &Path,
    mut writer: GgufWriter,
    plan: &[Planned<'_>],
    overwrite: bool,
    progress: bool,
) -> anyhow::Result<Summary> {
    let t0 = Instant::now();
    for p in plan {
        writer.add_tensor(TensorSpec::new(p.source.name(), p.ty, p.source.ne()))?;
    }
    let tensor_bytes: u64 = writer.tensors().iter().map(|t| t.nbytes()).sum();
    let n_elements: u64 = writer.tensors().iter().map(|t| t.n_elements()).sum();
    let bar = progress_bar(progress, tensor_bytes);
    let file_bytes =
        writer.write_to_path(path, overwrite, |i, spec, out| -> anyhow::Result<()> {
            bar.set_message(spec.name.clone());
            write_tensor(&*plan[i].source, spec.ty, out, &bar)
                .with_context(|| format!("tensor '{}'", spec.name))
        })?;
    bar.finish_and_clear();
    Ok(Summary {
        file_bytes,
        tensor_bytes,
        n_elements,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

fn progress_bar(show: bool, total: u64) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {bytes:>10}/{total_bytes:10} {binary_bytes_per_sec:>12} ETA {eta:>4} {wide_msg}",
        )
        .expect("valid template"),
    );
    bar
}

/// Streams one tensor: raw copy when the type is unchanged, else rows in bounded chunks, converted in parallel.
fn write_tensor(
    src: &dyn TensorSource,
    ty: GgmlType,
    out: &mut dyn Write,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<()> {
    let (stored_ty, raw) = src.stored();
    if let (true, Some(raw)) = (stored_ty == ty, raw) {
        out.write_all(raw)?;
        bar.inc(raw.len() as u64);
        return Ok(());
    }
    let row_len = src.row_len() as usize;
    let row_bytes = ty
        .row_bytes(row_len as u64)
        .with_context(|| format!("row length {row_len} is not a multiple of the {ty} block size"))?
        as usize;
    let n_rows = src.n_rows() as usize;
    let chunk_rows = (CHUNK_F32_BYTES / 4 / row_len).clamp(1, n_rows.max(1));
    let mut f32s = vec![0f32; chunk_rows * row_len];
    let mut bytes = vec![0u8; chunk_rows * row_bytes];
    let mut first = 0;
    while first < n_rows {
        let rows = chunk_rows.min(n_rows - first);
        let x = &mut f32s[..rows * row_len];
        src.read_rows(first as u64, x)?;
        if let Some(i) = x.iter().position(|v| !v.is_finite()) {
            bail!(
                "non-finite value {} at row {}, column {}",
                x[i],
                first + i / row_len,
                i % row_len
            );
        }
        let q = &mut bytes[..rows * row_bytes];
        q.par_chunks_mut(row_bytes)
            .zip(x.par_chunks(row_len))
            .try_for_each(|(o, r)| quantize_row(ty, r, o))?;
        out.write_all(q)?;
        bar.inc(q.len() as u64);
        first += rows;
    }
    Ok(())
}

/// Options of `deltaq quantize`.
pub struct QuantizeOptions {
    pub ftype: FileType,
    pub pure: bool,
    /// Tensors whose name contains one of these (or matches it with `*` wildcards) stay as they are.
    pub keep: Vec<String>,
    pub overwrite: bool,
    pub progress: bool,
}

/// Quantizes a GGUF file into another with llama-quantize's recipe for `opts.ftype`.
pub fn quantize_file(
    input: &Path,
    output: &Path,
    opts: &QuantizeOptions,
) -> anyhow::Result<Summary> {
    if same_file(input, output) {
        bail!("the output would overwrite the input {}", input.display());
    }
    let f = GgufFile::open(input)?;
    let mut writer = GgufWriter::new();
    for (k, v) in f.metadata() {
        writer.set(k, v.to_owned_value());
    }
    let plan = plan_for(&f, opts)?;
    // llama-quantize re-adds these two keys at the end.
    writer.remove("general.quantization_version");
    writer.set("general.quantization_version", OwnedValue::U32(2));
    writer.remove("general.file_type");
    writer.set("general.file_type", OwnedValue::U32(opts.ftype.id()));
    write_gguf(output, writer, &plan, opts.overwrite, opts.progress)
}

/// The tensors of `f` in llama-quantize's order with the type each gets.
pub fn plan_for<'a>(f: &'a GgufFile, opts: &QuantizeOptions) -> anyhow::Result<Vec<Planned<'a>>> {
    let arch = f.get_str("general.architecture").unwrap_or("");
    let n_layer = f.get_u64(&format!("{arch}.block_count")).unwrap_or(0);
    let n_gqa = head_ratio(f, arch);
    let mut names: Vec<String> = f.tensors().iter().map(|t| t.name.clone()).collect();
    sort_like_llama_quantize(&mut names);
    let mut recipe = Recipe::new(
        opts.ftype,
        opts.pure,
        names.iter().map(String::as_str),
        n_layer,
        n_gqa,
    );
    let mut plan = Vec::with_capacity(names.len());
    for name in &names {
        let info = f.tensor(name).expect("listed");
        let chosen = recipe.choose(name, &info.ne);
        let ty = match chosen {
            Some(ty) if !opts.keep.iter().any(|p| matches_pattern(name, p)) => ty,
            _ => info.ty,
        };
        if ty != info.ty && info.ty.is_quantized() {
            eprintln!(
                "warning: re-quantizing '{name}' from {} to {ty} loses more precision",
                info.ty
            );
        }
        plan.push(Planned {
            source: Box::new(GgufTensor { file: f, info }),
            ty,
        });
    }
    Ok(plan)
}

/// heads / kv heads of layer 0 (either may be a per-layer array).
fn head_ratio(f: &GgufFile, arch: &str) -> u64 {
    let first = |key: &str| -> Option<u64> {
        let v = f.get(&format!("{arch}.{key}"))?;
        match v.as_array() {
            Some(a) => a.ints()?.first().map(|&i| i as u64),
            None => v.as_int().map(|i| i as u64),
        }
    };
    match (
        first("attention.head_count"),
        first("attention.head_count_kv"),
    ) {
        (Some(h), Some(kv)) if kv > 0 => h / kv,
        (Some(_), None) => 1,
        _ => 0,
    }
}

/// Substring match, or a glob where `*` matches any run of characters.
fn matches_pattern(name: &str, pattern: &str) -> bool {
    if !pattern.contains('*') {
        return name.contains(pattern);
    }
    let parts: Vec<&str> = pattern.split('*').collect();
    let mut rest = name;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            match rest.strip_prefix(part) {
                Some(r) => rest = r,
                None => return false,
            }
        } else if i == parts.len() - 1 {
            return rest.ends_with(part);
        } else {
            match rest.find(part) {
                Some(p) => rest = &rest[p + part.len()..],
                None => return false,
            }
        }
    }
    rest.is_empty()
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::matches_pattern;

    #[test]
    fn patterns() {
        assert!(matches_pattern("blk.0.attn_qkv.weight", "attn_qkv"));
        assert!(matches_pattern(
            "blk.0.attn_qkv.weight",
            "blk.*.attn_qkv.weight"
        ));
        assert!(matches_pattern("blk.0.attn_qkv.weight", "*qkv*"));
        assert!(!matches_pattern("blk.0.attn_qkv.weight", "blk.*.ffn*"));
        assert!(!matches_pattern("blk.0.attn_qkv.weight", "ffn"));
    }
}
