//! `deltaq quantize` against `llama-quantize`: the same recipe on the same F32 file must give the same
//! file, tensor types, data and metadata (tiny-r2 fixtures, copied by tools/fetch-fixtures.sh).

use std::path::{Path, PathBuf};

use deltaq::gguf::GgufFile;
use deltaq::quantize::{quantize_file, FileType, QuantizeOptions};

fn shared(rel: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/shared")
        .join(rel);
    assert!(
        p.exists(),
        "{} is missing: run tools/fetch-fixtures.sh",
        p.display()
    );
    p
}

fn check(reference: &str, ftype: FileType, pure: bool) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    let opts = QuantizeOptions {
        ftype,
        pure,
        keep: vec![],
        overwrite: false,
        progress: false,
        imatrix: None,
        token_embedding_type: None,
        output_tensor_type: None,
        tensor_types: Vec::new(),
    };
    quantize_file(&shared("tiny-r2/tiny-r2-F32.gguf"), &out, &opts).unwrap();
    let ours = GgufFile::open(&out).unwrap();
    let theirs = GgufFile::open(shared(&format!("tiny-r2/quant/{reference}"))).unwrap();

    let names = |f: &GgufFile| {
        f.tensors()
            .iter()
            .map(|t| (t.name.clone(), t.ty, t.ne.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(&ours),
        names(&theirs),
        "{reference}: tensor order, types or shapes differ"
    );
    for t in theirs.tensors() {
        let (_, data) = ours.tensor_by_name(&t.name).unwrap();
        assert!(
            data == theirs.tensor_data(t),
            "{reference}: data of {} ({}) differs",
            t.name,
            t.ty
        );
    }
    let keys = |f: &GgufFile| f.keys().map(str::to_string).collect::<Vec<_>>();
    assert_eq!(
        keys(&ours),
        keys(&theirs),
        "{reference}: metadata keys or their order differ"
    );
    for (k, v) in theirs.metadata() {
        assert_eq!(
            ours.get(k).unwrap().to_owned_value(),
            v.to_owned_value(),
            "{reference}: metadata {k}"
        );
    }
    assert!(
        std::fs::read(&out).unwrap()
            == std::fs::read(shared(&format!("tiny-r2/quant/{reference}"))).unwrap(),
        "{reference}: same content but the files differ"
    );
}

macro_rules! file_test {
    ($name:ident, $file:literal, $ftype:ident, $pure:literal) => {
        #[test]
        fn $name() {
            check($file, FileType::$ftype, $pure);
        }
    };
}

file_test!(q2_k, "tiny-r2-Q2_K.gguf", Q2_K, false);
file_test!(q3_k_m, "tiny-r2-Q3_K_M.gguf", Q3_K_M, false);
file_test!(q4_k_m, "tiny-r2-Q4_K_M.gguf", Q4_K_M, false);
file_test!(q5_k_m, "tiny-r2-Q5_K_M.gguf", Q5_K_M, false);
file_test!(pure_q2_k, "tiny-r2-pure-Q2_K.gguf", Q2_K, true);
file_test!(pure_q3_k, "tiny-r2-pure-Q3_K.gguf", Q3_K_M, true);
file_test!(pure_q4_0, "tiny-r2-pure-Q4_0.gguf", Q4_0, true);
file_test!(pure_q4_1, "tiny-r2-pure-Q4_1.gguf", Q4_1, true);
file_test!(pure_q4_k, "tiny-r2-pure-Q4_K.gguf", Q4_K_M, true);
file_test!(pure_q5_0, "tiny-r2-pure-Q5_0.gguf", Q5_0, true);
file_test!(pure_q5_1, "tiny-r2-pure-Q5_1.gguf", Q5_1, true);
file_test!(pure_q5_k, "tiny-r2-pure-Q5_K.gguf", Q5_K_M, true);
file_test!(pure_q6_k, "tiny-r2-pure-Q6_K.gguf", Q6_K, true);
file_test!(pure_q8_0, "tiny-r2-pure-Q8_0.gguf", Q8_0, true);

#[test]
fn refuses_to_overwrite_and_leaves_no_partial_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    std::fs::write(&out, b"keep me").unwrap();
    let opts = QuantizeOptions {
        ftype: FileType::Q8_0,
        pure: false,
        keep: vec![],
        overwrite: false,
        progress: false,
        imatrix: None,
        token_embedding_type: None,
        output_tensor_type: None,
        tensor_types: Vec::new(),
    };
    let e = quantize_file(&shared("tiny-r2/tiny-r2-F32.gguf"), &out, &opts).unwrap_err();
    assert!(e.to_string().contains("exists"), "{e}");
    assert_eq!(std::fs::read(&out).unwrap(), b"keep me");
    // The input cannot be the output.
    let input = shared("tiny-r2/tiny-r2-F32.gguf");
    let opts = QuantizeOptions {
        overwrite: true,
        ..opts
    };
    assert!(quantize_file(&input, &input, &opts).is_err());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn keep_pattern_leaves_tensors_alone() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    let opts = QuantizeOptions {
        ftype: FileType::Q4_K_M,
        pure: false,
        keep: vec!["attn_qkv".into(), "blk.*.ssm_out.weight".into()],
        overwrite: false,
        progress: false,
        imatrix: None,
        token_embedding_type: None,
        output_tensor_type: None,
        tensor_types: Vec::new(),
    };
    quantize_file(&shared("tiny-r2/tiny-r2-F32.gguf"), &out, &opts).unwrap();
    let f = GgufFile::open(&out).unwrap();
    for t in f.tensors() {
        let kept = t.name.contains("attn_qkv") || t.name.ends_with("ssm_out.weight");
        if kept {
            assert_eq!(t.ty, deltaq::quant::GgmlType::F32, "{}", t.name);
        }
    }
    assert_eq!(f.get_u64("general.file_type").unwrap(), 15);
}
