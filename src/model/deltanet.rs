//! Gated DeltaNet (spec §3.3 and §4): causal depthwise conv with a rolling state, L2-normed q/k, and the
//! gated delta rule, either token by token (recurrent) or chunk by chunk (WY / UT form) for prompts.

use std::cell::Cell;

use rayon::prelude::*;

use super::hparams::HParams;
use super::weights::DeltaNetWeights;
use super::{carve, for_rows};
use crate::kernels::fgemm::{gemm, transpose};
use crate::kernels::fpenv::FlushDenormals;
use crate::kernels::ops::{
    axpy, conv_silu, delta_step, exp_in_place, l2_norm, rms_norm, sigmoid, silu_mul, softplus,
};
use crate::kernels::{matmul, matmuls};

/// Tokens per chunk of the chunked form (transformers and llama.cpp both use 64).
pub const CHUNK: usize = 64;

/// Per-sequence state of one DeltaNet layer, zero at sequence start.
#[derive(Clone, Debug)]
pub struct DeltaState {
    /// `[C][K−1]`: the last K−1 raw (pre-conv) qkv inputs per channel, oldest first (llama.cpp's layout).
    pub conv: Vec<f32>,
    /// `[Hv][dv][dk]`: per value head `M[j][i] = S[i][j]` (llama.cpp's transposed layout), so reads and
    /// outputs are contiguous dot products over rows.
    pub s: Vec<f32>,
}

impl DeltaState {
    pub fn new(hp: &HParams) -> DeltaState {
        DeltaState {
            conv: vec![0.0; hp.conv_channels() * (hp.conv_kernel - 1)],
            s: vec![0.0; hp.n_v_heads * hp.d_v * hp.d_k],
        }
    }
}

/// The states after each token but the last of a multi-token call (the state after the last one is
/// the live state), so that a speculative verification can roll back to any of its tokens without
/// running them again. The delta rule writes each token's state straight into its buffer here (no
/// copies), and a rollback swaps that buffer with the live one. Buffers are reused from call to call.
#[derive(Debug, Default)]
pub struct Checkpoints {
    /// Tokens saved (the call's `T − 1`).
    n: usize,
    /// `[T−1][C·(K−1)]`: the conv state after token t.
    conv: Vec<f32>,
    /// Per token t < T−1: the recurrent state after it, `[Hv × dv·dk]` as [`DeltaState::s`].
    s: Vec<Vec<f32>>,
}

impl Checkpoints {
    /// Puts `st` back to the state after token `t` of the call that saved these (which are spent:
    /// the recurrent state's buffer is swapped in, not copied).
    pub fn restore(&mut self, st: &mut DeltaState, t: usize) {
        assert!(t < self.n, "checkpoint {t} of {}", self.n);
        let cs = st.conv.len();
        st.conv.copy_from_slice(&self.conv[t * cs..][..cs]);
        std::mem::swap(&mut st.s, &mut self.s[t]);
        self.n = 0;
    }
}

/// Which form of the delta rule a multi-token call uses (single tokens are always recurrent).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeltaMode {
    #[default]
    Chunked,
    Recurrent,
}

