//! x86-64 kernels: AVX2 (+FMA, F16C) and AVX-512 (F/BW/VL/VNNI).
//!
//! The kernel bodies are written once, generic over [`Simd`] (the few integer dot-product primitives that
//! differ between the two instruction sets), and marked `#[inline(always)]`, so that each instantiation
//! is compiled inside one `#[target_feature]` entry point per weight type in [`avx2`] / [`avx512`]. Those
//! modules hand out their tables only after `is_x86_feature_detected!` confirmed the features.
//!
//! Layout of the work: a call gets `n_rows` weight rows and `n_tok` quantized activation rows. Decode
//! (`n_tok == 1`, and up to `FEW_TOKENS` for speculative decoding's verification) runs tiles of several
//! rows × all tokens (the activation chunk is loaded once for all rows, each weight row read once);
//! prefill runs tiles of rows × tokens, token tiles outermost so the call's weight rows stay in cache
//! while the activations stream through once. Integer sums are exact (the same i32 values as the scalar
//! reference); only the float accumulation differs in association.

use core::arch::x86_64::*;

use super::FEW_TOKENS;

mod attend;
pub mod avx2;
pub mod avx512;
mod float;
mod iq2;
mod iq3;
mod iq4xs;
mod iqgemm;
mod kdecode16;
mod kgemm;
pub(crate) mod kgemm_amx;
mod kgemm_avx2;
mod kquants;
mod kquants512;
mod legacy;
pub(crate) mod ops;
mod quantize;

/// How far ahead of the decode kernels' reads each row stream is prefetched, in bytes. From memory,
/// a 4096×4096 Q4_K matrix-vector product measured 13.0, 14.3, 14.2 and 14.3 GB/s at 512, 1024, 2048 and
/// 4096 bytes, and 10.4–11.3 GB/s without software prefetch (Q6_K: 12.5, 13.1, 13.0, 13.8).
const PREFETCH_AHEAD: usize = 2048;

/// Software prefetch for `R` streams read forward once (the decode tiles' rows from [`quant_rows`]'
/// stripes, the delta rule's state): as they are consumed, each stream's lines are requested
/// [`PREFETCH_AHEAD`] bytes ahead of the read, one cache line at a time. Near a decode row's end that is
/// the start of the stripe's next row, which the next tile reads. Prefetches never fault, so reaching
/// past the weights is harmless; the addresses are formed with wrapping arithmetic only.
pub(crate) struct StreamPrefetch<const R: usize> {
    rows: [*const u8; R],
    /// Offset from each row's start of the next line to request.
    next: usize,
}

impl<const R: usize> StreamPrefetch<R> {
    #[inline(always)]
    pub(crate) fn new(rows: [*const u8; R]) -> Self {
        Self {
            rows,
            next: PREFETCH_AHEAD,
        }
    }

    /// Requests every stream's lines up to [`PREFETCH_AHEAD`] bytes past offset `consumed` of its row.
    ///
    /// # Safety
    /// The CPU must have SSE (every x86-64 does); the addresses are never dereferenced.
    #[inline(always)]
    pub(crate) unsafe fn upto(&mut self, consumed: usize) {
        while self.next < consumed + PREFETCH_AHEAD {
            for r in self.rows {
                _mm_prefetch::<_MM_HINT_T0>(r.wrapping_add(self.next) as *const i8);
            }
            self.next += 64;
        }
    }
}

/// Software prefetch of the next prefill GEMM panel's weight rows into L2, spread over the current
/// panel's token tiles. Unpacking a panel reads each of its rows for the first time; without this, on
/// the 9B's pp512 about 19% of the GEMM's samples sat on those loads, waiting on memory.
pub(crate) struct PanelPrefetch {
    /// First byte of the first row.
    base: *const u8,
    /// Bytes from one row's start to the next.
    stride: usize,
    rows: usize,
    /// Cache lines per row, and the next line to request (row-major over `rows × lines`).
    lines: usize,
    next: usize,
}

