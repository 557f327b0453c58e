//! Prefill GEMM for the K-quants on NEON with FEAT_DotProd: 4 weight rows × 4 codes in a 128-bit vector.
//!
//! The row kernels of [`super::kquants`] decode each block's codes (shifts, masks, high-bit merges) for
//! every (row, token) pair. Here a panel of 4 rows is decoded once per call into a layout where byte
//! `4r + m` of quad vector `q` holds the code of row `r` at column `4q + m` (signed i8: the same values
//! the row kernels feed to `sdot`, offsets of Q3_K/Q6_K included), next to the rows' sub-block scales and
//! mins as vector lanes. Then `sdot vD.4s, vW.16b, vA.4b[i]` (by element) multiplies the 4 rows by 4
//! activation bytes of one token: 16 products, no activation shuffles.
//!
//! Bit-identity with the row kernels: a row kernel keeps a block's integer sum in the 4 i32 lanes of its
//! `sdot` accumulator, lane `i` holding the (scaled) products of the columns `c` with `c % 16 / 4 == i`,
//! converts the 4 lanes to f32 separately, accumulates them over the blocks in 4 f32 lanes (`d·dy`, one
//! fused multiply-add per lane) and only sums the lanes at the end (`vaddvq_f32`: `(l0 + l1) + (l2 + l3)`),
//! plus a scalar part for the mins. So the GEMM keeps the same 4 "column classes" apart: quad `q` goes to
//! class `q % 4` (activation element `i = q % 4` of the 16-byte activation chunk), each class has its own
//! accumulators per (4 rows, token), and the epilogue performs the same f32 operations in the same order
//! per (row, block, token). The integer sums per class are exact, so the results are bit-identical to
//! the row kernels of the dot-product table (prefill equals decode).
//!
//! Sub-block scales by summation by parts: with `P_j` the running (never reset) `sdot` sum of a class up
//! to sub-block `j` and `δ_j = sc_j − sc_{j+1}` (`sc_n = 0`), `Σ_j sc_j·(P_j − P_{j−1}) = Σ_j δ_j·P_j`.
//! The panel stores `δ`, so a sub-block costs one `mla` per class and token and no accumulator reset;
//! the i32 arithmetic wraps, and the result is the exact block sum (which fits in i32, §5.3).
//!
//! Tile: 4 rows × 2 tokens: 8 running sums `P` and 8 scaled sums `S` (token × class), 2 × 2 activation
//! chunks, 2 weight quads and the `δ` vector (23 of the 32 vector registers); a 1-token tile for an odd
//! token count. The tokens go in passes of 32, so that their activations stay in cache while each panel
//! of the call reads them. Per sub-block of 32 columns (Q4_K, Q5_K): 8 quad loads, 2 chunk loads per
//! token, 16 `sdot` and 8 `mla` for 256 multiply-adds; per sub-block of 16 columns: 4 + 2 loads, 8
//! `sdot`, 8 `mla`.

use core::arch::aarch64::*;
use core::arch::asm;
use std::cell::Cell;

use super::kquants::{
    q3_scales, q3k_half, q6k_half, scales_mins, Q2K, Q3K, Q4K, Q5K, Q6K, Q8K_BSUMS, Q8K_BYTES,
    Q8K_QS,
};
use super::neon::{h2f, ld_f32, ld_u16};
use crate::kernels::GemmOut;

/// Rows per panel (the i32 lanes of a vector).
const ROWS: usize = 4;
/// Tokens per tile (the last odd token goes through a 1-token tile).
const TOK: usize = 2;
/// Tokens per pass over the call's rows: every 4-row panel reads the activations of all the pass's
/// tokens, which should stay in L2 (32 × 292 bytes per 256 columns: 144 KiB at 4096 columns); the panels
/// are decoded again for each pass (a few instructions per row, block and token).
const TOK_BLOCK: usize = 32;