/// `a`: `[T × d]` normed inputs; writes the block output `[T × d]` to `out`.
/// With `save`, the call runs token by token and keeps the state after each token but the last there
/// ([`Checkpoints`]).
#[allow(clippy::too_many_arguments)]
pub fn forward(
    w: &DeltaNetWeights,
    hp: &HParams,
    st: &mut DeltaState,
    mode: DeltaMode,
    a: &[f32],
    out: &mut [f32],
    arena: &mut Vec<f32>,
    mut save: Option<&mut Checkpoints>,
) {
    let n_tok = a.len() / hp.n_embd;
    let (hk, hv, dk, dv) = (hp.n_k_heads, hp.n_v_heads, hp.d_k, hp.d_v);
    let (c, ks) = (hp.conv_channels(), hp.conv_kernel - 1);
    // The conv's input window [state (K−1 steps) | u (T steps)] × C: u is projected straight into it.
    // After the conv, the window's space holds the delta rule's output and the gated norm's.
    let (nq, nv) = (hk * dk, hv * dv);
    let heads = if n_tok == 1 { 0 } else { n_tok };
    let [win_space, z, b, alpha, qkv, gh, bh] = carve(
        arena,
        [
            ((ks + n_tok) * c).max(2 * n_tok * nv),
            n_tok * nv, // z: [T × Hv·dv]
            n_tok * hv, // b: [T × Hv]
            n_tok * hv, // α: [T × Hv]
            n_tok * c,  // q, k, v by head: [Hk × T × dk | Hk × T × dk | Hv × T × dv]
            heads * hv, // g, β by head (several tokens only)
            heads * hv,
        ],
    );
    let win = &mut win_space[..(ks + n_tok) * c];
    matmuls(
        a,
        n_tok,
        &mut [
            (&w.wqkv, &mut win[ks * c..]), // u: [T × C]
            (&w.wz, &mut *z),
            (&w.wbeta, &mut *b),
            (&w.walpha, &mut *alpha),
        ],
    );

    // q, k, v = silu(conv(u)) over the window [state (K−1 steps) | u (T steps)], by head; q and k
    // L2-normed per head, q scaled by 1/√dk.
    conv_window_in(&st.conv, c, win);
    let q_scale = 1.0 / (dk as f32).sqrt();
    conv_heads(
        &w.conv,
        hp.conv_kernel,
        win,
        n_tok,
        [nq, dk, dv],
        hp.rms_eps,
        q_scale,
        qkv,
    );
    conv_state_after(&mut st.conv, c, n_tok, win);
    let mode = match save.as_deref_mut() {
        Some(cp) => {
            // The conv state after token t is the window's K−1 inputs ending at t.
            cp.n = n_tok - 1;
            let cs = st.conv.len();
            super::grow(&mut cp.conv, cp.n * cs);
            if cp.s.len() < cp.n {
                cp.s.resize_with(cp.n, Vec::new);
            }
            for s in &mut cp.s[..cp.n] {
                s.resize(st.s.len(), 0.0);
            }
            for (t, dst) in cp.conv[..cp.n * cs].chunks_exact_mut(cs).enumerate() {
                conv_state_after(dst, c, t + 1, win);
            }
            DeltaMode::Recurrent
        }
        None => mode,
    };

    // β = σ(b); log-decay g = A · softplus(α + dt_bias) ≤ 0. Both [T × Hv], in place.
    b.iter_mut().for_each(|x| *x = sigmoid(*x));
    alpha
        .iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x = w.a[i % hv] * softplus(*x + w.dt_bias[i % hv]));
    let (beta, g) = (&*b, &*alpha);

    // Per-head inputs, head-major: g, β [Hv × T] (one token's row already is in that order).
    let (g, beta) = if n_tok == 1 {
        (g, beta)
    } else {
        (by_head(g, hv, 0, 1, gh), by_head(beta, hv, 0, 1, bh))
    };
    let (q, kv) = qkv.split_at(nq * n_tok);
    let (k, v) = kv.split_at(nq * n_tok);

    // Delta rule, one task per value head h; GGUF value heads are tiled: key head = h mod Hk.
    let (o_heads, n) = win_space.split_at_mut(hv * n_tok * dv); // [Hv × T × dv]

    // With `save`: per head, its part of every saved token's state.
    let mut saved_heads: Vec<Option<Vec<&mut [f32]>>> = (0..hv).map(|_| None).collect();
    if let Some(cp) = save.filter(|cp| cp.n > 0) {
        saved_heads
            .iter_mut()
            .for_each(|h| *h = Some(Vec::with_capacity(cp.n)));
        for s in &mut cp.s[..cp.n] {
            for (h, part) in s.chunks_exact_mut(dv * dk).enumerate() {
                saved_heads[h].as_mut().expect("set above").push(part);
            }
        }
    }
    st.s.par_chunks_mut(dv * dk)
        .zip(o_heads.par_chunks_mut(n_tok * dv))
        .zip(saved_heads.par_iter_mut())
        .enumerate()
        .for_each(|(h, ((s, o), saved))| {
            let kh = h % hk;
            let heads = Head {
                q: &q[kh * n_tok * dk..][..n_tok * dk],
                k: &k[kh * n_tok * dk..][..n_tok * dk],
                v: &v[h * n_tok * dv..][..n_tok * dv],
                g: &g[h * n_tok..][..n_tok],
                beta: &beta[h * n_tok..][..n_tok],
                dk,
                dv,
            };
            match (mode, saved) {
                (_, Some(saved)) => recurrent_saving(s, &heads, o, saved),
                (DeltaMode::Chunked, None) if n_tok > 1 => chunked(s, &heads, CHUNK, o),
                _ => recurrent(s, &heads, o),
            }
        });

    // Gated RMSNorm per head: RMSNorm(o_h; ssm_norm) ⊙ silu(z_h), back in token-major order [T × Hv·dv].
    let n = &mut n[..n_tok * nv];
    for_rows(n, nv, |t, n| {
        for (h, dst) in n.chunks_exact_mut(dv).enumerate() {
            dst.copy_from_slice(&o_heads[(h * n_tok + t) * dv..][..dv]);
            rms_norm(dst, &w.norm, hp.rms_eps);
            silu_mul(dst, &z[t * nv + h * dv..][..dv]);
        }
    });
    matmul(&w.wout, n, n_tok, out);
}

