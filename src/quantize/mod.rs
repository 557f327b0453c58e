//! Quantizing a model: llama-quantize's recipes, and a streaming writer that turns tensor sources (a GGUF
//! file, or a Hugging Face checkpoint being converted) into a GGUF of the chosen types, a few rows at a
//! time, on all cores, with a progress bar.

mod imatrix;
mod recipe;
mod target_bpw;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, ensure, Context};
use rayon::prelude::*;

use crate::gguf::{GgufFile, GgufWriter, OwnedValue, TensorInfo, TensorSpec};
use crate::quant::{dequantize_row, quantize_row_imatrix, GgmlType};

pub use imatrix::Imatrix;
pub use recipe::{
    is_quantizable, sort_like_llama_quantize, tensor_requires_imatrix, tensor_type_from_name,
    FileType, Recipe, TensorTypeOverride,
};
pub use target_bpw::{
    allocate, pick_for_lambda, quantize_file_to_bpw, quantize_file_to_bpw_sampled, Choice,
    TargetBpwReport, TARGET_BPW_KEY,
};

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
    writer: GgufWriter,
    plan: &[Planned<'_>],
    overwrite: bool,
    progress: bool,
) -> anyhow::Result<Summary> {
    write_gguf_weighted(path, writer, plan, &[], overwrite, progress)
}

