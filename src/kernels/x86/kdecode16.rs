//! Few-token tiles of 16 Q4_K rows on AVX-512 VNNI: the rows in the 16 i32 lanes of a zmm.
//!
//! The 4-row tiles of [`super::kquants`] put a chunk's 32 elements in a vector's lanes: per token they
//! pay a `maddubs` + `vpdpwssd` per 32 products, a scale multiply per row and chunk, and a horizontal sum
//! per (row, block). That is cheap for one token but not for the 2–4 tokens of a speculative
//! verification: on a 2-core Xeon (AVX-512) a 12288×4096 Q4_K product from memory with 3 tokens took
//! 1.6× the time of one. Here each block of 16 rows is transposed in registers, as the prefill GEMM
//! ([`super::kgemm`]) does once per call into a panel: lane `r` of quad vector `q` holds row `r`'s codes
//! `4q..4q+4`. Per token, 4 activation bytes broadcast from memory meet the 16 rows in one `vpdpbusd`
//! (64 products), a sub-block's 16 integer sums take their scales in one convert and one FMA (exact,
//! see `decode16_q4k`), the mins one `vpdpwssd` per pair of block sums, and no horizontal sums remain.
//! The transpose (32 shuffles per 32 bytes of 16 rows) is paid once per block for all tokens.
//!
//! No software prefetch: the 16 rows are 16 streams (one per stripe, `stripes`), which the hardware
//! prefetchers follow; `StreamPrefetch`'s instructions cost more than they gained (12288×4096 from memory,
//! 2 threads, 3 / 4 tokens: 1.34–1.41× / 1.50–1.54× a one-token product with them, 1.22–1.26× /
//! 1.27–1.33× without), and so did three `prefetcht0` per row and block 576, 1152 or 2304 bytes ahead
//! (3 tokens 1.19–1.20×, 1.26–1.30×, 1.34–1.36× against 1.22–1.25× without).
//!
//! From memory the tile waited on the 16 streams more than on its instructions, for two reasons found on
//! a Zen 4 VM (2 cores, one zmm `vpdpbusd` per cycle), with 256 rows in L2, one thread, 3 tokens:
//! - The stripes of the 9B's shapes are a multiple of 4 KiB apart, so the 16 streams fell into the same
//!   L1 sets and every load missed L1: 14 GB/s, 18 GB/s with all streams on one row. `stripes` now starts
//!   each stream at its own offset within the page (`kernels::stagger`): 23 GB/s.
//! - Four `vpgatherdd` per block for the headers took a quarter of the time; 16 loads and a 4×4
//!   transpose per 128-bit lane (`load_headers`) instead: 11.8 → 14.3 GB/s before the stagger.
//!
//! With both, two tokens (and one) also run faster here than in the 4-row tiles: 29.9 against 18.7 GB/s
//! for two. From memory, 12288×4096, 2 threads (`examples/few_tokens`), 2 / 3 / 4 tokens cost 1.05–1.07×
//! / 1.11× / 1.23–1.28× one token, against 1.11–1.32× / 1.41–1.47× / 1.59–1.67× before. Two or more
//! tokens take this tile; one keeps the 4-row tiles (no faster from memory, see `decode_layout`).
//!
//! A Q6_K tile of the same design (three transposed byte groups per half block, the codes assembled by
//! `vpternlogd`, `vpmulld` scales) ran at 22.9 against 16.2 GB/s for 3 tokens in L2, but from memory at
//! 8–14 GB/s on one thread against the 4-row tiles' 21–26, and 1.8–2.0× one token on two threads, with
//! or without software prefetch; Q6_K keeps the 4-row tiles.
//!
//! The integer sums per (row, block, token) are the exact i32 values of the other kernels, and the float
//! epilogue performs the same operations in the same order (`kquants::decode4_sm8`, `kgemm::tile`), so
//! results are bit-identical to theirs.

use core::arch::x86_64::*;

use super::kgemm::{dpwssd_bcast, t4, transpose16x8};
use super::kquants::{AB, ABSUMS, AQS};
use super::{loadu, read_f32};

/// Rows per tile (the i32 lanes of a zmm).
pub(super) const ROWS: usize = 16;