/// Regroups heads of `d` elements, found from element `off` of every row of `x` (`[T × stride]`), head
/// by head into `out` (`[H × T × d]`).
fn by_head<'a>(x: &[f32], stride: usize, off: usize, d: usize, out: &'a mut [f32]) -> &'a [f32] {
    let n_tok = x.len() / stride;
    for_rows(out, n_tok * d, |h, oh| {
        for (t, o) in oh.chunks_exact_mut(d).enumerate() {
            o.copy_from_slice(&x[t * stride + off + h * d..][..d]);
        }
    });
    out
}

/// Copies the conv state (`[C][K−1]`) into the first K−1 rows of the window `[K−1+T][C]`.
fn conv_window_in(state: &[f32], c: usize, win: &mut [f32]) {
    let ks = state.len() / c;
    for ch in 0..c {
        for i in 0..ks {
            win[i * c + ch] = state[ch * ks + i];
        }
    }
}

/// Writes to `state` (`[C][K−1]`) the conv state after the window's first `n` tokens: the K−1 inputs
/// ending at token `n − 1` (window rows `n..n + K − 1`).
fn conv_state_after(state: &mut [f32], c: usize, n: usize, win: &[f32]) {
    let ks = state.len() / c;
    for ch in 0..c {
        for i in 0..ks {
            state[ch * ks + i] = win[(n + i) * c + ch];
        }
    }
}

/// Tokens per task of [`conv_heads`]: a block's conv rows (`[16 × C]`, 384 KiB on the 0.8B) stay in L2
/// from the conv to their copies into the heads.
const CONV_TOKENS: usize = 16;

