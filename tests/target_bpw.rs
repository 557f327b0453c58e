//! `deltaq quantize --target-bpw`: on tiny-r2 with its importance matrix (tests/fixtures/imatrix), the
//! file stays within the target, mixes types, loads and runs; bad targets are clear errors.

use std::path::{Path, PathBuf};

use deltaq::gguf::GgufFile;
use deltaq::model::Model;
use deltaq::perplexity::{self as ppl, Options, Plan};
use deltaq::quant::GgmlType;
use deltaq::quantize::{
    quantize_file_to_bpw, quantize_file_to_bpw_sampled, FileType, ImatrixOptions, QuantizeOptions,
    TARGET_BPW_KEY,
};

fn root(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn model() -> PathBuf {
    let p = root("tests/fixtures/shared/tiny-r2/tiny-r2-F32.gguf");
    assert!(
        p.exists(),
        "{} is missing: run tools/fetch-fixtures.sh",
        p.display()
    );
    p
}

fn options(imatrix: bool) -> QuantizeOptions {
    QuantizeOptions {
        ftype: FileType::F32,
        pure: false,
        keep: vec![],
        overwrite: false,
        progress: false,
        imatrix: imatrix.then(|| ImatrixOptions {
            path: root("tests/fixtures/imatrix/tiny-r2.imatrix.gguf"),
            include: vec![],
            exclude: vec![],
        }),
        token_embedding_type: None,
        output_tensor_type: None,
        tensor_types: Vec::new(),
    }
}

/// Bits per weight as the perplexity table counts them.
fn bpw(f: &GgufFile) -> f64 {
    let (mut bytes, mut n) = (0u64, 0u64);
    for t in f.tensors() {
        bytes += f.tensor_data(t).len() as u64;
        n += t.n_elements();
    }
    bytes as f64 * 8.0 / n as f64
}

/// Measuring 16 rows per tensor keeps the test fast; the allocation is the same code.
const ROWS: usize = 16;

#[test]
fn within_the_target_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let src = model();
    let mut last_bpw = f64::INFINITY;
    for target in [4.0, 2.75] {
        let out = dir.path().join(format!("bpw{target}.gguf"));
        let r = quantize_file_to_bpw_sampled(&src, &out, target, &options(true), ROWS).unwrap();
        let f = GgufFile::open(&out).unwrap();
        let got = bpw(&f);
        assert!(got <= target, "{target}: {got} bpw");
        assert!(
            got > target - 0.25,
            "{target}: {got} bpw leaves much unused"
        );
        assert!((r.summary.bits_per_weight() - got).abs() < 1e-9);
        assert!(got < last_bpw);
        last_bpw = got;
        assert_eq!(f.get_f32(TARGET_BPW_KEY).unwrap(), target as f32);
        assert_eq!(
            f.get_u64("general.file_type").unwrap(),
            r.file_type.id() as u64
        );
        assert!(f.get("quantize.imatrix.file").is_some());
        let quantized: Vec<GgmlType> = f
            .tensors()
            .iter()
            .map(|t| t.ty)
            .filter(|t| t.is_quantized())
            .collect();
        assert!(
            quantized.iter().any(|&t| t != quantized[0]),
            "{target}: a mixture, not one type: {quantized:?}"
        );
        // norms and the other tensors llama-quantize never quantizes stay F32
        assert_eq!(
            f.tensor_by_name("output_norm.weight").unwrap().0.ty,
            GgmlType::F32
        );

        // It loads, and its predictions are close to the F32 model's.
        let base = GgufFile::open(&src).unwrap();
        let (m32, mq) = (Model::load(&base).unwrap(), Model::load(&f).unwrap());
        let tokens: Vec<u32> = (0..128u32).map(|i| (i * 37 + 11) % 1000).collect();
        let plan = Plan::new(
            tokens.len(),
            &Options {
                n_ctx: 64,
                n_batch: 64,
                max_chunks: Some(1),
                ..Options::default()
            },
        )
        .unwrap();
        let s = ppl::evaluate(&[&m32, &mq], 0, &tokens, &plan, &mut |_| {}, None).unwrap();
        let kl = s[1].kl.as_ref().unwrap().mean;
        assert!(
            s[1].ppl().is_finite() && kl.is_finite(),
            "{target}: KL {kl}"
        );
    }
}

#[test]
fn without_an_imatrix_no_low_bit_iq_types() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    quantize_file_to_bpw_sampled(&model(), &out, 3.5, &options(false), ROWS).unwrap();
    let f = GgufFile::open(&out).unwrap();
    assert!(bpw(&f) <= 3.5);
    for t in f.tensors() {
        assert!(
            !matches!(
                t.ty,
                GgmlType::IQ1_S
                    | GgmlType::IQ1_M
                    | GgmlType::IQ2_XXS
                    | GgmlType::IQ2_XS
                    | GgmlType::IQ2_S
                    | GgmlType::IQ3_XXS
            ) || t.name == "token_embd.weight"
                || t.name == "output.weight",
            "{} is {} without importance weights",
            t.name,
            t.ty
        );
    }
    assert!(f.get("quantize.imatrix.file").is_none());
}

#[test]
fn bad_targets_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let e = quantize_file_to_bpw(&model(), &out, bad, &options(true))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("positive number of bits per weight"),
            "{bad}: {e}"
        );
    }
    // Below IQ1_S everywhere (the norms stay F32): the smallest possible is reported.
    let e = quantize_file_to_bpw_sampled(&model(), &out, 1.0, &options(true), 1)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("below the smallest this file can be made"),
        "{e}"
    );
    let e = quantize_file_to_bpw_sampled(&model(), &out, 2.0, &options(false), 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("--imatrix"), "without a matrix, the hint: {e}");
    assert!(!out.exists(), "nothing written");
}
