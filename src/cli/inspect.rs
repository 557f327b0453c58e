use std::fmt::Write as _;
use std::path::PathBuf;

use deltaq::gguf::{GgufFile, Value};

#[derive(clap::Args)]
pub struct Args {
    /// GGUF file
    file: PathBuf,
    /// Print arrays and long strings in full instead of their beginning
    #[arg(long)]
    full: bool,
}

/// Array elements shown before "...".
const ARRAY_PREVIEW: usize = 8;
/// Characters of a long string (a chat template) shown before "...".
const STRING_PREVIEW: usize = 60;

pub fn run(a: Args) -> anyhow::Result<()> {
    let f = GgufFile::open(&a.file)?;
    let mut out = String::new();
    writeln!(out, "* File is LITTLE endian, GGUF version {}", f.version)?;
    writeln!(out, "* Dumping {} key/value pair(s)", f.n_kv() + 3)?;
    writeln!(
        out,
        "{:>7}: {:<10} | {:>8} | GGUF.version = {}",
        1, "UINT32", 1, f.version
    )?;
    writeln!(
        out,
        "{:>7}: {:<10} | {:>8} | GGUF.tensor_count = {}",
        2,
        "UINT64",
        1,
        f.tensors().len()
    )?;
    writeln!(
        out,
        "{:>7}: {:<10} | {:>8} | GGUF.kv_count = {}",
        3,
        "UINT64",
        1,
        f.n_kv()
    )?;
    for (i, (key, v)) in f.metadata().enumerate() {
        let (ty, n) = match v {
            Value::Array(arr) => (format!("[{}]", arr.elem_type.name()), arr.len),
            _ => (v.value_type().name().to_string(), 1),
        };
        writeln!(
            out,
            "{:>7}: {:<10} | {:>8} | {key} = {}",
            i + 4,
            ty,
            n,
            show(&v, a.full)
        )?;
    }
    writeln!(out, "* Dumping {} tensor(s)", f.tensors().len())?;
    writeln!(
        out,
        "{:>7}: {:>12} | {:>31} | {:<7} | {:>12} | {:>12} | name",
        "#", "elements", "ne", "type", "offset", "bytes"
    )?;
    let (mut elements, mut bytes) = (0u64, 0u64);
    for (i, t) in f.tensors().iter().enumerate() {
        let mut ne = t.ne.clone();
        ne.resize(4, 1);
        let ne: Vec<String> = ne.iter().map(|d| format!("{d:>6}")).collect();
        writeln!(
            out,
            "{:>7}: {:>12} | {} | {:<7} | {:>12} | {:>12} | {}",
            i + 1,
            t.n_elements(),
            ne.join(", "),
            t.ty.name(),
            f.data_start + t.offset,
            t.nbytes,
            t.name
        )?;
        elements += t.n_elements();
        bytes += t.nbytes;
    }
    let bpw = if elements > 0 {
        bytes as f64 * 8.0 / elements as f64
    } else {
        0.0
    };
    writeln!(
        out,
        "* Total: {} tensors, {} elements, {} bytes of tensor data ({:.2} MiB), {:.4} bits per weight",
        f.tensors().len(),
        elements,
        bytes,
        bytes as f64 / (1024.0 * 1024.0),
        bpw
    )?;
    if f.get_str("general.architecture").ok() == Some(deltaq::vision::mmproj::ARCH) {
        writeln!(out, "{}", mmproj_summary(&f))?;
    }
    print!("{out}");
    Ok(())
}

/// One line on what an mmproj file holds as deltaq reads it, or why it cannot.
fn mmproj_summary(f: &GgufFile) -> String {
    use deltaq::vision::tower::VisionModel;
    match VisionModel::load(f) {
        Ok(m) => {
            let (hp, im) = (&m.hp, &m.hp.image);
            let pixels = |p: Option<u64>| p.map_or("-".to_string(), |p| p.to_string());
            format!(
                "* Vision tower (mmproj, {}): {} blocks, width {} ({} heads of {}), FFN {}, output width {} \
                 (the text model's); patch {} px, merge {}x{} ({} px per token), position table {}x{}; \
                 image mean {:?}, std {:?}, min/max pixels {}/{}",
                deltaq::vision::mmproj::PROJECTOR,
                hp.n_layer,
                hp.n_embd,
                hp.n_head,
                hp.head_dim,
                hp.n_ff,
                hp.n_out,
                im.patch_size,
                im.merge_size,
                im.merge_size,
                im.factor(),
                hp.pos_side,
                hp.pos_side,
                im.image_mean,
                im.image_std,
                pixels(im.min_pixels),
                pixels(im.max_pixels)
            )
        }
        Err(e) => format!("* mmproj that deltaq cannot run: {e:#}"),
    }
}

/// A value as gguf-dump shows it: strings quoted, long arrays abbreviated.
fn show(v: &Value<'_>, full: bool) -> String {
    match v {
        Value::String(s) => {
            let text = String::from_utf8_lossy(s);
            match text.char_indices().nth(STRING_PREVIEW) {
                Some((cut, _)) if !full => format!("{:?}... ({} bytes)", &text[..cut], s.len()),
                _ => format!("{text:?}"),
            }
        }
        Value::Array(arr) => {
            let limit = if full { usize::MAX } else { ARRAY_PREVIEW };
            let mut items: Vec<String> = arr.iter().take(limit).map(|e| show(&e, full)).collect();
            if arr.len > limit {
                items.push(format!("... {} more", arr.len - limit));
            }
            format!("[{}]", items.join(", "))
        }
        Value::Bool(b) => b.to_string(),
        Value::F32(x) => format!("{x}"),
        Value::F64(x) => format!("{x}"),
        other => match other.as_int() {
            Some(i) => i.to_string(),
            None => format!("{other:?}"),
        },
    }
}
