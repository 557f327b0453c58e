//! Gated full attention (spec §3.2): joint Q/gate projection, per-head Q/K RMSNorm, partial NEOX RoPE,
//! causal GQA over an f32 KV cache, sigmoid output gate.

use rayon::prelude::*;

use super::for_rows;
use super::hparams::HParams;
use super::weights::AttentionWeights;
use crate::kernels::attend::attend;
use crate::kernels::ops::{rms_norm, sigmoid};
use crate::kernels::{matmul, matmuls};

/// Keys (after norm + RoPE) and raw values of every past position: `[pos][Hkv·hd]` each.
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// Rotates pairs `(i, i + n_rot/2)` of the first `n_rot` dims by `θ_i = pos · base^(−2i/n_rot)`; the rest
/// of the head is left alone. Angles in f64 so large positions keep their precision.
pub fn rope_neox(x: &mut [f32], pos: usize, n_rot: usize, base: f32) {
    let half = n_rot / 2;
    for i in 0..half {
        let theta = pos as f64 * (base as f64).powf(-2.0 * i as f64 / n_rot as f64);
        let (sin, cos) = theta.sin_cos();
        let (sin, cos) = (sin as f32, cos as f32);
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * cos - b * sin;
        x[i + half] = a * sin + b * cos;
    }
}

/// `a`: `[T × d]` normed inputs at positions `pos0..pos0+T`; writes the block output `[T × d]` to `out`.
pub fn forward(
    w: &AttentionWeights,
    hp: &HParams,
    il: usize,
    cache: &mut KvCache,
    pos0: usize,
    a: &[f32],
    out: &mut [f32],
) {
    let (nh, nkv, hd) = (hp.n_head[il], hp.n_head_kv[il], hp.head_dim);
    let n_tok = a.len() / hp.n_embd;
    // QG: [T × H × (q: hd | gate: hd)] — per-head interleaved, not [all q | all gates].
    let mut qg = vec![0f32; n_tok * 2 * nh * hd];
    let mut k = vec![0f32; n_tok * nkv * hd]; // [T × Hkv × hd]
    let mut v = vec![0f32; n_tok * nkv * hd]; // [T × Hkv × hd]
    matmuls(
        a,
        n_tok,
        &mut [(&w.wq, &mut qg), (&w.wk, &mut k), (&w.wv, &mut v)],
    );
    let mut q = vec![0f32; n_tok * nh * hd]; // [T × H × hd]
    let mut gate = vec![0f32; n_tok * nh * hd]; // [T × H × hd]
    for_rows(&mut q, nh * hd, |t, q| {
        let qg = &qg[t * 2 * nh * hd..][..2 * nh * hd];
        for (j, dst) in q.chunks_exact_mut(hd).enumerate() {
            dst.copy_from_slice(&qg[2 * hd * j..][..hd]);
            rms_norm(dst, &w.q_norm, hp.rms_eps);
            rope_neox(dst, pos0 + t, hp.n_rot, hp.rope_base);
        }
    });
    for_rows(&mut gate, nh * hd, |t, g| {
        let qg = &qg[t * 2 * nh * hd..][..2 * nh * hd];
        for (j, dst) in g.chunks_exact_mut(hd).enumerate() {
            dst.copy_from_slice(&qg[2 * hd * j + hd..][..hd]);
        }
    });
    for_rows(&mut k, nkv * hd, |t, k| {
        for k in k.chunks_exact_mut(hd) {
            rms_norm(k, &w.k_norm, hp.rms_eps);
            rope_neox(k, pos0 + t, hp.n_rot, hp.rope_base);
        }
    });
    cache.k.extend_from_slice(&k);
    cache.v.extend_from_slice(&v);

    // o[t][j] = Σ_τ softmax_τ(q·k_τ / √hd) v_τ over τ ≤ pos0 + t, KV head m = j / (H/Hkv).
    let group = nh / nkv;
    let scale = 1.0 / (hd as f32).sqrt();
    let kv_stride = nkv * hd;
    let (kc, vc) = (&cache.k, &cache.v);
    let mut o = vec![0f32; n_tok * nh * hd]; // [T × H × hd]
    o.par_chunks_mut(hd).enumerate().for_each(|(idx, o)| {
        let (t, j) = (idx / nh, idx % nh);
        let m = j / group;
        let q = &q[idx * hd..][..hd];
        let n_ctx = pos0 + t + 1;
        attend(q, &kc[m * hd..], &vc[m * hd..], kv_stride, n_ctx, scale, o);
    });
    for_rows(&mut o, nh * hd, |t, o| {
        for (o, g) in o.iter_mut().zip(&gate[t * nh * hd..][..nh * hd]) {
            *o *= sigmoid(*g);
        }
    });
    matmul(&w.wo, &o, n_tok, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_matches_formula() {
        let (n_rot, hd, base) = (64, 256, 1e7f32);
        for pos in [0usize, 1, 1000, 200_000] {
            let x: Vec<f32> = (0..hd)
                .map(|i| ((i * 37 % 17) as f32 - 8.0) / 8.0)
                .collect();
            let mut y = x.clone();
            rope_neox(&mut y, pos, n_rot, base);
            for i in 0..32 {
                let th = pos as f64 / (base as f64).powf(2.0 * i as f64 / 64.0);
                let (a, b) = (x[i] as f64, x[i + 32] as f64);
                assert!((y[i] as f64 - (a * th.cos() - b * th.sin())).abs() < 1e-6);
                assert!((y[i + 32] as f64 - (a * th.sin() + b * th.cos())).abs() < 1e-6);
            }
            assert_eq!(&y[64..], &x[64..]);
        }
    }
}
