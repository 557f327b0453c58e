//! GGUF writer: version 3, little-endian, tensors contiguous in info order and padded to the alignment,
//! as ggml's reader requires. Tensor data is streamed from a callback, so a file of any size is written
//! without holding it in memory; `write_to_path` is atomic (temp file in the same folder, then rename).

use std::io::{BufWriter, Write};
use std::path::Path;

use super::reader::pad;
use super::value::{OwnedValue, ValueType};
use super::{GgufError, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS, MAX_NAME_LEN};
use crate::quant::GgmlType;

/// A tensor to be written: its data comes later from the fill callback.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub ty: GgmlType,
    /// ggml order: `ne[0]` is the contiguous dimension.
    pub ne: Vec<u64>,
}

impl TensorSpec {
    pub fn new(name: impl Into<String>, ty: GgmlType, ne: &[u64]) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            ty,
            ne: ne.to_vec(),
        }
    }

    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }

    /// Byte size of the data (valid once `add_tensor` accepted the spec).
    pub fn nbytes(&self) -> u64 {
        self.n_elements() / self.ty.block_size() as u64 * self.ty.type_size() as u64
    }
}

#[derive(Default)]
pub struct GgufWriter {
    kv: Vec<(String, OwnedValue)>,
    tensors: Vec<TensorSpec>,
}