thread_local! {
    /// The calling thread's `[tokens × C]` conv rows of one block ([`conv_heads`]), kept between calls.
    static CONV_ROWS: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// Causal depthwise conv + SiLU. `taps`: `[K][C]`; `win`: `[K−1+T][C]`, the window [state | u];
/// `dims`: `[Hk·dk, dk, dv]`, the channels being [q: Hk × dk | k: Hk × dk | v: Hv × dv]. Writes `qkv`
/// by head, `[Hk × T × dk | Hk × T × dk | Hv × T × dv]` (the head of channels `c0..` at `c0·T`; for one
/// token, the row itself), q and k heads L2-normed and q scaled by `q_scale`.
/// Blocks of tokens run in parallel: the window is read in order, and each head's part of a block is
/// written as one run.
#[allow(clippy::too_many_arguments)]
fn conv_heads(
    taps: &[f32],
    kk: usize,
    win: &[f32],
    n_tok: usize,
    [nq, dk, dv]: [usize; 3],
    eps: f32,
    q_scale: f32,
    qkv: &mut [f32],
) {
    let c = taps.len() / kk;
    // Rows t0.. of silu(conv(u)) into y ([tokens × C]).
    let conv_rows = |t0: usize, y: &mut [f32]| conv_silu(taps, kk, &win[t0 * c..], y);
    // A head's row of channels c0..: q and k normed, q scaled.
    let finish = |c0: usize, h: &mut [f32]| {
        if c0 < 2 * nq {
            l2_norm(h, eps);
        }
        if c0 < nq {
            h.iter_mut().for_each(|x| *x *= q_scale);
        }
    };
    // One token: the conv writes the row in place, which is already [q heads | k heads | v heads].
    if n_tok == 1 {
        conv_rows(0, qkv);
    }
    // Every head as (first channel, width, [T × d]).
    let (qk, v) = qkv.split_at_mut(2 * nq * n_tok);
    let heads = (qk.chunks_exact_mut(n_tok * dk).enumerate())
        .map(|(h, o)| (h * dk, dk, o))
        .chain((v.chunks_exact_mut(n_tok * dv).enumerate()).map(|(h, o)| (2 * nq + h * dv, dv, o)));
    if n_tok == 1 {
        heads.for_each(|(c0, _, o)| finish(c0, o));
        return;
    }
    // Per block of tokens, (first channel, [tokens × d]) of every head.
    let n_blocks = n_tok.div_ceil(CONV_TOKENS);
    let mut blocks: Vec<Vec<(usize, &mut [f32])>> = (0..n_blocks).map(|_| Vec::new()).collect();
    for (c0, d, head) in heads {
        for (b, part) in head.chunks_mut(CONV_TOKENS * d).enumerate() {
            blocks[b].push((c0, part));
        }
    }
    blocks.par_iter_mut().enumerate().for_each(|(b, heads)| {
        let t0 = b * CONV_TOKENS;
        let tb = CONV_TOKENS.min(n_tok - t0);
        let mut rows = CONV_ROWS.take();
        if rows.len() < tb * c {
            rows.resize(tb * c, 0.0);
        }
        let y = &mut rows[..tb * c];
        conv_rows(t0, y);
        for (c0, out) in heads.iter_mut() {
            let d = out.len() / tb;
            for (t, o) in out.chunks_exact_mut(d).enumerate() {
                o.copy_from_slice(&y[t * c + *c0..][..d]);
                finish(*c0, o);
            }
        }
        CONV_ROWS.set(rows);
    });
}

/// One value head's inputs for `T` tokens: `q`, `k` `[T × dk]` (normed, q scaled), `v` `[T × dv]`,
/// log-decays `g` and write strengths `beta` `[T]`.
pub struct Head<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: &'a [f32],
    pub beta: &'a [f32],
    pub dk: usize,
    pub dv: usize,
}

/// Token by token: `S ← e^g S; δ = β (v − Sᵀk); S ← S + k δᵀ; o = Sᵀq`. With `M = Sᵀ` stored row-major
/// every value dim `j` is an independent row: decay, read, write and output are row operations.
/// `m`: `[dv × dk]`; `out`: `[T × dv]`.
pub fn recurrent(m: &mut [f32], x: &Head, out: &mut [f32]) {
    let _ftz = FlushDenormals::new();
    let (dk, dv) = (x.dk, x.dv);
    for t in 0..x.g.len() {
        let (q, k, v) = (
            &x.q[t * dk..][..dk],
            &x.k[t * dk..][..dk],
            &x.v[t * dv..][..dv],
        );
        let o = &mut out[t * dv..][..dv];
        delta_step(None, m, q, k, v, x.g[t].exp(), x.beta[t], o);
    }
}

