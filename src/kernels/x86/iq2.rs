//! The lattice formats IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S and IQ1_M × Q8_K (AVX2).
//!
//! Per 32 values the four grid points are looked up by index and packed into one vector of grid bytes.
//! IQ2: the weights' signs go onto the activations (`sign_epi8` with ±1 bytes built from the sign bits),
//! so `maddubs` multiplies unsigned grid bytes (≤ 43) with signed activations. IQ1: the grid bytes are
//! −1, 0 or 1, so `sign_epi8(y, grid)` is already the product. Q8_K activations lie in −127..=127, so
//! negating them cannot overflow, and pairs of products fit i16. The i32 sums and the per-group scale
//! products are exact, and the float steps are the scalar reference's, so the results are bit-identical
//! to `vec_dot_ref`.

use core::arch::x86_64::*;

use super::{f16_at, loadu, read_f32, read_u16, read_u32};
use crate::quant::iq::grids::{
    IQ1M_DELTA, IQ1S_DELTA, IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KSIGNS_IQ2XS,
};

/// Bytes of a Q8_K block, and the offset of its quants.
const AB: usize = 292;
const AQS: usize = 4;

/// ±1 bytes from 32 sign bits: byte `8l + j` is −1 where bit `j` of byte `l` of `s` is set.
#[inline(always)]
unsafe fn sign_bytes(s: u32) -> __m256i {
    let v = _mm256_set1_epi32(s as i32);
    // Byte e takes byte e/8 of s (each 128-bit lane holds all four bytes of the broadcast).
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(v, shuf);
    let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bits), bits);
    _mm256_or_si256(set, _mm256_set1_epi8(1))
}

/// The four grid points `g` as 32 unsigned bytes, point 0 lowest.
#[inline(always)]
unsafe fn grid_bytes(g: [u64; 4]) -> __m256i {
    _mm256_set_epi64x(g[3] as i64, g[2] as i64, g[1] as i64, g[0] as i64)
}

/// Σ grid·(±y) per i32 lane (bytes 4k..4k+4 in lane k).
#[inline(always)]
unsafe fn group_dot(grid: __m256i, signs: u32, y: *const u8) -> __m256i {
    let ys = _mm256_sign_epi8(loadu(y), sign_bytes(signs));
    _mm256_madd_epi16(_mm256_maddubs_epi16(grid, ys), _mm256_set1_epi16(1))
}

#[inline(always)]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// One weight format: block bytes and the exact integer sum Σ scale·grid·y of one block.
pub(crate) trait Iq2 {
    const WB: usize;
    /// The factor of the row's sum (IQ2: 1/8).
    const ROW_SCALE: f32 = 0.125;
    unsafe fn block_sum(w: *const u8, y: *const u8) -> i32;
    /// One block's term of the row's sum (`w`, `a`: the whole blocks), as the scalar reference forms it.
    #[inline(always)]
    unsafe fn block_term(w: *const u8, a: *const u8) -> f32 {
        let d = f16_at(w) * read_f32(a);
        d * Self::block_sum(w, a.add(AQS)) as f32
    }
}

pub(crate) struct Iq2Xxs;
pub(crate) struct Iq2Xs;
pub(crate) struct Iq2S;

impl Iq2 for Iq2Xxs {
    const WB: usize = 66;
    #[inline(always)]
    unsafe fn block_sum(w: *const u8, y: *const u8) -> i32 {
        let mut acc = _mm256_setzero_si256();
        for ib in 0..8 {
            let aux0 = read_u32(w.add(2 + 8 * ib));
            let aux1 = read_u32(w.add(6 + 8 * ib));
            let g = std::array::from_fn(|l| IQ2XXS_GRID[(aux0 >> (8 * l)) as u8 as usize]);
            let signs = (0..4).fold(0u32, |s, l| {
                s | (KSIGNS_IQ2XS[((aux1 >> (7 * l)) & 127) as usize] as u32) << (8 * l)
            });
            let p = group_dot(grid_bytes(g), signs, y.add(32 * ib));
            let ls = _mm256_set1_epi32(2 * (aux1 >> 28) as i32 + 1);
            acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(p, ls));
        }
        hsum_epi32(acc)
    }
}

/// The scales of group `ib`: the low nibble for its first 16 values (lanes 0..4), the high for the rest.
#[inline(always)]
unsafe fn half_scales(sc: u8) -> __m256i {
    let (lo, hi) = (2 * (sc & 0xf) as i32 + 1, 2 * (sc >> 4) as i32 + 1);
    _mm256_setr_epi32(lo, lo, lo, lo, hi, hi, hi, hi)
}

