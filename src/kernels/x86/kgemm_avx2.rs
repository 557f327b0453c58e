//! Prefill GEMM for the K-quants on AVX2 (no VNNI): 8 weight rows in the 8 i32 lanes of a ymm.
//!
//! The same panel scheme as the AVX-512 one ([`super::kgemm`]): a panel of 8 rows is unpacked once per
//! call so that lane `r` of quad vector `q` holds row `r`'s codes `4q..4q+4` (u8), and 4 activation bytes
//! of a token, broadcast from memory, meet 8 rows at once. Without `vpdpbusd`, `maddubs` makes i16 pair
//! sums; those of several quads are added in i16 (as many as the code width allows without overflow:
//! 8 for Q4_K, 2 for Q6_K), and one `madd` with the rows' sub-block scale (an i16 pair per lane) widens
//! them to i32. Two µops per 32 products instead of the tile kernels' three, and no per-row shuffles or
//! horizontal sums.
//!
//! The integer sums per (row, block, token) are exact, the same i32 values the row kernels form, and the
//! float epilogue performs the same operations in the same order, so the results are bit-identical to
//! theirs (prefill equals decode).

use core::arch::x86_64::*;
use std::cell::Cell;

use super::kquants::{KFormat, AB, ABSUMS, AQS};
use super::{read_f32, read_u32, PanelPrefetch};
use crate::kernels::GemmOut;

/// Rows per panel (the i32 lanes of a ymm).
const ROWS: usize = 8;

/// One super-block (256 columns) of an 8-row panel, unpacked.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(super) struct PanelBlock {
    /// Quad `q` (columns `4q..4q+4`): lane `r` holds row `r`'s four codes (u8).
    codes: [__m256i; 64],
    /// Sub-block `j`'s scale of every row, twice per lane (an i16 pair for `madd`).
    sc: [__m256i; 16],
    /// Block-sum factor pairs `(corr[2i], corr[2i+1])` of every row (i16 pairs), see `Pre::corr`.
    corr: [__m256i; 8],
    d: __m256,
    dmin: __m256,
}

thread_local! {
    /// The calling thread's unpacked panel, grown to the longest row seen.
    static PANEL: Cell<Vec<PanelBlock>> = const { Cell::new(Vec::new()) };
}

/// `out(t, r) = W[r] · A[t]` for K-quant rows `w` (`out.rows()` of them) and Q8_K activations `a`
/// (`out.n_tok()` rows).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (the caller's target features).
#[inline(always)]
pub(super) unsafe fn gemm<K: KFormat>(w: &[u8], a: &[u8], mut out: GemmOut<'_>) {
    let (n_rows, n_tok) = (out.rows(), out.n_tok());
    if n_tok == 0 || n_rows == 0 {
        return;
    }
    let (rb, nb) = out.blocks(w, a, K::WB, AB);
    let mut panel = PANEL.take();
    if panel.len() < nb {
        // SAFETY: `PanelBlock` is vectors only, for which all-zero bytes are a valid value.
        panel.resize(nb, unsafe { core::mem::zeroed() });
    }
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let arow = |t: usize| ap.add(t * nb * AB);
    let mut r0 = 0;
    while r0 < n_rows {
        let rows = ROWS.min(n_rows - r0);
        for (b, blk) in panel[..nb].iter_mut().enumerate() {
            unpack::<K>(wp.add(r0 * rb), rb, rows, b, blk);
        }
        let panel = &panel[..nb];
        // The next panel's rows stream into L2 while this one is multiplied, 4 tokens at a time.
        // After the last panel those are the rows past this call's, which `matmul`'s next work item
        // (usually run next by the same thread) starts with; past the matrix's end they are never read
        // (prefetches do not fault).
        let mut prefetch =
            PanelPrefetch::new(wp.wrapping_add((r0 + rows) * rb), rb, ROWS, nb * K::WB);
        let per_tile = prefetch.left().div_ceil(n_tok.div_ceil(4));
        // Token t's 8 results go to its output row at column r0 (`token_ptr` checks t).
        let mut o = |t: usize| out.token_ptr(t).wrapping_add(r0);
        let mut t = 0;
        while t + 4 <= n_tok {
            let dst = core::array::from_fn(|i| o(t + i));
            prefetch.step(per_tile);
            tile::<K, 4>(panel, core::array::from_fn(|i| arow(t + i)), dst, rows);
            t += 4;
        }
        if t + 2 <= n_tok {
            let dst = core::array::from_fn(|i| o(t + i));
            tile::<K, 2>(panel, core::array::from_fn(|i| arow(t + i)), dst, rows);
            t += 2;
        }
        if t < n_tok {
            tile::<K, 1>(panel, [arow(t)], [o(t)], rows);
        }
        prefetch.step(usize::MAX);
        r0 += rows;
    }
    PANEL.set(panel);
}

