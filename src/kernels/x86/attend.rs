//! Attention over the KV cache (the grouped streaming softmax of `kernels::attend`): up to eight queries
//! served by each load of a key or value row (AVX-512; four with AVX2's 16 registers), FMA register
//! tiles, weights by the vector `exp`; f16 rows widened by F16C's `vcvtph2ps` (exact). One body for two
//! widths: 8 lanes (`__m256`, the AVX2 table) and 16 lanes (`__m512`, the AVX-512 table, whose 32
//! registers hold 4 × 4 and 8 × 2 score tiles).

use core::arch::x86_64::*;

use half::f16;

use super::hsum_ps;
use super::ops::exp_ps;
use crate::kernels::attend::{self, AttnOut, KvElem, KvPages, BLOCK, PF_ROWS};
use crate::kernels::dispatch::AttendSteps;

/// An f32 vector of `LANES` lanes, with the operations the tiles use.
pub(crate) trait Vf: Copy {
    const LANES: usize;
    /// Queries × rows per score tile for 4, 3, 2 and 1 queries (at most 8 accumulators with 16
    /// registers, 16 with 32).
    const SCORE_ROWS: [usize; 4];
    unsafe fn zero() -> Self;
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(p: *mut f32, v: Self);
    unsafe fn splat(x: f32) -> Self;
    /// `a·b + c`, one rounding.
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self;
    /// The lane sums of every vector of `acc` into `out` (as many), each vector's sum in one fixed
    /// order whatever the others are.
    unsafe fn hsums(acc: &[Self], out: &mut [f32]);
}

impl Vf for __m256 {
    const LANES: usize = 8;
    const SCORE_ROWS: [usize; 4] = [2, 2, 4, 4];
    #[inline(always)]
    unsafe fn zero() -> Self {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self) {
        _mm256_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        _mm256_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
        _mm256_fmadd_ps(a, b, c)
    }
    /// One vector at a time: halves added down to one lane ([`hsum_ps`]).
    #[inline(always)]
    unsafe fn hsums(acc: &[Self], out: &mut [f32]) {
        for (o, &a) in out.iter_mut().zip(acc) {
            *o = hsum_ps(a);
        }
    }
}

impl Vf for __m512 {
    const LANES: usize = 16;
    const SCORE_ROWS: [usize; 4] = [4, 4, 8, 8];
    #[inline(always)]
    unsafe fn zero() -> Self {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self) {
        _mm512_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        _mm512_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
        _mm512_fmadd_ps(a, b, c)
    }
    /// Sixteen vectors at a time, transposed as they are added (30 shuffles and 15 adds for 16 sums,
    /// where one vector alone takes 4 and 4): every add joins lanes of one vector, so each sum is
    /// `((c0 + c1) + (c2 + c3))` over its 128-bit chunks, each chunk `(l0 + l2) + (l1 + l3)`, whatever
    /// the other vectors are (a short batch is padded with zeros).
    #[inline(always)]
    unsafe fn hsums(acc: &[Self], out: &mut [f32]) {
        assert_eq!(acc.len(), out.len(), "hsums: shapes");
        for (acc, out) in acc.chunks(16).zip(out.chunks_mut(16)) {
            let mut a = [_mm512_setzero_ps(); 16];
            a[..acc.len()].copy_from_slice(acc);
            // [a(2p) l0+l2, a(2p+1) l0+l2, a(2p) l1+l3, a(2p+1) l1+l3] per chunk.
            let b: [__m512; 8] = core::array::from_fn(|p| {
                let (x, y) = (a[2 * p], a[2 * p + 1]);
                _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y))
            });
            // Lane k of chunk c: chunk c's sum of a(4p + k).
            let c: [__m512; 4] = core::array::from_fn(|p| {
                let (x, y) = (b[2 * p], b[2 * p + 1]);
                _mm512_add_ps(
                    _mm512_shuffle_ps::<0x44>(x, y),
                    _mm512_shuffle_ps::<0xEE>(x, y),
                )
            });
            // Chunks [c(2p): 0+1, 2+3, c(2p+1): 0+1, 2+3].
            let d: [__m512; 2] = core::array::from_fn(|p| {
                let (x, y) = (c[2 * p], c[2 * p + 1]);
                _mm512_add_ps(
                    _mm512_shuffle_f32x4::<0x88>(x, y),
                    _mm512_shuffle_f32x4::<0xDD>(x, y),
                )
            });
            // Lane 4q + k: the sum of a(4q + k).
            let e = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x88>(d[0], d[1]),
                _mm512_shuffle_f32x4::<0xDD>(d[0], d[1]),
            );
            let mut sums = [0f32; 16];
            _mm512_storeu_ps(sums.as_mut_ptr(), e);
            out.copy_from_slice(&sums[..out.len()]);
        }
    }
}

