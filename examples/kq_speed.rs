//! Quick single-thread throughput probe for the quantized matrix-vector kernels (no criterion):
//! `cargo run --release --example kq_speed -- <TYPE> <hot|cold|bw> [reps] [isa]`.
//!
//! - `hot`: one 4096×4096 matrix, multiplied repeatedly (weights in cache as far as they fit).
//! - `cold`: copies of the matrix totalling ≥ 512 MiB, used in turn (weights from memory).
//! - `bw`: summing a 1 GiB buffer (the single-core read bandwidth reference).
//!
//! Prints the median and best GB/s over `reps` timed calls (the best is the better estimate on a loaded
//! machine). Small enough to run under `valgrind --tool=callgrind` for instruction counts per block.

use std::time::Instant;

use deltaq::kernels::{self, Isa};
use deltaq::quant::{self, GgmlType};

const N: usize = 4096;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn report(what: &str, bytes: f64, wall: &[f64]) {
    let w: Vec<f64> = wall.iter().map(|t| bytes / t / 1e9).collect();
    let best = w.iter().cloned().fold(0.0, f64::max);
    println!(
        "{what}: median {:.2} GB/s, best {:.2} GB/s",
        median(w),
        best
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let ty = GgmlType::from_name(args.get(1).map_or("Q4_K", |s| s)).expect("type");
    let mode = args.get(2).map_or("hot", |s| s.as_str());
    let reps: usize = args.get(3).map_or(50, |s| s.parse().unwrap());
    let isa = Isa::from_name(args.get(4).map_or("avx2", |s| s)).expect("isa");
    if mode == "bw" {
        let buf: Vec<u64> = (0..(1usize << 27)).map(|i| i as u64).collect();
        let mut t = Vec::new();
        for _ in 0..reps.min(20) {
            let s = Instant::now();
            let mut acc = [0u64; 8];
            for c in buf.chunks_exact(8) {
                for l in 0..8 {
                    acc[l] = acc[l].wrapping_add(c[l]);
                }
            }
            std::hint::black_box(acc);
            t.push(s.elapsed().as_secs_f64());
        }
        report("bw", (buf.len() * 8) as f64, &t);
        return;
    }
    let k = kernels::by_isa(isa).expect("isa not available");
    let rb = ty.row_bytes(N as u64).unwrap() as usize;
    let mut w = vec![0u8; rb * N];
    let mut s = 1u64;
    let mut rnd = || {
        s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    };
    let row: Vec<f32> = (0..N).map(|_| rnd()).collect();
    for (r, o) in w.chunks_exact_mut(rb).enumerate() {
        let x: Vec<f32> = (0..N).map(|i| row[(i + 17 * r) % N]).collect();
        quant::quantize_row(ty, &x, o).unwrap();
    }
    let x: Vec<f32> = (0..N).map(|_| rnd()).collect();
    let act = ty.vec_dot_type();
    let mut a = vec![0u8; act.row_bytes(N as u64).unwrap() as usize];
    (k.quantize_act)(act, &x, &mut a);
    let copies = if mode == "cold" {
        (512usize << 20).div_ceil(w.len())
    } else {
        1
    };
    let mats: Vec<Vec<u8>> = (0..copies).map(|_| w.clone()).collect();
    let mut out = vec![0f32; N];
    let mut t = Vec::new();
    for i in 0..reps + copies.min(8) {
        let m = &mats[i % copies];
        let s = Instant::now();
        (k.quant_rows)(ty, m, &a, 1, &mut out);
        let dt = s.elapsed().as_secs_f64();
        if i >= copies.min(8) {
            t.push(dt);
        }
    }
    std::hint::black_box(&out);
    let what = format!("{} {} {}", ty.name(), isa.name(), mode);
    report(&what, w.len() as f64, &t);
}