impl Iq2 for Iq2Xs {
    const WB: usize = 74;
    #[inline(always)]
    unsafe fn block_sum(w: *const u8, y: *const u8) -> i32 {
        let mut acc = _mm256_setzero_si256();
        for ib in 0..8 {
            let q: [u16; 4] = std::array::from_fn(|l| {
                let p = w.add(2 + 8 * ib + 2 * l);
                u16::from_le_bytes([*p, *p.add(1)])
            });
            let g = q.map(|q| IQ2XS_GRID[(q & 511) as usize]);
            let signs = (0..4).fold(0u32, |s, l| {
                s | (KSIGNS_IQ2XS[(q[l] >> 9) as usize] as u32) << (8 * l)
            });
            let p = group_dot(grid_bytes(g), signs, y.add(32 * ib));
            let sc = half_scales(*w.add(66 + ib));
            acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(p, sc));
        }
        hsum_epi32(acc)
    }
}

impl Iq2 for Iq2S {
    const WB: usize = 82;
    #[inline(always)]
    unsafe fn block_sum(w: *const u8, y: *const u8) -> i32 {
        let (qs, qh, signs, scales) = (w.add(2), w.add(66), w.add(34), w.add(74));
        let mut acc = _mm256_setzero_si256();
        for ib in 0..8 {
            let h = *qh.add(ib) as usize;
            let g = std::array::from_fn(|l| {
                IQ2S_GRID[*qs.add(4 * ib + l) as usize | (h << (8 - 2 * l) & 0x300)]
            });
            let p = group_dot(grid_bytes(g), read_u32(signs.add(4 * ib)), y.add(32 * ib));
            let sc = half_scales(*scales.add(ib));
            acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(p, sc));
        }
        hsum_epi32(acc)
    }
}

pub(crate) struct Iq1S;

impl Iq2 for Iq1S {
    const WB: usize = 50;
    const ROW_SCALE: f32 = 1.0;
    unsafe fn block_sum(_: *const u8, _: *const u8) -> i32 {
        unreachable!("IQ1_S forms its block term itself")
    }
    #[inline(always)]
    unsafe fn block_term(w: *const u8, a: *const u8) -> f32 {
        let (mut sumi, mut sumi1) = (0i32, 0i32);
        for ib in 0..8 {
            let qh = read_u16(w.add(34 + 2 * ib));
            let g = std::array::from_fn(|l| {
                IQ1S_GRID[*w.add(2 + 4 * ib + l) as usize | (((qh >> (3 * l)) & 7) as usize) << 8]
            });
            let prod = _mm256_sign_epi8(loadu(a.add(AQS + 32 * ib)), grid_bytes(g));
            let pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), prod);
            let lsum = hsum_epi32(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
            let ls = 2 * ((qh >> 12) & 7) as i32 + 1;
            let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
            let bsums = read_u16(a.add(260 + 4 * ib)) as i16 as i32
                + read_u16(a.add(262 + 4 * ib)) as i16 as i32;
            sumi += ls * lsum;
            sumi1 += ls * delta * bsums;
        }
        f16_at(w) * read_f32(a) * (sumi as f32 + IQ1S_DELTA * sumi1 as f32)
    }
}

pub(crate) struct Iq1M;

impl Iq2 for Iq1M {
    const WB: usize = 56;
    const ROW_SCALE: f32 = 1.0;
    unsafe fn block_sum(_: *const u8, _: *const u8) -> i32 {
        unreachable!("IQ1_M forms its block term itself")
    }
    #[inline(always)]
    unsafe fn block_term(w: *const u8, a: *const u8) -> f32 {
        let sc: [u16; 4] = std::array::from_fn(|k| read_u16(w.add(48 + 2 * k)));
        let d16 =
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
        let d = f16_at(d16.to_le_bytes().as_ptr());
        let ones = _mm256_set1_epi8(1);
        let (mut acc1, mut acc2) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for ib in 0..8 {
            let (qs, qh) = (w.add(4 * ib), w.add(32 + 2 * ib));
            let g = std::array::from_fn(|l| {
                let h = (*qh.add(l / 2) as usize) << (8 - 4 * (l % 2)) & 0x700;
                IQ1S_GRID[*qs.add(l) as usize | h]
            });
            let y = loadu(a.add(AQS + 32 * ib));
            let prod = _mm256_sign_epi8(y, grid_bytes(g));
            let s1 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones, prod), _mm256_set1_epi16(1));
            let s2 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones, y), _mm256_set1_epi16(1));
            let ls = |h: usize| 2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3 * h)) & 7) as i32 + 1;
            let (ls1, ls2) = (ls(0), ls(1));
            let dl = |l: usize| {
                let minus = *qh.add(l / 2) & (0x08 << (4 * (l % 2))) != 0;
                if minus {
                    -1
                } else {
                    1
                }
            };
            let m2 = _mm256_setr_epi32(
                dl(0) * ls1,
                dl(0) * ls1,
                dl(1) * ls1,
                dl(1) * ls1,
                dl(2) * ls2,
                dl(2) * ls2,
                dl(3) * ls2,
                dl(3) * ls2,
            );
            let m1 = _mm256_setr_epi32(ls1, ls1, ls1, ls1, ls2, ls2, ls2, ls2);
            acc1 = _mm256_add_epi32(acc1, _mm256_mullo_epi32(s1, m1));
            acc2 = _mm256_add_epi32(acc2, _mm256_mullo_epi32(s2, m2));
        }
        let (sumi1, sumi2) = (hsum_epi32(acc1), hsum_epi32(acc2));
        d * read_f32(a) * (sumi1 as f32 + IQ1M_DELTA * sumi2 as f32)
    }
}