impl PanelPrefetch {
    /// `rows` rows of `row_bytes` bytes at `base`, `stride` apart (no rows: nothing to request).
    #[inline(always)]
    pub(crate) fn new(base: *const u8, stride: usize, rows: usize, row_bytes: usize) -> Self {
        Self {
            base,
            stride,
            rows,
            lines: row_bytes.div_ceil(64),
            next: 0,
        }
    }

    /// Lines still to request.
    #[inline(always)]
    pub(crate) fn left(&self) -> usize {
        self.rows * self.lines - self.next
    }

    /// Requests the next `n` lines (fewer at the end).
    ///
    /// # Safety
    /// The CPU must have SSE (every x86-64 does); the addresses are never dereferenced.
    #[inline(always)]
    pub(crate) unsafe fn step(&mut self, n: usize) {
        let end = self.next + n.min(self.left());
        while self.next < end {
            let (r, l) = (self.next / self.lines, self.next % self.lines);
            let p = self.base.wrapping_add(r * self.stride + l * 64);
            _mm_prefetch::<_MM_HINT_T1>(p as *const i8);
            self.next += 1;
        }
    }
}

/// Wrapping sum of `words`, read as the decode kernels read a tile's rows: four streams (the quarters,
/// side by side) with [`StreamPrefetch`]. A read-bandwidth probe: on the Xeon of the README it read from
/// 2% slower to 10% faster than one plain sequential stream, depending on the run.
pub(crate) fn sum_words_prefetched(words: &[u64]) -> u64 {
    let len = words.len() / 32 * 8;
    let q: [&[u64]; 4] = core::array::from_fn(|s| &words[s * len..(s + 1) * len]);
    let mut prefetch = StreamPrefetch::new(q.map(|p| p.as_ptr() as *const u8));
    let mut acc = [0u64; 8];
    let lines = q[0]
        .chunks_exact(8)
        .zip(q[1].chunks_exact(8))
        .zip(q[2].chunks_exact(8).zip(q[3].chunks_exact(8)));
    for (i, ((a, b), (c, d))) in lines.enumerate() {
        // SAFETY: prefetching needs only SSE, which every x86-64 CPU has, and never dereferences.
        unsafe { prefetch.upto(i * 64) };
        for line in [a, b, c, d] {
            for (s, w) in acc.iter_mut().zip(line) {
                *s = s.wrapping_add(*w);
            }
        }
    }
    acc.iter()
        .fold(super::sum_words(&words[4 * len..]), |s, v| {
            s.wrapping_add(*v)
        })
}

/// The integer dot-product primitives that differ between AVX2 and AVX-512 VNNI. Both implementations
/// return bit-identical results for the inputs the kernels pass.
pub(crate) trait Simd {
    /// `acc + Σ₄ a·b`: u8 × i8 products summed in groups of four consecutive bytes into each i32 lane.
    /// Callers guarantee that adjacent pairs of products fit an i16 (AVX2's `maddubs` saturates).
    unsafe fn dot_u8i8(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
    /// `acc + madd(maddubs(a, b), s)`: u8 × i8 pair sums (must fit i16) times the i16 lanes of `s`,
    /// pairs summed into each i32 lane.
    unsafe fn dot_u8i8_s16(acc: __m256i, a: __m256i, b: __m256i, s: __m256i) -> __m256i;
    /// 512-bit vectors available: the decode kernels that have a 512-bit form use it.
    const WIDE: bool = false;
}

#[inline(always)]
unsafe fn loadu(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline(always)]
unsafe fn loadu128(p: *const u8) -> __m128i {
    _mm_loadu_si128(p as *const __m128i)
}

#[inline(always)]
unsafe fn read_u16(p: *const u8) -> u16 {
    u16::from_le_bytes(core::ptr::read_unaligned(p as *const [u8; 2]))
}

#[inline(always)]
unsafe fn read_u32(p: *const u8) -> u32 {
    u32::from_le_bytes(core::ptr::read_unaligned(p as *const [u8; 4]))
}

#[inline(always)]
unsafe fn read_f32(p: *const u8) -> f32 {
    f32::from_le_bytes(core::ptr::read_unaligned(p as *const [u8; 4]))
}

/// f16 at `p` → f32 (F16C, exact).
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(read_u16(p) as i32)))
}

