//! bf16 products of many activation rows with a packed matrix, for the vision tower's 16-bit path:
//! `C (+)= A·B` with `A` and `B` rounded to bf16 and multiplied pairwise by AVX512-BF16's `vdpbf16ps`,
//! which does two multiply-adds per f32 lane and instruction: twice an f32 FMA's, at the same issue rate
//! (AMD Zen 4: 3.65 G instructions/s of either on one core).
//!
//! Layout: steps `2q` and `2q + 1` share one u32 (the even step in the low half). `A` is `[m × k2]` such
//! pairs, row-major ([`to_pairs`]); `B` is packed as panels of [`NR`] columns, `panel[q][j]` = pair `q`
//! of column `j` ([`pack_transposed`], [`pack_rows`]); an odd `k` gets a zero last half.
//!
//! Arithmetic, as Intel's SDM defines `vdpbf16ps` (AMD Zen 4 agrees: `tests` hold it to the reference):
//! per pair, the odd product is added to the f32 accumulator, then the even one, each add rounded to
//! nearest even; bf16 inputs that are subnormal count as zero and subnormal sums are flushed to zero. The
//! products of two bf16 are exact in f32. Each output element is one such chain per [`KC2`] pairs, the
//! blocks added in order, as in `panel_gemm`; [`gemm_ref`] is the scalar reference. Rounding to bf16
//! ([`bf16_rne`]) is `vcvtne2ps2bf16`'s: nearest even, subnormals to zero, NaN kept quiet.

use std::sync::OnceLock;

use rayon::prelude::*;

/// Columns per packed panel.
pub const NR: usize = 32;

/// Pairs of steps per pass over `A` (256 steps, as `panel_gemm`).
const KC2: usize = 128;

/// Whether the kernels run: the AVX-512 kernel table is in use (the best this CPU has, unless
/// `DELTAQ_ISA` chose another; it implies AVX2, FMA and AVX512-VL) and the CPU has AVX512-BF16;
/// decided once. Elsewhere the
/// reference stands in for them, so the functions stay correct, but callers should keep the f32 path.
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            super::kernels().isa.is_avx512() && is_x86_feature_detected!("avx512bf16")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// `x` rounded to bf16 (the bits): nearest even, subnormals to signed zero, NaN quiet.
pub fn bf16_rne(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    if x.is_subnormal() {
        return ((b >> 16) & 0x8000) as u16;
    }
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// u32 pairs per row of `k` steps.
pub fn pairs(k: usize) -> usize {
    k.div_ceil(2)
}

/// u32 of `n` columns of depth `k` packed.
pub fn packed_len(n: usize, k: usize) -> usize {
    n.div_ceil(NR) * NR * pairs(k)
}

/// `dst [m × pairs(k)]` = rows `src[i·ld ..][..k]` rounded to bf16 pairs, blocks of rows over the rayon
/// pool.
pub fn to_pairs(m: usize, k: usize, src: &[f32], ld: usize, dst: &mut [u32]) {
    const ROWS: usize = 16;
    let k2 = pairs(k).max(1);
    dst[..m * pairs(k)]
        .par_chunks_mut(ROWS * k2)
        .enumerate()
        .for_each(|(b, d)| rows_to_pairs(d.len() / k2, k, &src[b * ROWS * ld..], ld, d));
}

/// [`to_pairs`] on the calling thread (inside a work item).
pub fn rows_to_pairs(m: usize, k: usize, src: &[f32], ld: usize, dst: &mut [u32]) {
    let k2 = pairs(k);
    assert!(m == 0 || (ld >= k && src.len() >= (m - 1) * ld + k) && dst.len() >= m * k2);
    for (i, d) in dst[..m * k2].chunks_exact_mut(k2.max(1)).enumerate() {
        row_to_pairs(&src[i * ld..][..k], d);
    }
}

/// One row of `k` floats into `pairs(k)` u32.
fn row_to_pairs(src: &[f32], dst: &mut [u32]) {
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: AVX512-BF16 was just detected; `dst` holds pairs(src.len()) u32 (the caller's slice).
        return unsafe { x86::row_to_pairs(src, dst) };
    }
    row_to_pairs_ref(src, dst)
}

/// The scalar form of [`row_to_pairs`] (writes the first `pairs(src.len())` of `dst`).
fn row_to_pairs_ref(src: &[f32], dst: &mut [u32]) {
    for (q, d) in dst[..pairs(src.len())].iter_mut().enumerate() {
        let lo = bf16_rne(src[2 * q]) as u32;
        let hi = src.get(2 * q + 1).map_or(0, |&v| bf16_rne(v) as u32);
        *d = lo | hi << 16;
    }
}

/// The softmax weights of `scale · x` left unnormalized, as bf16 pairs: `dst = bf16(exp(scale·(x − max)))`;
/// returns their sum (over the f32 values), by which the caller divides what it computes from them
/// (attention: `O = (E·V) / sum`). One pass to find the max and one to exponentiate, round and sum,
/// instead of softmax, scaling and rounding each over the row.
pub fn softmax_pairs(x: &[f32], scale: f32, dst: &mut [u32]) -> f32 {
    assert!(dst.len() >= pairs(x.len()));
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: `available` implies AVX2, FMA, AVX512-VL and AVX512-BF16; `dst` holds pairs(len) u32.
        return unsafe { x86::softmax_pairs(x, scale, dst) };
    }
    softmax_pairs_ref(x, scale, dst)
}

