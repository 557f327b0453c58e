//! Kernel throughput per weight type and instruction-set path (every table `kernels::available()` gives).
//!
//! - `matvec/<type>/<isa>/<threads>t`: a 4096×4096 matrix times one activation row, in GB/s of weight
//!   bytes (criterion's `bytes/s`). Copies of the matrix (≥ 2 GiB in all, over 4× the 480 MiB L3 of the
//!   largest server CPUs) are used in turn so the weights come from memory, not cache, as in decoding.
//!   They sit in one anonymous mapping advised for transparent huge pages, as the model's weights are
//!   (`GgufFile::open`): with 4 KiB pages TLB misses slow both this and `membw` by up to 2× on a VM.
//! - `matvec-hot/<type>/<isa>/1t`: the same with a single copy, multiplied again and again (the weights
//!   stay in L2/L3 as far as they fit): the kernel's own speed, without the memory limit.
//! - `gemm/<type>/<isa>/<threads>t`: the same matrix times 512 activation rows (32 for the scalar path),
//!   reported as multiply-adds × 2 per second (criterion's `elem/s` = FLOP/s-equivalent);
//!   `<isa>-panel` is the same table's prefill GEMM (`Kernels::quant_gemm`) where it has one.
//! - `membw/<threads>t`: reading a 2 GiB buffer (sum of u64; huge pages too), the bandwidth the matvec
//!   figures compare to.
//!
//! Activation quantization is done once outside the timed loop. Select with criterion filters, e.g.
//! `cargo bench --bench kernels -- 'matvec/Q4_K'`; `DELTAQ_BENCH_TYPES=Q4_K,Q8_0` limits the types.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use deltaq::bench::{huge_region, sum_buffer};
use deltaq::kernels::{self, Isa, Kernels};
use deltaq::quant::{self, GgmlType};
use rayon::prelude::*;

const N: usize = 4096;
const ALL_TYPES: [GgmlType; 13] = [
    GgmlType::Q4_K,
    GgmlType::Q8_0,
    GgmlType::Q6_K,
    GgmlType::Q5_K,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
];

fn types() -> Vec<GgmlType> {
    match std::env::var("DELTAQ_BENCH_TYPES") {
        Ok(list) => list
            .split(',')
            .map(|s| GgmlType::from_name(s.trim()).expect("type name"))
            .collect(),
        Err(_) => ALL_TYPES.to_vec(),
    }
}

fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