/// Sum of the 8 lanes.
#[inline(always)]
unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The per-tile interface every quantized weight type implements: `R` weight rows × `T` activation rows,
/// `nb` blocks each; returns `out[r][t]`. Every shape gives each (row, token) the same float operations
/// in the same order, so results do not depend on the tiling.
pub(crate) trait QuantTile {
    /// Bytes per weight block.
    const WB: usize;
    /// Bytes per activation block.
    const AB: usize;
    /// A prefill tile (the rows are in cache, read once per token tile).
    unsafe fn tile<S: Simd, const R: usize, const T: usize>(
        w: [*const u8; R],
        a: [*const u8; T],
        nb: usize,
    ) -> [[f32; T]; R];
    /// A tile of the decode layout (`T` ≤ [`FEW_TOKENS`]): each row is read from memory once for all
    /// tokens, with software prefetch ([`StreamPrefetch`]).
    unsafe fn stream<S: Simd, const R: usize, const T: usize>(
        w: [*const u8; R],
        a: [*const u8; T],
        nb: usize,
    ) -> [[f32; T]; R];
}

/// `out[r * n_tok + t] = W[r] · A[t]` with tiles of `RD` rows × all tokens for decode and few tokens
/// (≤ [`FEW_TOKENS`], see [`stripes`]) and `RP` rows × `TP` tokens for prefill.
///
/// # Safety
/// The CPU must support the features `S` and `K` are compiled for (the caller's target features).
#[inline(always)]
pub(crate) unsafe fn quant_rows<
    S: Simd,
    K: QuantTile,
    const RD: usize,
    const RP: usize,
    const TP: usize,
>(
    w: &[u8],
    a: &[u8],
    n_tok: usize,
    out: &mut [f32],
) {
    if n_tok == 0 || out.is_empty() {
        return;
    }
    let n_rows = out.len() / n_tok;
    assert_eq!(n_rows * n_tok, out.len(), "output is not rows × tokens");
    let rb = w.len() / n_rows;
    let ab = a.len() / n_tok;
    let nb = rb / K::WB;
    assert!(
        rb * n_rows == w.len() && nb * K::WB == rb && a.len() == n_tok * ab && nb * K::AB == ab,
        "quant_rows: weight/activation lengths do not match"
    );
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let wrow = |r: usize| wp.add(r * rb);
    let arow = |t: usize| ap.add(t * ab);
    match n_tok {
        1 => return decode_layout::<S, K, RD, 1>(w, a, n_rows, out),
        2 => return decode_layout::<S, K, RD, 2>(w, a, n_rows, out),
        3 => return decode_layout::<S, K, RD, 3>(w, a, n_rows, out),
        4 => return decode_layout::<S, K, RD, 4>(w, a, n_rows, out),
        _ => {}
    }
    let mut t = 0;
    while t < n_tok {
        let tt = TP.min(n_tok - t);
        let mut r = 0;
        while r < n_rows {
            let rr = RP.min(n_rows - r);
            if rr == RP && tt == TP {
                let res = K::tile::<S, RP, TP>(
                    core::array::from_fn(|i| wrow(r + i)),
                    core::array::from_fn(|j| arow(t + j)),
                    nb,
                );
                for (i, row) in res.iter().enumerate() {
                    out[(r + i) * n_tok + t..][..TP].copy_from_slice(row);
                }
            } else if tt == TP {
                for i in 0..rr {
                    let res = K::tile::<S, 1, TP>(
                        [wrow(r + i)],
                        core::array::from_fn(|j| arow(t + j)),
                        nb,
                    );
                    out[(r + i) * n_tok + t..][..TP].copy_from_slice(&res[0]);
                }
            } else if rr == RP {
                for j in 0..tt {
                    let res = K::tile::<S, RP, 1>(
                        core::array::from_fn(|i| wrow(r + i)),
                        [arow(t + j)],
                        nb,
                    );
                    for (i, v) in res.iter().enumerate() {
                        out[(r + i) * n_tok + t + j] = v[0];
                    }
                }
            } else {
                for i in 0..rr {
                    for j in 0..tt {
                        out[(r + i) * n_tok + t + j] =
                            K::tile::<S, 1, 1>([wrow(r + i)], [arow(t + j)], nb)[0][0];
                    }
                }
            }
            r += rr;
        }
        t += tt;
    }
}

