//! GGUF reader: parses and validates the header, metadata and tensor infos of a memory-mapped file once,
//! then hands out tensor data as borrowed slices of the mapping.

use std::collections::HashMap;
use std::path::Path;

use super::value::{ArrayView, Cursor, Value, ValueType};
use super::{GgufError, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS, MAX_NAME_LEN};
use crate::quant::GgmlType;

/// The bytes behind a [`GgufFile`]: a read-only mapping, or a buffer (tests, fuzzing).
enum Backing {
    Mmap(memmap2::Mmap),
    Bytes(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Bytes(b) => b,
        }
    }
}

/// One tensor-info record, validated: its data lies inside the file and overlaps no other tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// Dimensions as recorded (`n_dims` of them), `ne[0]` the contiguous one.
    pub ne: Vec<u64>,
    /// Offset relative to the data section.
    pub offset: u64,
    /// Byte size of the data.
    pub nbytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }

    /// Elements per row (`ne[0]`).
    pub fn row_len(&self) -> u64 {
        self.ne.first().copied().unwrap_or(1)
    }

    /// Number of rows (`ne[1]·ne[2]·ne[3]`).
    pub fn n_rows(&self) -> u64 {
        self.ne.iter().skip(1).product()
    }

    /// Shape in PyTorch/NumPy order (outermost first): the reverse of `ne`.
    pub fn torch_shape(&self) -> Vec<u64> {
        self.ne.iter().rev().copied().collect()
    }
}

#[derive(Debug)]
struct KvEntry {
    key: String,
    ty: ValueType,
    /// Byte range of the encoded value (after the type tag).
    start: usize,
    end: usize,
}