/// [`recurrent`], leaving the state after each token but the last in `saved[t]` (`T − 1` head states):
/// token 0 reads `m` and writes `saved[0]`, token t reads `saved[t−1]` and writes `saved[t]`, and the
/// last token reads `saved[T−2]` and writes `m`. Each state is written once, as in place, and never
/// copied. The value dims (state rows) are independent, so the tokens run over blocks of
/// [`SAVE_ROWS`] rows, which stay in L1 from one token to the next: the state is read from memory once
/// for all tokens instead of once per token. Every row gets the same operations as token by token.
fn recurrent_saving(m: &mut [f32], x: &Head, out: &mut [f32], saved: &mut [&mut [f32]]) {
    let _ftz = FlushDenormals::new();
    let (dk, dv, n_tok) = (x.dk, x.dv, x.g.len());
    debug_assert_eq!(saved.len() + 1, n_tok);
    let decay: Vec<f32> = x.g.iter().map(|g| g.exp()).collect();
    for j0 in (0..dv).step_by(SAVE_ROWS) {
        let nr = SAVE_ROWS.min(dv - j0);
        let rows = j0 * dk..(j0 + nr) * dk;
        for t in 0..n_tok {
            let (q, k, v) = (
                &x.q[t * dk..][..dk],
                &x.k[t * dk..][..dk],
                &x.v[t * dv + j0..][..nr],
            );
            let (beta, o) = (x.beta[t], &mut out[t * dv + j0..][..nr]);
            let (before, rest) = saved.split_at_mut(t);
            let from = before.last().map(|s| &s[rows.clone()]);
            let (d, b) = (decay[t], beta);
            match (from, rest.first_mut()) {
                // Token 0 reads the live state.
                (None, Some(to)) => delta_step(
                    Some(&m[rows.clone()]),
                    &mut to[rows.clone()],
                    q,
                    k,
                    v,
                    d,
                    b,
                    o,
                ),
                (Some(from), Some(to)) => {
                    delta_step(Some(from), &mut to[rows.clone()], q, k, v, d, b, o)
                }
                (Some(from), None) => {
                    delta_step(Some(from), &mut m[rows.clone()], q, k, v, d, b, o)
                }
                (None, None) => delta_step(None, &mut m[rows.clone()], q, k, v, d, b, o),
            }
        }
    }
}

/// State rows per block of [`recurrent_saving`]: 16 rows of `dk` = 128 are 8 KiB, so the block read and
/// its writes for 3 tokens fit in L1.
const SAVE_ROWS: usize = 16;