/// A KV element type, loaded `V::LANES` consecutive elements at a time as f32 lanes.
pub(crate) trait Row<V: Vf>: KvElem {
    unsafe fn load(p: *const Self) -> V;
}

impl Row<__m256> for f32 {
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
}

impl Row<__m256> for f16 {
    #[inline(always)]
    unsafe fn load(p: *const f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
}

impl Row<__m512> for f32 {
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
}

impl Row<__m512> for f16 {
    #[inline(always)]
    unsafe fn load(p: *const f16) -> __m512 {
        cvtph2ps_load(p)
    }
}

/// `vcvtph2ps` with its load folded in: LLVM emits the intrinsic as the register form with `{sae}`,
/// which cannot take a memory operand, and on Intel the register form costs a port-5 µop (an FMA port)
/// that the memory form leaves to the load ports.
///
/// # Safety
/// The CPU must have AVX-512F; 16 values readable at `p`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn cvtph2ps_load(p: *const f16) -> __m512 {
    let r: __m512;
    // SAFETY: reads the 32 bytes at `p`, which the caller guarantees; no other memory.
    unsafe {
        core::arch::asm!(
            "vcvtph2ps {r}, ymmword ptr [{p}]",
            r = lateout(zmm_reg) r,
            p = in(reg) p,
            options(pure, readonly, nostack, preserves_flags)
        );
    }
    r
}

/// `$name`: the grouped body with tiles of `$v`, compiled with `$features`. A macro rather than a
/// generic function under two `#[target_feature]` wrappers: closures get the target features of the
/// function they are written in, and in a plain generic body every intrinsic became a call (pp512 at
/// depth ran 10 times slower).
macro_rules! grouped_body {
    ($name:ident, $v:ty, $features:literal) => {
        #[target_feature(enable = $features)]
        unsafe fn $name<T: Row<$v>>(
            qs: &[f32],
            n_ctx: &[usize],
            kv: KvPages<'_, T>,
            scale: f32,
            out: AttnOut<'_>,
        ) {
            attend::body_grouped(
                qs,
                n_ctx,
                kv,
                scale,
                out,
                // AVX-512: two 8-query score tiles share each key row ([`scores`]).
                if <$v as Vf>::LANES == 16 {
                    attend::GROUP_MAX
                } else {
                    attend::GROUP
                },
                // SAFETY (all three): compiled with this function's features, which the caller
                // guarantees; each checks that the rows it reads are inside its slices.
                |i0, q, k, v, stride, s, r| unsafe {
                    scores::<$v, T>(q, k, v, stride, s, r, i0 == 0)
                },
                |s, max, sum| *sum += unsafe { weights(s, max) } as f64,
                |o, w, v, stride, r| unsafe { values::<$v, T>(o, w, v, stride, r) },
            )
        }
    };
}

grouped_body!(run_avx2, __m256, "avx2,fma,f16c");
grouped_body!(
    run_avx512,
    __m512,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl"
);