/// One row's super-block, decoded.
#[derive(Clone, Copy)]
pub(super) struct RowBlock {
    /// The 256 codes in column order, as the row kernels multiply them (signed).
    codes: [i8; 256],
    /// Sub-block scales (8 of 32 columns or 16 of 16 columns).
    sc: [i32; 16],
    /// Mins per sub-block (formats with mins: 8 or 16).
    mins: [i16; 16],
    d: f32,
    dmin: f32,
}

impl RowBlock {
    const ZERO: RowBlock = RowBlock {
        codes: [0; 256],
        sc: [0; 16],
        mins: [0; 16],
        d: 0.0,
        dmin: 0.0,
    };
}

/// One super-block (256 columns) of a 4-row panel, decoded and transposed.
#[derive(Clone, Copy)]
#[repr(C, align(16))]
pub(super) struct PanelBlock {
    /// `codes[q]`: byte `4r + m` is row `r`'s code at column `4q + m`.
    codes: [[i8; 16]; 64],
    /// `delta[j]`: lane `r` is row `r`'s `sc_j − sc_{j+1}` (sub-block scales, `sc_16 = 0`).
    delta: [[i32; 4]; 16],
    /// `mins[j]`: lane `r` is row `r`'s min of sub-block `j`.
    mins: [[i16; 4]; 16],
    d: [f32; 4],
    dmin: [f32; 4],
}

impl PanelBlock {
    const ZERO: PanelBlock = PanelBlock {
        codes: [[0; 16]; 64],
        delta: [[0; 4]; 16],
        mins: [[0; 4]; 16],
        d: [0.0; 4],
        dmin: [0.0; 4],
    };
}

thread_local! {
    /// The calling thread's decoded panel, grown to the longest row seen.
    static PANEL: Cell<Vec<PanelBlock>> = const { Cell::new(Vec::new()) };
}

/// A K-quant format as the GEMM sees it.
pub(super) trait KGemm {
    /// Bytes of a weight block.
    const WB: usize;
    /// 16 sub-blocks of 16 columns (else 8 of 32).
    const SUB16: bool;
    /// Mins per block: 0 (codes stored with their offset, no mins), 8 (one per 32 columns, against pairs
    /// of `bsums`) or 16 (one per 16 columns).
    const N_MIN: usize;
    /// Decodes the block at `x` into `out` (every field the format uses; the others are left alone).
    ///
    /// # Safety
    /// `x` must be readable for `WB` bytes.
    unsafe fn decode(x: *const u8, out: &mut RowBlock);
}

/// Stores 16 codes at column `col` of `out`.
#[inline(always)]
fn put(out: &mut RowBlock, col: usize, v: int8x16_t) {
    let dst = &mut out.codes[col..col + 16];
    // SAFETY: `dst` is 16 writable bytes (the slice above is bounds-checked); NEON is part of every
    // aarch64 CPU.
    unsafe { vst1q_s8(dst.as_mut_ptr(), v) }
}

/// Stores half `h` of a block as the shared half decoders (`q3k_half`, `q6k_half`) return it: pair `j`
/// holds columns `128·h + 32·j ..+16` and `..+32`.
#[inline(always)]
fn put_half(out: &mut RowBlock, h: usize, pairs: [(int8x16_t, int8x16_t); 4]) {
    for (j, (v0, v1)) in pairs.into_iter().enumerate() {
        let col = 128 * h + 32 * j;
        put(out, col, v0);
        put(out, col + 16, v1);
    }
}

impl KGemm for Q2K {
    const WB: usize = 84;
    const SUB16: bool = true;
    const N_MIN: usize = 16;