/// [`write_gguf`] with importance weights: `weights[i]` (if present) for `plan[i]`, `ne[0]` per expert.
pub fn write_gguf_weighted(
    path: &Path,
    mut writer: GgufWriter,
    plan: &[Planned<'_>],
    weights: &[Option<&[f32]>],
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
            let qw = weights.get(i).copied().flatten();
            write_tensor(&*plan[i].source, spec.ty, qw, out, &bar)
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

/// Streams one tensor: raw copy when the type is unchanged, else rows in bounded chunks, converted in parallel
/// (with expert `e`'s slice of the importance weights `qw` for the rows of expert `e`).
fn write_tensor(
    src: &dyn TensorSource,
    ty: GgmlType,
    qw: Option<&[f32]>,
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
    let rows_per_expert = src.ne().get(1).copied().unwrap_or(1).max(1) as usize;
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
            .enumerate()
            .try_for_each(|(i, (o, r))| {
                let w = qw.map(|w| {
                    let e = (first + i) / rows_per_expert;
                    &w[e * row_len..(e + 1) * row_len]
                });
                quantize_row_imatrix(ty, r, w, o)
            })?;
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
    /// `--imatrix`: importance weights for the quantizers.
    pub imatrix: Option<ImatrixOptions>,
    /// `--token-embedding-type`, `--output-tensor-type`: these two tensors' types, whatever the recipe.
    pub token_embedding_type: Option<GgmlType>,
    pub output_tensor_type: Option<GgmlType>,
    /// `--tensor-type PATTERN=TYPE` (and `--tensor-type-file`): per-tensor types by name pattern.
    pub tensor_types: Vec<TensorTypeOverride>,
}

/// llama-quantize's `--imatrix FILE` with `--include-weights` / `--exclude-weights` (name substrings).
#[derive(Clone, Debug, Default)]
pub struct ImatrixOptions {
    pub path: PathBuf,
    pub include: Vec<String>,
    pub exclude: Vec<String>,
}

impl ImatrixOptions {
    /// Loads and filters the matrix as llama-quantize does; `None` when no entry is left (then
    /// llama-quantize quantizes as without `--imatrix`).
    pub fn load(&self) -> anyhow::Result<Option<Imatrix>> {
        ensure!(
            self.include.is_empty() || self.exclude.is_empty(),
            "--include-weights and --exclude-weights cannot be used together"
        );
        let mut m = Imatrix::load(&self.path)?;
        m.filter(&self.include, &self.exclude);
        if m.entries.is_empty() {
            return Ok(None);
        }
        m.check_finite()?;
        Ok(Some(m))
    }
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
    let imatrix = match &opts.imatrix {
        Some(o) => o.load()?,
        None => None,
    };
    let f = GgufFile::open(input)?;
    let mut writer = GgufWriter::new();
    for (k, v) in f.metadata() {
        writer.set(k, v.to_owned_value());
    }
    let (plan, weights) = plan_weighted(&f, opts, imatrix.as_ref())?;
    check_quantizers(&plan)?;
    // llama-quantize re-adds these two keys at the end, then its imatrix keys.
    set_last(
        &mut writer,
        "general.quantization_version",
        OwnedValue::U32(2),
    );
    set_last(
        &mut writer,
        "general.file_type",
        OwnedValue::U32(opts.ftype.id()),
    );
    if let (Some(m), Some(o)) = (&imatrix, &opts.imatrix) {
        imatrix_metadata(&mut writer, m, &o.path);
    }
    write_gguf_weighted(
        output,
        writer,
        &plan,
        &weights,
        opts.overwrite,
        opts.progress,
    )
}

/// Fails before writing anything if a planned type has no quantizer here yet (the IQ formats' arrive
/// separately): one block of zeros with unit weights through the row dispatch.
fn check_quantizers(plan: &[Planned<'_>]) -> anyhow::Result<()> {
    let mut seen = Vec::new();
    for p in plan {
        let (stored, _) = p.source.stored();
        if p.ty == stored || seen.contains(&p.ty) {
            continue;
        }
        seen.push(p.ty);
        let n = p.ty.block_size();
        let mut out = vec![0u8; p.ty.type_size()];
        quantize_row_imatrix(p.ty, &vec![0.0; n], Some(&vec![1.0; n]), &mut out)
            .with_context(|| format!("tensor '{}'", p.source.name()))?;
    }
    Ok(())
}

/// Sets `key` as the last key (llama.cpp's `gguf_set_val_*` on an existing key moves it to the end).
fn set_last(writer: &mut GgufWriter, key: &str, value: OwnedValue) {
    writer.remove(key);
    writer.set(key, value);
}

/// The keys llama-quantize records about its importance matrix (its strings cut to 127 bytes).
fn imatrix_metadata(writer: &mut GgufWriter, m: &Imatrix, path: &Path) {
    let cut = |s: &str| OwnedValue::String(s.as_bytes()[..s.len().min(127)].to_vec());
    set_last(
        writer,
        "quantize.imatrix.file",
        cut(&path.to_string_lossy()),
    );
    if let Some(ds) = m.datasets.first() {
        set_last(writer, "quantize.imatrix.dataset", cut(ds));
    }
    let n_entries = OwnedValue::U32(m.entries.len() as u32);
    set_last(writer, "quantize.imatrix.entries_count", n_entries);
    if m.chunk_count > 0 {
        let n_chunks = OwnedValue::U32(m.chunk_count as u32);
        set_last(writer, "quantize.imatrix.chunks_count", n_chunks);
    }
}

/// The tensors of `f` in llama-quantize's order with the type each gets.
pub fn plan_for<'a>(f: &'a GgufFile, opts: &QuantizeOptions) -> anyhow::Result<Vec<Planned<'a>>> {
    Ok(plan_weighted(f, opts, None)?.0)
}

/// The plan and, per planned tensor, its importance weights.
pub type WeightedPlan<'a, 'm> = (Vec<Planned<'a>>, Vec<Option<&'m [f32]>>);

/// [`plan_for`] with each tensor's importance weights, and llama-quantize's refusals: a tensor that
/// needs weights (`tensor_requires_imatrix`) and has none, or weights of the wrong size.
pub fn plan_weighted<'a, 'm>(
    f: &'a GgufFile,
    opts: &QuantizeOptions,
    imatrix: Option<&'m Imatrix>,
) -> anyhow::Result<WeightedPlan<'a, 'm>> {
    let arch = f.get_str("general.architecture").unwrap_or("");
    let n_layer = f.get_u64(&format!("{arch}.block_count")).unwrap_or(0);
    let n_expert = f.get_u64(&format!("{arch}.expert_count")).unwrap_or(0);
    let n_gqa = head_ratio(f, arch);
    let mut names: Vec<String> = f.tensors().iter().map(|t| t.name.clone()).collect();
    sort_like_llama_quantize(&mut names);
    let mut recipe = Recipe::new(
        opts.ftype,
        opts.pure,
        names.iter().map(String::as_str),
        n_layer,
        n_gqa,
    )
    .with_model(arch, n_expert);
    recipe.has_imatrix = imatrix.is_some();
    recipe.token_embedding_type = opts.token_embedding_type;
    recipe.output_tensor_type = opts.output_tensor_type;
    recipe.tensor_types = opts.tensor_types.clone();
    let mut plan = Vec::with_capacity(names.len());
    let mut weights = Vec::with_capacity(names.len());
    for name in &names {
        let info = f.tensor(name).expect("listed");
        let chosen = recipe.choose(name, &info.ne)?;
        let ty = match chosen {
            Some(ty) if !opts.keep.iter().any(|p| matches_pattern(name, p)) => ty,
            _ => info.ty,
        };
        let needs_imatrix = chosen.is_some() && tensor_requires_imatrix(name, ty, opts.ftype);
        if imatrix.is_none() && needs_imatrix {
            bail!(
                "this quantization requires an importance matrix (--imatrix): tensor {name} would be {ty}"
            );
        }
        let mut qw = None;
        if let (Some(m), true) = (imatrix, ty != info.ty) {
            qw = tensor_weights(m, name, &info.ne, opts.progress)?;
            if qw.is_none() && needs_imatrix {
                // llama-imatrix (and deltaq imatrix) never run the multi-token-prediction block, whose
                // layer index is `block_count - nextn_predict_layers` and up.
                let n_mtp = f
                    .get_u64(&format!("{arch}.nextn_predict_layers"))
                    .unwrap_or(0);
                let mtp = (n_layer.saturating_sub(n_mtp)..n_layer)
                    .map(|il| format!("blk.{il}."))
                    .find(|p| name.starts_with(p.as_str()));
                let hint = mtp.map_or_else(String::new, |p| {
                    let re = p.replace('.', "\\.");
                    format!(
                        "; {name} is in the multi-token-prediction block, which importance matrices \
                         never cover: --tensor-type '{re}=q4_K' gives that block a type that needs none \
                         (--keep-f32 '{p}' keeps it as it is)"
                    )
                });
                bail!(
                    "missing importance matrix for tensor {name} in a very low-bit quantization ({ty}){hint}"
                );
            }
        }
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
        weights.push(qw);
    }
    Ok((plan, weights))
}

/// A tensor's importance weights as llama-quantize matches them: by exact name, `ne[0]·ne[2]` of them (one
/// row per expert). No entry means no weights; a wrong size is an error except for the token embeddings,
/// which llama-imatrix never sees in full.
fn tensor_weights<'m>(
    m: &'m Imatrix,
    name: &str,
    ne: &[u64],
    verbose: bool,
) -> anyhow::Result<Option<&'m [f32]>> {
    let Some(w) = m.entries.get(name) else {
        if verbose {
            eprintln!("note: no importance weights for {name}");
        }
        return Ok(None);
    };
    let dim = |i: usize| ne.get(i).copied().unwrap_or(1);
    ensure!(
        dim(3) == 1,
        "tensor {name} has 4 dimensions; importance weights apply to 2-D and 3-D tensors"
    );
    let want = dim(0).saturating_mul(dim(2));
    if w.len() as u64 == want {
        return Ok(Some(w));
    }
    ensure!(
        name == "token_embd.weight" || name == "per_layer_token_embd.weight",
        "imatrix size {} is different from tensor size {want} for {name}",
        w.len()
    );
    if verbose {
        eprintln!(
            "note: imatrix size {} differs from tensor size {want} for {name}: not used",
            w.len()
        );
    }
    Ok(None)
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