/// Raw scores of a group of `s.len()` (1 to 16) queries against key rows `0..r`: every (query, row)
/// pair gets one accumulator over the head, chunk after chunk, and [`Vf::hsums`], whatever the group
/// size. Tiles of `V::SCORE_ROWS` rows, then rows one at a time. `fetch`: prefetch the rows ahead (the
/// block's first group; the others find them in cache).
///
/// # Safety
/// The CPU must have what `V` needs (inlined into a [`grouped_body!`] function); the head length a
/// multiple of `V::LANES`.
#[inline(always)]
unsafe fn scores<V: Vf, T: Row<V>>(
    qs: &[f32],
    k: &[T],
    v: &[T],
    stride: usize,
    s: &mut [[f32; BLOCK]],
    r: usize,
    fetch: bool,
) {
    let g = s.len();
    if g == 16 && V::LANES == 16 {
        // Two tiles of 8 queries × 2 rows take turns on each pair of key rows: a block of keys (64 KiB
        // in f16) does not stay in L1, and each group streams it from L2 once.
        return scores_n::<V, T, 8, 2, 2>(qs, k, v, stride, s, r, fetch);
    }
    // Otherwise tiles of 8 queries (AVX-512) or of up to 4, one after the other: the same operations
    // per pair. Only the first prefetches.
    let hd = qs.len() / g;
    let mut at = 0;
    while at < g {
        let n = if V::LANES == 16 && g - at >= 8 {
            8
        } else {
            (g - at).min(4)
        };
        let (q, s) = (&qs[at * hd..(at + n) * hd], &mut s[at..at + n]);
        if n == 8 {
            // 8 queries × 2 rows: 16 accumulators, each row widened once for 8 queries.
            scores_n::<V, T, 8, 2, 1>(q, k, v, stride, s, r, fetch && at == 0);
        } else {
            scores4::<V, T>(q, k, v, stride, s, r, fetch && at == 0);
        }
        at += n;
    }
}

/// [`scores`] for 1 to 4 queries (not recursive: a recursive call would not be inlined into the
/// function that has the target features, and its intrinsics would become calls).
#[inline(always)]
unsafe fn scores4<V: Vf, T: Row<V>>(
    qs: &[f32],
    k: &[T],
    v: &[T],
    stride: usize,
    s: &mut [[f32; BLOCK]],
    r: usize,
    fetch: bool,
) {
    match (s.len(), V::SCORE_ROWS[4 - s.len().clamp(1, 4)]) {
        (4, 4) => scores_n::<V, T, 4, 4, 1>(qs, k, v, stride, s, r, fetch),
        (4, _) => scores_n::<V, T, 4, 2, 1>(qs, k, v, stride, s, r, fetch),
        (3, 4) => scores_n::<V, T, 3, 4, 1>(qs, k, v, stride, s, r, fetch),
        (3, _) => scores_n::<V, T, 3, 2, 1>(qs, k, v, stride, s, r, fetch),
        (2, 8) => scores_n::<V, T, 2, 8, 1>(qs, k, v, stride, s, r, fetch),
        (2, _) => scores_n::<V, T, 2, 4, 1>(qs, k, v, stride, s, r, fetch),
        (_, 8) => scores_n::<V, T, 1, 8, 1>(qs, k, v, stride, s, r, fetch),
        _ => scores_n::<V, T, 1, 4, 1>(qs, k, v, stride, s, r, fetch),
    }
}

