//! Minimal NumPy `.npy` (format 1.0) reading and writing for float32, float64 and int32 arrays:
//! enough to exchange tensors and logits with Python references.

use std::io::Write;
use std::path::Path;

/// Writes a little-endian float32 array of `shape` (C order) to `path`, atomically.
pub fn write_f32(path: &Path, shape: &[u64], data: &[f32]) -> std::io::Result<()> {
    write_le(path, "<f4", shape, data, |v| v.to_le_bytes())
}

/// Writes a little-endian int32 array of `shape` (C order) to `path`, atomically.
pub fn write_i32(path: &Path, shape: &[u64], data: &[i32]) -> std::io::Result<()> {
    write_le(path, "<i4", shape, data, |v| v.to_le_bytes())
}

fn write_le<T: Copy>(
    path: &Path,
    descr: &str,
    shape: &[u64],
    data: &[T],
    bytes: fn(T) -> [u8; 4],
) -> std::io::Result<()> {
    let n: u64 = shape.iter().product();
    if n != data.len() as u64 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("shape {shape:?} does not hold {} values", data.len()),
        ));
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    {
        let mut w = std::io::BufWriter::new(tmp.as_file_mut());
        w.write_all(&header(descr, shape))?;
        for chunk in data.chunks(1 << 16) {
            let b: Vec<u8> = chunk.iter().flat_map(|&v| bytes(v)).collect();
            w.write_all(&b)?;
        }
        w.flush()?;
    }
    crate::gguf::readable_by_all(tmp.as_file())?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

fn header(descr: &str, shape: &[u64]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // Magic (6) + version (2) + header length (2) + dict + newline, padded to a multiple of 64.
    let total = (10 + dict.len() + 1).div_ceil(64) * 64;
    dict.push_str(&" ".repeat(total - 10 - dict.len() - 1));
    dict.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out
}

/// An array read from a `.npy` file, widened to f64 (exact for f32 and i32).
#[derive(Debug, Clone)]
pub struct NpyArray {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

/// Reads a C-order little-endian `<f4`, `<f8`, `<i4` or `<i8` array.
pub fn read(path: &Path) -> std::io::Result<NpyArray> {
    let bytes = std::fs::read(path)?;
    parse(&bytes).map_err(|m| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: {m}", path.display()),
        )
    })
}

pub fn parse(bytes: &[u8]) -> Result<NpyArray, String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not a .npy file".into());
    }
    let (hlen, hstart) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize,
            12,
        ),
        v => return Err(format!("unsupported .npy version {v}")),
    };
    let dict = bytes
        .get(hstart..hstart + hlen)
        .and_then(|h| std::str::from_utf8(h).ok())
        .ok_or("truncated header")?;
    let field = |name: &str| -> Result<&str, String> {
        let i = dict
            .find(&format!("'{name}'"))
            .ok_or(format!("no '{name}' in header"))?;
        Ok(dict[i + name.len() + 2..].trim_start_matches([':', ' ']))
    };
    let descr = field("descr")?;
    let descr = descr.get(1..4).ok_or("bad descr")?;
    if field("fortran_order")?.starts_with("True") {
        return Err("Fortran order is not supported".into());
    }
    let shape_text = field("shape")?;
    let shape_text = &shape_text[1..shape_text.find(')').ok_or("bad shape")?];
    let shape: Vec<usize> = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| format!("bad dimension '{s}'")))
        .collect::<Result<_, _>>()?;
    let n: usize = shape.iter().product();
    let body = &bytes[hstart + hlen..];
    let size = match descr {
        "<f4" | "<i4" => 4,
        "<f8" | "<i8" => 8,
        d => return Err(format!("unsupported dtype {d}")),
    };
    if body.len() < n * size {
        return Err(format!(
            "data holds {} bytes, shape needs {}",
            body.len(),
            n * size
        ));
    }
    let data = body[..n * size]
        .chunks_exact(size)
        .map(|c| match descr {
            "<f4" => f32::from_le_bytes(c.try_into().unwrap()) as f64,
            "<i4" => i32::from_le_bytes(c.try_into().unwrap()) as f64,
            "<f8" => f64::from_le_bytes(c.try_into().unwrap()),
            _ => i64::from_le_bytes(c.try_into().unwrap()) as f64,
        })
        .collect();
    Ok(NpyArray { shape, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.npy");
        let data: Vec<f32> = (0..6).map(|i| i as f32 * 0.5).collect();
        write_f32(&p, &[2, 3], &data).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!((bytes.len() - 24) % 64, 0, "header padded to 64");
        let a = read(&p).unwrap();
        assert_eq!(a.shape, vec![2, 3]);
        assert_eq!(a.data, data.iter().map(|&v| v as f64).collect::<Vec<_>>());
    }
}