/// An open GGUF file.
pub struct GgufFile {
    backing: Backing,
    pub version: u32,
    pub alignment: u64,
    /// File offset where tensor data starts.
    pub data_start: u64,
    kv: Vec<KvEntry>,
    kv_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("n_kv", &self.kv.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Maps `path` read-only and validates it. Only the metadata pages are touched.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io = |e: std::io::Error| GgufError::Io(format!("{}: {e}", path.display()));
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            return Err(GgufError::NotGguf(format!("{} is empty", path.display())));
        }
        // SAFETY: the mapping is read-only and private to this process. Every access is bounds-checked
        // against the length seen here; a file truncated by another process *after* this point is outside
        // what a reader can defend against (as with every mmap-based loader).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        // Page faults on the mapping then fill the page cache with 2 MiB folios mapped by one PMD each
        // (where the kernel and filesystem can, e.g. ext4 on Linux ≥ 6.x): decoding streams every weight
        // once per token, and with 4 KiB pages the TLB misses cost it up to 40% on a VM (where each miss is
        // a two-level walk). Only advice: a kernel without file THP ignores it.
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        Self::parse(Backing::Mmap(map)).map_err(|e| e.in_file(path))
    }

    /// Parses a GGUF image held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::parse(Backing::Bytes(bytes))
    }

    fn parse(backing: Backing) -> Result<GgufFile, GgufError> {
        let buf = backing.bytes();
        let mut cur = Cursor::new(buf, false);
        let magic = cur
            .bytes(4, "magic")
            .map_err(|_| GgufError::NotGguf("file is shorter than the 4-byte magic".into()))?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::NotGguf(format!(
                "bad magic {magic:02x?} (expected \"GGUF\")"
            )));
        }
        let version = cur.u32("version")?;
        if version & 0xFFFF == 0 && version != 0 {
            return Err(GgufError::Unsupported(
                "big-endian GGUF files are not supported (byte-swapped version field)".into(),
            ));
        }
        if !(1..=3).contains(&version) {
            return Err(GgufError::Unsupported(format!(
                "GGUF version {version} (supported: 1, 2, 3)"
            )));
        }
        let mut cur = Cursor {
            v1: version == 1,
            ..cur
        };
        let n_tensors = cur.count("tensor count")?;
        let n_kv = cur.count("metadata count")?;
        // Every KV record needs at least 12 bytes and every tensor info at least 24: bound counts by the file.
        if n_kv > cur.remaining() as u64 / 12 {
            return Err(GgufError::Truncated(format!(
                "header claims {n_kv} metadata entries but only {} bytes follow",
                cur.remaining()
            )));
        }
        if n_tensors > cur.remaining() as u64 / 24 {
            return Err(GgufError::Truncated(format!(
                "header claims {n_tensors} tensors but only {} bytes follow",
                cur.remaining()
            )));
        }

        let mut kv = Vec::with_capacity(n_kv as usize);
        let mut kv_index = HashMap::with_capacity(n_kv as usize);
        for i in 0..n_kv {
            let key_pos = cur.pos;
            let key = cur.string("metadata key")?;
            let key = std::str::from_utf8(key).map_err(|_| {
                GgufError::Invalid(format!("metadata key #{i} at byte {key_pos} is not UTF-8"))
            })?;
            if key.is_empty() {
                return Err(GgufError::Invalid(format!(
                    "metadata key #{i} at byte {key_pos} is empty"
                )));
            }
            let type_id = cur.u32("metadata value type")?;
            let ty = ValueType::from_id(type_id).ok_or_else(|| {
                GgufError::Invalid(format!(
                    "metadata key '{key}' has unknown value type {type_id}"
                ))
            })?;
            let start = cur.pos;
            cur.value(ty, 0)
                .map_err(|e| e.context(&format!("metadata key '{key}'")))?;
            if kv_index.insert(key.to_string(), kv.len()).is_some() {
                return Err(GgufError::Invalid(format!(
                    "duplicate metadata key '{key}'"
                )));
            }
            kv.push(KvEntry {
                key: key.to_string(),
                ty,
                start,
                end: cur.pos,
            });
        }

        let alignment = match kv_index.get("general.alignment").map(|&i| &kv[i]) {
            None => DEFAULT_ALIGNMENT,
            Some(e) if e.ty != ValueType::U32 => {
                return Err(GgufError::Invalid(format!(
                    "general.alignment has type {} (must be UINT32)",
                    e.ty.name()
                )))
            }
            Some(e) => {
                let a = u32::from_le_bytes(buf[e.start..e.end].try_into().expect("4 bytes checked"))
                    as u64;
                if a == 0 || !a.is_power_of_two() {
                    return Err(GgufError::Invalid(format!(
                        "general.alignment {a} is not a power of two"
                    )));
                }
                a
            }
        };

        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut tensor_index = HashMap::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let t = read_tensor_info(&mut cur, i)?;
            if tensor_index.insert(t.name.clone(), tensors.len()).is_some() {
                return Err(GgufError::Invalid(format!(
                    "duplicate tensor name '{}'",
                    t.name
                )));
            }
            tensors.push(t);
        }

        let data_start = pad(cur.pos as u64, alignment)
            .ok_or_else(|| GgufError::Invalid("data section offset overflows".into()))?;
        let file_len = buf.len() as u64;
        check_extents(&tensors, data_start, alignment, file_len)?;

        Ok(GgufFile {
            backing,
            version,
            alignment,
            data_start,
            kv,
            kv_index,
            tensors,
            tensor_index,
        })
    }

    /// The whole file image.
    pub fn bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    /// Drops the metadata pages (everything before the tensor data) from the process's resident set,
    /// once the model, tokenizer and chat template have been built from them. They stay in the page
    /// cache, and a later read maps them again. In a Qwen3.5 file they are about 16 MB, mostly the
    /// 248k-token vocabulary and 500k merges, which the tokenizer has copied into its own tables:
    /// 3% of the 0.8B's resident memory for nothing. A no-op for in-memory images and off Unix.
    pub fn release_metadata_pages(&self) {
        #[cfg(unix)]
        if let Backing::Mmap(map) = &self.backing {
            // A multiple of every page size in use (4, 16 and 64 KiB), so the range ends on a page
            // boundary at or before the first tensor.
            const GRANULE: usize = 64 << 10;
            let len = (self.data_start as usize).min(map.len()) / GRANULE * GRANULE;
            if len > 0 {
                // SAFETY: the mapping is private and read-only, so none of its pages was ever
                // written: MADV_DONTNEED discards no data, and the next access to the range reads the
                // same file bytes again at the same addresses. Slices borrowed from the range (keys,
                // strings) therefore keep their contents; the file changing on disk is the caveat
                // every mapping has (see `open`).
                let _ = unsafe {
                    map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, 0, len)
                };
            }
        }
    }

    /// Metadata keys in file order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.kv.iter().map(|e| e.key.as_str())
    }

    pub fn n_kv(&self) -> usize {
        self.kv.len()
    }

    /// A metadata value, decoded from the file on demand (arrays stay lazy).
    pub fn get(&self, key: &str) -> Option<Value<'_>> {
        let e = &self.kv[*self.kv_index.get(key)?];
        let mut cur = Cursor::new(&self.bytes()[..e.end], self.version == 1);
        cur.pos = e.start;
        cur.value(e.ty, 0).ok()
    }

    /// The metadata in file order.
    pub fn metadata(&self) -> impl Iterator<Item = (&str, Value<'_>)> {
        self.kv
            .iter()
            .filter_map(|e| Some((e.key.as_str(), self.get(&e.key)?)))
    }

    /// Typed getters that name the key in their error.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key)?;
        v.as_str()
            .ok_or_else(|| GgufError::Invalid(format!("metadata '{key}' is not a UTF-8 string")))
    }

    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.require(key)?;
        v.as_int()
            .and_then(|i| u64::try_from(i).ok())
            .ok_or_else(|| {
                GgufError::Invalid(format!("metadata '{key}' is not a non-negative integer"))
            })
    }

    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        let v = self.require(key)?;
        v.as_f64()
            .map(|f| f as f32)
            .ok_or_else(|| GgufError::Invalid(format!("metadata '{key}' is not a number")))
    }

    pub fn get_array(&self, key: &str) -> Result<ArrayView<'_>, GgufError> {
        let v = self.require(key)?;
        v.as_array()
            .ok_or_else(|| GgufError::Invalid(format!("metadata '{key}' is not an array")))
    }

    fn require(&self, key: &str) -> Result<Value<'_>, GgufError> {
        self.get(key)
            .ok_or_else(|| GgufError::Missing(format!("metadata key '{key}'")))
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor's bytes, borrowed from the mapping (extents were checked at open).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.data_start + t.offset) as usize;
        &self.bytes()[start..start + t.nbytes as usize]
    }

    /// Looks a tensor up by name and returns its info and bytes.
    pub fn tensor_by_name(&self, name: &str) -> Result<(&TensorInfo, &[u8]), GgufError> {
        let t = self
            .tensor(name)
            .ok_or_else(|| GgufError::Missing(format!("tensor '{name}'")))?;
        Ok((t, self.tensor_data(t)))
    }

    /// Whether tensors are laid out as ggml's own reader requires: in info order, contiguous, padded.
    pub fn is_ggml_strict_layout(&self) -> bool {
        let mut expect = 0u64;
        for t in &self.tensors {
            if t.offset != expect {
                return false;
            }
            expect = match pad(t.offset + t.nbytes, self.alignment) {
                Some(e) => e,
                None => return false,
            };
        }
        true
    }
}

