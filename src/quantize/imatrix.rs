//! Importance matrices for quantization, read as `llama-quantize --imatrix` reads them (its
//! `load_imatrix` over common's `common_imatrix_load`): the GGUF format of `llama-imatrix`
//! (`<name>.in_sum2` and `<name>.counts` per weight matrix) or the legacy `.dat` format.
//!
//! The weight of column `i` of expert `j` is `in_sum2[j·ne0 + i] / round(counts[j])`, or 1 for every
//! column of an expert that saw no tokens; a legacy entry holds `sum·ncall` averages, divided back by
//! its call count.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, ensure, Context};

use crate::gguf::{GgufFile, ValueType};
use crate::quant::GgmlType;

/// An importance matrix as llama-quantize uses it: one weight per column (per expert) of each matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct Imatrix {
    /// Tensor name → weights (`ne[0] · n_expert` of them).
    pub entries: BTreeMap<String, Vec<f32>>,
    /// Datasets the matrix was computed on (`imatrix.datasets`, or the legacy file's trailer).
    pub datasets: Vec<String>,
    /// Chunks it was computed on (`imatrix.chunk_count`, or the legacy trailer's count; 0 if absent).
    pub chunk_count: i32,
    /// Whether it came from a legacy `.dat` file.
    pub is_legacy: bool,
}

/// A matrix's `.in_sum2` and `.counts` tensors as they are found.
type SumsAndCounts = (Option<Vec<f32>>, Option<Vec<f32>>);

const IN_SUM2: &str = ".in_sum2";
const COUNTS: &str = ".counts";

impl Imatrix {
    /// Reads a GGUF or legacy imatrix file (a file that does not start with the GGUF magic is legacy).
    pub fn load(path: &Path) -> anyhow::Result<Imatrix> {
        let bytes =
            std::fs::read(path).with_context(|| format!("reading imatrix {}", path.display()))?;
        Imatrix::from_bytes(bytes).with_context(|| format!("imatrix {}", path.display()))
    }

    pub fn from_bytes(bytes: Vec<u8>) -> anyhow::Result<Imatrix> {
        if bytes.starts_with(b"GGUF") {
            let f = GgufFile::from_bytes(bytes).context("not a valid GGUF file")?;
            Imatrix::from_gguf(&f)
        } else {
            Imatrix::from_legacy(&bytes)
        }
    }

    fn from_gguf(f: &GgufFile) -> anyhow::Result<Imatrix> {
        ensure!(!f.tensors().is_empty(), "no data (the file has no tensors)");
        let has = |k: &str| f.get(k).is_some();
        ensure!(
            has("imatrix.datasets") && has("imatrix.chunk_count") && has("imatrix.chunk_size"),
            "missing imatrix metadata (imatrix.datasets, imatrix.chunk_count, imatrix.chunk_size)"
        );
        let mut datasets = Vec::new();
        if let Some(names) = f.get("imatrix.datasets").and_then(|v| v.as_array()) {
            if let Some(strings) = names.strings() {
                for s in strings {
                    datasets.push(String::from_utf8_lossy(s).into_owned());
                }
            }
        }
        let u32_key = |k: &str| -> anyhow::Result<u32> {
            let v = f.get(k).expect("checked above");
            ensure!(
                v.value_type() == ValueType::U32,
                "metadata '{k}' is {}, not u32",
                v.value_type().name()
            );
            Ok(v.as_int().expect("u32") as u32)
        };
        // llama.cpp reads the u32 into an int32_t.
        let chunk_count = u32_key("imatrix.chunk_count")? as i32;
        u32_key("imatrix.chunk_size")?;

        // name → (in_sum2, counts); tensors with other names are ignored, as in llama.cpp.
        let mut pairs: BTreeMap<&str, SumsAndCounts> = BTreeMap::new();
        for t in f.tensors() {
            let (base, is_sums) = if let Some(b) = t.name.strip_suffix(IN_SUM2) {
                (b, true)
            } else if let Some(b) = t.name.strip_suffix(COUNTS) {
                (b, false)
            } else {
                continue;
            };
            ensure!(
                t.ty == GgmlType::F32,
                "{} is {}: sums and counts must be F32",
                t.name,
                t.ty
            );
            let values: Vec<f32> = f
                .tensor_data(t)
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let slot = pairs.entry(base).or_default();
            if is_sums {
                slot.0 = Some(values);
            } else {
                slot.1 = Some(values);
            }
        }

        let mut entries = BTreeMap::new();
        for (name, pair) in pairs {
            let (Some(sums), Some(counts)) = pair else {
                bail!("mismatched sums and counts for {name} (one of {name}{IN_SUM2}, {name}{COUNTS} is missing)");
            };
            entries.insert(name.to_string(), weights_from_sums(name, &sums, &counts)?);
        }
        Ok(Imatrix {
            entries,
            datasets,
            chunk_count,
            is_legacy: false,
        })
    }