/// Q4_K block bytes.
const WB: usize = 144;

/// Dwords `0..8` of 16 rows, each row's 32 bytes at `p + off[r]`, transposed: `out[q]` lane `r` = row `r`
/// dword `q`.
#[inline(always)]
unsafe fn load_transpose(p: *const u8, off: &[isize; ROWS]) -> [__m512i; 8] {
    let rows = [
        loadu(p.offset(off[0])),
        loadu(p.offset(off[1])),
        loadu(p.offset(off[2])),
        loadu(p.offset(off[3])),
        loadu(p.offset(off[4])),
        loadu(p.offset(off[5])),
        loadu(p.offset(off[6])),
        loadu(p.offset(off[7])),
        loadu(p.offset(off[8])),
        loadu(p.offset(off[9])),
        loadu(p.offset(off[10])),
        loadu(p.offset(off[11])),
        loadu(p.offset(off[12])),
        loadu(p.offset(off[13])),
        loadu(p.offset(off[14])),
        loadu(p.offset(off[15])),
    ];
    transpose16x8(&rows)
}

/// The 16-byte headers of 16 blocks (`p + off[r]`), transposed: `out[e]` lane `r` = row `r` dword `e`.
/// Loads and a 4×4 transpose per 128-bit lane: on Zen 4 four `vpgatherdd` per block took a quarter of
/// the 3-token tile's time, the loads and shuffles a tenth.
#[inline(always)]
unsafe fn load_headers(p: *const u8, off: &[isize; ROWS]) -> [__m512i; 4] {
    // z[k] = rows k, 4+k, 8+k, 12+k: after the in-lane transposes lane L of out[e] holds rows 4L..4L+4.
    let (h0, h1, h2, h3) = t4(
        four_headers(p, off, 0),
        four_headers(p, off, 1),
        four_headers(p, off, 2),
        four_headers(p, off, 3),
    );
    [h0, h1, h2, h3]
}

/// The headers of rows `k`, `4 + k`, `8 + k`, `12 + k` in the four 128-bit lanes.
#[inline(always)]
unsafe fn four_headers(p: *const u8, off: &[isize; ROWS], k: usize) -> __m512i {
    let h = |r: usize| _mm_loadu_si128(p.offset(off[r]) as *const __m128i);
    let v = _mm512_castsi128_si512(h(k));
    let v = _mm512_inserti32x4::<1>(v, h(4 + k));
    let v = _mm512_inserti32x4::<2>(v, h(8 + k));
    _mm512_inserti32x4::<3>(v, h(12 + k))
}

/// Byte `k` of each dword, zero-extended (`k` < 4).
#[inline(always)]
unsafe fn byte_of(v: __m512i, k: u32) -> __m512i {
    let s = _mm512_srl_epi32(v, _mm_cvtsi32_si128(8 * k as i32));
    if k == 3 {
        s
    } else {
        _mm512_and_si512(s, _mm512_set1_epi32(0xFF))
    }
}

/// Byte `k` of each dword in both i16 halves: `b | b << 16` (`k` < 4).
#[inline(always)]
unsafe fn byte_pair_of(v: __m512i, k: i8) -> __m512i {
    let z = -128i8; // 0x80: a zero byte
    let c = _mm_setr_epi8(
        k,
        z,
        k,
        z,
        4 + k,
        z,
        4 + k,
        z,
        8 + k,
        z,
        8 + k,
        z,
        12 + k,
        z,
        12 + k,
        z,
    );
    _mm512_shuffle_epi8(v, _mm512_broadcast_i32x4(c))
}

