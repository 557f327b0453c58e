//! The GGUF reader and writer: against a file written by the `gguf` Python package (llama.cpp's own
//! writer), through a round trip, and against a corpus of malformed files that must each give a clear
//! error and never a panic.

use std::path::{Path, PathBuf};

use deltaq::gguf::{GgufError, GgufFile, GgufWriter, OwnedValue, TensorSpec, ValueType};
use deltaq::quant::GgmlType;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Copies every key and tensor of `f` into a writer, unchanged.
fn copy_writer(f: &GgufFile) -> GgufWriter {
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        w.set(k, v.to_owned_value());
    }
    for t in f.tensors() {
        w.add_tensor(TensorSpec::new(&t.name, t.ty, &t.ne)).unwrap();
    }
    w
}

fn write_to_vec(w: &GgufWriter, f: &GgufFile) -> Vec<u8> {
    let mut out = Vec::new();
    w.write(&mut out, |i, _, dst| -> Result<(), GgufError> {
        dst.write_all(f.tensor_data(&f.tensors()[i]))
            .map_err(|e| GgufError::Io(e.to_string()))
    })
    .unwrap();
    out
}

#[test]
fn reads_a_file_written_by_gguf_py_and_rewrites_it_byte_for_byte() {
    let path = fixture("quant-vectors.gguf");
    let original = std::fs::read(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.tensors().len(), 240);
    assert!(f.is_ggml_strict_layout());
    assert_eq!(
        f.get_str("general.architecture").unwrap(),
        "deltaq-quant-vectors"
    );
    let t = f.tensor("pure-Q4_K:blk.0.attn_qkv.weight").unwrap();
    assert_eq!(
        (t.ty, t.ne.as_slice(), t.nbytes),
        (GgmlType::Q4_K, &[256u64, 8][..], 8 * 144)
    );
    let t = f.tensor("src:token_embd.weight").unwrap();
    assert_eq!((t.ty, t.ne.as_slice()), (GgmlType::F32, &[256u64, 8][..]));

    let w = copy_writer(&f);
    assert_eq!(w.file_size().unwrap(), original.len() as u64);
    assert!(
        write_to_vec(&w, &f) == original,
        "our writer differs from gguf-py's on the same content"
    );
}

