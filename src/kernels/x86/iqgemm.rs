//! Prefill GEMM for the IQ formats with Q8_K activations on AVX-512 VNNI: IQ4_XS, IQ3_S, IQ3_XXS, IQ2_S,
//! IQ2_XS, IQ2_XXS, IQ1_S and IQ1_M. The layout is [`super::kgemm`]'s: a panel of 16 rows is unpacked
//! once per call into u8 codes transposed so that lane `r` of quad vector `q` holds row `r`'s codes
//! `4q..4q+4`, and every 4 activation bytes of a token, broadcast, meet 16 rows in one `vpdpbusd`.
//!
//! Each format's weights are signed small integers `v` per element (IQ4_XS: the non-linear levels
//! −127..113; IQ2/IQ3: grid magnitudes with their signs; IQ1: `8·g + δ`, the grid value −1/0/1 and the
//! group's delta sign ±1 in one integer, see [`Iq1S`]) times an integer scale per 16 or 32 elements. They
//! are stored as the codes `v + 2^SHIFT` (u8), and the offset is taken off with the activations' block
//! sums (Q8_K keeps one per 16 elements): `Σ s·v·y = Σ s·code·y − 2^SHIFT·Σ s·bsum`, exact in i32.
//!
//! Per (row, block, token) that leaves the block's exact integer sum `X`, the same integer the row
//! kernels and the scalar references form, and the float steps are theirs: `sum += (d·d8)·X` (IQ1:
//! `sum += (d·d8)·(X/8)`, equal to the reference's `sumi + 1/8·sumi1`, see [`Iq1S`]), the row's factor
//! (IQ2: 1/8, IQ3_XXS: 1/4) applied at the end. So the results are bit-identical to `quant_rows` (prefill
//! equals decode).

use core::arch::x86_64::*;
use std::cell::Cell;

use super::iq3::{sign_bytes, Iq3, Iq3S, Iq3Xxs};
use super::kgemm::{dpwssd_bcast, drive, shl, transpose16x8, PanelKernel};
use super::kquants::{AB, ABSUMS, AQS};
use super::{f16_at, read_f32, read_u16, read_u32};
use crate::kernels::GemmOut;
use crate::quant::iq::grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KSIGNS_IQ2XS};
use crate::quant::GgmlType;

/// Rows per panel (the i32 lanes of a zmm).
const ROWS: usize = 16;

/// An IQ weight block as the GEMM takes it.
pub(super) trait IqBlock {
    /// Bytes per block (256 elements).
    const WB: usize;
    /// The codes are the signed values plus `2^SHIFT` (`|v| < 2^SHIFT`, codes < 256).
    const SHIFT: i32;
    /// 16 scales of 16 elements (else 8 of 32).
    const SCALES16: bool;
    /// Factor of the block's integer sum inside its term (IQ1: 1/8).
    const INNER: f32 = 1.0;
    /// Factor of the row's sum (IQ2: 1/8, IQ3_XXS: 1/4).
    const FACTOR: f32 = 1.0;
    /// The block at `p`: returns its scale `d`; fills its signed values chunk by chunk (32 i8 each, in
    /// element order) and its integer scales (16 or the first 8 of `sc`).
    ///
    /// # Safety
    /// `p` must point to `WB` readable bytes; the CPU must have AVX2 and F16C.
    unsafe fn unpack(p: *const u8, vals: &mut [__m256i; 8], sc: &mut [i32; 16]) -> f32;
}

/// Is `ty` one of the formats of [`gemm_avx512`]?
pub(super) fn supports(ty: GgmlType) -> bool {
    use GgmlType as G;
    matches!(
        ty,
        G::IQ4_XS | G::IQ3_S | G::IQ3_XXS | G::IQ2_S | G::IQ2_XS | G::IQ2_XXS | G::IQ1_S | G::IQ1_M
    )
}