impl GgufWriter {
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Sets a metadata key, keeping its position if it already exists.
    pub fn set(&mut self, key: &str, value: OwnedValue) {
        match self.kv.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.kv.push((key.to_string(), value)),
        }
    }

    pub fn remove(&mut self, key: &str) {
        self.kv.retain(|(k, _)| k != key);
    }

    pub fn get(&self, key: &str) -> Option<&OwnedValue> {
        self.kv.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// Adds a tensor info; data is written in the order tensors are added.
    pub fn add_tensor(&mut self, spec: TensorSpec) -> Result<(), GgufError> {
        let bad = |m: String| GgufError::Invalid(format!("tensor '{}': {m}", spec.name));
        if spec.name.is_empty() || spec.name.len() >= MAX_NAME_LEN {
            return Err(bad(format!("name must be 1..{} bytes", MAX_NAME_LEN - 1)));
        }
        if spec.ne.is_empty() || spec.ne.len() > MAX_DIMS || spec.ne.contains(&0) {
            return Err(bad(format!(
                "shape {:?} must have 1..={MAX_DIMS} non-zero dimensions",
                spec.ne
            )));
        }
        if !spec.ne[0].is_multiple_of(spec.ty.block_size() as u64) {
            return Err(bad(format!(
                "row length {} is not a multiple of the {} block size {}",
                spec.ne[0],
                spec.ty,
                spec.ty.block_size()
            )));
        }
        if spec
            .ne
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .is_none()
        {
            return Err(bad("element count overflows".into()));
        }
        if self.tensors.iter().any(|t| t.name == spec.name) {
            return Err(bad("duplicate name".into()));
        }
        self.tensors.push(spec);
        Ok(())
    }

    fn alignment(&self) -> Result<u64, GgufError> {
        match self.get("general.alignment") {
            None => Ok(DEFAULT_ALIGNMENT),
            Some(OwnedValue::U32(a)) if a.is_power_of_two() => Ok(*a as u64),
            Some(v) => Err(GgufError::Invalid(format!(
                "general.alignment must be a UINT32 power of two, got {v:?}"
            ))),
        }
    }

    /// Header, metadata and tensor infos, padded to the alignment.
    fn header(&self, alignment: u64) -> Result<Vec<u8>, GgufError> {
        let mut out = Vec::new();
        out.extend_from_slice(GGUF_MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kv.len() as u64).to_le_bytes());
        for (i, (key, value)) in self.kv.iter().enumerate() {
            if key.is_empty() || self.kv[..i].iter().any(|(k, _)| k == key) {
                return Err(GgufError::Invalid(format!(
                    "metadata key '{key}' is empty or duplicated"
                )));
            }
            check_array(key, value)?;
            OwnedValue::String(key.as_bytes().to_vec()).encode(&mut out);
            out.extend_from_slice(&value.value_type().id().to_le_bytes());
            value.encode(&mut out);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            OwnedValue::String(t.name.as_bytes().to_vec()).encode(&mut out);
            out.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for d in &t.ne {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset = pad(offset + t.nbytes(), alignment).expect("sizes checked in add_tensor");
        }
        let len = pad(out.len() as u64, alignment).expect("small") as usize;
        out.resize(len, 0);
        Ok(out)
    }

    /// Total file size the writer will produce.
    pub fn file_size(&self) -> Result<u64, GgufError> {
        let a = self.alignment()?;
        let mut size = self.header(a)?.len() as u64;
        for t in &self.tensors {
            size = pad(size + t.nbytes(), a).expect("sizes checked in add_tensor");
        }
        Ok(size)
    }

    /// Streams the file to `out`. `fill(i, spec, w)` must write exactly `spec.nbytes()` bytes of tensor `i`.
    pub fn write<W: Write, E: From<GgufError>>(
        &self,
        out: &mut W,
        mut fill: impl FnMut(usize, &TensorSpec, &mut dyn Write) -> Result<(), E>,
    ) -> Result<u64, E> {
        let io = |e: std::io::Error| GgufError::Io(format!("writing GGUF: {e}"));
        let alignment = self.alignment()?;
        let header = self.header(alignment)?;
        out.write_all(&header).map_err(io)?;
        let mut written = header.len() as u64;
        let zeros = vec![0u8; alignment as usize];
        for (i, t) in self.tensors.iter().enumerate() {
            let mut counter = CountingWriter {
                inner: &mut *out,
                count: 0,
            };
            fill(i, t, &mut counter)?;
            if counter.count != t.nbytes() {
                return Err(GgufError::Invalid(format!(
                    "tensor '{}': wrote {} bytes, expected {}",
                    t.name,
                    counter.count,
                    t.nbytes()
                ))
                .into());
            }
            written += t.nbytes();
            let padded = pad(written, alignment).expect("checked");
            out.write_all(&zeros[..(padded - written) as usize])
                .map_err(io)?;
            written = padded;
        }
        Ok(written)
    }

    /// Writes the file atomically: to a temporary file in the same folder, renamed over `path` on
    /// success; on any error the temporary file is removed and `path` is untouched. With `overwrite`
    /// false an existing `path` is an error.
    pub fn write_to_path<E: From<GgufError>>(
        &self,
        path: &Path,
        overwrite: bool,
        fill: impl FnMut(usize, &TensorSpec, &mut dyn Write) -> Result<(), E>,
    ) -> Result<u64, E> {
        let io = |e: std::io::Error| GgufError::Io(format!("{}: {e}", path.display()));
        if !overwrite && path.exists() {
            return Err(GgufError::Io(format!("{} already exists", path.display())).into());
        }
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let tmp = tempfile::Builder::new()
            .prefix(".deltaq-")
            .suffix(".tmp")
            .tempfile_in(dir)
            .map_err(io)?;
        let mut buf = BufWriter::with_capacity(1 << 20, tmp);
        let size = self.write(&mut buf, fill)?;
        let tmp = buf.into_inner().map_err(|e| io(e.into_error()))?;
        tmp.as_file().sync_all().map_err(io)?;
        readable_by_all(tmp.as_file()).map_err(io)?;
        if overwrite {
            tmp.persist(path).map_err(|e| io(e.error))?;
        } else {
            tmp.persist_noclobber(path).map_err(|e| io(e.error))?;
        }
        Ok(size)
    }
}

/// ggml rejects nested arrays, and every element must have the declared type.
fn check_array(key: &str, value: &OwnedValue) -> Result<(), GgufError> {
    if let OwnedValue::Array(t, items) = value {
        if *t == ValueType::Array {
            return Err(GgufError::Invalid(format!(
                "metadata '{key}': nested arrays are not allowed"
            )));
        }
        if let Some(v) = items.iter().find(|v| v.value_type() != *t) {
            return Err(GgufError::Invalid(format!(
                "metadata '{key}': array of {} holds a {}",
                t.name(),
                v.value_type().name()
            )));
        }
    }
    Ok(())
}

struct CountingWriter<'a, W: Write> {
    inner: &'a mut W,
    count: u64,
}

impl<W: Write> Write for CountingWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Temporary files are created private (0600); a finished output gets the usual 0644.
pub(crate) fn readable_by_all(f: &std::fs::File) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
    }
    #[cfg(not(unix))]
    let _ = f;
    Ok(())
}
