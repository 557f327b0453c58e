//! Speed of the chunked delta rule for one head (`dk = dv = 128`, 256 tokens, chunks of `CHUNK`):
//! `cargo run --release --example chunk_probe`; `G=3` sets the log-decay per token to about −3 (a
//! fast-decaying head, whose distant decay factors are subnormal). The FLOP figure is approximate.

use deltaq::model::deltanet::{chunked, Head, CHUNK};
use std::time::Instant;
fn main() {
    let (dk, dv, n) = (128usize, 128usize, 256usize);
    let mut seed = 1u64;
    let mut r = || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    };
    let q: Vec<f32> = (0..n * dk).map(|_| r() * 0.1).collect();
    let k: Vec<f32> = (0..n * dk).map(|_| r() * 0.1).collect();
    let v: Vec<f32> = (0..n * dv).map(|_| r()).collect();
    let gs: f32 = std::env::var("G")
        .map(|s| s.parse().unwrap())
        .unwrap_or(0.1);
    let g: Vec<f32> = (0..n).map(|_| -gs * (r() + 0.5)).collect();
    let b: Vec<f32> = (0..n).map(|_| r() + 0.5).collect();
    let h = Head {
        q: &q,
        k: &k,
        v: &v,
        g: &g,
        beta: &b,
        dk,
        dv,
    };
    let mut m = vec![0f32; dk * dv];
    let mut o = vec![0f32; n * dv];
    for _ in 0..3 {
        chunked(&mut m, &h, CHUNK, &mut o);
    }
    // The fastest of 15 rounds of 20 calls: the host's other tenants only ever slow a round down.
    let dt = (0..15)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..20 {
                chunked(&mut m, &h, CHUNK, &mut o);
            }
            t.elapsed().as_secs_f64() / 20.0
        })
        .fold(f64::INFINITY, f64::min);
    let flop = (n / CHUNK) as f64 * 2.0 * 5.0e6;
    println!(
        "chunked 1 head {n} tok: {:.1} us, ~{:.1} GFLOP/s (approx 10 MFLOP/chunk)",
        dt * 1e6,
        flop / dt / 1e9
    );
}
