//! Quick single-thread throughput probe for the quantized matrix-vector kernels (no criterion):
//! `cargo run --release --example kq_speed -- <TYPE> <hot|cold|bw> [reps] [isa]`.
//!
//! - `hot`: one 4096×4096 matrix, multiplied repeatedly (weights in cache as far as they fit).
//! - `cold`: copies of the matrix totalling ≥ 512 MiB, used in turn (weights from memory).
//! - `bw`: summing a 1 GiB buffer (the single-core read bandwidth reference).
//! - `ratio`: the acceptance measurement. Copies of the matrix totalling 2 GiB (over 4× this host's
//!   480 MiB L3), each followed in memory by a same-sized buffer; per round, each copy's matrix-vector
//!   product alternates with a sum over its buffer, so both see the same host conditions at millisecond
//!   granularity; prints the medians over rounds of both GB/s figures and of their ratio. `ROWS=n`
//!   shrinks the matrix (e.g. 512 rows keep `hot` in L2: the kernel's compute-bound speed); `ITEM=n`
//!   multiplies each copy in calls of n rows, as `matmul`'s work items do.
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

fn sum_pass(buf: &[u64]) -> f64 {
    let s = Instant::now();
    let mut acc = [0u64; 8];
    for c in buf.chunks_exact(8) {
        for l in 0..8 {
            acc[l] = acc[l].wrapping_add(c[l]);
        }
    }
    std::hint::black_box(acc);
    s.elapsed().as_secs_f64()
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
            t.push(sum_pass(&buf));
        }
        report("bw", (buf.len() * 8) as f64, &t);
        return;
    }
    let k = kernels::by_isa(isa).expect("isa not available");
    let rb = ty.row_bytes(N as u64).unwrap() as usize;
    // ROWS=n: fewer rows (e.g. 512, to keep the matrix in L2 for `hot`).
    let rows: usize = std::env::var("ROWS").map_or(N, |v| v.parse().unwrap());
    let mut w = vec![0u8; rb * rows];
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
    // TOK=n: n activation rows per call in `hot` / `cold` (the few-token verification shapes).
    let n_tok: usize = std::env::var("TOK").map_or(1, |v| v.parse().unwrap());
    let act = ty.vec_dot_type();
    let ab = act.row_bytes(N as u64).unwrap() as usize;
    let mut a = vec![0u8; ab * n_tok];
    for at in a.chunks_exact_mut(ab) {
        let x: Vec<f32> = (0..N).map(|_| rnd()).collect();
        (k.quantize_act)(act, &x, at);
    }
    let copies = if mode == "ratio" {
        // Above this host's 480 MiB L3 several times over.
        (2048usize << 20).div_ceil(w.len())
    } else if mode == "cold" {
        (512usize << 20).div_ceil(w.len())
    } else {
        1
    };
    // Ratio mode: one anonymous mapping holding [copy 0 | sum chunk 0 | copy 1 | sum chunk 1 | ...], so
    // the matrix and the bandwidth reference sit in the same kind of memory, advised for transparent
    // huge pages as the model's weights are (HUGE=0 leaves 4 KiB pages: on a VM both then run up to 2×
    // slower from TLB misses).
    let huge = std::env::var("HUGE").map_or(true, |v| v != "0");
    let l = w.len();
    let bytes = if mode == "ratio" { 2 * l * copies } else { 1 };
    let mut region = if huge {
        deltaq::bench::huge_region(bytes)
    } else {
        memmap2::MmapMut::map_anon(bytes)
    }
    .unwrap();
    if mode == "ratio" {
        for (i, c) in region.chunks_exact_mut(l).enumerate() {
            if i % 2 == 0 {
                c.copy_from_slice(&w);
            } else {
                c.fill(i as u8);
            }
        }
    }
    let owned: Vec<Vec<u8>> = if mode == "ratio" {
        Vec::new()
    } else {
        (0..copies).map(|_| w.clone()).collect()
    };
    let mats: Vec<&[u8]> = if mode == "ratio" {
        region.chunks_exact(l).step_by(2).collect()
    } else {
        owned.iter().map(|v| v.as_slice()).collect()
    };
    let mut out = vec![0f32; rows * n_tok];
    if mode == "ratio" {
        let chunks: Vec<&[u64]> = region
            .chunks_exact(l)
            .skip(1)
            .step_by(2)
            .map(bytemuck::cast_slice)
            .collect();
        // ITEM=n: rows per call (read once, outside the timed loop).
        let item: usize = std::env::var("ITEM").map_or(rows, |v| v.parse().unwrap());
        let (mut bw, mut mv, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..reps.min(30) {
            let (mut tb, mut tm) = (0.0, 0.0);
            for (i, m) in mats.iter().enumerate() {
                tb += sum_pass(chunks[i]);
                let s = Instant::now();
                for (m, o) in m.chunks(item * rb).zip(out[..rows].chunks_mut(item)) {
                    (k.quant_rows)(ty, m, &a[..ab], 1, o);
                }
                tm += s.elapsed().as_secs_f64();
            }
            let bytes = (w.len() * copies) as f64;
            bw.push(bytes / tb / 1e9);
            mv.push(bytes / tm / 1e9);
            ratio.push(tb / tm);
        }
        std::hint::black_box(&out);
        println!(
            "{} {} ratio: matvec median {:.2} GB/s, bw median {:.2} GB/s, ratio median {:.3}",
            ty.name(),
            isa.name(),
            median(mv),
            median(bw),
            median(ratio)
        );
        return;
    }
    let mut t = Vec::new();
    for i in 0..reps + copies.min(8) {
        let m = mats[i % copies];
        let s = Instant::now();
        (k.quant_rows)(ty, m, &a, n_tok, &mut out);
        let dt = s.elapsed().as_secs_f64();
        if i >= copies.min(8) {
            t.push(dt);
        }
    }
    std::hint::black_box(&out);
    let what = format!("{} {} {} {n_tok} tok", ty.name(), isa.name(), mode);
    report(&what, w.len() as f64, &t);
}
