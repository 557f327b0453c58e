//! Opening a GGUF with a real-size vocabulary, and the scalar reference quant paths per type.
//! Run `tools/fetch-fixtures.sh` first (the 248k-token vocabulary GGUF comes from the fixtures).

use std::path::Path;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use deltaq::gguf::GgufFile;
use deltaq::quant::{dequantize_row, quantize_row, vec_dot_row, GgmlType};

fn open_gguf(c: &mut Criterion) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/shared/tokenizer/ggml-vocab-qwen35.gguf");
    if !path.exists() {
        eprintln!(
            "skipping gguf_open: {} missing (run tools/fetch-fixtures.sh)",
            path.display()
        );
        return;
    }
    c.bench_function("gguf_open_qwen35_vocab", |b| {
        b.iter(|| GgufFile::open(&path).unwrap())
    });
}

fn quant_paths(c: &mut Criterion) {
    let n = 4096;
    let x: Vec<f32> = (0..n).map(|i| 0.1 + 2.0 * (i as f32).cos()).collect();
    let mut g = c.benchmark_group("quant_ref");
    g.throughput(Throughput::Elements(n as u64));
    for ty in GgmlType::WEIGHT_QUANTS {
        let mut q = vec![0u8; ty.row_bytes(n as u64).unwrap() as usize];
        quantize_row(ty, &x, &mut q).unwrap();
        let at = ty.vec_dot_type();
        let mut a = vec![0u8; at.row_bytes(n as u64).unwrap() as usize];
        quantize_row(at, &x, &mut a).unwrap();
        let mut out = vec![0f32; n];
        g.bench_with_input(BenchmarkId::new("quantize", ty), &ty, |b, &ty| {
            b.iter(|| quantize_row(ty, &x, &mut q).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("dequantize", ty), &ty, |b, &ty| {
            b.iter(|| dequantize_row(ty, &q, &mut out).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("vec_dot", ty), &ty, |b, &ty| {
            b.iter(|| vec_dot_row(ty, &q, &a).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, open_gguf, quant_paths);
criterion_main!(benches);