    /// The legacy format: `i32 n_entries`, then per entry `i32 len, name, i32 ncall, i32 nval, f32 × nval`,
    /// then optionally `i32 chunk_count, i32 len, dataset`.
    fn from_legacy(bytes: &[u8]) -> anyhow::Result<Imatrix> {
        let mut r = Reader { bytes, pos: 0 };
        let n_entries = r
            .i32()
            .context("no data (not a GGUF file and too short for a legacy .dat file)")?;
        ensure!(
            n_entries >= 1,
            "no data: a legacy .dat file must start with a positive entry count (got {n_entries})"
        );
        let mut entries = BTreeMap::new();
        for i in 1..=n_entries {
            let read_entry = |r: &mut Reader| -> anyhow::Result<(String, Vec<f32>)> {
                let len = r.i32()?;
                ensure!(len >= 0, "negative name length {len}");
                let raw = r.take(len as usize)?;
                // llama.cpp builds the name as a C string: it ends at the first NUL.
                let raw = raw.split(|&b| b == 0).next().unwrap_or(&[]);
                let name = String::from_utf8(raw.to_vec()).context("name is not UTF-8")?;
                let ncall = r.i32()?;
                let nval = r.i32()?;
                ensure!(nval >= 1, "{name}: {nval} values");
                let data = r.take(nval as usize * 4)?;
                let sums: Vec<f32> = data
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                // Legacy sums hold average·ncall: divide by the call count again.
                let w = if ncall > 0 {
                    sums.iter().map(|&s| s / ncall as f32).collect()
                } else {
                    sums
                };
                Ok((name, w))
            };
            let (name, w) = read_entry(&mut r)
                .with_context(|| format!("legacy .dat file: entry {i} of {n_entries}"))?;
            entries.insert(name, w);
        }
        // The trailer is optional; llama.cpp keeps whatever part of it reads.
        let mut chunk_count = 0;
        let mut datasets = Vec::new();
        if r.remaining() > 0 {
            let mut n = [0u8; 4];
            let avail = r.remaining().min(4);
            n[..avail].copy_from_slice(r.take(avail).expect("available"));
            chunk_count = i32::from_le_bytes(n);
            if avail == 4 {
                if let Ok(len) = r.i32() {
                    if len > 0 {
                        if let Ok(raw) = r.take(len as usize) {
                            let raw = raw.split(|&b| b == 0).next().unwrap_or(&[]);
                            datasets.push(String::from_utf8_lossy(raw).into_owned());
                        }
                    }
                }
            }
        }
        Ok(Imatrix {
            entries,
            datasets,
            chunk_count,
            is_legacy: true,
        })
    }

    /// llama-quantize's `--exclude-weights` (drop entries whose name contains a pattern) and
    /// `--include-weights` (keep only entries whose name contains one); plain substrings, not globs.
    pub fn filter(&mut self, include: &[String], exclude: &[String]) {
        if !exclude.is_empty() {
            self.entries
                .retain(|name, _| !exclude.iter().any(|p| name.contains(p.as_str())));
        }
        if !include.is_empty() {
            self.entries
                .retain(|name, _| include.iter().any(|p| name.contains(p.as_str())));
        }
    }

    /// The first non-finite weight, which llama-quantize refuses.
    pub fn check_finite(&self) -> anyhow::Result<()> {
        for (name, w) in &self.entries {
            if let Some(v) = w.iter().find(|v| !v.is_finite()) {
                bail!("imatrix contains non-finite value {v} (entry {name})");
            }
        }
        Ok(())
    }
}

/// `in_sum2 / count` per expert, 1 for an expert without tokens (llama-quantize's `load_imatrix`).
fn weights_from_sums(name: &str, sums: &[f32], counts: &[f32]) -> anyhow::Result<Vec<f32>> {
    ensure!(!counts.is_empty(), "{name}{COUNTS} is empty");
    ensure!(
        !sums.is_empty() && sums.len().is_multiple_of(counts.len()),
        "{name}: {} sums do not split into {} experts",
        sums.len(),
        counts.len()
    );
    let ne0 = sums.len() / counts.len();
    let mut w = Vec::with_capacity(sums.len());
    for (expert, &c) in sums.chunks_exact(ne0).zip(counts) {
        ensure!(c.is_finite(), "{name}: non-finite count {c}");
        // llama.cpp rounds the count to an integer (lround) and divides by it as a float.
        let count = c.round() as i64 as f32;
        if count > 0.0 {
            w.extend(expert.iter().map(|&s| s / count));
        } else {
            w.extend(std::iter::repeat_n(1.0, ne0));
        }
    }
    Ok(w)
}