    #[inline(always)]
    unsafe fn decode(x: *const u8, out: &mut RowBlock) {
        let sc = vld1q_u8(x);
        let mut b = [0u8; 16];
        vst1q_u8(b.as_mut_ptr(), vandq_u8(sc, vdupq_n_u8(0x0F)));
        for (o, s) in out.sc.iter_mut().zip(b) {
            *o = s as i32;
        }
        vst1q_u8(b.as_mut_ptr(), vshrq_n_u8::<4>(sc));
        for (o, m) in out.mins.iter_mut().zip(b) {
            *o = m as i16;
        }
        let three = vdupq_n_u8(3);
        for h in 0..2 {
            let mut q0 = vld1q_u8(x.add(16 + 32 * h));
            let mut q1 = vld1q_u8(x.add(16 + 32 * h + 16));
            for j in 0..4 {
                let col = 128 * h + 32 * j;
                put(out, col, vreinterpretq_s8_u8(vandq_u8(q0, three)));
                put(out, col + 16, vreinterpretq_s8_u8(vandq_u8(q1, three)));
                q0 = vshrq_n_u8::<2>(q0);
                q1 = vshrq_n_u8::<2>(q1);
            }
        }
        out.d = h2f(ld_u16(x.add(80)));
        out.dmin = h2f(ld_u16(x.add(82)));
    }
}

impl KGemm for Q3K {
    const WB: usize = 110;
    const SUB16: bool = true;
    const N_MIN: usize = 0;

    #[inline(always)]
    unsafe fn decode(x: *const u8, out: &mut RowBlock) {
        for (o, s) in out.sc.iter_mut().zip(q3_scales(x.add(96))) {
            *o = s as i32;
        }
        for h in 0..2 {
            put_half(out, h, q3k_half(x, h));
        }
        out.d = h2f(ld_u16(x.add(108)));
    }
}

/// Q4_K/Q5_K: the 8 sub-block scales and mins (12 bytes after `d`, `dmin`) into `out`.
///
/// # Safety
/// `x` must be readable for the block's first 16 bytes.
#[inline(always)]
unsafe fn scales_mins_into(x: *const u8, out: &mut RowBlock) {
    let (scales, mins) = scales_mins(x.add(4));
    for ((sc, mn), (s, m)) in out
        .sc
        .iter_mut()
        .zip(&mut out.mins)
        .zip(scales.into_iter().zip(mins))
    {
        *sc = s as i32;
        *mn = m as i16;
    }
}

impl KGemm for Q4K {
    const WB: usize = 144;
    const SUB16: bool = false;
    const N_MIN: usize = 8;

    #[inline(always)]
    unsafe fn decode(x: *const u8, out: &mut RowBlock) {
        scales_mins_into(x, out);
        let m4 = vdupq_n_u8(0x0F);
        for c in 0..4 {
            let q0 = vld1q_u8(x.add(16 + 32 * c));
            let q1 = vld1q_u8(x.add(16 + 32 * c + 16));
            let col = 64 * c;
            put(out, col, vreinterpretq_s8_u8(vandq_u8(q0, m4)));
            put(out, col + 16, vreinterpretq_s8_u8(vandq_u8(q1, m4)));
            put(out, col + 32, vreinterpretq_s8_u8(vshrq_n_u8::<4>(q0)));
            put(out, col + 48, vreinterpretq_s8_u8(vshrq_n_u8::<4>(q1)));
        }
        out.d = h2f(ld_u16(x));
        out.dmin = h2f(ld_u16(x.add(2)));
    }
}

impl KGemm for Q5K {
    const WB: usize = 176;
    const SUB16: bool = false;
    const N_MIN: usize = 8;