#[test]
fn round_trip_every_value_type() {
    let mut w = GgufWriter::new();
    w.set("general.architecture", OwnedValue::str("test"));
    w.set("u8", OwnedValue::U8(200));
    w.set("i8", OwnedValue::I8(-100));
    w.set("u16", OwnedValue::U16(60000));
    w.set("i16", OwnedValue::I16(-30000));
    w.set("u32", OwnedValue::U32(4_000_000_000));
    w.set("i32", OwnedValue::I32(-2_000_000_000));
    w.set("f32", OwnedValue::F32(1.5e-6));
    w.set("bool", OwnedValue::Bool(true));
    w.set("str", OwnedValue::str("héllo, 日本語"));
    w.set("u64", OwnedValue::U64(u64::MAX));
    w.set("i64", OwnedValue::I64(i64::MIN));
    w.set("f64", OwnedValue::F64(std::f64::consts::PI));
    w.set("strings", OwnedValue::strings(&["a", "", "ccc"]));
    w.set(
        "ints",
        OwnedValue::Array(
            ValueType::I32,
            vec![OwnedValue::I32(-1), OwnedValue::I32(7)],
        ),
    );
    w.set(
        "bools",
        OwnedValue::Array(
            ValueType::Bool,
            vec![OwnedValue::Bool(false), OwnedValue::Bool(true)],
        ),
    );
    w.set("empty", OwnedValue::Array(ValueType::F32, vec![]));
    let specs = [
        TensorSpec::new("a", GgmlType::F32, &[3, 2]),
        TensorSpec::new("b", GgmlType::Q8_0, &[64, 3]),
        TensorSpec::new("c", GgmlType::Q6_K, &[256]),
        TensorSpec::new("d", GgmlType::F16, &[5, 1, 2, 3]),
    ];
    for s in &specs {
        w.add_tensor(s.clone()).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.gguf");
    let size = w
        .write_to_path(&path, false, |i, s, dst| -> Result<(), GgufError> {
            let bytes: Vec<u8> = (0..s.nbytes())
                .map(|b| (b as u8).wrapping_mul(31).wrapping_add(i as u8))
                .collect();
            dst.write_all(&bytes)
                .map_err(|e| GgufError::Io(e.to_string()))
        })
        .unwrap();
    assert_eq!(size, std::fs::metadata(&path).unwrap().len());
    assert_eq!(size, w.file_size().unwrap());
    // Only the output remains in the folder: the temporary file was renamed.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

    let f = GgufFile::open(&path).unwrap();
    assert!(f.is_ggml_strict_layout());
    let keys: Vec<&str> = f.keys().collect();
    assert_eq!(keys.len(), 17);
    for (k, v) in f.metadata() {
        assert_eq!(Some(&v.to_owned_value()), w.get(k), "key {k}");
    }
    for (i, s) in specs.iter().enumerate() {
        let (t, data) = f.tensor_by_name(&s.name).unwrap();
        assert_eq!((t.ty, &t.ne), (s.ty, &s.ne));
        assert_eq!(t.offset % 32, 0);
        let expect: Vec<u8> = (0..s.nbytes())
            .map(|b| (b as u8).wrapping_mul(31).wrapping_add(i as u8))
            .collect();
        assert_eq!(data, &expect[..]);
    }
    let strings: Vec<&[u8]> = f.get_array("strings").unwrap().strings().unwrap().collect();
    assert_eq!(strings, vec![&b"a"[..], b"", b"ccc"]);

    // An existing output is not overwritten unless asked, and a failing fill leaves nothing behind.
    let again = w.write_to_path(&path, false, |_, _, _| -> Result<(), GgufError> { Ok(()) });
    assert!(again.is_err());
    let fail = dir.path().join("fail.gguf");
    let r = w.write_to_path(&fail, false, |_, _, _| -> Result<(), GgufError> {
        Err(GgufError::Io("source vanished".into()))
    });
    assert!(r.is_err());
    assert!(!fail.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn writer_rejects_what_ggml_would() {
    let mut w = GgufWriter::new();
    assert!(
        w.add_tensor(TensorSpec::new("x", GgmlType::Q4_K, &[128, 2]))
            .is_err(),
        "row not a block multiple"
    );
    assert!(
        w.add_tensor(TensorSpec::new("x".repeat(64), GgmlType::F32, &[1]))
            .is_err(),
        "name too long"
    );
    assert!(
        w.add_tensor(TensorSpec::new("x", GgmlType::F32, &[1, 1, 1, 1, 1]))
            .is_err(),
        "5 dims"
    );
    assert!(
        w.add_tensor(TensorSpec::new("x", GgmlType::F32, &[0]))
            .is_err(),
        "zero dim"
    );
    w.add_tensor(TensorSpec::new("x", GgmlType::F32, &[1]))
        .unwrap();
    assert!(
        w.add_tensor(TensorSpec::new("x", GgmlType::F32, &[1]))
            .is_err(),
        "duplicate"
    );
    w.set("nested", OwnedValue::Array(ValueType::Array, vec![]));
    assert!(w.file_size().is_err(), "nested arrays");
    w.set(
        "nested",
        OwnedValue::Array(ValueType::U8, vec![OwnedValue::U16(1)]),
    );
    assert!(w.file_size().is_err(), "mixed array");
    w.remove("nested");
    w.set("general.alignment", OwnedValue::U32(48));
    assert!(w.file_size().is_err(), "alignment not a power of two");
    w.set("general.alignment", OwnedValue::U32(64));
    assert_eq!(w.file_size().unwrap() % 64, 0);
}

// ---- malformed files -------------------------------------------------------------------------------

/// Raw GGUF encoder for building broken files.
#[derive(Default, Clone)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw(b"GGUF".to_vec());
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn u32(&mut self, v: u32) -> &mut Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Raw {
        self.0.extend_from_slice(b);
        self
    }
    fn str(&mut self, s: &[u8]) -> &mut Raw {
        self.u64(s.len() as u64).bytes(s)
    }
    fn kv_u32(&mut self, key: &str, v: u32) -> &mut Raw {
        self.str(key.as_bytes()).u32(4).u32(v)
    }
    fn tensor(&mut self, name: &str, ne: &[u64], ty: u32, offset: u64) -> &mut Raw {
        self.str(name.as_bytes()).u32(ne.len() as u32);
        for &d in ne {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    fn pad_data(&mut self, data_len: usize) -> Vec<u8> {
        let mut v = self.0.clone();
        v.resize(v.len().div_ceil(32) * 32 + data_len, 0);
        v
    }
}

fn open(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
    std::panic::catch_unwind(|| GgufFile::from_bytes(bytes)).expect("the reader panicked")
}

fn expect_err(name: &str, bytes: Vec<u8>, needle: &str) {
    match open(bytes) {
        Ok(_) => panic!("{name}: accepted"),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.to_lowercase().contains(&needle.to_lowercase()),
                "{name}: unclear error '{msg}'"
            );
        }
    }
}

/// A small valid file with every section: two KVs (one string array) and two tensors.
fn valid_small() -> Vec<u8> {
    let mut r = Raw::header(3, 2, 2);
    r.str(b"general.architecture").u32(8).str(b"qwen35");
    r.str(b"tokens")
        .u32(9)
        .u32(8)
        .u64(3)
        .str(b"a")
        .str(b"bb")
        .str(b"");
    r.tensor("w", &[32, 2], 8, 0).tensor("n", &[4], 0, 96);
    r.pad_data(96 + 16)
}

#[test]
fn valid_small_file_opens() {
    let f = open(valid_small()).unwrap();
    assert_eq!(f.tensors().len(), 2);
    assert_eq!(f.tensor("w").unwrap().nbytes, 68);
    assert_eq!(f.get_array("tokens").unwrap().len, 3);
}

#[test]
fn every_truncation_is_an_error() {
    let full = valid_small();
    for len in 0..full.len() {
        let r = open(full[..len].to_vec());
        assert!(
            r.is_err(),
            "truncated to {len} of {} bytes was accepted",
            full.len()
        );
    }
}

#[test]
fn malformed_corpus_gives_clear_errors() {
    let data = |r: &mut Raw, n: usize| r.pad_data(n);
    expect_err("empty", vec![], "not a GGUF");
    expect_err("bad magic", b"GGML\x03\0\0\0".to_vec(), "magic");
    expect_err("version 0", Raw::header(0, 0, 0).0, "version");
    expect_err("version 4", Raw::header(4, 0, 0).0, "version");
    expect_err(
        "big endian",
        Raw::header(3u32.swap_bytes(), 0, 0).0,
        "big-endian",
    );
    expect_err("negative count", Raw::header(3, u64::MAX, 0).0, "negative");
    expect_err("huge tensor count", Raw::header(3, 1 << 40, 0).0, "tensors");
    expect_err("huge kv count", Raw::header(3, 0, 1 << 40).0, "metadata");
    expect_err(
        "huge string",
        Raw::header(3, 0, 1).u64(1 << 50).0.clone(),
        "claims",
    );
    expect_err(
        "string past end",
        Raw::header(3, 0, 1).u64(100).bytes(b"abc").0.clone(),
        "truncated",
    );
    expect_err(
        "non-utf8 key",
        Raw::header(3, 0, 1)
            .str(b"\xff\xfe")
            .u32(4)
            .u32(1)
            .0
            .clone(),
        "UTF-8",
    );
    expect_err(
        "empty key",
        Raw::header(3, 0, 1).str(b"").u32(4).u32(1).0.clone(),
        "empty",
    );
    expect_err(
        "unknown value type",
        Raw::header(3, 0, 1).str(b"k").u32(13).u32(1).0.clone(),
        "unknown value type",
    );
    expect_err(
        "duplicate key",
        Raw::header(3, 0, 2).kv_u32("k", 1).kv_u32("k", 2).0.clone(),
        "duplicate",
    );
    expect_err(
        "bool 2",
        Raw::header(3, 0, 1).str(b"k").u32(7).bytes(&[2]).0.clone(),
        "bool",
    );
    expect_err(
        "huge array",
        Raw::header(3, 0, 1)
            .str(b"k")
            .u32(9)
            .u32(8)
            .u64(1 << 40)
            .0
            .clone(),
        "claims",
    );
    expect_err(
        "array count beyond data",
        Raw::header(3, 0, 1)
            .str(b"k")
            .u32(9)
            .u32(8)
            .u64(1 << 20)
            .0
            .clone(),
        "truncated",
    );
    expect_err(
        "unknown array element type",
        Raw::header(3, 0, 1)
            .str(b"k")
            .u32(9)
            .u32(77)
            .u64(1)
            .0
            .clone(),
        "element type",
    );
    let mut deep = Raw::header(3, 0, 1);
    deep.str(b"k").u32(9);
    for _ in 0..6 {
        deep.u32(9).u64(1);
    }
    expect_err("deeply nested arrays", deep.0.clone(), "nested");
    expect_err(
        "alignment wrong type",
        Raw::header(3, 0, 1)
            .str(b"general.alignment")
            .u32(10)
            .u64(32)
            .0
            .clone(),
        "alignment",
    );
    expect_err(
        "alignment zero",
        Raw::header(3, 0, 1)
            .kv_u32("general.alignment", 0)
            .0
            .clone(),
        "power of two",
    );
    expect_err(
        "alignment 48",
        Raw::header(3, 0, 1)
            .kv_u32("general.alignment", 48)
            .0
            .clone(),
        "power of two",
    );

    let one = |name: &str, ne: &[u64], ty: u32, off: u64, n: usize| {
        let mut r = Raw::header(3, 1, 0);
        r.tensor(name, ne, ty, off);
        data(&mut r, n)
    };
    expect_err("5 dims", one("t", &[1, 1, 1, 1, 1], 0, 0, 4), "dimensions");
    expect_err("zero dim", one("t", &[4, 0], 0, 0, 0), "zero dimension");
    expect_err(
        "dims overflow",
        one("t", &[1 << 40, 1 << 40], 0, 0, 0),
        "overflow",
    );
    expect_err(
        "removed type 4",
        one("t", &[32], 4, 0, 32),
        "unknown ggml type",
    );
    expect_err(
        "removed type 31",
        one("t", &[32], 31, 0, 32),
        "unknown ggml type",
    );
    expect_err(
        "unknown type 99",
        one("t", &[32], 99, 0, 32),
        "unknown ggml type",
    );
    expect_err(
        "row not block multiple",
        one("t", &[33], 8, 0, 64),
        "multiple",
    );
    expect_err("misaligned offset", one("t", &[4], 0, 8, 64), "alignment");
    expect_err(
        "data past end",
        one("t", &[1024], 0, 0, 100),
        "ends at byte",
    );
    expect_err(
        "offset overflow",
        one("t", &[4], 0, u64::MAX - 31, 0),
        "overflow",
    );
    expect_err("empty name", one("", &[4], 0, 0, 16), "empty name");
    expect_err(
        "long name",
        one(&"x".repeat(64), &[4], 0, 0, 16),
        "name is 64 bytes",
    );
    let mut r = Raw::header(3, 1, 0);
    r.str(b"\xc3\x28").u32(1).u64(4).u32(0).u64(0);
    expect_err("non-utf8 name", data(&mut r, 16), "not UTF-8");

    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[64], 0, 0).tensor("a", &[4], 0, 256);
    expect_err("duplicate tensor", data(&mut r, 512), "duplicate tensor");
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[64], 0, 0).tensor("b", &[4], 0, 128);
    expect_err("overlapping tensors", data(&mut r, 512), "overlap");
}

/// Deterministic byte flips and splices of a valid file: the reader may accept or reject, never panic.
#[test]
fn mutated_files_never_panic() {
    let base = valid_small();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..20_000 {
        let mut m = base.clone();
        for _ in 0..1 + next() % 4 {
            let i = (next() % m.len() as u64) as usize;
            match next() % 3 {
                0 => m[i] = next() as u8,
                1 => m[i] ^= 1 << (next() % 8),
                _ => m[i] = [0x00, 0xff, 0x7f, 0x80][(next() % 4) as usize],
            }
        }
        if let Ok(f) = open(m) {
            for (_, v) in f.metadata() {
                if let Some(a) = v.as_array() {
                    a.iter().count();
                }
            }
            for t in f.tensors() {
                assert_eq!(f.tensor_data(t).len() as u64, t.nbytes);
            }
        }
    }
}

#[test]
fn opening_a_missing_file_names_it() {
    let e = GgufFile::open("no/such/model.gguf")
        .unwrap_err()
        .to_string();
    assert!(e.contains("no/such/model.gguf"), "{e}");
}