fn read_tensor_info(cur: &mut Cursor<'_>, i: u64) -> Result<TensorInfo, GgufError> {
    let pos = cur.pos;
    let name = cur.string("tensor name")?;
    let name = std::str::from_utf8(name)
        .map_err(|_| GgufError::Invalid(format!("tensor #{i} at byte {pos}: name is not UTF-8")))?
        .to_string();
    let ctx = |msg: String| GgufError::Invalid(format!("tensor '{name}': {msg}"));
    if name.is_empty() {
        return Err(GgufError::Invalid(format!(
            "tensor #{i} at byte {pos} has an empty name"
        )));
    }
    if name.len() >= MAX_NAME_LEN {
        return Err(ctx(format!(
            "name is {} bytes (limit {})",
            name.len(),
            MAX_NAME_LEN - 1
        )));
    }
    let n_dims = cur.u32("tensor n_dims")?;
    if n_dims as usize > MAX_DIMS {
        return Err(ctx(format!("{n_dims} dimensions (limit {MAX_DIMS})")));
    }
    let mut ne = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        ne.push(cur.count("tensor dimension")?);
    }
    let type_id = cur.u32("tensor type")?;
    let offset = cur.u64("tensor offset")?;
    let ty =
        GgmlType::from_id(type_id).ok_or_else(|| ctx(format!("unknown ggml type id {type_id}")))?;
    if ne.contains(&0) {
        return Err(ctx(format!("has a zero dimension {ne:?}")));
    }
    let n_elements = ne
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| ctx(format!("element count of {ne:?} overflows")))?;
    let row = ne.first().copied().unwrap_or(1);
    if row % ty.block_size() as u64 != 0 {
        return Err(ctx(format!(
            "row length {row} is not a multiple of the {ty} block size {}",
            ty.block_size()
        )));
    }
    let nbytes = (n_elements / ty.block_size() as u64)
        .checked_mul(ty.type_size() as u64)
        .ok_or_else(|| ctx("byte size overflows".into()))?;
    Ok(TensorInfo {
        name,
        ty,
        ne,
        offset,
        nbytes,
    })
}

/// Every tensor's offset aligned, its data inside the file, and no two tensors overlapping.
fn check_extents(
    tensors: &[TensorInfo],
    data_start: u64,
    alignment: u64,
    file_len: u64,
) -> Result<(), GgufError> {
    let mut spans = Vec::with_capacity(tensors.len());
    for t in tensors {
        if t.offset % alignment != 0 {
            return Err(GgufError::Invalid(format!(
                "tensor '{}': offset {} is not a multiple of the alignment {alignment}",
                t.name, t.offset
            )));
        }
        let end = data_start
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.nbytes))
            .ok_or_else(|| {
                GgufError::Invalid(format!(
                    "tensor '{}': offset {} overflows",
                    t.name, t.offset
                ))
            })?;
        if end > file_len {
            return Err(GgufError::Truncated(format!(
                "tensor '{}' ends at byte {end} but the file has {file_len} bytes (incomplete download?)",
                t.name
            )));
        }
        spans.push((t.offset, t.offset + t.nbytes, &t.name));
    }
    spans.sort_unstable();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(GgufError::Invalid(format!(
                "tensors '{}' and '{}' overlap",
                w[0].2, w[1].2
            )));
        }
    }
    Ok(())
}

/// Rounds `x` up to a multiple of `align` (a power of two).
pub(crate) fn pad(x: u64, align: u64) -> Option<u64> {
    Some(x.checked_add(align - 1)? & !(align - 1))
}