struct Rng(u64);
impl Rng {
    fn f(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// One 4096×4096 matrix of `ty` (quantized from random floats, row by row).
fn matrix(ty: GgmlType) -> Vec<u8> {
    let mut rng = Rng(1);
    let rb = ty.row_bytes(N as u64).unwrap() as usize;
    let mut out = vec![0u8; rb * N];
    let row: Vec<f32> = (0..N).map(|_| rng.f()).collect();
    // Rows differ by a rotation of one random row: cheap to make, still realistic values.
    out.par_chunks_mut(rb).enumerate().for_each(|(r, o)| {
        let x: Vec<f32> = (0..N).map(|i| row[(i + 17 * r) % N]).collect();
        match ty {
            GgmlType::F32 => o.copy_from_slice(bytemuck::cast_slice(&x)),
            GgmlType::F16 => o
                .chunks_exact_mut(2)
                .zip(&x)
                .for_each(|(o, v)| o.copy_from_slice(&quant::f16_from_f32(*v).to_le_bytes())),
            GgmlType::BF16 => o
                .chunks_exact_mut(2)
                .zip(&x)
                .for_each(|(o, v)| o.copy_from_slice(&quant::bf16_from_f32(*v).to_le_bytes())),
            _ => quant::quantize_row(ty, &x, o).unwrap(),
        }
    });
    out
}

/// `out = W · A` for `n_tok` activation rows, rows split over the current rayon pool in chunks.
fn run(
    k: &Kernels,
    ty: GgmlType,
    w: &[u8],
    act_q: &[u8],
    act_f: &[f32],
    n_tok: usize,
    out: &mut [f32],
) {
    let rb = w.len() / N;
    // Decode items as `matmul` cuts them (about 256 KiB of weights each).
    let chunk = if n_tok == 1 {
        kernels::decode_rows_per_item(w.len(), N, rayon::current_num_threads(), 1)
    } else {
        32
    };
    out.par_chunks_mut(chunk * n_tok)
        .enumerate()
        .for_each(|(i, o)| {
            let rows = o.len() / n_tok;
            let w = &w[i * chunk * rb..(i * chunk + rows) * rb];
            if is_float(ty) {
                (k.float_rows)(ty, w, act_f, n_tok, o)
            } else {
                (k.quant_rows)(ty, w, act_q, n_tok, o)
            }
        });
}

/// The same through the table's prefill GEMM: items of 64 rows × all tokens (token-major per item).
fn run_panels(k: &Kernels, ty: GgmlType, w: &[u8], act_q: &[u8], n_tok: usize, out: &mut [f32]) {
    let g = k.quant_gemm.expect("a table with a GEMM");
    let rb = w.len() / N;
    let chunk = 64;
    out.par_chunks_mut(chunk * n_tok)
        .enumerate()
        .for_each(|(i, o)| {
            let rows = o.len() / n_tok;
            let w = &w[i * chunk * rb..(i * chunk + rows) * rb];
            (g.run)(ty, w, act_q, kernels::GemmOut::new(o, n_tok))
        });
}

fn activations(k: &Kernels, ty: GgmlType, n_tok: usize) -> (Vec<u8>, Vec<f32>) {
    let mut rng = Rng(7);
    let x: Vec<f32> = (0..n_tok * N).map(|_| rng.f()).collect();
    if is_float(ty) {
        return (Vec::new(), x);
    }
    let act = ty.vec_dot_type();
    let rb = act.row_bytes(N as u64).unwrap() as usize;
    let mut q = vec![0u8; n_tok * rb];
    for (x, q) in x.chunks_exact(N).zip(q.chunks_exact_mut(rb)) {
        (k.quantize_act)(act, x, q);
    }
    (q, x)
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}

fn thread_counts() -> Vec<usize> {
    let max = std::thread::available_parallelism().map_or(1, |n| n.get());
    [1, 2].into_iter().filter(|&t| t <= max).collect()
}

fn matvec(c: &mut Criterion) {
    for ty in types() {
        let one = matrix(ty);
        let copies = (2048usize << 20).div_ceil(one.len()).max(2);
        let mut region = huge_region(one.len() * copies).expect("anonymous mapping");
        for c in region.chunks_exact_mut(one.len()) {
            c.copy_from_slice(&one);
        }
        let mats: Vec<&[u8]> = region.chunks_exact(one.len()).collect();
        let mut g = c.benchmark_group(format!("matvec/{}", ty.name()));
        g.throughput(Throughput::Bytes(one.len() as u64));
        for k in kernels::available() {
            let (q, f) = activations(k, ty, 1);
            for threads in thread_counts() {
                let p = pool(threads);
                let mut out = vec![0f32; N];
                let mut i = 0;
                // The timed loop runs inside the pool, as a decode step does (the model enters it
                // once per generation), so each product pays the fork/join but not a pool entry.
                g.bench_function(BenchmarkId::new(k.isa.name(), format!("{threads}t")), |b| {
                    p.install(|| {
                        b.iter(|| {
                            i = (i + 1) % copies;
                            run(k, ty, mats[i], &q, &f, 1, &mut out);
                            black_box(&out);
                        })
                    })
                });
            }
        }
        g.finish();
    }
}

fn matvec_hot(c: &mut Criterion) {
    for ty in types() {
        let w = matrix(ty);
        let mut g = c.benchmark_group(format!("matvec-hot/{}", ty.name()));
        g.throughput(Throughput::Bytes(w.len() as u64));
        for k in kernels::available() {
            let (q, f) = activations(k, ty, 1);
            let p = pool(1);
            let mut out = vec![0f32; N];
            g.bench_function(BenchmarkId::new(k.isa.name(), "1t"), |b| {
                b.iter(|| {
                    p.install(|| run(k, ty, &w, &q, &f, 1, &mut out));
                    black_box(&out);
                })
            });
        }
        g.finish();
    }
}

fn gemm(c: &mut Criterion) {
    for ty in types() {
        let w = matrix(ty);
        let mut g = c.benchmark_group(format!("gemm/{}", ty.name()));
        g.sample_size(10);
        for k in kernels::available() {
            let n_tok = if k.isa == Isa::Scalar { 32 } else { 512 };
            g.throughput(Throughput::Elements((2 * N * N * n_tok) as u64));
            let (q, f) = activations(k, ty, n_tok);
            for threads in thread_counts() {
                let p = pool(threads);
                let mut out = vec![0f32; N * n_tok];
                g.bench_function(BenchmarkId::new(k.isa.name(), format!("{threads}t")), |b| {
                    b.iter(|| {
                        p.install(|| run(k, ty, &w, &q, &f, n_tok, &mut out));
                        black_box(&out);
                    })
                });
                if k.quant_gemm.is_some_and(|g| (g.supports)(ty)) {
                    let id =
                        BenchmarkId::new(format!("{}-panel", k.isa.name()), format!("{threads}t"));
                    g.bench_function(id, |b| {
                        b.iter(|| {
                            p.install(|| run_panels(k, ty, &w, &q, n_tok, &mut out));
                            black_box(&out);
                        })
                    });
                }
            }
        }
        g.finish();
    }
}

fn membw(c: &mut Criterion) {
    let region = sum_buffer(2usize << 27).expect("anonymous mapping");
    let buf: &[u64] = bytemuck::cast_slice(&region[..]);
    let mut g = c.benchmark_group("membw");
    g.sample_size(10);
    g.throughput(Throughput::Bytes((buf.len() * 8) as u64));
    for threads in thread_counts() {
        let p = pool(threads);
        // One plain sequential stream per thread, and the decode kernels' read pattern (four
        // streams with software prefetch, `kernels::sum_words_streamed`), which reads faster on some
        // machines: the matvec figures are compared with the higher of the two.
        for (name, sum) in [
            (
                format!("{threads}t"),
                kernels::sum_words as fn(&[u64]) -> u64,
            ),
            (format!("{threads}t-prefetch"), kernels::sum_words_streamed),
        ] {
            g.bench_function(name, |b| {
                b.iter(|| {
                    p.install(|| {
                        buf.par_chunks(buf.len() / threads)
                            .map(sum)
                            .reduce(|| 0, u64::wrapping_add)
                    })
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, membw, matvec, matvec_hot, gemm);
criterion_main!(benches);