    #[inline(always)]
    unsafe fn decode(x: *const u8, out: &mut RowBlock) {
        scales_mins_into(x, out);
        let m4 = vdupq_n_u8(0x0F);
        let sixteen = vdupq_n_u8(0x10);
        let mut qh0 = vld1q_u8(x.add(16));
        let mut qh1 = vld1q_u8(x.add(32));
        for c in 0..4 {
            let q0 = vld1q_u8(x.add(48 + 32 * c));
            let q1 = vld1q_u8(x.add(48 + 32 * c + 16));
            let l0 = vorrq_u8(vandq_u8(q0, m4), vandq_u8(vshlq_n_u8::<4>(qh0), sixteen));
            let l1 = vorrq_u8(vandq_u8(q1, m4), vandq_u8(vshlq_n_u8::<4>(qh1), sixteen));
            let h0 = vorrq_u8(vshrq_n_u8::<4>(q0), vandq_u8(vshlq_n_u8::<3>(qh0), sixteen));
            let h1 = vorrq_u8(vshrq_n_u8::<4>(q1), vandq_u8(vshlq_n_u8::<3>(qh1), sixteen));
            let col = 64 * c;
            put(out, col, vreinterpretq_s8_u8(l0));
            put(out, col + 16, vreinterpretq_s8_u8(l1));
            put(out, col + 32, vreinterpretq_s8_u8(h0));
            put(out, col + 48, vreinterpretq_s8_u8(h1));
            qh0 = vshrq_n_u8::<2>(qh0);
            qh1 = vshrq_n_u8::<2>(qh1);
        }
        out.d = h2f(ld_u16(x));
        out.dmin = h2f(ld_u16(x.add(2)));
    }
}

impl KGemm for Q6K {
    const WB: usize = 210;
    const SUB16: bool = true;
    const N_MIN: usize = 0;

    #[inline(always)]
    unsafe fn decode(x: *const u8, out: &mut RowBlock) {
        for (k, o) in out.sc.iter_mut().enumerate() {
            *o = *x.add(192 + k) as i8 as i32;
        }
        for h in 0..2 {
            put_half(out, h, q6k_half(x, h));
        }
        out.d = h2f(ld_u16(x.add(208)));
    }
}

/// `out(t, r) = W[r] · A[t]` for K-quant rows `w` (`out.rows()` of them) and Q8_K activations `a`
/// (`out.n_tok()` rows), bit-identical to the dot-product table's row kernels.
///
/// # Safety
/// The CPU must have FEAT_DotProd (the caller's target feature). (Lengths are checked here.)
#[inline(always)]
pub(super) unsafe fn gemm<K: KGemm>(w: &[u8], a: &[u8], mut out: GemmOut<'_>) {
    let (n_rows, n_tok) = (out.rows(), out.n_tok());
    if n_tok == 0 || n_rows == 0 {
        return;
    }
    let (rb, nb) = out.blocks(w, a, K::WB, Q8K_BYTES);
    let mut panel = PANEL.take();
    if panel.len() < nb {
        panel.resize(nb, PanelBlock::ZERO);
    }
    let mut rows_blk = [RowBlock::ZERO; ROWS];
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let arow = |t: usize| ap.add(t * nb * Q8K_BYTES);
    for t0 in (0..n_tok).step_by(TOK_BLOCK) {
        let t1 = n_tok.min(t0 + TOK_BLOCK);
        let mut r0 = 0;
        while r0 < n_rows {
            let rows = ROWS.min(n_rows - r0);
            // Lanes past `rows` decode as zeros (earlier panels may have filled them).
            rows_blk[rows..].fill(RowBlock::ZERO);
            for (b, blk) in panel[..nb].iter_mut().enumerate() {
                unpack::<K>(wp.add(r0 * rb), rb, rows, b, &mut rows_blk, blk);
            }
            let panel = &panel[..nb];
            // Token t's results go to its output row at column r0 (`token_ptr` checks t).
            let mut o = |t: usize| out.token_ptr(t).wrapping_add(r0);
            let mut t = t0;
            while t + TOK <= t1 {
                let dst = core::array::from_fn(|i| o(t + i));
                tile::<K, TOK>(panel, core::array::from_fn(|i| arow(t + i)), dst, rows);
                t += TOK;
            }
            if t < t1 {
                tile::<K, 1>(panel, [arow(t)], [o(t)], rows);
            }
            r0 += rows;
        }
    }
    PANEL.set(panel);
}