/// `out(t, r) = W[r] · A[t]` for the formats of [`supports`].
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI (the AVX-512 table calls it only after
/// detecting them). Panics on another type.
pub(super) unsafe fn gemm_avx512(ty: GgmlType, w: &[u8], a: &[u8], out: GemmOut<'_>) {
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn run<K: IqBlock>(w: &[u8], a: &[u8], out: GemmOut<'_>) {
        gemm::<K>(w, a, out)
    }
    let f: unsafe fn(&[u8], &[u8], GemmOut<'_>) = match ty {
        GgmlType::IQ4_XS => run::<Iq4Xs>,
        GgmlType::IQ3_S => run::<Iq3S>,
        GgmlType::IQ3_XXS => run::<Iq3Xxs>,
        GgmlType::IQ2_S => run::<Iq2S>,
        GgmlType::IQ2_XS => run::<Iq2Xs>,
        GgmlType::IQ2_XXS => run::<Iq2Xxs>,
        GgmlType::IQ1_S => run::<Iq1S>,
        GgmlType::IQ1_M => run::<Iq1M>,
        other => panic!("IQ gemm called with {other}"),
    };
    // SAFETY: the caller guarantees the CPU features; lengths are checked inside.
    unsafe { f(w, a, out) }
}

pub(super) struct Iq4Xs;

impl IqBlock for Iq4Xs {
    const WB: usize = 136;
    const SHIFT: i32 = 7;
    const SCALES16: bool = false;
    #[inline(always)]
    unsafe fn unpack(p: *const u8, vals: &mut [__m256i; 8], sc: &mut [i32; 16]) -> f32 {
        for (c, v) in vals.iter_mut().enumerate() {
            *v = super::iq4xs::levels(p, c);
            sc[c] = super::iq4xs::scale(p, c) as i32;
        }
        f16_at(p)
    }
}

/// The IQ3 formats through the row kernels' unpacking ([`Iq3::unpack`]): grid magnitudes, ±1 sign
/// bytes and the chunk's scale broadcast as i16.
#[inline(always)]
unsafe fn unpack_iq3<K: Iq3>(p: *const u8, vals: &mut [__m256i; 8], sc: &mut [i32; 16]) -> f32 {
    let u = K::unpack(p);
    for c in 0..8 {
        vals[c] = _mm256_sign_epi8(u.g[c], u.s[c]);
        sc[c] = _mm_extract_epi16::<0>(_mm256_castsi256_si128(u.sc[c])) as i16 as i32;
    }
    f16_at(p)
}

impl IqBlock for Iq3S {
    // Grid magnitudes ≤ 15.
    const WB: usize = <Iq3S as Iq3>::WB;
    const SHIFT: i32 = 4;
    const SCALES16: bool = false;
    #[inline(always)]
    unsafe fn unpack(p: *const u8, vals: &mut [__m256i; 8], sc: &mut [i32; 16]) -> f32 {
        unpack_iq3::<Iq3S>(p, vals, sc)
    }
}

impl IqBlock for Iq3Xxs {
    // Grid magnitudes ≤ 62.
    const WB: usize = <Iq3Xxs as Iq3>::WB;
    const SHIFT: i32 = 6;
    const SCALES16: bool = false;
    const FACTOR: f32 = 0.25;
    #[inline(always)]
    unsafe fn unpack(p: *const u8, vals: &mut [__m256i; 8], sc: &mut [i32; 16]) -> f32 {
        unpack_iq3::<Iq3Xxs>(p, vals, sc)
    }
}

/// Four 8-byte grid points, point 0 lowest, with the signs of `signs` (bit `e` → element `e`) applied.
#[inline(always)]
unsafe fn signed_points(g: [u64; 4], signs: u32) -> __m256i {
    let v = _mm256_set_epi64x(g[3] as i64, g[2] as i64, g[1] as i64, g[0] as i64);
    _mm256_sign_epi8(v, sign_bytes(signs))
}

/// Four 7-bit sign indices `idx(0..4)` → 32 sign bits (`KSIGNS_IQ2XS` adds the parity bit).
#[inline(always)]
fn ksigns(idx: impl Fn(usize) -> usize) -> u32 {
    (0..4).fold(0u32, |s, l| s | (KSIGNS_IQ2XS[idx(l)] as u32) << (8 * l))
}

pub(super) struct Iq2Xxs;

impl IqBlock for Iq2Xxs {
    // Grid magnitudes ≤ 43.
    const WB: usize = 66;
    const SHIFT: i32 = 6;
    const SCALES16: bool = false;
    const FACTOR: f32 = 0.125;
    #[inline(always)]
    unsafe fn unpack(p: *const u8, vals: &mut [__m256i; 8], sc: &mut [i32; 16]) -> f32 {
        for (ib, v) in vals.iter_mut().enumerate() {
            let aux0 = read_u32(p.add(2 + 8 * ib));
            let aux1 = read_u32(p.add(6 + 8 * ib));
            let g = core::array::from_fn(|l| IQ2XXS_GRID[(aux0 >> (8 * l)) as u8 as usize]);
            let s = ksigns(|l| ((aux1 >> (7 * l)) & 127) as usize);
            *v = signed_points(g, s);
            sc[ib] = 2 * (aux1 >> 28) as i32 + 1;
        }
        f16_at(p)
    }
}

pub(super) struct Iq2Xs;

impl IqBlock for Iq2Xs {
    const WB: usize = 74;
    const SHIFT: i32 = 6;
    const SCALES16: bool = true;
    const FACTOR: f32 = 0.125;
    #[inline(always)]
    unsafe fn unpack(p: *const u8, vals: &mut [__m256i; 8], sc: &mut [i32; 16]) -> f32 {
        for (ib, v) in vals.iter_mut().enumerate() {
            let q: [u16; 4] = core::array::from_fn(|l| read_u16(p.add(2 + 8 * ib + 2 * l)));
            let g = q.map(|q| IQ2XS_GRID[(q & 511) as usize]);
            let s = ksigns(|l| (q[l] >> 9) as usize);
            *v = signed_points(g, s);
            let b = *p.add(66 + ib);
            sc[2 * ib] = 2 * (b & 0xf) as i32 + 1;
            sc[2 * ib + 1] = 2 * (b >> 4) as i32 + 1;
        }
        f16_at(p)
    }
}

pub(super) struct Iq2S;

impl IqBlock for Iq2S {
    const WB: usize = 82;
    const SHIFT: i32 = 6;
    const SCALES16: bool = true;
    const FACTOR: f32 = 0.125;
    #[inline(always)]
    unsafe fn unpack(p: *const u8, vals: &mut [__m256i; 8], sc: &mut [i32; 16]) -> f32 {
        let (qs, signs, qh, scales) = (p.add(2), p.add(34), p.add(66), p.add(74));
        for (ib, v) in vals.iter_mut().enumerate() {
            let h = *qh.add(ib) as usize;
            let g = core::array::from_fn(|l| {
                IQ2S_GRID[*qs.add(4 * ib + l) as usize | (h << (8 - 2 * l) & 0x300)]
            });
            *v = signed_points(g, read_u32(signs.add(4 * ib)));
            let b = *scales.add(ib);
            sc[2 * ib] = 2 * (b & 0xf) as i32 + 1;
            sc[2 * ib + 1] = 2 * (b >> 4) as i32 + 1;
        }
        f16_at(p)
    }
}

/// `8·g + δ` per byte: grid values `g` ∈ {−1, 0, 1} (the bytes of four IQ1 grid points) and each group's
/// delta sign `δ` = ±1 (byte `8l..8l+8` from `delta[l]`), in −9..=9.
#[inline(always)]
unsafe fn iq1_values(g: [u64; 4], delta: [i8; 4]) -> __m256i {
    let v = _mm256_set_epi64x(g[3] as i64, g[2] as i64, g[1] as i64, g[0] as i64);
    let v2 = _mm256_add_epi8(v, v);
    let v4 = _mm256_add_epi8(v2, v2);
    let v8 = _mm256_add_epi8(v4, v4);
    let d = _mm256_set_epi64x(
        i64::from_ne_bytes([delta[3] as u8; 8]),
        i64::from_ne_bytes([delta[2] as u8; 8]),
        i64::from_ne_bytes([delta[1] as u8; 8]),
        i64::from_ne_bytes([delta[0] as u8; 8]),
    );
    _mm256_add_epi8(v8, d)
}

/// IQ1_S. The reference forms per block `sumi = Σ s·g·y` and `sumi1 = Σ s·δ·y` (δ per 32 elements, from
/// the block sums) and adds `d·d8·(sumi + 1/8·sumi1)`. Here one integer `X = Σ s·(8g + δ)·y = 8·sumi +
/// sumi1` is formed and `X/8` taken in f32. `|sumi|, |sumi1| ≤ 256·15·128 < 2²⁰`, so `|X| < 2²³`: every
/// conversion is exact, and so are the reference's `1/8·sumi1` and its sum `sumi + sumi1/8 = X/8` (a
/// multiple of 1/8 below 2²⁰); the same value, bit for bit.
pub(super) struct Iq1S;

impl IqBlock for Iq1S {
    const WB: usize = 50;
    const SHIFT: i32 = 4;
    const SCALES16: bool = false;
    const INNER: f32 = 0.125;
    #[inline(always)]
    unsafe fn unpack(p: *const u8, vals: &mut [__m256i; 8], sc: &mut [i32; 16]) -> f32 {
        for (ib, v) in vals.iter_mut().enumerate() {
            let qh = read_u16(p.add(34 + 2 * ib));
            let g = core::array::from_fn(|l| {
                IQ1S_GRID[*p.add(2 + 4 * ib + l) as usize | (((qh >> (3 * l)) & 7) as usize) << 8]
            });
            let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
            *v = iq1_values(g, [delta; 4]);
            sc[ib] = 2 * ((qh >> 12) & 7) as i32 + 1;
        }
        f16_at(p)
    }
}

/// IQ1_M: as [`Iq1S`] (`X = 8·sumi1 + sumi2`), with a delta sign per 8 elements and a scale per 16.
pub(super) struct Iq1M;

impl IqBlock for Iq1M {
    const WB: usize = 56;
    const SHIFT: i32 = 4;
    const SCALES16: bool = true;
    const INNER: f32 = 0.125;
    #[inline(always)]
    unsafe fn unpack(p: *const u8, vals: &mut [__m256i; 8], sc: &mut [i32; 16]) -> f32 {
        let s: [u16; 4] = core::array::from_fn(|k| read_u16(p.add(48 + 2 * k)));
        for (ib, v) in vals.iter_mut().enumerate() {
            let (qs, qh) = (p.add(4 * ib), p.add(32 + 2 * ib));
            let g = core::array::from_fn(|l| {
                let h = (*qh.add(l / 2) as usize) << (8 - 4 * (l % 2)) & 0x700;
                IQ1S_GRID[*qs.add(l) as usize | h]
            });
            let delta = core::array::from_fn(|l| {
                if *qh.add(l / 2) & (0x08 << (4 * (l % 2))) != 0 {
                    -1
                } else {
                    1
                }
            });
            *v = iq1_values(g, delta);
            for h in 0..2 {
                sc[2 * ib + h] = 2 * ((s[ib / 2] >> (6 * (ib % 2) + 3 * h)) & 7) as i32 + 1;
            }
        }
        let d16 = (s[0] >> 12) | ((s[1] >> 8) & 0x00f0) | ((s[2] >> 4) & 0x0f00) | (s[3] & 0xf000);
        f16_at(d16.to_le_bytes().as_ptr())
    }
}

/// One block (256 columns) of a 16-row panel, unpacked.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct PanelBlock {
    /// Quad `q` (columns `4q..4q+4`): lane `r` holds row `r`'s four codes (u8).
    codes: [__m512i; 64],
    /// Sub-block `j`'s scale of every row (i32 lanes).
    sc: [__m512i; 16],
    /// Per pair of 16-element groups `(2i, 2i + 1)`: their scales as an i16 pair, for the block sums.
    corr: [__m512i; 8],
    d: __m512,
}