/// The scalar form of [`softmax_pairs`] (`f32::exp`; the kernel's exp differs by an ulp or so).
pub fn softmax_pairs_ref(x: &[f32], scale: f32, dst: &mut [u32]) -> f32 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let m = max * scale;
    let e: Vec<f32> = x.iter().map(|&v| v.mul_add(scale, -m).exp()).collect();
    row_to_pairs_ref(&e, dst);
    e.iter().sum()
}

/// Packs `B[p][j] = src[j·ld + p]` (`B`'s columns are `src`'s rows: a weight matrix, or keys) for
/// `j < n`, `p < k` into `dst` ([`packed_len`] u32).
pub fn pack_transposed(n: usize, k: usize, src: &[f32], ld: usize, dst: &mut [u32]) {
    assert!(n == 0 || (ld >= k && src.len() >= (n - 1) * ld + k));
    let k2 = pairs(k);
    if k2 == 0 {
        return;
    }
    let mut row = vec![0u32; k2];
    for (q, panel) in dst[..packed_len(n, k)]
        .chunks_exact_mut(NR * k2)
        .enumerate()
    {
        let cols = NR.min(n - q * NR);
        if cols < NR {
            panel.fill(0);
        }
        for jj in 0..cols {
            row_to_pairs(&src[(q * NR + jj) * ld..][..k], &mut row);
            for (p, &v) in row.iter().enumerate() {
                panel[p * NR + jj] = v;
            }
        }
    }
}

/// Packs `B[p][j] = src[p·ld + j]` (`B` row-major: values) for `j < n`, `p < k` into `dst`.
pub fn pack_rows(n: usize, k: usize, src: &[f32], ld: usize, dst: &mut [u32]) {
    assert!(k == 0 || (ld >= n && src.len() >= (k - 1) * ld + n));
    let k2 = pairs(k);
    if k2 == 0 {
        return;
    }
    for (q, panel) in dst[..packed_len(n, k)]
        .chunks_exact_mut(NR * k2)
        .enumerate()
    {
        let cols = NR.min(n - q * NR);
        for (p, row) in panel.chunks_exact_mut(NR).enumerate() {
            for (jj, d) in row.iter_mut().enumerate() {
                let at = |s: usize| -> u32 {
                    if jj < cols && s < k {
                        bf16_rne(src[s * ld + q * NR + jj]) as u32
                    } else {
                        0
                    }
                };
                *d = at(2 * p) | at(2 * p + 1) << 16;
            }
        }
    }
}

/// `c[i·ldc + j] (+)= Σ_p A[i][p] · B[p][j]` for `i < m`, `j < n` over `k2` pairs, `a` from [`to_pairs`]
/// (row stride `lda2` pairs), `b` packed with the same `n` and a depth of `k2` pairs; `accumulate =
/// false` overwrites `c`.
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    m: usize,
    n: usize,
    k2: usize,
    a: &[u32],
    lda2: usize,
    b: &[u32],
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        ldc >= n && c.len() >= (m - 1) * ldc + n,
        "bf16 gemm: C too short"
    );
    // SAFETY: C's extent was just checked, and `c` is borrowed mutably for the call.
    unsafe { gemm_raw(m, n, k2, a, lda2, b, c.as_mut_ptr(), ldc, accumulate) }
}