/// Decodes block `b` of `rows` (≤ 4) rows starting at `w` (`rb` bytes apart) into `out`, through the
/// per-row scratch `rows_blk` (whose entries past `rows` must be zero).
///
/// # Safety
/// Rows `0..rows` must each hold at least `b + 1` blocks of `K::WB` bytes (`gemm` checks the lengths);
/// the CPU features as [`gemm`].
#[inline(always)]
unsafe fn unpack<K: KGemm>(
    w: *const u8,
    rb: usize,
    rows: usize,
    b: usize,
    rows_blk: &mut [RowBlock; ROWS],
    out: &mut PanelBlock,
) {
    for (r, rbk) in rows_blk[..rows].iter_mut().enumerate() {
        K::decode(w.add(r * rb + b * K::WB), rbk);
    }
    let g = &*rows_blk;
    // 16 columns at a time: a 4 × 4 transpose of u32 (4 codes) from rows to quads.
    for (c, quads) in out.codes.chunks_exact_mut(4).enumerate() {
        let r: [uint32x4_t; 4] = core::array::from_fn(|i| {
            vreinterpretq_u32_s8(vld1q_s8(g[i].codes[16 * c..16 * c + 16].as_ptr()))
        });
        let t0 = vreinterpretq_u64_u32(vtrn1q_u32(r[0], r[1]));
        let t1 = vreinterpretq_u64_u32(vtrn2q_u32(r[0], r[1]));
        let t2 = vreinterpretq_u64_u32(vtrn1q_u32(r[2], r[3]));
        let t3 = vreinterpretq_u64_u32(vtrn2q_u32(r[2], r[3]));
        let q = [
            vtrn1q_u64(t0, t2),
            vtrn1q_u64(t1, t3),
            vtrn2q_u64(t0, t2),
            vtrn2q_u64(t1, t3),
        ];
        for (dst, q) in quads.iter_mut().zip(q) {
            vst1q_s8(dst.as_mut_ptr(), vreinterpretq_s8_u64(q));
        }
    }
    // Scale differences for the summation by parts (the scales past the format's sub-blocks are zero).
    for (j, (delta, mins)) in out.delta.iter_mut().zip(&mut out.mins).enumerate() {
        *delta = core::array::from_fn(|i| g[i].sc[j] - g[i].sc.get(j + 1).copied().unwrap_or(0));
        *mins = core::array::from_fn(|i| g[i].mins[j]);
    }
    out.d = core::array::from_fn(|i| g[i].d);
    out.dmin = core::array::from_fn(|i| g[i].dmin);
}