/// One row of `nb` blocks · one Q8_K row: `ROW_SCALE · Σ_blocks term`, as the scalar reference.
#[inline(always)]
unsafe fn dot_row<K: Iq2>(w: *const u8, a: *const u8, nb: usize) -> f32 {
    let mut sumf = 0f32;
    for i in 0..nb {
        sumf += K::block_term(w.add(i * K::WB), a.add(i * AB));
    }
    K::ROW_SCALE * sumf
}

/// `out[r * n_tok + t] = W[r] · A[t]`.
///
/// # Safety
/// The CPU must have AVX2 and F16C (the caller's target features).
#[inline(always)]
pub(crate) unsafe fn quant_rows<K: Iq2>(w: &[u8], a: &[u8], n_tok: usize, out: &mut [f32]) {
    if n_tok == 0 || out.is_empty() {
        return;
    }
    let n_rows = out.len() / n_tok;
    let (rb, ab) = (w.len() / n_rows, a.len() / n_tok);
    let nb = rb / K::WB;
    assert!(
        n_rows * n_tok == out.len()
            && rb * n_rows == w.len()
            && nb * K::WB == rb
            && ab * n_tok == a.len()
            && nb * AB == ab,
        "quant_rows: weight/activation lengths do not match"
    );
    for (r, o) in out.chunks_exact_mut(n_tok).enumerate() {
        for (t, o) in o.iter_mut().enumerate() {
            *o = dot_row::<K>(w.as_ptr().add(r * rb), a.as_ptr().add(t * ab), nb);
        }
    }
}

/// [`quant_rows`] compiled for AVX2 (both x86 tables use it: the AVX-512 table's CPUs have AVX2).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn rows_avx2<K: Iq2>(w: &[u8], a: &[u8], n_tok: usize, out: &mut [f32]) {
    quant_rows::<K>(w, a, n_tok, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{self, GgmlType};

    /// Random blocks (finite f16 scales) · Q8_K rows: the same f32 bits as the scalar reference.
    fn bit_identical<K: Iq2>(ty: GgmlType) {
        if !super::super::avx2::detected() {
            return;
        }
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (rows, n_tok, nb) = (5, 3, 4);
        let n = nb * 256;
        let mut w: Vec<u8> = (0..rows * nb * K::WB).map(|_| rnd() as u8).collect();
        for b in w.chunks_exact_mut(K::WB) {
            let d = ((rnd() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1;
            let h = quant::f16_from_f32(d);
            if ty == GgmlType::IQ1_M {
                // The f16 scale's nibble k is the top nibble of the u16 scale word k.
                for k in 0..4 {
                    let v = &mut b[48 + 2 * k + 1];
                    *v = (*v & 0x0F) | (((h >> (4 * k)) & 0xF) << 4) as u8;
                }
            } else {
                b[..2].copy_from_slice(&h.to_le_bytes());
            }
        }
        let x: Vec<f32> = (0..n_tok * n)
            .map(|_| (rnd() >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
            .collect();
        let mut a = vec![0u8; n_tok * nb * AB];
        quant::quantize_row(GgmlType::Q8_K, &x, &mut a).unwrap();
        let mut got = vec![0f32; rows * n_tok];
        // SAFETY: AVX2, FMA and F16C were detected above.
        unsafe { rows_avx2::<K>(&w, &a, n_tok, &mut got) };
        let (rb, ab) = (nb * K::WB, nb * AB);
        for r in 0..rows {
            for t in 0..n_tok {
                let want = quant::vec_dot_row(ty, &w[r * rb..][..rb], &a[t * ab..][..ab]).unwrap();
                assert_eq!(
                    got[r * n_tok + t].to_bits(),
                    want.to_bits(),
                    "{ty} r{r} t{t}"
                );
            }
        }
    }

    #[test]
    fn kernels_equal_scalar_bitwise() {
        bit_identical::<Iq2Xxs>(GgmlType::IQ2_XXS);
        bit_identical::<Iq2Xs>(GgmlType::IQ2_XS);
        bit_identical::<Iq2S>(GgmlType::IQ2_S);
        bit_identical::<Iq1S>(GgmlType::IQ1_S);
        bit_identical::<Iq1M>(GgmlType::IQ1_M);
    }
}