/// `NB` tiles of `G` queries × `R` rows: the `NB` tiles take turns on each `R` key rows.
#[inline(always)]
unsafe fn scores_n<V: Vf, T: Row<V>, const G: usize, const R: usize, const NB: usize>(
    qs: &[f32],
    k: &[T],
    v: &[T],
    stride: usize,
    s: &mut [[f32; BLOCK]],
    r: usize,
    fetch: bool,
) {
    let (hd, l) = (qs.len() / (G * NB), V::LANES);
    assert!(
        s.len() == G * NB && r <= BLOCK && hd.is_multiple_of(l) && r > 0,
        "scores: shapes"
    );
    assert!(k.len() >= (r - 1) * stride + hd, "scores: rows outside k");
    let kp = k.as_ptr();
    // Every load is at `c..c + l` < hd of query `j < G·NB` or of key row `< r` (checked above).
    let mut i = 0;
    while i + R <= r {
        // Decoding reads each row once, straight from memory: fetch the keys a few rows ahead (the
        // next block's first ones at the end) and this block's values for the value pass to come.
        if fetch {
            prefetch_rows::<_MM_HINT_T0, T>(kp, (i + PF_ROWS) * stride, R, stride, hd);
            prefetch_rows::<_MM_HINT_T1, T>(v.as_ptr(), i * stride, R, stride, hd);
        }
        for (b, s) in s.chunks_exact_mut(G).enumerate() {
            let qp = qs.as_ptr().add(b * G * hd);
            let mut acc = [[V::zero(); R]; G];
            let mut c = 0;
            while c < hd {
                let mut kr = [V::zero(); R];
                for (t, kr) in kr.iter_mut().enumerate() {
                    *kr = T::load(kp.add((i + t) * stride + c));
                }
                for (j, acc) in acc.iter_mut().enumerate() {
                    let q = V::load(qp.add(j * hd + c));
                    for (a, &kr) in acc.iter_mut().zip(&kr) {
                        *a = V::fmadd(q, kr, *a);
                    }
                }
                c += l;
            }
            let mut sums = [[0f32; R]; G];
            V::hsums(acc.as_flattened(), sums.as_flattened_mut());
            for (s, sums) in s.iter_mut().zip(&sums) {
                s[i..i + R].copy_from_slice(sums);
            }
        }
        i += R;
    }
    while i < r {
        for (b, s) in s.chunks_exact_mut(G).enumerate() {
            let qp = qs.as_ptr().add(b * G * hd);
            let mut acc = [V::zero(); G];
            let mut c = 0;
            while c < hd {
                let kr = T::load(kp.add(i * stride + c));
                for (j, a) in acc.iter_mut().enumerate() {
                    *a = V::fmadd(V::load(qp.add(j * hd + c)), kr, *a);
                }
                c += l;
            }
            let mut sums = [0f32; G];
            V::hsums(&acc, &mut sums);
            for (s, &sum) in s.iter_mut().zip(&sums) {
                s[i] = sum;
            }
        }
        i += 1;
    }
}

/// Prefetches (into the cache level `HINT` names) `n` rows of `len` elements ([`attend::for_row_lines`]).
#[inline(always)]
fn prefetch_rows<const HINT: i32, T>(p: *const T, at: usize, n: usize, stride: usize, len: usize) {
    // SAFETY: SSE is the x86-64 baseline; a prefetch reads nothing architecturally and never faults.
    attend::for_row_lines(p, at, n, stride, len, |a| unsafe {
        _mm_prefetch::<HINT>(a as *const i8)
    });
}

/// `s ← e^{s − max}` (the 8-lane vector `exp` for both widths, the tail through a padded chunk); returns
/// the sum of the new values: 8 lanes, then [`hsum_ps`], then the tail in order.
///
/// # Safety
/// AVX2 and FMA must be available.
#[inline(always)]
unsafe fn weights(s: &mut [f32], max: f32) -> f32 {
    let m = _mm256_set1_ps(max);
    let mut acc = _mm256_setzero_ps();
    let mut chunks = s.chunks_exact_mut(8);
    for c in &mut chunks {
        // `c` holds exactly 8 values.
        let e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), m));
        _mm256_storeu_ps(c.as_mut_ptr(), e);
        acc = _mm256_add_ps(acc, e);
    }
    let tail = chunks.into_remainder();
    let mut sum = hsum_ps(acc);
    if !tail.is_empty() {
        let mut pad = [max; 8];
        pad[..tail.len()].copy_from_slice(tail);
        // `pad` holds 8 values.
        let e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(pad.as_ptr()), m));
        _mm256_storeu_ps(pad.as_mut_ptr(), e);
        for (t, &e) in tail.iter_mut().zip(&pad) {
            *t = e;
            sum += e;
        }
    }
    sum
}