/// One token's products with a group's 16 quad vectors: `(Σ_m lo[m]·y[4m..4m+4], Σ_m hi[m]·y[32+4m..])`,
/// each 4 activation bytes broadcast from memory. One asm block, so that the displacements sit in the
/// instructions: as single `vpdpbusd` calls LLVM formed every address with its own `lea`.
///
/// # Safety
/// The 64 bytes at `y` must be readable; the CPU must have AVX-512 F and VNNI.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dots16(lo: &[__m512i; 8], hi: &[__m512i; 8], y: *const u8) -> (__m512i, __m512i) {
    let mut il = _mm512_setzero_si512();
    let mut ih = _mm512_setzero_si512();
    // SAFETY: the caller guarantees the 64 bytes at `y` are readable and the CPU features (AVX-512
    // VNNI); the block reads only those bytes and writes only `il` and `ih`.
    unsafe {
        core::arch::asm!(
            "vpdpbusd {il}, {l0}, dword ptr [{y}]{{1to16}}",
            "vpdpbusd {ih}, {h0}, dword ptr [{y} + 32]{{1to16}}",
            "vpdpbusd {il}, {l1}, dword ptr [{y} + 4]{{1to16}}",
            "vpdpbusd {ih}, {h1}, dword ptr [{y} + 36]{{1to16}}",
            "vpdpbusd {il}, {l2}, dword ptr [{y} + 8]{{1to16}}",
            "vpdpbusd {ih}, {h2}, dword ptr [{y} + 40]{{1to16}}",
            "vpdpbusd {il}, {l3}, dword ptr [{y} + 12]{{1to16}}",
            "vpdpbusd {ih}, {h3}, dword ptr [{y} + 44]{{1to16}}",
            "vpdpbusd {il}, {l4}, dword ptr [{y} + 16]{{1to16}}",
            "vpdpbusd {ih}, {h4}, dword ptr [{y} + 48]{{1to16}}",
            "vpdpbusd {il}, {l5}, dword ptr [{y} + 20]{{1to16}}",
            "vpdpbusd {ih}, {h5}, dword ptr [{y} + 52]{{1to16}}",
            "vpdpbusd {il}, {l6}, dword ptr [{y} + 24]{{1to16}}",
            "vpdpbusd {ih}, {h6}, dword ptr [{y} + 56]{{1to16}}",
            "vpdpbusd {il}, {l7}, dword ptr [{y} + 28]{{1to16}}",
            "vpdpbusd {ih}, {h7}, dword ptr [{y} + 60]{{1to16}}",
            il = inout(zmm_reg) il,
            ih = inout(zmm_reg) ih,
            l0 = in(zmm_reg) lo[0],
            l1 = in(zmm_reg) lo[1],
            l2 = in(zmm_reg) lo[2],
            l3 = in(zmm_reg) lo[3],
            l4 = in(zmm_reg) lo[4],
            l5 = in(zmm_reg) lo[5],
            l6 = in(zmm_reg) lo[6],
            l7 = in(zmm_reg) lo[7],
            h0 = in(zmm_reg) hi[0],
            h1 = in(zmm_reg) hi[1],
            h2 = in(zmm_reg) hi[2],
            h3 = in(zmm_reg) hi[3],
            h4 = in(zmm_reg) hi[4],
            h5 = in(zmm_reg) hi[5],
            h6 = in(zmm_reg) hi[6],
            h7 = in(zmm_reg) hi[7],
            y = in(reg) y,
            options(pure, readonly, nostack, preserves_flags)
        );
    }
    (il, ih)
}