/// Little-endian reads that fail instead of running past the end.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize) -> anyhow::Result<&'a [u8]> {
        ensure!(
            n <= self.remaining(),
            "truncated: {n} bytes wanted at offset {}, {} left",
            self.pos,
            self.remaining()
        );
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn i32(&mut self) -> anyhow::Result<i32> {
        let b = self.take(4)?;
        Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn legacy(entries: &[(&str, i32, &[f32])], trailer: Option<(i32, &str)>) -> Vec<u8> {
        let mut b = (entries.len() as i32).to_le_bytes().to_vec();
        for (name, ncall, vals) in entries {
            b.extend((name.len() as i32).to_le_bytes());
            b.extend(name.as_bytes());
            b.extend(ncall.to_le_bytes());
            b.extend((vals.len() as i32).to_le_bytes());
            for v in *vals {
                b.extend(v.to_le_bytes());
            }
        }
        if let Some((n, ds)) = trailer {
            b.extend(n.to_le_bytes());
            b.extend((ds.len() as i32).to_le_bytes());
            b.extend(ds.as_bytes());
        }
        b
    }

    #[test]
    fn legacy_divides_by_ncall() {
        let m = Imatrix::from_bytes(legacy(
            &[("a.weight", 4, &[8.0, 2.0]), ("b.weight", 0, &[3.0])],
            Some((7, "data.txt")),
        ))
        .unwrap();
        assert_eq!(m.entries["a.weight"], vec![2.0, 0.5]);
        assert_eq!(m.entries["b.weight"], vec![3.0]);
        assert_eq!(m.chunk_count, 7);
        assert_eq!(m.datasets, vec!["data.txt".to_string()]);
        assert!(m.is_legacy);
        let bare = Imatrix::from_bytes(legacy(&[("a.weight", 1, &[1.0])], None)).unwrap();
        assert_eq!((bare.chunk_count, bare.datasets.len()), (0, 0));
    }

    #[test]
    fn malformed_legacy_files_are_errors() {
        let good = legacy(&[("a.weight", 4, &[8.0, 2.0])], None);
        for cut in [0, 3, 4, 9, 17, good.len() - 1] {
            assert!(
                Imatrix::from_bytes(good[..cut].to_vec()).is_err(),
                "cut at {cut}"
            );
        }
        assert!(
            Imatrix::from_bytes(legacy(&[], None)).is_err(),
            "no entries"
        );
        assert!(
            Imatrix::from_bytes(legacy(&[("a", 1, &[])], None)).is_err(),
            "no values"
        );
        let mut neg = good.clone();
        neg[4..8].copy_from_slice(&(-5i32).to_le_bytes());
        assert!(Imatrix::from_bytes(neg).is_err(), "negative name length");
        let mut huge = good;
        huge[4..8].copy_from_slice(&i32::MAX.to_le_bytes());
        assert!(Imatrix::from_bytes(huge).is_err(), "name past the end");
    }

    #[test]
    fn per_expert_counts_and_zero_counts() {
        let w = weights_from_sums("x", &[2.0, 4.0, 5.0, 6.0, 9.0, 9.0], &[2.4, 0.0, 2.5]).unwrap();
        // 2.4 rounds to 2, 2.5 rounds away from zero to 3 (lround); an expert without tokens gets 1.
        assert_eq!(w, vec![1.0, 2.0, 1.0, 1.0, 3.0, 3.0]);
        assert!(weights_from_sums("x", &[1.0, 2.0, 3.0], &[1.0, 1.0]).is_err());
        assert!(weights_from_sums("x", &[1.0], &[]).is_err());
        assert!(weights_from_sums("x", &[1.0], &[f32::NAN]).is_err());
    }

    #[test]
    fn include_and_exclude() {
        let mut m = Imatrix::from_bytes(legacy(
            &[
                ("blk.0.ffn_up.weight", 1, &[1.0]),
                ("blk.0.ffn_down.weight", 1, &[1.0]),
                ("blk.0.attn_qkv.weight", 1, &[1.0]),
            ],
            None,
        ))
        .unwrap();
        let mut ex = m.clone();
        ex.filter(&[], &["ffn".to_string()]);
        assert_eq!(
            ex.entries.keys().collect::<Vec<_>>(),
            ["blk.0.attn_qkv.weight"]
        );
        m.filter(&["ffn_up".to_string(), "qkv".to_string()], &[]);
        assert_eq!(
            m.entries.keys().collect::<Vec<_>>(),
            ["blk.0.attn_qkv.weight", "blk.0.ffn_up.weight"]
        );
    }
}