/// [`stripes`] with tiles of `RD` rows where they pay, else of 4: wider tiles (`kdecode16`'s 16 rows) pay
/// a transpose per block that two or more tokens amortize. For one token, from memory, they were no
/// faster than the 4-row tiles on Zen 4, and slower on one thread (Q4_K 15–20 against 19–23 GB/s).
///
/// # Safety
/// As [`stripes`].
#[inline(always)]
unsafe fn decode_layout<S: Simd, K: QuantTile, const RD: usize, const T: usize>(
    w: &[u8],
    a: &[u8],
    n_rows: usize,
    out: &mut [f32],
) {
    if RD > 4 && T < 2 {
        stripes::<S, K, 4, T>(w, a, n_rows, out)
    } else {
        stripes::<S, K, RD, T>(w, a, n_rows, out)
    }
}

// `quant_rows` has one `stripes` instance per few-token count.
const _: () = assert!(FEW_TOKENS == 4);

/// The decode layout, for `T` ≤ [`FEW_TOKENS`] tokens (decode, and the verification step of speculative
/// decoding): the rows are cut into RD stripes of q consecutive rows and tile g takes row g of each
/// stripe, all `T` tokens at once, so each of the tile's row streams walks its own stripe forward through
/// memory and every weight byte is read once. The L2 prefetcher follows RD such streams as it follows
/// one sequential read. Tiles of RD adjacent rows instead interleave RD streams a row apart in the same
/// 4 KiB pages, which it follows poorly: 8.7 against 12.9 GB/s for a 4096×4096 Q4_K from memory
/// (`examples/kq_speed ratio`).
///
/// # Safety
/// As [`quant_rows`], which checked the lengths (`n_rows` rows of `w`, `T` rows of `a`, `out` is
/// `[n_rows × T]`).
#[inline(always)]
unsafe fn stripes<S: Simd, K: QuantTile, const RD: usize, const T: usize>(
    w: &[u8],
    a: &[u8],
    n_rows: usize,
    out: &mut [f32],
) {
    let rb = w.len() / n_rows;
    let ab = a.len() / T;
    let nb = rb / K::WB;
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let wrow = |r: usize| wp.add(r * rb);
    let arows: [*const u8; T] = core::array::from_fn(|t| ap.add(t * ab));
    let q = n_rows / RD;
    // Wide tiles: stream i starts at row s[i] of its stripe and wraps once, as 16 streams a multiple of
    // 4 KiB apart would share L1 sets (`stagger`). Four streams fit the sets' 8 ways: the one-token tiles
    // keep their order.
    let s = if RD > 4 {
        crate::kernels::stagger::stream_starts::<RD>(q, rb)
    } else {
        [0; RD]
    };
    for g in 0..q {
        let rows: [usize; RD] = core::array::from_fn(|i| {
            let k = g + s[i];
            i * q + if k >= q { k - q } else { k }
        });
        let res = K::stream::<S, RD, T>(core::array::from_fn(|i| wrow(rows[i])), arows, nb);
        for (i, v) in res.iter().enumerate() {
            out[rows[i] * T..][..T].copy_from_slice(v);
        }
    }
    let r0 = RD * q;
    if RD > 4 && n_rows - r0 >= 4 {
        // Rows left over by the wide tiles: 4-row tiles.
        stripes::<S, K, 4, T>(&w[r0 * rb..], a, n_rows - r0, &mut out[r0 * T..]);
        return;
    }
    for r in r0..n_rows {
        let res = K::stream::<S, 1, T>([wrow(r)], arows, nb);
        out[r * T..][..T].copy_from_slice(&res[0]);
    }
}

