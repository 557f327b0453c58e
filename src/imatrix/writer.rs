//! llama-imatrix's two file formats.
//!
//! GGUF (the default): metadata `general.type = "imatrix"`, `imatrix.datasets` (array of strings),
//! `imatrix.chunk_count`, `imatrix.chunk_size` (u32), then per weight in name order two F32 tensors:
//! `<name>.in_sum2` (`{n_in, n_mat}`: the raw sums of squares) and `<name>.counts` (`{1, n_mat}`: rows
//! summed), shapes written as ggml does (trailing 1-sized dimensions dropped).
//!
//! Legacy `.dat`: i32 entry count; per entry (name order) i32 name length, the name, i32 `ncall`
//! (chunks: `ceil(count / chunk_size)`), i32 value count, then the f32 values `sum / count · ncall`;
//! after the entries the i32 chunk count and the dataset name (i32 length + bytes).

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};

use super::Imatrix;
use crate::gguf::{GgufWriter, OwnedValue, TensorSpec};
use crate::quant::GgmlType;

/// Writes `m` as llama-imatrix's GGUF file, atomically (overwriting `path`).
pub fn write_gguf(m: &Imatrix, path: &Path) -> Result<()> {
    let mut w = GgufWriter::new();
    w.set("general.type", OwnedValue::str("imatrix"));
    w.set("imatrix.datasets", OwnedValue::strings(&m.datasets));
    w.set("imatrix.chunk_count", OwnedValue::U32(m.chunk_count));
    w.set("imatrix.chunk_size", OwnedValue::U32(m.chunk_size));
    // ggml_n_dims: trailing dimensions of 1 are not written.
    let shape = |ne: [u64; 2]| -> Vec<u64> {
        if ne[1] == 1 {
            vec![ne[0]]
        } else {
            ne.to_vec()
        }
    };
    for e in &m.entries {
        let n_mat = e.counts.len() as u64;
        let n_in = e.in_sum2.len() as u64 / n_mat;
        w.add_tensor(TensorSpec::new(
            format!("{}.in_sum2", e.name),
            GgmlType::F32,
            &shape([n_in, n_mat]),
        ))?;
        w.add_tensor(TensorSpec::new(
            format!("{}.counts", e.name),
            GgmlType::F32,
            &shape([1, n_mat]),
        ))?;
    }
    w.write_to_path::<anyhow::Error>(path, true, |i, _, out| {
        let e = &m.entries[i / 2];
        if i % 2 == 0 {
            write_f32s(out, &e.in_sum2)?;
        } else {
            let counts: Vec<f32> = e.counts.iter().map(|&c| c as f32).collect();
            write_f32s(out, &counts)?;
        }
        Ok(())
    })
    .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Writes `m` in llama-imatrix's legacy `.dat` format, atomically (overwriting `path`). Entries with no
/// data are left out, as llama-imatrix does; the dataset written is the last one.
pub fn write_dat(m: &Imatrix, path: &Path) -> Result<()> {
    let bytes = dat_bytes(m);
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".deltaq-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    tmp.write_all(&bytes)
        .and_then(|_| tmp.as_file().sync_all())
        .with_context(|| format!("writing {}", path.display()))?;
    tmp.persist(path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// The `.dat` file's bytes.
pub fn dat_bytes(m: &Imatrix) -> Vec<u8> {
    let chunk = m.chunk_size.max(1) as u64;
    let stored: Vec<_> = m
        .entries
        .iter()
        .filter(|e| e.counts.iter().any(|&c| c > 0))
        .collect();
    let mut out = Vec::new();
    let i32le = |out: &mut Vec<u8>, v: usize| out.extend_from_slice(&(v as i32).to_le_bytes());
    i32le(&mut out, stored.len());
    for e in stored {
        i32le(&mut out, e.name.len());
        out.extend_from_slice(e.name.as_bytes());
        let max = e.counts.iter().copied().max().unwrap_or(0);
        let ncall = max.div_ceil(chunk);
        i32le(&mut out, ncall as usize);
        i32le(&mut out, e.in_sum2.len());
        let per_mat = e.in_sum2.len() / e.counts.len();
        for (i, &v) in e.in_sum2.iter().enumerate() {
            let (mut value, mut count) = (v, e.counts[i / per_mat] as f32);
            if count == 0.0 {
                // llama-imatrix stores 1 for matrices without data.
                (value, count) = (1.0, 1.0);
            }
            out.extend_from_slice(&((value / count) * ncall as f32).to_le_bytes());
        }
    }
    i32le(&mut out, m.chunk_count as usize);
    let dataset = m.datasets.last().map_or("", String::as_str);
    i32le(&mut out, dataset.len());
    out.extend_from_slice(dataset.as_bytes());
    out
}

fn write_f32s(out: &mut dyn Write, v: &[f32]) -> std::io::Result<()> {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    out.write_all(&bytes)
}