/// Unpacks block `b` of `rows` (≤ 8) rows starting at `w` (`rb` bytes apart); lanes past `rows` get zero
/// codes and scales.
///
/// # Safety
/// Rows `0..rows` must each hold at least `b + 1` blocks of `K::WB` bytes (`gemm` checks the lengths);
/// the CPU features as [`gemm`].
#[inline(always)]
unsafe fn unpack<K: KFormat>(w: *const u8, rb: usize, rows: usize, b: usize, out: &mut PanelBlock) {
    let zero = _mm256_setzero_si256();
    // [chunk][row]: 32 codes of columns 32c..32c+32.
    let mut ch = [[zero; ROWS]; 8];
    let mut sc = [[0i16; 16]; ROWS];
    let mut corr = [[0i16; 16]; ROWS];
    let mut d = [0f32; ROWS];
    let mut dmin = [0f32; ROWS];
    for r in 0..rows {
        let p = w.add(r * rb + b * K::WB);
        let pre = K::prepare(p);
        d[r] = pre.d;
        dmin[r] = pre.dmin;
        // Scales 0..7 are the low lane of `sc_lo`, 8..15 that of `sc_hi` (16-scale formats).
        _mm_storeu_si128(
            sc[r].as_mut_ptr() as *mut __m128i,
            _mm256_castsi256_si128(pre.sc_lo),
        );
        _mm_storeu_si128(
            sc[r][8..].as_mut_ptr() as *mut __m128i,
            _mm256_castsi256_si128(pre.sc_hi),
        );
        _mm256_storeu_si256(corr[r].as_mut_ptr() as *mut __m256i, pre.corr);
        for (c, chunk) in ch.iter_mut().enumerate() {
            chunk[r] = K::chunk(p, c);
        }
    }
    for (c, chunk) in ch.iter().enumerate() {
        let q = transpose8x8(chunk);
        out.codes[8 * c..8 * c + 8].copy_from_slice(&q);
    }
    let n_sc = if K::SCALES16 { 16 } else { 8 };
    let pair = |lo: i16, hi: i16| (lo as u16 as u32 | ((hi as u16 as u32) << 16)) as i32;
    for (j, v) in out.sc[..n_sc].iter_mut().enumerate() {
        let lanes: [i32; ROWS] = core::array::from_fn(|r| pair(sc[r][j], sc[r][j]));
        *v = _mm256_loadu_si256(lanes.as_ptr() as *const __m256i);
    }
    for (i, v) in out.corr.iter_mut().enumerate() {
        let lanes: [i32; ROWS] = core::array::from_fn(|r| pair(corr[r][2 * i], corr[r][2 * i + 1]));
        *v = _mm256_loadu_si256(lanes.as_ptr() as *const __m256i);
    }
    out.d = _mm256_loadu_ps(d.as_ptr());
    out.dmin = _mm256_loadu_ps(dmin.as_ptr());
}