/// `acc.s[r] += Σ_m w.b[4r + m] · a.b[4I + m]` (`sdot`, by element).
///
/// # Safety
/// The CPU must have FEAT_DotProd.
#[inline(always)]
unsafe fn sdot_lane<const I: usize>(mut acc: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t {
    macro_rules! sdot {
        ($i:literal) => {
            asm!(
                concat!("sdot {acc:v}.4s, {w:v}.16b, {a:v}.4b[", $i, "]"),
                acc = inout(vreg) acc,
                w = in(vreg) w,
                a = in(vreg) a,
                options(pure, nomem, nostack, preserves_flags)
            )
        };
    }
    match I {
        0 => sdot!(0),
        1 => sdot!(1),
        2 => sdot!(2),
        _ => sdot!(3),
    }
    acc
}

/// Σ_k mins[k] · bsums[k] for the panel's 4 rows (16 mins, `b0`/`b1` the 16 bsums).
#[inline(always)]
unsafe fn mins16(pb: &PanelBlock, b0: int16x8_t, b1: int16x8_t) -> int32x4_t {
    let m = |k: usize| vld1_s16(pb.mins[k].as_ptr());
    let mut acc = vmull_laneq_s16::<0>(m(0), b0);
    acc = vmlal_laneq_s16::<1>(acc, m(1), b0);
    acc = vmlal_laneq_s16::<2>(acc, m(2), b0);
    acc = vmlal_laneq_s16::<3>(acc, m(3), b0);
    acc = vmlal_laneq_s16::<4>(acc, m(4), b0);
    acc = vmlal_laneq_s16::<5>(acc, m(5), b0);
    acc = vmlal_laneq_s16::<6>(acc, m(6), b0);
    acc = vmlal_laneq_s16::<7>(acc, m(7), b0);
    acc = vmlal_laneq_s16::<0>(acc, m(8), b1);
    acc = vmlal_laneq_s16::<1>(acc, m(9), b1);
    acc = vmlal_laneq_s16::<2>(acc, m(10), b1);
    acc = vmlal_laneq_s16::<3>(acc, m(11), b1);
    acc = vmlal_laneq_s16::<4>(acc, m(12), b1);
    acc = vmlal_laneq_s16::<5>(acc, m(13), b1);
    acc = vmlal_laneq_s16::<6>(acc, m(14), b1);
    vmlal_laneq_s16::<7>(acc, m(15), b1)
}

/// Σ_j mins[j] · pairs[j] for the panel's 4 rows (8 mins, `pairs[j] = bsums[2j] + bsums[2j+1]`).
#[inline(always)]
unsafe fn mins8(pb: &PanelBlock, pairs: int16x8_t) -> int32x4_t {
    let m = |k: usize| vld1_s16(pb.mins[k].as_ptr());
    let mut acc = vmull_laneq_s16::<0>(m(0), pairs);
    acc = vmlal_laneq_s16::<1>(acc, m(1), pairs);
    acc = vmlal_laneq_s16::<2>(acc, m(2), pairs);
    acc = vmlal_laneq_s16::<3>(acc, m(3), pairs);
    acc = vmlal_laneq_s16::<4>(acc, m(4), pairs);
    acc = vmlal_laneq_s16::<5>(acc, m(5), pairs);
    acc = vmlal_laneq_s16::<6>(acc, m(6), pairs);
    vmlal_laneq_s16::<7>(acc, m(7), pairs)
}

/// Column class `I` of sub-block `j` (chunks `j·cps .. j·cps + cps` of 16 columns): `p[t][I] += Σ (codes ·
/// activations)` over the quads `4·chunk + I`.
///
/// # Safety
/// The CPU must have FEAT_DotProd; `cps` ≤ 2 and `(j + 1)·cps` ≤ 16.
#[inline(always)]
unsafe fn class<const T: usize, const I: usize>(
    pb: &PanelBlock,
    j: usize,
    cps: usize,
    av: &[[int8x16_t; 2]; T],
    p: &mut [[int32x4_t; 4]; T],
) {
    let w0 = vld1q_s8(pb.codes[4 * (j * cps) + I].as_ptr());
    let w1 = if cps == 2 {
        vld1q_s8(pb.codes[4 * (j * cps + 1) + I].as_ptr())
    } else {
        w0
    };
    for (p, av) in p.iter_mut().zip(av) {
        p[I] = sdot_lane::<I>(p[I], w0, av[0]);
        if cps == 2 {
            p[I] = sdot_lane::<I>(p[I], w1, av[1]);
        }
    }
}

/// Sub-block `j` (chunks `j·cps .. j·cps + cps` of 16 columns) for `T` tokens: the running sums `p` go
/// on, and `s += δ_j · p` (summation by parts).
///
/// # Safety
/// Each `ab[t]` must point to a Q8_K block; the CPU must have FEAT_DotProd; `cps` ≤ 2 and `(j + 1)·cps` ≤
/// 16.
#[inline(always)]
unsafe fn sub_block<const T: usize>(
    pb: &PanelBlock,
    j: usize,
    cps: usize,
    ab: &[*const u8; T],
    p: &mut [[int32x4_t; 4]; T],
    s: &mut [[int32x4_t; 4]; T],
) {
    let av: [[int8x16_t; 2]; T] = core::array::from_fn(|t| {
        let q = ab[t].add(Q8K_QS + 16 * j * cps) as *const i8;
        let a0 = vld1q_s8(q);
        [a0, if cps == 2 { vld1q_s8(q.add(16)) } else { a0 }]
    });
    class::<T, 0>(pb, j, cps, &av, p);
    class::<T, 1>(pb, j, cps, &av, p);
    class::<T, 2>(pb, j, cps, &av, p);
    class::<T, 3>(pb, j, cps, &av, p);
    let delta = vld1q_s32(pb.delta[j].as_ptr());
    for (s, p) in s.iter_mut().zip(p.iter()) {
        for (s, p) in s.iter_mut().zip(p) {
            *s = vmlaq_s32(*s, *p, delta);
        }
    }
}

/// `T` tokens × the panel's 4 rows over all `panel.len()` blocks; token `t`'s first `rows` results are
/// stored at `out[t]`.
///
/// Per (row, token) the f32 operations are those of the row kernels: per block, class lane `i` gets
/// `fma(v_i, float(S_i), d·dy)` and (mins) `s −= (dmin·dy)·float(M)`; at the end `((v_0 + v_1) + (v_2 +
/// v_3)) + s`.
///
/// # Safety
/// Each `a[t]` must point to `panel.len()` Q8_K blocks, and `out[t]` to `rows` (≤ 4) writable floats;
/// the CPU features as [`gemm`].
#[inline(always)]
unsafe fn tile<K: KGemm, const T: usize>(
    panel: &[PanelBlock],
    a: [*const u8; T],
    out: [*mut f32; T],
    rows: usize,
) {
    let zero = vdupq_n_s32(0);
    let fzero = vdupq_n_f32(0.0);
    // Chunks of 16 columns per sub-block, sub-blocks per block.
    let (cps, n_sub) = if K::SUB16 { (1, 16) } else { (2, 8) };
    let mut fv = [[fzero; 4]; T];
    let mut fs = [fzero; T];
    for (b, pb) in panel.iter().enumerate() {
        let ab: [*const u8; T] = core::array::from_fn(|t| a[t].add(b * Q8K_BYTES));
        if K::N_MIN > 0 {
            let dmin = vld1q_f32(pb.dmin.as_ptr());
            for (fs, &y) in fs.iter_mut().zip(&ab) {
                let b0 = vld1q_s16(y.add(Q8K_BSUMS) as *const i16);
                let b1 = vld1q_s16(y.add(Q8K_BSUMS + 16) as *const i16);
                let m = if K::N_MIN == 16 {
                    mins16(pb, b0, b1)
                } else {
                    // Pairs of 16-column sums: |·| ≤ 2·16·128, no i16 overflow.
                    mins8(pb, vpaddq_s16(b0, b1))
                };
                let dmin_dy = vmulq_n_f32(dmin, ld_f32(y));
                *fs = vsubq_f32(*fs, vmulq_f32(dmin_dy, vcvtq_f32_s32(m)));
            }
        }
        // Running sums P and scaled sums S per (token, class).
        let mut p = [[zero; 4]; T];
        let mut s = [[zero; 4]; T];
        // Two sub-blocks per iteration (`n_sub` is even): less loop overhead per `sdot`.
        for j in (0..n_sub).step_by(2) {
            sub_block(pb, j, cps, &ab, &mut p, &mut s);
            sub_block(pb, j + 1, cps, &ab, &mut p, &mut s);
        }
        let d = vld1q_f32(pb.d.as_ptr());
        for ((fv, s), &y) in fv.iter_mut().zip(&s).zip(&ab) {
            let d_dy = vmulq_n_f32(d, ld_f32(y));
            for (fv, s) in fv.iter_mut().zip(s) {
                *fv = vfmaq_f32(*fv, vcvtq_f32_s32(*s), d_dy);
            }
        }
    }
    for (t, (&[v0, v1, v2, v3], &s)) in fv.iter().zip(&fs).enumerate() {
        let mut res = [0f32; ROWS];
        let sum = vaddq_f32(vaddq_f32(v0, v1), vaddq_f32(v2, v3));
        vst1q_f32(res.as_mut_ptr(), vaddq_f32(sum, s));
        core::ptr::copy_nonoverlapping(res.as_ptr(), out[t], rows);
    }
}