/// `T` tokens × 16 Q4_K rows (`w[r]`, `nb` blocks each), returned as `[row][token]`.
///
/// # Safety
/// Each `w[r]` must point to `nb` readable blocks of 144 bytes and each `a[t]` to `nb` Q8_K blocks; the
/// CPU must have AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI.
#[inline(always)]
pub(super) unsafe fn decode16_q4k<const T: usize>(
    w: [*const u8; ROWS],
    a: [*const u8; T],
    nb: usize,
) -> [[f32; T]; ROWS] {
    let base = w[0];
    let off: [isize; ROWS] = core::array::from_fn(|r| w[r].offset_from(base));
    let zero = _mm512_setzero_si512();
    let nib = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let p = base.add(b * WB);
        let mut ab = [core::ptr::null::<u8>(); T];
        for t in 0..T {
            ab[t] = a[t].add(b * AB);
        }
        // Header of the 16 blocks: (d | dmin << 16) and the 12 scale bytes as three u32 per row.
        let [dd, u0, u1, u2] = load_headers(p, &off);
        let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
        let dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(dd)));
        // ggml's kmask arithmetic, one row per lane: scales 0-3, 4-7 and mins 0-3, 4-7 as bytes.
        let (k1, k2, k3) = (
            _mm512_set1_epi32(0x3f3f_3f3f),
            _mm512_set1_epi32(0x0f0f_0f0f),
            _mm512_set1_epi32(0x0303_0303),
        );
        let s03 = _mm512_and_si512(u0, k1);
        let s47 = _mm512_or_si512(
            _mm512_and_si512(u2, k2),
            _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u0), k3)),
        );
        let m03 = _mm512_and_si512(u1, k1);
        let m47 = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi32::<4>(u2), k2),
            _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u1), k3)),
        );

        // Σ scale·sum per (row, token) in f32, exactly: every product (|sum| ≤ 32·15·128, scale ≤ 63) is
        // an integer below 2²², and the chunks of groups 0–1 and of groups 2–3 each add up to at most
        // 4·32·15·128·63 < 2²⁴, so `sa`, `sb` hold the exact integers and `sa + sb` rounds the exact
        // block sum once, as `cvtepi32_ps` of the other kernels' i32 sum does: the same bits for two
        // µops per chunk fewer than `vpmulld` (2) + `vpaddd`.
        let mut sa = [_mm512_setzero_ps(); T];
        let mut sb = [_mm512_setzero_ps(); T];
        // Group j: qs bytes 32j..32j+32, low nibbles are chunk 2j, high nibbles chunk 2j + 1.
        for j in 0..4 {
            let x = load_transpose(p.add(16 + 32 * j), &off);
            let (sc_lo, sc_hi) = if j < 2 {
                (byte_of(s03, 2 * j as u32), byte_of(s03, 2 * j as u32 + 1))
            } else {
                (
                    byte_of(s47, 2 * j as u32 - 4),
                    byte_of(s47, 2 * j as u32 - 3),
                )
            };
            // The high nibbles stay in place (16× their codes): their scale is taken /16 (exact).
            let sc_lo = _mm512_cvtepi32_ps(sc_lo);
            let sc_hi = _mm512_mul_ps(_mm512_cvtepi32_ps(sc_hi), _mm512_set1_ps(1.0 / 16.0));
            let mut lo = [zero; 8];
            let mut hi = [zero; 8];
            for m in 0..8 {
                lo[m] = _mm512_and_si512(x[m], nib);
                hi[m] = _mm512_andnot_si512(nib, x[m]);
            }
            for t in 0..T {
                // Chunk 2j: activation quads 16j..16j+8; chunk 2j + 1: 16j+8..16j+16.
                let (il, ih) = dots16(&lo, &hi, ab[t].add(AQS + 64 * j));
                let acc = if j < 2 { &mut sa[t] } else { &mut sb[t] };
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(il), sc_lo, *acc);
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ih), sc_hi, *acc);
            }
        }
        // Σ min·bsum per (row, token): block sums 2i, 2i+1 (16 elements each) belong to sub-block i.
        let mut corr = [zero; 8];
        for i in 0..4 {
            corr[i] = byte_pair_of(m03, i as i8);
            corr[4 + i] = byte_pair_of(m47, i as i8);
        }
        for t in 0..T {
            let mut mm = zero;
            for (i, c) in corr.iter().enumerate() {
                mm = dpwssd_bcast(mm, *c, ab[t].add(ABSUMS + 4 * i));
            }
            let dy = _mm512_set1_ps(read_f32(ab[t]));
            let st = _mm512_add_ps(sa[t], sb[t]);
            acc[t] = _mm512_fmadd_ps(st, _mm512_mul_ps(d, dy), acc[t]);
            acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mm), _mm512_mul_ps(dmin, dy), acc[t]);
        }
    }
    let mut by_token = [[0f32; ROWS]; T];
    for t in 0..T {
        _mm512_storeu_ps(by_token[t].as_mut_ptr(), acc[t]);
    }
    let mut res = [[0f32; T]; ROWS];
    for r in 0..ROWS {
        for t in 0..T {
            res[r][t] = by_token[t][r];
        }
    }
    res
}
