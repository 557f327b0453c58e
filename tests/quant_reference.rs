//! Quantization and dequantization against llama.cpp: the blocks in `tests/fixtures/quant-vectors.gguf`
//! were written by `llama-quantize` (no importance matrix) from the F32 rows stored beside them, and the
//! stored sha256 of each tensor's dequantization comes from the `gguf` Python package
//! (see tools/make_quant_vectors.py).

use std::collections::BTreeMap;
use std::path::Path;

use deltaq::gguf::GgufFile;
use deltaq::quant::{dequantize_row, quantize_row, GgmlType};
use sha2::{Digest, Sha256};

fn vectors() -> GgufFile {
    GgufFile::open(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant-vectors.gguf"))
        .unwrap()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn sha256_f32(v: &[f32]) -> String {
    let mut h = Sha256::new();
    for x in v {
        h.update(x.to_le_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Every quantized tensor of the fixture, with its F32 source rows.
fn cases(f: &GgufFile) -> Vec<(String, GgmlType, &[u8], Vec<f32>)> {
    let mut out = Vec::new();
    for t in f.tensors() {
        let Some((_, tensor)) = t.name.split_once(':').filter(|(tag, _)| *tag != "src") else {
            continue;
        };
        let (_, src) = f.tensor_by_name(&format!("src:{tensor}")).unwrap();
        out.push((t.name.clone(), t.ty, f.tensor_data(t), f32s(src)));
    }
    assert!(
        out.len() > 200,
        "fixture holds {} quantized tensors",
        out.len()
    );
    out
}

#[test]
fn dequantization_equals_gguf_py() {
    let f = vectors();
    let mut per_type = BTreeMap::new();
    for (name, ty, data, src) in cases(&f) {
        let mut out = vec![0f32; src.len()];
        dequantize_row(ty, data, &mut out).unwrap();
        let expect = f.get_str(&format!("sha256.{name}")).unwrap();
        assert_eq!(
            sha256_f32(&out),
            expect,
            "{name} ({ty}): dequantization differs from the gguf package"
        );
        *per_type.entry(ty.name()).or_insert(0) += 1;
    }
    // All ten weight formats are covered.
    assert_eq!(per_type.len(), 10, "{per_type:?}");
}

#[test]
fn quantization_is_byte_identical_to_llama_quantize() {
    let f = vectors();
    let mut failures = Vec::new();
    for (name, ty, expect, src) in cases(&f) {
        let mut out = vec![0u8; expect.len()];
        quantize_row(ty, &src, &mut out).unwrap();
        if out != expect {
            let block = ty.type_size();
            let first = out.iter().zip(expect).position(|(a, b)| a != b).unwrap();
            failures.push(format!(
                "{name} ({ty}): first difference in block {}",
                first / block
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} tensors differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// ggml's own round-trip bound (tests/test-quantize-fns.cpp), on real rows rather than a cosine.
#[test]
fn round_trip_error_within_ggml_thresholds() {
    let f = vectors();
    for (name, ty, data, src) in cases(&f) {
        let mut out = vec![0f32; src.len()];
        dequantize_row(ty, data, &mut out).unwrap();
        let err: f64 = src
            .iter()
            .zip(&out)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        let rms_src =
            (src.iter().map(|&a| (a as f64).powi(2)).sum::<f64>() / src.len() as f64).sqrt();
        let rel = (err / src.len() as f64).sqrt() / rms_src;
        // Relative RMS bounds a bit above what llama.cpp's files show (fixture README table).
        let bound = match ty {
            GgmlType::Q2_K => 0.35,
            GgmlType::Q3_K => 0.18,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4_K => 0.10,
            GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5_K => 0.05,
            GgmlType::Q6_K => 0.025,
            GgmlType::Q8_0 => 0.008,
            other => panic!("unexpected type {other}"),
        };
        assert!(rel < bound, "{name}: relative RMS error {rel} ≥ {bound}");
    }
}