thread_local! {
    /// The calling thread's unpacked panel, grown to the longest row seen.
    static PANEL: Cell<Vec<PanelBlock>> = const { Cell::new(Vec::new()) };
}

super::kgemm::panel_kernel!(
    /// The IQ format `K` as a [`PanelKernel`].
    IqPanel,
    IqBlock
);

/// `out(t, r) = W[r] · A[t]` for rows `w` of format `K` (`out.rows()` of them) and Q8_K activations `a`
/// (`out.n_tok()` rows).
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI (the caller's target features).
#[inline(always)]
unsafe fn gemm<K: IqBlock>(w: &[u8], a: &[u8], out: GemmOut<'_>) {
    drive::<IqPanel<K>>(w, a, out)
}

/// Unpacks block `b` of `rows` (≤ 16) rows starting at `w` (`rb` bytes apart); lanes past `rows` get zero
/// codes, scales and `d`.
///
/// # Safety
/// Rows `0..rows` must each hold at least `b + 1` blocks of `K::WB` bytes (`gemm` checks the lengths);
/// the CPU features as [`gemm`].
#[inline(always)]
unsafe fn unpack<K: IqBlock>(w: *const u8, rb: usize, rows: usize, b: usize, out: &mut PanelBlock) {
    let zero = _mm256_setzero_si256();
    // [chunk][row]: 32 codes of columns 32c..32c+32.
    let mut ch = [[zero; ROWS]; 8];
    let mut sc = [[0i32; 16]; ROWS];
    let mut d = [0f32; ROWS];
    let offset = _mm256_set1_epi8((1u32 << K::SHIFT) as u8 as i8);
    for r in 0..rows {
        let mut vals = [zero; 8];
        d[r] = K::unpack(w.add(r * rb + b * K::WB), &mut vals, &mut sc[r]);
        for (chunk, v) in ch.iter_mut().zip(vals) {
            chunk[r] = _mm256_add_epi8(v, offset);
        }
    }
    for (c, chunk) in ch.iter().enumerate() {
        let q = transpose16x8(chunk);
        out.codes[8 * c..8 * c + 8].copy_from_slice(&q);
    }
    let n_sc = if K::SCALES16 { 16 } else { 8 };
    for (j, v) in out.sc[..n_sc].iter_mut().enumerate() {
        let lanes: [i32; ROWS] = core::array::from_fn(|r| sc[r][j]);
        *v = _mm512_loadu_si512(lanes.as_ptr() as *const __m512i);
    }
    // The scale of 16-element group g.
    let group = |r: usize, g: usize| if K::SCALES16 { sc[r][g] } else { sc[r][g / 2] };
    for i in 0..8 {
        let lanes: [i32; ROWS] = core::array::from_fn(|r| {
            (group(r, 2 * i) as i16 as u16 as u32
                | ((group(r, 2 * i + 1) as i16 as u16 as u32) << 16)) as i32
        });
        out.corr[i] = _mm512_loadu_si512(lanes.as_ptr() as *const __m512i);
    }
    out.d = _mm512_loadu_ps(d.as_ptr());
}

/// `T` tokens × the panel's 16 rows over all `panel.len()` blocks; token `t`'s 16 results are stored
/// (lanes in `mask`) at `out[t]`.
///
/// # Safety
/// Each `a[t]` must point to `panel.len()` Q8_K blocks, and `out[t]` to writable floats for the lanes in
/// `mask`; the CPU features as [`gemm`].
#[inline(always)]
unsafe fn tile<K: IqBlock, const T: usize>(
    panel: &[PanelBlock],
    a: [*const u8; T],
    out: [*mut f32; T],
    mask: __mmask16,
) {
    let zero = _mm512_setzero_si512();
    // Quads per sub-block, sub-blocks per block.
    let (qps, n_sub) = if K::SCALES16 { (4, 16) } else { (8, 8) };
    let mut acc = [_mm512_setzero_ps(); T];
    for (b, pb) in panel.iter().enumerate() {
        let ab: [*const u8; T] = core::array::from_fn(|t| a[t].add(b * AB));
        let mut s = [zero; T];
        for j in 0..n_sub {
            let mut isum = [zero; T];
            for q in j * qps..(j + 1) * qps {
                let wq = pb.codes[q];
                for t in 0..T {
                    let y = _mm512_set1_epi32(read_u32(ab[t].add(AQS + 4 * q)) as i32);
                    isum[t] = _mm512_dpbusd_epi32(isum[t], wq, y);
                }
            }
            for t in 0..T {
                s[t] = _mm512_add_epi32(s[t], _mm512_mullo_epi32(isum[t], pb.sc[j]));
            }
        }
        // Σ scale·bsum per (row, token), 16 block sums as 8 pairs.
        let mut m = [zero; T];
        for (i, c) in pb.corr.iter().enumerate() {
            for t in 0..T {
                m[t] = dpwssd_bcast(m[t], *c, ab[t].add(ABSUMS + 4 * i));
            }
        }
        for t in 0..T {
            // X = S − 2^SHIFT·Σ scale·bsum; sum += (d·d8)·X [IQ1: (d·d8)·(X·1/8)].
            let x = _mm512_cvtepi32_ps(_mm512_sub_epi32(s[t], shl(m[t], K::SHIFT)));
            let x = if K::INNER != 1.0 {
                _mm512_mul_ps(x, _mm512_set1_ps(K::INNER))
            } else {
                x
            };
            let dd = _mm512_mul_ps(pb.d, _mm512_set1_ps(read_f32(ab[t])));
            acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(dd, x));
        }
    }
    for (o, v) in out.iter().zip(&acc) {
        let v = if K::FACTOR != 1.0 {
            _mm512_mul_ps(_mm512_set1_ps(K::FACTOR), *v)
        } else {
            *v
        };
        _mm512_mask_storeu_ps(*o, mask, v);
    }
}