/// [`gemm`] writing through a pointer (work items that own column blocks of one matrix).
///
/// # Safety
/// For `i < m`, `j < n`, `c + i·ldc + j` must be valid for reads and writes, and nothing else may access
/// those elements during the call (`ldc ≥ n`).
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_raw(
    m: usize,
    n: usize,
    k2: usize,
    a: &[u32],
    lda2: usize,
    b: &[u32],
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        lda2 >= k2 && a.len() >= (m - 1) * lda2 + k2,
        "bf16 gemm: A too short"
    );
    assert!(
        b.len() >= n.div_ceil(NR) * NR * k2,
        "bf16 gemm: B too short"
    );
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: AVX512-BF16 was detected; A and B were checked above, C is the caller's.
        return unsafe { x86::gemm(m, n, k2, a, lda2, b, c, ldc, accumulate) };
    }
    // SAFETY: the caller's extent: rows i < m of n elements at stride ldc.
    let c = unsafe { std::slice::from_raw_parts_mut(c, (m - 1) * ldc + n) };
    gemm_packed_ref(m, n, k2, a, lda2, b, c, ldc, accumulate)
}

/// One `vdpbf16ps` lane: `acc` plus the odd, then the even product of the pairs `a` and `b`.
fn dot_pair(acc: f32, a: u32, b: u32) -> f32 {
    let widen = |h: u32| {
        let x = f32::from_bits((h & 0xffff) << 16);
        if x.is_subnormal() {
            0.0
        } else {
            x
        }
    };
    let ftz = |x: f32| {
        if x.is_subnormal() {
            f32::from_bits(x.to_bits() & 0x8000_0000)
        } else {
            x
        }
    };
    let acc = ftz(acc + widen(a >> 16) * widen(b >> 16));
    ftz(acc + widen(a) * widen(b))
}