/// 8 rows of 8 u32 → 8 vectors of 8 u32: `out[q]` lane `r` = `rows[r]` element `q`.
#[inline(always)]
unsafe fn transpose8x8(rows: &[__m256i; ROWS]) -> [__m256i; 8] {
    // Per group of four rows: u[e] = [rows 0-3 elem e | rows 0-3 elem 4+e] (in-lane 4×4 transposes).
    let t4 = |r: &[__m256i]| -> [__m256i; 4] {
        let t0 = _mm256_unpacklo_epi32(r[0], r[1]);
        let t1 = _mm256_unpackhi_epi32(r[0], r[1]);
        let t2 = _mm256_unpacklo_epi32(r[2], r[3]);
        let t3 = _mm256_unpackhi_epi32(r[2], r[3]);
        [
            _mm256_unpacklo_epi64(t0, t2),
            _mm256_unpackhi_epi64(t0, t2),
            _mm256_unpacklo_epi64(t1, t3),
            _mm256_unpackhi_epi64(t1, t3),
        ]
    };
    let u = t4(&rows[..4]);
    let v = t4(&rows[4..]);
    core::array::from_fn(|q| {
        if q < 4 {
            _mm256_permute2x128_si256::<0x20>(u[q], v[q])
        } else {
            _mm256_permute2x128_si256::<0x31>(u[q - 4], v[q - 4])
        }
    })
}

/// `T` tokens × the panel's 8 rows over all `panel.len()` blocks; token `t`'s first `rows` results are
/// stored at `out[t]`.
///
/// # Safety
/// Each `a[t]` must point to `panel.len()` Q8_K blocks, and `out[t]` to `rows` (≤ 8) writable floats;
/// the CPU features as [`gemm`].
#[inline(always)]
unsafe fn tile<K: KFormat, const T: usize>(
    panel: &[PanelBlock],
    a: [*const u8; T],
    out: [*mut f32; T],
    rows: usize,
) {
    let zero = _mm256_setzero_si256();
    // Quads per sub-block, sub-blocks per block.
    let (qps, n_sub) = if K::SCALES16 { (4, 16) } else { (8, 8) };
    // Quads whose i16 pair sums can be added before widening: each is at most 2·(2^bits − 1)·128 in
    // magnitude (Q8_K activations are −128..127), and the sum must stay within i16.
    let lim = 32767 / (2 * ((1 << K::CODE_BITS) - 1) * 128);
    let group = if lim >= 8 {
        8
    } else if lim >= 4 {
        4
    } else {
        2
    }
    .min(qps);
    let mut acc = [_mm256_setzero_ps(); T];
    for (b, pb) in panel.iter().enumerate() {
        let ab: [*const u8; T] = core::array::from_fn(|t| a[t].add(b * AB));
        let mut s = [zero; T];
        for j in 0..n_sub {
            for g0 in (j * qps..(j + 1) * qps).step_by(group) {
                let mut p16 = [zero; T];
                for q in g0..g0 + group {
                    let wq = pb.codes[q];
                    for t in 0..T {
                        let y = _mm256_set1_epi32(read_u32(ab[t].add(AQS + 4 * q)) as i32);
                        p16[t] = _mm256_add_epi16(p16[t], _mm256_maddubs_epi16(wq, y));
                    }
                }
                for t in 0..T {
                    s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(p16[t], pb.sc[j]));
                }
            }
        }
        // Σ corr·bsums per (row, token), 16 block sums as 8 pairs.
        let mut m = [zero; T];
        for (i, c) in pb.corr.iter().enumerate() {
            for t in 0..T {
                let bs = _mm256_set1_epi32(read_u32(ab[t].add(ABSUMS + 4 * i)) as i32);
                m[t] = _mm256_add_epi32(m[t], _mm256_madd_epi16(*c, bs));
            }
        }
        for t in 0..T {
            let dy = _mm256_set1_ps(read_f32(ab[t]));
            if K::MINS {
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), _mm256_mul_ps(pb.d, dy), acc[t]);
                acc[t] =
                    _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m[t]), _mm256_mul_ps(pb.dmin, dy), acc[t]);
            } else {
                // Codes stored with an offset: `S − (Σ corr·bsums) << SHIFT`.
                let st =
                    _mm256_sub_epi32(s[t], _mm256_sll_epi32(m[t], _mm_cvtsi32_si128(K::SHIFT)));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(st), _mm256_mul_ps(pb.d, dy), acc[t]);
            }
        }
    }
    for (o, v) in out.iter().zip(&acc) {
        if rows == ROWS {
            _mm256_storeu_ps(*o, *v);
        } else {
            let mut tmp = [0f32; ROWS];
            _mm256_storeu_ps(tmp.as_mut_ptr(), *v);
            core::ptr::copy_nonoverlapping(tmp.as_ptr(), *o, rows);
        }
    }
}
