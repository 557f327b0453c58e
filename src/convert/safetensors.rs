//! Hugging Face safetensors checkpoints, single-file or sharded (`model.safetensors.index.json`).
//!
//! Only the JSON headers are read up front (and checked against the file sizes); tensor data is read
//! later through short-lived memory maps of just the byte range a few rows need, so converting a model
//! never holds more than a bounded window of it in memory.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use memmap2::{Mmap, MmapOptions};
use serde_json::Value;

/// Element types of the weights we convert. Anything else is kept as its safetensors name and only
/// rejected if a tensor of that type is actually needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    BF16,
}

impl Dtype {
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
        }
    }

    fn parse(s: &str) -> Option<Dtype> {
        match s {
            "F32" => Some(Dtype::F32),
            "F16" => Some(Dtype::F16),
            "BF16" => Some(Dtype::BF16),
            _ => None,
        }
    }

    /// Converts little-endian elements to f32 (exactly: every F16/BF16 value is an f32).
    pub fn to_f32(self, src: &[u8], out: &mut [f32]) {
        debug_assert_eq!(src.len(), out.len() * self.size());
        match self {
            Dtype::F32 => {
                for (o, b) in out.iter_mut().zip(src.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            Dtype::F16 => {
                for (o, b) in out.iter_mut().zip(src.chunks_exact(2)) {
                    *o = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
                }
            }
            Dtype::BF16 => {
                for (o, b) in out.iter_mut().zip(src.chunks_exact(2)) {
                    *o = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
                }
            }
        }
    }
}

/// One tensor of a checkpoint: where its bytes are.
#[derive(Clone, Debug)]
pub struct StTensor {
    pub name: String,
    /// The dtype as the file names it ("BF16", "F32", "I64", ...).
    pub dtype_name: String,
    /// PyTorch order (last dimension contiguous).
    pub shape: Vec<u64>,
    /// Index into [`Checkpoint::files`].
    pub file: usize,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    pub nbytes: u64,
}

impl StTensor {
    pub fn dtype(&self) -> anyhow::Result<Dtype> {
        Dtype::parse(&self.dtype_name).with_context(|| {
            format!(
                "tensor '{}' has dtype {}, which deltaq cannot convert (supported: F32, F16, BF16)",
                self.name, self.dtype_name
            )
        })
    }

    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// The safetensors files of a checkpoint and their tensors, in the order llama.cpp's converter visits
/// them: files sorted by name, and within a file tensors sorted by name.
pub struct Checkpoint {
    pub files: Vec<(PathBuf, File)>,
    pub tensors: Vec<StTensor>,
}

impl Checkpoint {
    pub fn open(dir: &Path) -> anyhow::Result<Checkpoint> {
        let index_path = dir.join("model.safetensors.index.json");
        let mut expected: Option<HashMap<String, String>> = None;
        let part_names: Vec<String> = if index_path.is_file() {
            let text = std::fs::read_to_string(&index_path)
                .with_context(|| format!("reading {}", index_path.display()))?;
            let index: Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not valid JSON", index_path.display()))?;
            let map = index
                .get("weight_map")
                .and_then(Value::as_object)
                .with_context(|| {
                    format!("{} has no \"weight_map\" object", index_path.display())
                })?;
            let mut weight_map = HashMap::new();
            for (k, v) in map {
                let file = v.as_str().with_context(|| {
                    format!(
                        "{}: weight_map[{k:?}] is not a string",
                        index_path.display()
                    )
                })?;
                weight_map.insert(k.clone(), file.to_string());
            }
            let parts: BTreeSet<String> = weight_map.values().cloned().collect();
            let missing: Vec<&String> = parts.iter().filter(|p| !dir.join(p).is_file()).collect();
            if !missing.is_empty() {
                bail!(
                    "missing shard(s) of the checkpoint in {}: {} (referenced by model.safetensors.index.json)",
                    dir.display(),
                    missing
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            expected = Some(weight_map);
            parts.into_iter().collect()
        } else {
            let mut parts = Vec::new();
            for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
                let name = e?.file_name().to_string_lossy().into_owned();
                if name.starts_with("model") && name.ends_with(".safetensors") {
                    parts.push(name);
                }
            }
            parts.sort();
            if parts.is_empty() {
                bail!(
                    "no safetensors weights in {} (expected model.safetensors or model.safetensors.index.json with its shards)",
                    dir.display()
                );
            }
            parts
        };

        let mut files = Vec::new();
        let mut tensors = Vec::new();
        let mut seen: HashMap<String, String> = HashMap::new();
        for part in &part_names {
            let path = dir.join(part);
            let file = File::open(&path).with_context(|| format!("opening {}", path.display()))?;
            let mut part_tensors = read_header(&path, &file, files.len())?;
            part_tensors.sort_by(|a, b| a.name.cmp(&b.name));
            for t in &part_tensors {
                if let Some(other) = seen.insert(t.name.clone(), part.clone()) {
                    bail!("tensor '{}' is in both {other} and {part}", t.name);
                }
            }
            tensors.extend(part_tensors);
            files.push((path, file));
        }

        if let Some(weight_map) = expected {
            let mut missing: Vec<(&String, &String)> = weight_map
                .iter()
                .filter(|(name, _)| !seen.contains_key(*name))
                .collect();
            if !missing.is_empty() {
                missing.sort();
                let list: Vec<String> = missing
                    .iter()
                    .take(10)
                    .map(|(n, f)| format!("'{n}' (in {f})"))
                    .collect();
                bail!(
                    "{} tensor(s) listed in model.safetensors.index.json are missing from their shard: {}{}",
                    missing.len(),
                    list.join(", "),
                    if missing.len() > 10 { ", ..." } else { "" }
                );
            }
            let extra = seen.keys().filter(|n| !weight_map.contains_key(*n)).count();
            if extra > 0 {
                eprintln!(
                    "warning: {extra} tensor(s) in the shards are not listed in model.safetensors.index.json"
                );
            }
        }
        Ok(Checkpoint { files, tensors })
    }

    /// Maps `len` bytes of tensor `t` starting `start` bytes into its data.
    pub fn map(&self, t: &StTensor, start: u64, len: u64) -> anyhow::Result<Mmap> {
        assert!(start + len <= t.nbytes, "range outside tensor '{}'", t.name);
        let (path, file) = &self.files[t.file];
        map_range(file, t.offset + start, len as usize)
            .with_context(|| format!("mapping {}", path.display()))
    }
}

/// Maps a byte range of a file read-only.
fn map_range(file: &File, offset: u64, len: usize) -> std::io::Result<Mmap> {
    // SAFETY: the mapping is read-only and the range was checked against the file size when the
    // header was read; the file is opened read-only by us and must not be truncated or rewritten by
    // another process while we convert (as with any memory-mapped model loader).
    let map = unsafe { MmapOptions::new().offset(offset).len(len).map(file)? };
    // Sequential read-ahead hint; failure only costs speed.
    let _ = map.advise(memmap2::Advice::Sequential);
    Ok(map)
}

/// Reads and checks one file's header: the tensors it holds, with absolute offsets.
fn read_header(path: &Path, file: &File, file_index: usize) -> anyhow::Result<Vec<StTensor>> {
    use std::io::Read;
    let shown = path.display();
    let file_len = file.metadata()?.len();
    if file_len < 8 {
        bail!("{shown}: truncated safetensors file ({file_len} bytes, no header)");
    }
    let mut len_bytes = [0u8; 8];
    (&*file).read_exact(&mut len_bytes)?;
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > 100 << 20 {
        bail!("{shown}: not a safetensors file (header length {header_len})");
    }
    if 8 + header_len > file_len {
        bail!(
            "{shown}: truncated safetensors file (header needs {} bytes, the file has {file_len})",
            8 + header_len
        );
    }
    let mut header = vec![0u8; header_len as usize];
    (&*file).read_exact(&mut header)?;
    let header: Value = serde_json::from_slice(&header)
        .with_context(|| format!("{shown}: the safetensors header is not valid JSON"))?;
    let obj = header
        .as_object()
        .with_context(|| format!("{shown}: the safetensors header is not a JSON object"))?;
    let data_start = 8 + header_len;
    let mut out = Vec::with_capacity(obj.len());
    for (name, meta) in obj {
        if name == "__metadata__" {
            continue;
        }
        let bad = |what: &str| anyhow::anyhow!("{shown}: tensor '{name}': {what}");
        let dtype_name = meta
            .get("dtype")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("no dtype"))?
            .to_string();
        let shape: Vec<u64> = meta
            .get("shape")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no shape"))?
            .iter()
            .map(|d| d.as_u64().ok_or_else(|| bad("bad shape")))
            .collect::<Result<_, _>>()?;
        let offsets = meta
            .get("data_offsets")
            .and_then(Value::as_array)
            .filter(|a| a.len() == 2)
            .ok_or_else(|| bad("no data_offsets"))?;
        let (begin, end) = match (offsets[0].as_u64(), offsets[1].as_u64()) {
            (Some(b), Some(e)) if b <= e => (b, e),
            _ => return Err(bad("bad data_offsets")),
        };
        if let Some(dt) = Dtype::parse(&dtype_name) {
            let want = shape
                .iter()
                .try_fold(dt.size() as u64, |a, &d| a.checked_mul(d))
                .ok_or_else(|| bad("shape overflows"))?;
            if want != end - begin {
                return Err(bad(&format!(
                    "shape {shape:?} of {dtype_name} needs {want} bytes, data_offsets give {}",
                    end - begin
                )));
            }
        }
        if data_start + end > file_len {
            bail!(
                "{shown}: truncated safetensors file: tensor '{name}' ends at byte {}, the file has {file_len}",
                data_start + end
            );
        }
        out.push(StTensor {
            name: name.clone(),
            dtype_name,
            shape,
            file: file_index,
            offset: data_start + begin,
            nbytes: end - begin,
        });
    }
    Ok(out)
}