/// The scalar reference of [`gemm`]: `B` unpacked (`b[q·ldb + j]`, pair `q` of column `j`), the kernel's
/// order of operations.
#[allow(clippy::too_many_arguments)]
pub fn gemm_ref(
    m: usize,
    n: usize,
    k2: usize,
    a: &[u32],
    lda2: usize,
    b: &[u32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    for i in 0..m {
        for j in 0..n {
            let mut out = if accumulate { c[i * ldc + j] } else { 0.0 };
            for q0 in (0..k2).step_by(KC2) {
                let s = (q0..k2.min(q0 + KC2))
                    .fold(0f32, |s, q| dot_pair(s, a[i * lda2 + q], b[q * ldb + j]));
                out = if q0 == 0 && !accumulate { s } else { out + s };
            }
            c[i * ldc + j] = out;
        }
    }
}

/// [`gemm_ref`] over packed panels (where the CPU has no AVX512-BF16).
#[allow(clippy::too_many_arguments)]
fn gemm_packed_ref(
    m: usize,
    n: usize,
    k2: usize,
    a: &[u32],
    lda2: usize,
    b: &[u32],
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    for q in 0..n.div_ceil(NR) {
        let cols = NR.min(n - q * NR);
        let panel = &b[q * NR * k2..][..NR * k2];
        gemm_ref(
            m,
            cols,
            k2,
            a,
            lda2,
            panel,
            NR,
            &mut c[q * NR..],
            ldc,
            accumulate,
        );
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::*;

    use super::{KC2, NR};

    /// 32 floats at a time by `vcvtne2ps2bf16`, the tail by the reference.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn row_to_pairs(src: &[f32], dst: &mut [u32]) {
        let n32 = src.len() / 32;
        for i in 0..n32 {
            // SAFETY: 32 floats at 32·i < len are in `src`; 16 u32 at 16·i < pairs(len) in `dst`.
            let lo = _mm512_loadu_ps(src.as_ptr().add(32 * i));
            let hi = _mm512_loadu_ps(src.as_ptr().add(32 * i + 16));
            let v: __m512i = core::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
            _mm512_storeu_si512(dst.as_mut_ptr().add(16 * i).cast(), v);
        }
        super::row_to_pairs_ref(&src[32 * n32..], &mut dst[16 * n32..]);
    }

    /// See [`super::softmax_pairs`]: 8 lanes at a time (the exp of `ops`), the tail by the reference's
    /// formula.
    #[target_feature(enable = "avx2,fma,avx512f,avx512bf16,avx512vl")]
    pub unsafe fn softmax_pairs(x: &[f32], scale: f32, dst: &mut [u32]) -> f32 {
        use crate::kernels::x86::ops::{exp_ps, max_of};
        let n8 = x.len() / 8 * 8;
        let max = max_of(x);
        let (s, m) = (_mm256_set1_ps(scale), _mm256_set1_ps(max * scale));
        let mut acc = _mm256_setzero_ps();
        for i in (0..n8).step_by(8) {
            // SAFETY: i + 8 ≤ n floats; i/2 + 4 ≤ pairs(n) u32.
            let e = exp_ps(_mm256_fmsub_ps(_mm256_loadu_ps(x.as_ptr().add(i)), s, m));
            acc = _mm256_add_ps(acc, e);
            let h: __m128i = core::mem::transmute(_mm256_cvtneps_pbh(e));
            _mm_storeu_si128(dst.as_mut_ptr().add(i / 2).cast(), h);
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        let mut sum: f32 = lanes.iter().sum();
        let tail: Vec<f32> = x[n8..]
            .iter()
            .map(|&v| v.mul_add(scale, -max * scale).exp())
            .collect();
        sum += tail.iter().sum::<f32>();
        super::row_to_pairs_ref(&tail, &mut dst[n8 / 2..]);
        sum
    }

    /// `C (+)= A·B` by register tiles of up to 12 rows × one panel (24 accumulators).
    ///
    /// # Safety
    /// AVX512-BF16 present; A and B as [`super::gemm_raw`] checked them, C as its caller guarantees.
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm(
        m: usize,
        n: usize,
        k2: usize,
        a: &[u32],
        lda2: usize,
        b: &[u32],
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        if k2 == 0 {
            if !accumulate {
                for i in 0..m {
                    // SAFETY: row i's n elements are inside the caller's extent.
                    core::slice::from_raw_parts_mut(c.add(i * ldc), n).fill(0.0);
                }
            }
            return;
        }
        for q0 in (0..k2).step_by(KC2) {
            let kc = KC2.min(k2 - q0);
            for i0 in (0..m).step_by(12) {
                for p in 0..n.div_ceil(NR) {
                    let t = Tile {
                        rows: 12.min(m - i0),
                        cols: NR.min(n - p * NR),
                        kc,
                        a: a[i0 * lda2 + q0..].as_ptr(),
                        lda2,
                        b: b[(p * k2 + q0) * NR..][..kc * NR].as_ptr(),
                        c: c.add(i0 * ldc + p * NR),
                        ldc,
                        load_c: accumulate || q0 > 0,
                    };
                    // A panel with at most 16 columns (the last of an odd width, e.g. the 9B tower's
                    // head size 72 = 32 + 32 + 8) takes half the products.
                    macro_rules! by_rows {
                        ($h:literal; $($r:literal),*) => {
                            match t.rows {
                                $($r => tile::<$r, $h>(&t),)*
                                r => unreachable!("tile of {r} rows"),
                            }
                        };
                    }
                    if t.cols > 16 {
                        by_rows!(2; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);
                    } else {
                        by_rows!(1; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);
                    }
                }
            }
        }
    }

    /// `rows × cols` of C over `kc` pairs; pointers at the tile's first row, pair and element.
    struct Tile {
        rows: usize,
        cols: usize,
        kc: usize,
        a: *const u32,
        lda2: usize,
        b: *const u32,
        c: *mut f32,
        ldc: usize,
        load_c: bool,
    }

    /// `H` halves of 16 columns.
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn tile<const R: usize, const H: usize>(x: &Tile) {
        let arow: [*const u32; R] = core::array::from_fn(|r| x.a.add(r * x.lda2));
        let mut acc = [[_mm512_setzero_ps(); H]; R];
        for q in 0..x.kc {
            // SAFETY: q < kc pairs of R ≤ rows rows of A and of the kc × NR panel (checked extents).
            let b: [__m512bh; H] = core::array::from_fn(|h| {
                core::mem::transmute(_mm512_loadu_si512(x.b.add(q * NR + 16 * h).cast()))
            });
            // Spelled out per row (constant indices) so the accumulators stay in registers.
            macro_rules! row {
                ($r:literal) => {
                    if $r < R {
                        let av: __m512bh =
                            core::mem::transmute(_mm512_set1_epi32(*arow[$r].add(q) as i32));
                        acc[$r][0] = _mm512_dpbf16_ps(acc[$r][0], av, b[0]);
                        if H > 1 {
                            acc[$r][H - 1] = _mm512_dpbf16_ps(acc[$r][H - 1], av, b[H - 1]);
                        }
                    }
                };
            }
            row!(0);
            row!(1);
            row!(2);
            row!(3);
            row!(4);
            row!(5);
            row!(6);
            row!(7);
            row!(8);
            row!(9);
            row!(10);
            row!(11);
        }
        // SAFETY: rows R ≤ rows and columns < cols of the tile, inside C's checked extent.
        crate::kernels::panel_gemm::x86::store_tile(&acc, x.cols, x.c, x.ldc, x.load_c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rng(u32);
    impl Rng {
        fn next(&mut self) -> u32 {
            self.0 = self.0.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            self.0
        }
        fn f(&mut self) -> f32 {
            (self.next() >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        }
    }

    /// Rounding: the SIMD conversion equals [`bf16_rne`] on random bit patterns (NaNs, infinities,
    /// subnormals, ties), and `bf16_rne` rounds ties to even.
    #[test]
    fn rounding_matches_the_reference() {
        assert_eq!(bf16_rne(1.0), 0x3f80);
        assert_eq!(bf16_rne(f32::from_bits(0x3f80_8000)), 0x3f80); // tie, even stays
        assert_eq!(bf16_rne(f32::from_bits(0x3f81_8000)), 0x3f82); // tie, odd rounds up
        assert_eq!(bf16_rne(f32::from_bits(0x0000_0001)), 0);
        assert_eq!(bf16_rne(f32::from_bits(0x8040_0000)), 0x8000);
        let mut rng = Rng(7);
        let mut src: Vec<f32> = (0..4099).map(|_| f32::from_bits(rng.next())).collect();
        src.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::NAN,
        ]);
        src.extend((0..64).map(|i| f32::from_bits(0x3f80_8000 + (i << 16))));
        let mut got = vec![0u32; pairs(src.len())];
        let mut want = got.clone();
        row_to_pairs(&src, &mut got);
        row_to_pairs_ref(&src, &mut want);
        assert_eq!(got, want);
    }

    /// One pair: the odd product goes first (1 − 1 + 2^-30 keeps the small term), sums that are
    /// subnormal are flushed, subnormal inputs read as zero.
    #[test]
    fn dot_pair_order_and_flushing() {
        let bf = |x: f32| bf16_rne(x) as u32;
        let pair = |even: f32, odd: f32| bf(even) | bf(odd) << 16;
        let tiny = 2f32.powi(-15);
        assert_eq!(
            dot_pair(1.0, pair(tiny, -1.0), pair(tiny, 1.0)),
            2f32.powi(-30)
        );
        assert_eq!(dot_pair(1.0, pair(-1.0, tiny), pair(1.0, tiny)), 0.0);
        let sub = 0x0040u32; // a subnormal bf16
        assert_eq!(dot_pair(0.0, sub | sub << 16, pair(1.0, 1.0)), 0.0);
        let m = 2f32.powi(-70);
        assert_eq!(dot_pair(0.0, pair(m, 0.0), pair(m, 0.0)), 0.0); // 2^-140: flushed
                                                                    // The kernel on the same cases: a first pair of 1·1, then the pair under test.
        let cases = [
            (pair(tiny, -1.0), pair(tiny, 1.0)),
            (pair(-1.0, tiny), pair(1.0, tiny)),
            (sub | sub << 16, pair(1.0, 1.0)),
        ];
        for (a, b) in cases {
            let a = [pair(0.0, 1.0), a];
            let mut panel = vec![0u32; 2 * NR];
            (panel[0], panel[NR]) = (pair(0.0, 1.0), b);
            let (mut got, mut want) = ([0f32], [0f32]);
            gemm(1, 1, 2, &a, 2, &panel, &mut got, 1, false);
            gemm_ref(1, 1, 2, &a, 2, &panel, NR, &mut want, 1, false);
            assert_eq!(got[0].to_bits(), want[0].to_bits(), "{a:x?} · {b:x}");
        }
        let (mut got, mut want) = ([0f32], [0f32]);
        let (a, b) = ([pair(m, 0.0)], [pair(m, 0.0); NR]);
        gemm(1, 1, 1, &a, 1, &b, &mut got, 1, false);
        gemm_ref(1, 1, 1, &a, 1, &b, NR, &mut want, 1, false);
        assert_eq!(got[0].to_bits(), want[0].to_bits(), "flushed product");
    }

    /// The fused softmax against its reference: every weight within one bf16 step, sums within 1e-6.
    #[test]
    fn softmax_pairs_matches_the_reference() {
        let mut rng = Rng(5);
        for n in [1, 7, 8, 9, 64, 3072, 3077] {
            let x: Vec<f32> = (0..n).map(|_| rng.f() * 40.0).collect();
            let (mut got, mut want) = (vec![0u32; pairs(n)], vec![0u32; pairs(n)]);
            let gs = softmax_pairs(&x, 0.125, &mut got);
            let ws = softmax_pairs_ref(&x, 0.125, &mut want);
            assert!((gs - ws).abs() <= 1e-6 * ws, "{n}: sum {gs} vs {ws}");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                for sh in [0, 16] {
                    let (g, w) = ((g >> sh) & 0xffff, (w >> sh) & 0xffff);
                    assert!(g.abs_diff(w) <= 1, "{n} pair {i}: {g:x} vs {w:x}");
                }
            }
            // The largest weight is exactly 1.
            let max = (0..n)
                .map(|i| (got[i / 2] >> (16 * (i % 2))) & 0xffff)
                .max();
            assert_eq!(max, Some(0x3f80));
        }
    }

    /// The kernel against the reference, bit for bit, on shapes with partial tiles, panels, pair
    /// blocks and odd depths, from both packings, overwriting and accumulating.
    #[test]
    fn gemm_matches_the_reference() {
        let mut rng = Rng(3);
        for (m, n, k) in [
            (1, 1, 1),
            (12, 32, 256),
            (13, 33, 257),
            (7, 70, 64),
            (25, 5, 601),
            (48, 96, 72),
            (3, 31, 0),
            (37, 64, 513),
        ] {
            let (k2, ldc) = (pairs(k), n + 5);
            let af: Vec<f32> = (0..m * (k + 3)).map(|_| rng.f()).collect();
            let mut a = vec![0u32; m * k2];
            to_pairs(m, k, &af, k + 3, &mut a);
            let b: Vec<f32> = (0..k * n).map(|_| rng.f()).collect(); // [k × n]
            let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect(); // [n × k]
            let mut from_rows = vec![u32::MAX; packed_len(n, k)];
            pack_rows(n, k, &b, n, &mut from_rows);
            let mut from_cols = vec![u32::MAX; packed_len(n, k)];
            pack_transposed(n, k, &bt, k, &mut from_cols);
            assert_eq!(from_rows, from_cols, "{m}x{n}x{k}: packings");
            // B unpacked as pairs: [k2 × n].
            let mut bu = vec![0u32; k2 * n];
            for j in 0..n {
                let mut col = vec![0u32; k2];
                row_to_pairs_ref(&bt[j * k..][..k], &mut col);
                for q in 0..k2 {
                    bu[q * n + j] = col[q];
                }
            }
            let c0: Vec<f32> = (0..m * ldc).map(|_| rng.f()).collect();
            for accumulate in [false, true] {
                let mut want = c0.clone();
                gemm_ref(m, n, k2, &a, k2, &bu, n, &mut want, ldc, accumulate);
                let mut got = c0.clone();
                gemm(m, n, k2, &a, k2, &from_rows, &mut got, ldc, accumulate);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{m}x{n}x{k} acc={accumulate}");
                // And near the exact product of the rounded inputs.
                for i in 0..m {
                    for j in 0..n {
                        let base = if accumulate {
                            c0[i * ldc + j] as f64
                        } else {
                            0.0
                        };
                        let w: f64 = (0..k)
                            .map(|p| {
                                let r = |x: f32| f32::from_bits((bf16_rne(x) as u32) << 16) as f64;
                                r(af[i * (k + 3) + p]) * r(b[p * n + j])
                            })
                            .sum::<f64>()
                            + base;
                        let g = got[i * ldc + j] as f64;
                        assert!((g - w).abs() <= 1e-5, "{m}x{n}x{k} ({i}, {j}): {g} vs {w}");
                    }
                }
            }
        }
    }
}
