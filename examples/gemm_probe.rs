//! Single-thread speed of the table's prefill GEMM (`Kernels::quant_gemm`) on one weight in cache, as
//! `matmul` calls it (items of 64 rows × all tokens): `cargo run --release --example gemm_probe --
//! [TYPE] [n_in] [n_out] [tokens] [reps] [isa]` (default Q4_K 1024 3584 512 15, the best ISA). Prints the
//! median and best time per product and the multiply-adds per second (GMAC/s). `COLD=1` reads the weight
//! from memory (copies used in turn), as the model's prefill does.

use std::time::Instant;

use deltaq::kernels::{self, GemmOut, Isa, Q8kQuants};
use deltaq::quant::{self, GgmlType};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let ty = GgmlType::from_name(args.get(1).map_or("Q4_K", |s| s)).expect("type");
    let n_in: usize = args.get(2).map_or(1024, |s| s.parse().unwrap());
    let n_out: usize = args.get(3).map_or(3584, |s| s.parse().unwrap());
    let n_tok: usize = args.get(4).map_or(512, |s| s.parse().unwrap());
    let reps: usize = args.get(5).map_or(15, |s| s.parse().unwrap());
    let k = match args.get(6) {
        Some(s) => kernels::by_isa(Isa::from_name(s).expect("isa")).expect("ISA on this CPU"),
        None => kernels::kernels(),
    };
    let g = k
        .quant_gemm
        .filter(|g| (g.supports)(ty))
        .expect("a GEMM for this type");

    let mut s = 1u64;
    let mut rnd = || {
        s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    };
    let rb = ty.row_bytes(n_in as u64).expect("row length") as usize;
    let mut w0 = vec![0u8; rb * n_out];
    for o in w0.chunks_exact_mut(rb) {
        let x: Vec<f32> = (0..n_in).map(|_| rnd()).collect();
        quant::quantize_row(ty, &x, o).expect("a type deltaq writes");
    }
    // `COLD=1`: copies of the weight totalling at least 1 GiB, used in turn, so that every product reads
    // its weight from memory as prefill does (the model's weights are larger than the caches).
    let copies = match std::env::var("COLD") {
        Ok(_) => (1usize << 30).div_ceil(w0.len()),
        Err(_) => 1,
    };
    let ws = vec![w0; copies];
    let act = ty.vec_dot_type();
    let ab = act.row_bytes(n_in as u64).unwrap() as usize;
    let mut a = vec![0u8; n_tok * ab];
    for q in a.chunks_exact_mut(ab) {
        let x: Vec<f32> = (0..n_in).map(|_| rnd()).collect();
        (k.quantize_act)(act, &x, q);
    }
    let mut out = vec![0f32; 64 * n_tok];
    let mut times = Vec::with_capacity(reps);
    for rep in 0..reps + 1 {
        let w = &ws[rep % copies];
        let t0 = Instant::now();
        // A GEMM that takes the Q8_K quants as aligned rows gets them as `matmuls` makes them: copied
        // once per product (timed with it).
        let quants = g.run_quants.filter(|q| (q.supports)(ty)).map(|q| {
            let mut buf = (Vec::new(), Vec::new());
            kernels::q8k_quants(&a, n_in, &mut buf);
            (q.run, buf)
        });
        for r0 in (0..n_out).step_by(64) {
            let rows = 64.min(n_out - r0);
            let o = GemmOut::new(&mut out[..rows * n_tok], n_tok);
            let wr = &w[r0 * rb..(r0 + rows) * rb];
            match &quants {
                Some((run, (lines, sums32))) => run(
                    ty,
                    wr,
                    &a,
                    Q8kQuants {
                        lines,
                        sums32,
                        n_in,
                    },
                    o,
                ),
                None => (g.run)(ty, wr, &a, o),
            }
        }
        times.push(t0.elapsed().as_secs_f64());
    }
    std::hint::black_box(&out);
    times.remove(0);
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let macs = (n_in * n_out * n_tok) as f64;
    println!(
        "{} {}x{} x {} tokens, {}: median {:.2} ms ({:.1} GMAC/s), best {:.2} ms ({:.1} GMAC/s)",
        ty.name(),
        n_out,
        n_in,
        n_tok,
        k.isa.name(),
        times[reps / 2] * 1e3,
        macs / times[reps / 2] / 1e9,
        times[0] * 1e3,
        macs / times[0] / 1e9
    );
}