/// `out_j ← out_j + Σ_{i<r} w[j][i]·v_i` for a group of `w.len()` (1 to 16) queries whose outputs are
/// consecutive in `out`: two vectors of every output at a time stay in registers while each value row is
/// loaded once for the group; every element takes one FMA per row, in row order (the same operations
/// whatever the group size).
///
/// # Safety
/// The CPU must have what `V` needs (inlined into a [`grouped_body!`] function); the head length a
/// multiple of `V::LANES`.
#[inline(always)]
unsafe fn values<V: Vf, T: Row<V>>(
    out: &mut [f32],
    w: &[[f32; BLOCK]],
    v: &[T],
    stride: usize,
    r: usize,
) {
    // Groups of up to 8 outputs (AVX-512's 32 registers) or 4 (AVX2's 16), one after the other.
    let (g, most) = (w.len(), if V::LANES == 16 { 8 } else { 4 });
    let hd = out.len() / g;
    let mut at = 0;
    while at < g {
        let n = (g - at).min(most);
        let (o, w) = (&mut out[at * hd..(at + n) * hd], &w[at..at + n]);
        match n {
            8 => values_n::<V, T, 8>(o, w, v, stride, r),
            7 => values_n::<V, T, 7>(o, w, v, stride, r),
            6 => values_n::<V, T, 6>(o, w, v, stride, r),
            5 => values_n::<V, T, 5>(o, w, v, stride, r),
            4 => values_n::<V, T, 4>(o, w, v, stride, r),
            3 => values_n::<V, T, 3>(o, w, v, stride, r),
            2 => values_n::<V, T, 2>(o, w, v, stride, r),
            _ => values_n::<V, T, 1>(o, w, v, stride, r),
        }
        at += n;
    }
}