/// The weight types the prefill GEMMs ([`kgemm`], [`kgemm_avx2`]) take: the K-quants.
fn kgemm_supports(ty: crate::quant::GgmlType) -> bool {
    use crate::quant::GgmlType as G;
    matches!(ty, G::Q2_K | G::Q3_K | G::Q4_K | G::Q5_K | G::Q6_K)
}

/// A table's `quant_gemm` entry: `fn quant_gemm(ty, w, a, out)` (or `fn $name`) dispatching the K-quants
/// to `$module::gemm::<K>`, each instantiation compiled with `$features`; with `quants`, its
/// `run_quants` entry `fn $name(ty, w, a, qs, out)` dispatching to `$module::gemm_quants::<K>`.
macro_rules! kgemm_entry {
    (@entry $features:literal, $name:ident, $module:ident :: $gemm:ident, ($($arg:ident: $ty:ty),*)) => {
        fn $name(ty: GgmlType, w: &[u8], a: &[u8], $($arg: $ty,)* out: GemmOut<'_>) {
            #[target_feature(enable = $features)]
            unsafe fn run<K: super::kquants::KFormat>(
                w: &[u8],
                a: &[u8],
                $($arg: $ty,)*
                out: GemmOut<'_>,
            ) {
                super::$module::$gemm::<K>(w, a, $($arg,)* out)
            }
            let f: unsafe fn(&[u8], &[u8], $($ty,)* GemmOut<'_>) = match ty {
                GgmlType::Q2_K => run::<Q2K>,
                GgmlType::Q3_K => run::<Q3K>,
                GgmlType::Q4_K => run::<Q4K>,
                GgmlType::Q5_K => run::<Q5K>,
                GgmlType::Q6_K => run::<Q6K>,
                other => panic!("quant_gemm called with {other}"),
            };
            // SAFETY: the table holding this entry is only handed out after `detected()` confirmed
            // `$features` (and, for the AMX table, the tile state); lengths are checked inside.
            unsafe { f(w, a, $($arg,)* out) }
        }
    };
    ($features:literal, $module:ident) => {
        super::kgemm_entry!(@entry $features, quant_gemm, $module::gemm, ());
    };
    ($features:literal, $module:ident, $name:ident) => {
        super::kgemm_entry!(@entry $features, $name, $module::gemm, ());
    };
    ($features:literal, $module:ident, $name:ident, quants) => {
        super::kgemm_entry!(@entry $features, $name, $module::gemm_quants, (qs: Q8kQuants<'_>));
    };
}
pub(crate) use kgemm_entry;

pub(crate) use float::float_rows;
pub(crate) use iq3::{Iq3S, Iq3Xxs};
pub(crate) use iq4xs::IQ4XS;
pub(crate) use kquants::{Q2K, Q3K, Q4K, Q5K, Q6K};
pub(crate) use legacy::{IQ4NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
pub(crate) use quantize::quantize_act;

#[cfg(test)]
mod tests {
    //! The AVX-512 table's tile shapes (4 rows × 4 tokens) run through the AVX2 primitives, so the
    //! shape-generic code the AVX-512 path uses is tested on AVX2-only machines too.

    use super::avx2::Avx2;
    use super::*;
    use crate::kernels::scalar;
    use crate::quant::{self, GgmlType};

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn rows_4x4(ty: GgmlType, w: &[u8], a: &[u8], n_tok: usize, out: &mut [f32]) {
        match ty {
            GgmlType::Q4_0 => quant_rows::<Avx2, Q4_0, 4, 4, 4>(w, a, n_tok, out),
            GgmlType::Q4_1 => quant_rows::<Avx2, Q4_1, 4, 4, 4>(w, a, n_tok, out),
            GgmlType::Q5_0 => quant_rows::<Avx2, Q5_0, 4, 4, 4>(w, a, n_tok, out),
            GgmlType::Q5_1 => quant_rows::<Avx2, Q5_1, 4, 4, 4>(w, a, n_tok, out),
            GgmlType::Q8_0 => quant_rows::<Avx2, Q8_0, 4, 4, 4>(w, a, n_tok, out),
            GgmlType::Q2_K => quant_rows::<Avx2, Q2K, 4, 4, 4>(w, a, n_tok, out),
            GgmlType::Q3_K => quant_rows::<Avx2, Q3K, 4, 4, 4>(w, a, n_tok, out),
            GgmlType::Q4_K => quant_rows::<Avx2, Q4K, 4, 4, 4>(w, a, n_tok, out),
            GgmlType::Q5_K => quant_rows::<Avx2, Q5K, 4, 4, 4>(w, a, n_tok, out),
            GgmlType::Q6_K => quant_rows::<Avx2, Q6K, 4, 4, 4>(w, a, n_tok, out),
            GgmlType::IQ3_XXS => quant_rows::<Avx2, Iq3Xxs, 4, 4, 4>(w, a, n_tok, out),
            GgmlType::IQ3_S => quant_rows::<Avx2, Iq3S, 4, 4, 4>(w, a, n_tok, out),
            GgmlType::IQ4_NL => quant_rows::<Avx2, IQ4NL, 4, 4, 4>(w, a, n_tok, out),
            GgmlType::IQ4_XS => quant_rows::<Avx2, IQ4XS, 4, 4, 4>(w, a, n_tok, out),
            // Types without an x86 kernel fall back to the scalar reference in the tables too.
            _ => scalar::quant_rows(ty, w, a, n_tok, out),
        }
    }

    #[test]
    fn avx512_tile_shapes_on_avx2() {
        if !avx2::detected() {
            return;
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let n = 512;
        for ty in GgmlType::WEIGHT_QUANTS {
            for (rows, n_tok) in [(9, 1), (9, 9), (4, 4), (7, 5)] {
                let wf: Vec<f32> = (0..rows * n)
                    .map(|_| (rnd() >> 40) as f32 / 8e6 - 1.0)
                    .collect();
                let xf: Vec<f32> = (0..n_tok * n)
                    .map(|_| (rnd() >> 40) as f32 / 8e6 - 1.0)
                    .collect();
                let rb = ty.row_bytes(n as u64).unwrap() as usize;
                let act = ty.vec_dot_type();
                let ab = act.row_bytes(n as u64).unwrap() as usize;
                let mut w = vec![0u8; rows * rb];
                let mut a = vec![0u8; n_tok * ab];
                quant::quantize_row(ty, &wf, &mut w).unwrap();
                quant::quantize_row(act, &xf, &mut a).unwrap();
                let mut want = vec![0f32; rows * n_tok];
                let mut got = vec![0f32; rows * n_tok];
                scalar::quant_rows(ty, &w, &a, n_tok, &mut want);
                // SAFETY: AVX2, FMA and F16C were detected above.
                unsafe { rows_4x4(ty, &w, &a, n_tok, &mut got) };
                for (g, s) in got.iter().zip(&want) {
                    assert!((g - s).abs() <= 1e-4 * s.abs().max(1.0), "{ty}: {g} vs {s}");
                }
            }
        }
    }
}
