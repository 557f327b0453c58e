//! What a speculative-decoding verification step costs at the matmul level: `matmul` (rayon's pool, as the
//! model runs it) of one weight from memory with 1, 2, 3 and 4 tokens, no criterion:
//! `cargo run --release --example few_tokens -- [TYPE] [n_in] [n_out] [rounds]` (default Q4_K 4096 12288,
//! the 9B's FFN up/gate shape).
//!
//! Copies of the matrix totalling at least 1 GiB (`COPIES=n`: n copies) (several times this host's L3) are used in turn, so every
//! call reads its weight from memory. Each round runs every token count over all copies, one after the
//! other, so the counts see the same host conditions; prints per token count the median time per call
//! and its ratio to one token's, and the median over rounds of the per-round ratios.

use std::time::Instant;

use deltaq::kernels::{matmul, Weight};
use deltaq::quant::{self, GgmlType};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let ty = GgmlType::from_name(args.get(1).map_or("Q4_K", |s| s)).expect("type");
    let n_in: usize = args.get(2).map_or(4096, |s| s.parse().unwrap());
    let n_out: usize = args.get(3).map_or(12288, |s| s.parse().unwrap());
    let rounds: usize = args.get(4).map_or(15, |s| s.parse().unwrap());
    const MAX_TOK: usize = 4;

    let mut s = 1u64;
    let mut rnd = || {
        s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    };
    let rb = ty.row_bytes(n_in as u64).expect("row length") as usize;
    let mut w = vec![0u8; rb * n_out];
    let base: Vec<f32> = (0..n_in).map(|_| rnd()).collect();
    for (r, o) in w.chunks_exact_mut(rb).enumerate() {
        let x: Vec<f32> = (0..n_in).map(|i| base[(i + 17 * r) % n_in]).collect();
        quant::quantize_row(ty, &x, o).expect("a type deltaq writes");
    }
    // COPIES=1: the matrix stays in cache as far as it fits (the kernels' compute-bound speed).
    let copies = std::env::var("COPIES").map_or((1usize << 30).div_ceil(w.len()), |v| {
        v.parse().expect("COPIES")
    });
    let mut region = deltaq::bench::huge_region(w.len() * copies).expect("mapping");
    for c in region.chunks_exact_mut(w.len()) {
        c.copy_from_slice(&w);
    }
    let mats: Vec<Weight> = region
        .chunks_exact(w.len())
        .map(|data| Weight {
            name: "w",
            ty,
            n_in,
            n_out,
            data,
        })
        .collect();
    let x: Vec<f32> = (0..MAX_TOK * n_in).map(|_| rnd()).collect();
    let mut out = vec![0f32; MAX_TOK * n_out];
    // Warm-up: page tables, thread pool, activation buffers.
    for n in 1..=MAX_TOK {
        for m in &mats {
            matmul(m, &x[..n * n_in], n, &mut out[..n * n_out]);
        }
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); MAX_TOK];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); MAX_TOK];
    for _ in 0..rounds {
        let mut per = [0f64; MAX_TOK];
        for (n, t) in per.iter_mut().enumerate().map(|(i, t)| (i + 1, t)) {
            let start = Instant::now();
            for m in &mats {
                matmul(m, &x[..n * n_in], n, &mut out[..n * n_out]);
            }
            *t = start.elapsed().as_secs_f64() / mats.len() as f64;
        }
        for n in 0..MAX_TOK {
            times[n].push(per[n]);
            ratios[n].push(per[n] / per[0]);
        }
    }
    std::hint::black_box(&out);
    println!(
        "{} {n_out}x{n_in} ({:.1} MB, {copies} copies), {} threads, {rounds} rounds:",
        ty.name(),
        w.len() as f64 / 1e6,
        rayon::current_num_threads()
    );
    let t1 = median(times[0].clone());
    for n in 0..MAX_TOK {
        let t = median(times[n].clone());
        println!(
            "  {} tok: {:8.1} µs ({:5.2} GB/s)  x{:.3} of 1 tok (median of per-round ratios x{:.3})",
            n + 1,
            t * 1e6,
            w.len() as f64 / t / 1e9,
            t / t1,
            median(ratios[n].clone())
        );
    }
}