#[inline(always)]
unsafe fn values_n<V: Vf, T: Row<V>, const G: usize>(
    out: &mut [f32],
    w: &[[f32; BLOCK]],
    v: &[T],
    stride: usize,
    r: usize,
) {
    let (hd, l) = (out.len() / G, V::LANES);
    assert!(
        w.len() == G && r <= BLOCK && hd.is_multiple_of(l) && r > 0,
        "values: shapes"
    );
    assert!(v.len() >= (r - 1) * stride + hd, "values: rows outside v");
    let (op, vp) = (out.as_mut_ptr(), v.as_ptr());
    // Every access is at `c..c + 2l` (or `c..c + l`) < hd of output `j < G` or of value row `< r`.
    let mut c = 0;
    while c < hd {
        let n = if c + 2 * l <= hd { 2 } else { 1 };
        let mut acc = [[V::zero(); 2]; G];
        for (j, a) in acc.iter_mut().enumerate() {
            for (h, a) in a[..n].iter_mut().enumerate() {
                *a = V::load(op.add(j * hd + c + h * l));
            }
        }
        for i in 0..r {
            let row = vp.add(i * stride + c);
            let v0 = T::load(row);
            let v1 = if n == 2 { T::load(row.add(l)) } else { v0 };
            for (a, w) in acc.iter_mut().zip(w) {
                let wi = V::splat(w[i]);
                a[0] = V::fmadd(wi, v0, a[0]);
                a[1] = V::fmadd(wi, v1, a[1]);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            for (h, &a) in a[..n].iter().enumerate() {
                V::store(op.add(j * hd + c + h * l), a);
            }
        }
        c += n * l;
    }
}

/// The AVX2 table's one-query entry ([`attend::attend`]): checks the shapes, then runs the SIMD body
/// (or the reference for heads that are not a multiple of 8 long). Only reachable through the AVX2
/// and AVX-512 tables, which are handed out after AVX2, FMA and F16C were detected.
pub(crate) fn entry<T: Row<__m256>>(
    q: &[f32],
    kv: KvPages<'_, T>,
    n_ctx: usize,
    scale: f32,
    out: &mut [f32],
) {
    entry_many(q, &[n_ctx], kv, scale, AttnOut::Whole(out))
}

/// The AVX2 table's several-query entry ([`attend::attend_many`]), as [`entry`].
pub(crate) fn entry_many<T: Row<__m256>>(
    qs: &[f32],
    n_ctx: &[usize],
    kv: KvPages<'_, T>,
    scale: f32,
    out: AttnOut<'_>,
) {
    let hd = attend::check_many(qs, n_ctx, &kv, &out);
    if !hd.is_multiple_of(8) {
        // The SIMD loops cover multiples of 8 only; no model has such a head, but stay correct.
        return attend::attend_many_ref(qs, n_ctx, kv, scale, out);
    }
    // SAFETY: the tables holding this entry are only handed out after `avx2::detected()` confirmed
    // AVX2, FMA and F16C; the head length is a multiple of 8 and every row is inside its page
    // (`check_many`; the tiles check their slices anyway).
    unsafe { run_avx2(qs, n_ctx, kv, scale, out) }
}

/// The AVX-512 table's one-query entry: 16-lane tiles (heads that are not a multiple of 16 long take
/// the AVX2 entry).
pub(crate) fn entry512<T: Row<__m512> + Row<__m256>>(
    q: &[f32],
    kv: KvPages<'_, T>,
    n_ctx: usize,
    scale: f32,
    out: &mut [f32],
) {
    entry_many512(q, &[n_ctx], kv, scale, AttnOut::Whole(out))
}

/// The AVX-512 table's several-query entry, as [`entry512`].
pub(crate) fn entry_many512<T: Row<__m512> + Row<__m256>>(
    qs: &[f32],
    n_ctx: &[usize],
    kv: KvPages<'_, T>,
    scale: f32,
    out: AttnOut<'_>,
) {
    let hd = attend::check_many(qs, n_ctx, &kv, &out);
    if !hd.is_multiple_of(16) {
        return entry_many(qs, n_ctx, kv, scale, out);
    }
    // SAFETY: the AVX-512 table is only handed out after `avx512::detected()` (AVX2, FMA, F16C,
    // AVX-512 F/BW/VL); the head length is a multiple of 16 and every row is inside its page.
    unsafe { run_avx512(qs, n_ctx, kv, scale, out) }
}

/// The AVX2 table's attention steps over f32 rows ([`AttendSteps`]): the grouped body's own weights and
/// values.
pub(crate) const STEPS: AttendSteps = AttendSteps {
    weights: weights_avx2,
    values: values_avx2,
};

/// The AVX-512 table's: the same weights, 16-lane values.
pub(crate) const STEPS512: AttendSteps = AttendSteps {
    weights: weights_avx2,
    values: values_avx512,
};

fn weights_avx2(s: &mut [f32], max: f32, sum: &mut f64) {
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn run(s: &mut [f32], max: f32) -> f32 {
        weights(s, max)
    }
    // SAFETY: the tables holding this entry are only handed out after `avx2::detected()`.
    *sum += unsafe { run(s, max) } as f64;
}

fn values_avx2(out: &mut [f32], w: &[[f32; BLOCK]], v: &[f32], stride: usize, r: usize) {
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn run(out: &mut [f32], w: &[[f32; BLOCK]], v: &[f32], stride: usize, r: usize) {
        values::<__m256, f32>(out, w, v, stride, r)
    }
    if !(out.len() / w.len()).is_multiple_of(8) {
        return attend::values_ref(out, w, v, stride, r);
    }
    // SAFETY: as `weights_avx2`; `values_n` checks that its rows are inside `v`.
    unsafe { run(out, w, v, stride, r) }
}

fn values_avx512(out: &mut [f32], w: &[[f32; BLOCK]], v: &[f32], stride: usize, r: usize) {
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    unsafe fn run(out: &mut [f32], w: &[[f32; BLOCK]], v: &[f32], stride: usize, r: usize) {
        values::<__m512, f32>(out, w, v, stride, r)
    }
    if !(out.len() / w.len()).is_multiple_of(16) {
        return values_avx2(out, w, v, stride, r);
    }
    // SAFETY: the AVX-512 table is only handed out after `avx512::detected()`; `values_n` checks that
    // its rows are inside `v`.
    unsafe { run(out, w, v, stride, r) }
}
