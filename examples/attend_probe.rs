//! Attention at depth for profilers and kernel work, no criterion: `cargo run --release --example
//! attend_probe -- [DEPTH] [TOKENS]` runs one KV head of the 0.8B's shape (head dim 256, 4 query heads per
//! KV head, the head's rows back to back in pages of `KV_PAGE` positions, as the cache stores them) for a
//! TOKENS-token prefill chunk (default 64; 1 is a decoding step) after DEPTH positions (default 16384),
//! over an f16 and a Q8_0 cache (or only the one named by a third argument, `f16` or `q8_0`), on one thread, and prints the fastest of 15 runs and its GFLOP/s (4
//! flops per query, position and head element: the scores and the weighted values).

use deltaq::kernels::attend::{attend_many, KvPages};
use deltaq::kernels::attend_quant::attend_quant_many;
use deltaq::quant::{BlockFormat, BlockQ8_0};
use half::f16;
use std::time::Instant;
fn main() {
    let depth: usize = std::env::args()
        .nth(1)
        .map_or(16384, |s| s.parse().unwrap());
    let n_tok: usize = std::env::args().nth(2).map_or(64, |s| s.parse().unwrap());
    let heads = 4;
    let hd = 256;
    let n_all = depth + n_tok;
    // The cache stores each KV head's rows back to back, in pages of its own.
    let stride = hd;
    let mut x = 1u32;
    let mut rnd = || {
        x = x.wrapping_mul(1664525).wrapping_add(1013904223);
        (x >> 8) as f32 / (1u32 << 24) as f32 - 0.5
    };
    let kf: Vec<f32> = (0..n_all * stride).map(|_| rnd()).collect();
    let vf: Vec<f32> = (0..n_all * stride).map(|_| rnd()).collect();
    let page = deltaq::model::KV_PAGE;
    let kp: Vec<Vec<f16>> = kf
        .chunks(page * stride)
        .map(|c| c.iter().map(|&v| f16::from_f32(v)).collect())
        .collect();
    let vp: Vec<Vec<f16>> = vf
        .chunks(page * stride)
        .map(|c| c.iter().map(|&v| f16::from_f32(v)).collect())
        .collect();
    let q8 = |x: &[f32]| -> Vec<Vec<BlockQ8_0>> {
        x.chunks(page * stride)
            .map(|c| {
                let mut b = vec![<BlockQ8_0 as bytemuck::Zeroable>::zeroed(); c.len() / 32];
                BlockQ8_0::quantize(c, &mut b);
                b
            })
            .collect()
    };
    let (kq, vq) = (q8(&kf), q8(&vf));
    let nq = n_tok * heads;
    let qs: Vec<f32> = (0..nq * hd).map(|_| 4.0 * rnd()).collect();
    let n_ctx: Vec<usize> = (0..nq).map(|i| depth + i / heads + 1).collect();
    let mut out = vec![0f32; nq * hd];
    let only = std::env::args().nth(3);
    for kind in ["f16", "q8_0"] {
        if only.as_deref().is_some_and(|o| o != kind) {
            continue;
        }
        let mut ts = vec![];
        for _ in 0..15 {
            let t0 = Instant::now();
            if kind == "f16" {
                attend_many(
                    &qs,
                    &n_ctx,
                    KvPages {
                        k: &kp,
                        v: &vp,
                        page_rows: page,
                        stride,
                        offset: 0,
                    },
                    0.0625,
                    &mut out,
                );
            } else {
                attend_quant_many(
                    &qs,
                    &n_ctx,
                    KvPages {
                        k: &kq,
                        v: &vq,
                        page_rows: page,
                        stride: stride / 32,
                        offset: 0,
                    },
                    0.0625,
                    &mut out,
                );
            }
            ts.push(t0.elapsed().as_secs_f64());
        }
        ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let flops = 4.0 * (nq * hd) as f64 * (depth as f64 + n_tok as f64 / 2.0);
        println!(
            "{kind} depth {depth}: min {:.1} ms, {:.1} GFLOP/s (1 thread)",
            ts[0] * 1e3,
            flops / ts[0] / 1e9
        );
    }
}