/// The chunked (WY / UT-transform) form of the same recurrence, spec §4, chunks of `chunk` tokens
/// (the last one shorter instead of zero-padded: padding rows would not change anything).
/// Every exponential is of `γ_i − γ_j` with `j ≤ i` (≤ 0): masked before exp, never a ratio.
///
/// Works on `S = Mᵀ` (`[dk × dv]`) so that every step is a row-major matrix product ([`gemm`]).
pub fn chunked(m: &mut [f32], x: &Head, chunk: usize, out: &mut [f32]) {
    // Decay factors of distant tokens are subnormal in fast-decaying heads (see `fpenv`).
    let _ftz = FlushDenormals::new();
    let (dk, dv) = (x.dk, x.dv);
    let n_tok = x.g.len();
    let mut s = vec![0f32; dk * dv];
    transpose(m, dv, dk, &mut s);
    let mut kt = vec![0f32; dk * chunk]; // Kᵀ [dk × n]
    let mut a = vec![0f32; chunk * chunk]; // A [n × n]
    let mut p = vec![0f32; chunk * chunk]; // P [n × n]
    let mut dm = vec![0f32; chunk * chunk]; // D [n × n]
    let mut uu = vec![0f32; chunk * dv]; // U, then V' [n × dv]
    let mut ww = vec![0f32; chunk * dk]; // W [n × dk]
    let mut vs = vec![0f32; chunk * dv]; // V' rows scaled by their decay to the chunk end [n × dv]
    let mut s0 = 0;
    while s0 < n_tok {
        let n = chunk.min(n_tok - s0);
        let q = &x.q[s0 * dk..(s0 + n) * dk];
        let k = &x.k[s0 * dk..(s0 + n) * dk];
        let v = &x.v[s0 * dv..(s0 + n) * dv];
        let beta = &x.beta[s0..s0 + n];

        // γ_i = Σ_{s≤i} g_s (inclusive cumulative log-decay), in f64: γ can reach −10³ within a chunk and
        // the f32 rounding of γ_i − γ_j would then cost ~1e-4 relative in every decay factor.
        let gamma: Vec<f64> = x.g[s0..s0 + n]
            .iter()
            .scan(0f64, |acc, &g| {
                *acc += g as f64;
                Some(*acc)
            })
            .collect();
        let eg: Vec<f32> = gamma.iter().map(|g| g.exp() as f32).collect();
        // D_ij = e^{γ_i−γ_j} for j ≤ i, 0 above the diagonal (e^−∞); the differences in f64, rounded to f32
        // (a relative error of |γ_i − γ_j|·2⁻²⁴ at most) and exponentiated as one vector.
        let d = &mut dm[..n * n];
        for (i, row) in d.chunks_exact_mut(n).enumerate() {
            for (j, x) in row.iter_mut().enumerate() {
                *x = if j <= i {
                    (gamma[i] - gamma[j]) as f32
                } else {
                    f32::NEG_INFINITY
                };
            }
        }
        exp_in_place(d);
        let d = &*d;

        // K·Kᵀ and Q·Kᵀ, then A_ij = β_i (k_i·k_j) D_ij strictly lower and P_ij = (q_i·k_j) D_ij lower
        // with the diagonal.
        let (a, p) = (&mut a[..n * n], &mut p[..n * n]);
        transpose(k, n, dk, &mut kt);
        gemm(n, n, dk, 1.0, k, dk, &kt, n, 0.0, a, n);
        gemm(n, n, dk, 1.0, q, dk, &kt, n, 0.0, p, n);
        for i in 0..n {
            let (ai, pi, di) = (&mut a[i * n..][..n], &mut p[i * n..][..n], &d[i * n..][..n]);
            for (j, (a, d)) in ai.iter_mut().zip(di).enumerate() {
                *a = if j < i { beta[i] * *a * d } else { 0.0 };
            }
            pi.iter_mut().zip(di).for_each(|(p, d)| *p *= d);
        }

        // (I + A) U = β⊙V and (I + A) W = β⊙e^γ⊙K by forward substitution, in blocks of rows: the
        // earlier blocks' contribution as one product, then row by row inside the block.
        let (uu, ww) = (&mut uu[..n * dv], &mut ww[..n * dk]);
        for i in 0..n {
            let (ui, vi) = (&mut uu[i * dv..][..dv], &v[i * dv..][..dv]);
            ui.iter_mut().zip(vi).for_each(|(u, v)| *u = beta[i] * v);
            let (wi, ki) = (&mut ww[i * dk..][..dk], &k[i * dk..][..dk]);
            let f = beta[i] * eg[i];
            wi.iter_mut().zip(ki).for_each(|(w, k)| *w = f * k);
        }
        const SUBST_BLOCK: usize = 8;
        for i0 in (0..n).step_by(SUBST_BLOCK) {
            let i1 = (i0 + SUBST_BLOCK).min(n);
            let (done_u, rest_u) = uu.split_at_mut(i0 * dv);
            let (done_w, rest_w) = ww.split_at_mut(i0 * dk);
            if i0 > 0 {
                gemm(
                    i1 - i0,
                    dv,
                    i0,
                    -1.0,
                    &a[i0 * n..],
                    n,
                    done_u,
                    dv,
                    1.0,
                    rest_u,
                    dv,
                );
                gemm(
                    i1 - i0,
                    dk,
                    i0,
                    -1.0,
                    &a[i0 * n..],
                    n,
                    done_w,
                    dk,
                    1.0,
                    rest_w,
                    dk,
                );
            }
            for i in i0..i1 {
                let (blk_u, cur_u) = rest_u.split_at_mut((i - i0) * dv);
                let (blk_w, cur_w) = rest_w.split_at_mut((i - i0) * dk);
                for j in i0..i {
                    let aij = a[i * n + j];
                    axpy(&mut cur_u[..dv], -aij, &blk_u[(j - i0) * dv..][..dv]);
                    axpy(&mut cur_w[..dk], -aij, &blk_w[(j - i0) * dk..][..dk]);
                }
            }
        }

        // V' = U − W·S (the per-token deltas, with the incoming state).
        gemm(n, dv, dk, -1.0, ww, dk, &s, dv, 1.0, uu, dv);
        let vp = &*uu;
        // O = e^γ ⊙ (Q·S) (inter-chunk) + P·V' (intra-chunk, diagonal included).
        let o = &mut out[s0 * dv..(s0 + n) * dv];
        gemm(n, dv, dk, 1.0, q, dk, &s, dv, 0.0, o, dv);
        for (oi, e) in o.chunks_exact_mut(dv).zip(&eg) {
            oi.iter_mut().for_each(|x| *x *= e);
        }
        gemm(n, dv, n, 1.0, p, n, vp, dv, 1.0, o, dv);
        // S ← e^{γ_last} S + Kᵀ · (e^{γ_last−γ_t} V'_t)_t
        let vs = &mut vs[..n * dv];
        for t in 0..n {
            let d = d[(n - 1) * n + t];
            for (y, x) in vs[t * dv..][..dv].iter_mut().zip(&vp[t * dv..][..dv]) {
                *y = d * x;
            }
        }
        gemm(dk, dv, n, 1.0, &kt, n, vs, dv, eg[n - 1], &mut s, dv);
        s0 += n;
    }
    transpose(&s, dk, dv, m);
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rng(u64);
    impl Rng {
        fn uniform(&mut self) -> f32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 40) as f32 / (1u64 << 24) as f32
        }
        fn normal_vec(&mut self, n: usize) -> Vec<f32> {
            (0..n)
                .map(|_| (0..12).map(|_| self.uniform()).sum::<f32>() - 6.0)
                .collect()
        }
    }

    fn unit_rows(mut x: Vec<f32>, d: usize, scale: f32) -> Vec<f32> {
        for r in x.chunks_exact_mut(d) {
            l2_norm(r, 1e-6);
            r.iter_mut().for_each(|v| *v *= scale);
        }
        x
    }

    /// Spec §4's recommended test: chunked vs recurrent in f32, dk = dv = 128, C = 64, g ∈ U(−20, −1e-4).
    #[test]
    fn chunked_matches_recurrent() {
        let (dk, dv) = (128, 128);
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for n_tok in [1usize, 63, 64, 65, 200] {
            let q = unit_rows(rng.normal_vec(n_tok * dk), dk, 1.0 / (dk as f32).sqrt());
            let k = unit_rows(rng.normal_vec(n_tok * dk), dk, 1.0);
            let v = rng.normal_vec(n_tok * dv);
            let g: Vec<f32> = (0..n_tok)
                .map(|_| -1e-4 - rng.uniform() * (20.0 - 1e-4))
                .collect();
            let beta: Vec<f32> = (0..n_tok).map(|_| rng.uniform()).collect();
            let s0: Vec<f32> = rng.normal_vec(dk * dv).iter().map(|x| x * 0.1).collect();
            let head = Head {
                q: &q,
                k: &k,
                v: &v,
                g: &g,
                beta: &beta,
                dk,
                dv,
            };
            let (mut m1, mut m2) = (s0.clone(), s0.clone());
            let (mut o1, mut o2) = (vec![0f32; n_tok * dv], vec![0f32; n_tok * dv]);
            recurrent(&mut m1, &head, &mut o1);
            chunked(&mut m2, &head, CHUNK, &mut o2);
            let max = |a: &[f32], b: &[f32]| {
                a.iter()
                    .zip(b)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0f32, f32::max)
            };
            assert!(
                max(&o1, &o2) < 1e-4,
                "T={n_tok}: outputs differ by {}",
                max(&o1, &o2)
            );
            assert!(
                max(&m1, &m2) < 1e-4,
                "T={n_tok}: states differ by {}",
                max(&m1, &m2)
            );
        }
    }

    /// Slow decays (g near 0) keep the state large: the regime where errors would accumulate.
    #[test]
    fn chunked_matches_recurrent_slow_decay() {
        let (dk, dv, n_tok) = (64, 64, 150);
        let mut rng = Rng(42);
        let q = unit_rows(rng.normal_vec(n_tok * dk), dk, 0.125);
        let k = unit_rows(rng.normal_vec(n_tok * dk), dk, 1.0);
        let v = rng.normal_vec(n_tok * dv);
        let g: Vec<f32> = (0..n_tok).map(|_| -0.05 * rng.uniform()).collect();
        let beta: Vec<f32> = (0..n_tok).map(|_| rng.uniform()).collect();
        let head = Head {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
            dk,
            dv,
        };
        let (mut m1, mut m2) = (vec![0f32; dk * dv], vec![0f32; dk * dv]);
        let (mut o1, mut o2) = (vec![0f32; n_tok * dv], vec![0f32; n_tok * dv]);
        recurrent(&mut m1, &head, &mut o1);
        chunked(&mut m2, &head, 16, &mut o2);
        let d = o1
            .iter()
            .zip(&o2)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(d < 1e-4, "outputs differ by {d}");
    }
}
