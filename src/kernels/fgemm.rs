//! Small dense f32 matrix products for the model's own math (the chunked delta rule):
//! `C ← α·A·B + β·C`, all row-major with leading dimensions.
//!
//! The body is plain Rust over a 4 × 16 register tile (broadcast one `A` element, multiply a row of 16
//! `B` elements), written once and compiled twice: as is, and with AVX2+FMA enabled, which the x86
//! kernel tables select at run time. The scalar table keeps the plain copy, so `DELTAQ_ISA=scalar` runs
//! no FMA.

/// `c[i][j] ← alpha · Σ_p a[i][p] · b[p][j] + beta · c[i][j]` for `i < m`, `j < n`, `p < k`;
/// `a[i][p] = a[i·lda + p]`, `b[p][j] = b[p·ldb + j]`, `c[i][j] = c[i·ldc + j]`. `beta = 0` overwrites
/// `c` (NaNs in it included).
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        a.len() >= (m - 1) * lda + k && lda >= k,
        "gemm: A too short"
    );
    assert!(
        k == 0 || (b.len() >= (k - 1) * ldb + n && ldb >= n),
        "gemm: B too short"
    );
    assert!(
        c.len() >= (m - 1) * ldc + n && ldc >= n,
        "gemm: C too short"
    );
    let args = Args {
        m,
        n,
        k,
        alpha,
        a,
        lda,
        b,
        ldb,
        beta,
        ldc,
    };
    #[cfg(target_arch = "x86_64")]
    match super::kernels().isa {
        // SAFETY: the AVX-512 table is only handed out after AVX-512 F/BW/VL/VNNI were detected.
        super::Isa::Avx512 | super::Isa::Amx => return unsafe { gemm_avx512(&args, c) },
        // SAFETY: the AVX2 table is only handed out after AVX2, FMA and F16C were detected.
        super::Isa::Avx2 => return unsafe { gemm_avx2(&args, c) },
        _ => {}
    }
    gemm_body::<false>(&args, c, 0, 0);
}

#[derive(Clone, Copy)]
struct Args<'a> {
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &'a [f32],
    lda: usize,
    b: &'a [f32],
    ldb: usize,
    beta: f32,
    ldc: usize,
}

/// The full 4 × 16 tiles with AVX2 intrinsics; the edges through the generic body.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gemm_avx2(x: &Args, c: &mut [f32]) {
    use core::arch::x86_64::*;
    let (m, n, k) = (x.m, x.n, x.k);
    let (full_m, full_n) = (m / MR * MR, n / NR * NR);
    let (ap, bp, cp) = (x.a.as_ptr(), x.b.as_ptr(), c.as_mut_ptr());
    let (alpha, beta) = (_mm256_set1_ps(x.alpha), _mm256_set1_ps(x.beta));
    for i in (0..full_m).step_by(MR) {
        for j in (0..full_n).step_by(NR) {
            let mut acc = [[_mm256_setzero_ps(); 2]; MR];
            for p in 0..k {
                // SAFETY: p < k, j + 16 ≤ n and i + 4 ≤ m: inside the extents `gemm` asserted.
                let b0 = _mm256_loadu_ps(bp.add(p * x.ldb + j));
                let b1 = _mm256_loadu_ps(bp.add(p * x.ldb + j + 8));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let a = _mm256_broadcast_ss(&*ap.add((i + r) * x.lda + p));
                    acc[0] = _mm256_fmadd_ps(a, b0, acc[0]);
                    acc[1] = _mm256_fmadd_ps(a, b1, acc[1]);
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                for (h, v) in acc.iter().enumerate() {
                    // SAFETY: as above, for C.
                    let o = cp.add((i + r) * x.ldc + j + 8 * h);
                    let v = _mm256_mul_ps(alpha, *v);
                    let v = if x.beta == 0.0 {
                        v
                    } else {
                        _mm256_fmadd_ps(beta, _mm256_loadu_ps(o), v)
                    };
                    _mm256_storeu_ps(o, v);
                }
            }
        }
    }
    gemm_body::<true>(x, c, full_m, full_n)
}

/// The AVX-512 kernel: 8 × 32 tiles (16 accumulators of 16 lanes, each `B` row loaded once per 8 rows
/// of `A`), then the AVX2 kernel for the 4 × 16 tiles left at the edges, then the generic body. Every
/// element is the same FMA chain over `p` as in the AVX2 kernel, so the two agree bitwise.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f")]
unsafe fn gemm_avx512(x: &Args, c: &mut [f32]) {
    use core::arch::x86_64::*;
    const MR: usize = 8;
    const NR: usize = 32;
    let (m, n, k) = (x.m, x.n, x.k);
    let (full_m, full_n) = (m / MR * MR, n / NR * NR);
    let (ap, bp, cp) = (x.a.as_ptr(), x.b.as_ptr(), c.as_mut_ptr());
    let (alpha, beta) = (_mm512_set1_ps(x.alpha), _mm512_set1_ps(x.beta));
    for i in (0..full_m).step_by(MR) {
        for j in (0..full_n).step_by(NR) {
            let mut acc = [[_mm512_setzero_ps(); 2]; MR];
            for p in 0..k {
                // SAFETY: p < k, j + 32 ≤ n and i + 8 ≤ m: inside the extents `gemm` asserted.
                let b0 = _mm512_loadu_ps(bp.add(p * x.ldb + j));
                let b1 = _mm512_loadu_ps(bp.add(p * x.ldb + j + 16));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let a = _mm512_set1_ps(*ap.add((i + r) * x.lda + p));
                    acc[0] = _mm512_fmadd_ps(a, b0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(a, b1, acc[1]);
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                for (h, v) in acc.iter().enumerate() {
                    // SAFETY: as above, for C.
                    let o = cp.add((i + r) * x.ldc + j + 16 * h);
                    let v = _mm512_mul_ps(alpha, *v);
                    let v = if x.beta == 0.0 {
                        v
                    } else {
                        _mm512_fmadd_ps(beta, _mm512_loadu_ps(o), v)
                    };
                    _mm512_storeu_ps(o, v);
                }
            }
        }
    }
    if full_m == m && full_n == n {
        return;
    }
    // The edges: rows past `full_m` (all columns), then columns past `full_n` of the first rows. The
    // AVX2 kernel and the generic body each take a rectangle from the origin, so run them on views.
    if full_m < m {
        let rest_rows = Args {
            m: m - full_m,
            a: &x.a[full_m * x.lda..],
            ..*x
        };
        gemm_avx2(&rest_rows, &mut c[full_m * x.ldc..]);
    }
    if full_n < n && full_m > 0 {
        let rest_cols = Args {
            m: full_m,
            n: n - full_n,
            // Empty when k = 0 (then B is never read).
            b: x.b.get(full_n..).unwrap_or(&[]),
            ..*x
        };
        gemm_avx2(&rest_cols, &mut c[full_n..]);
    }
}

#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Register tile of the vector kernel: rows × columns.
#[cfg(target_arch = "x86_64")]
const MR: usize = 4;
#[cfg(target_arch = "x86_64")]
const NR: usize = 16;

/// Everything outside the first `done_m` rows × `done_n` columns (which a vector kernel has done): row
/// by row, 64 columns at a time as `acc += a[i][p] · b[p][..]` over contiguous slices (vectorizes).
#[inline(always)]
fn gemm_body<const FMA: bool>(x: &Args, c: &mut [f32], done_m: usize, done_n: usize) {
    const W: usize = 64;
    for i in 0..x.m {
        let ai = &x.a[i * x.lda..][..x.k];
        let first = if i < done_m { done_n } else { 0 };
        for j0 in (first..x.n).step_by(W) {
            let w = W.min(x.n - j0);
            let mut acc = [0f32; W];
            let acc = &mut acc[..w];
            for (p, &av) in ai.iter().enumerate() {
                for (s, &b) in acc.iter_mut().zip(&x.b[p * x.ldb + j0..][..w]) {
                    *s = madd::<FMA>(av, b, *s);
                }
            }
            for (o, v) in c[i * x.ldc + j0..][..w].iter_mut().zip(acc.iter()) {
                *o = if x.beta == 0.0 {
                    x.alpha * v
                } else {
                    x.alpha * v + x.beta * *o
                };
            }
        }
    }
}

/// `dst[j][i] = src[i][j]` for a `rows × cols` row-major `src`: 8 × 8 blocks in registers with AVX2
/// (4 × 4 with NEON), the edges element by element.
pub fn transpose(src: &[f32], rows: usize, cols: usize, dst: &mut [f32]) {
    assert!(src.len() >= rows * cols && dst.len() >= rows * cols);
    #[cfg(target_arch = "x86_64")]
    if matches!(
        super::kernels().isa,
        super::Isa::Avx2 | super::Isa::Avx512 | super::Isa::Amx
    ) {
        // SAFETY: both tables are only handed out after AVX2 was detected; the lengths are checked.
        return unsafe { transpose_avx2(src, rows, cols, dst) };
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: NEON is part of every aarch64 CPU; the lengths are checked.
    return unsafe { transpose_neon(src, rows, cols, dst) };
    #[allow(unreachable_code)]
    transpose_ref(src, rows, cols, dst, 0, 0)
}

/// The elements of [`transpose`] outside the first `done_r` rows × `done_c` columns.
fn transpose_ref(
    src: &[f32],
    rows: usize,
    cols: usize,
    dst: &mut [f32],
    done_r: usize,
    done_c: usize,
) {
    for i in 0..rows {
        let first = if i < done_r { done_c } else { 0 };
        for j in first..cols {
            dst[j * rows + i] = src[i * cols + j];
        }
    }
}

/// # Safety
/// The CPU must have AVX2; `src` and `dst` must hold `rows × cols` elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose_avx2(src: &[f32], rows: usize, cols: usize, dst: &mut [f32]) {
    use core::arch::x86_64::*;
    let (full_r, full_c) = (rows / 8 * 8, cols / 8 * 8);
    let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr());
    for i in (0..full_r).step_by(8) {
        for j in (0..full_c).step_by(8) {
            // SAFETY (loads and stores): i + 8 ≤ rows and j + 8 ≤ cols.
            let r: [__m256; 8] =
                core::array::from_fn(|k| _mm256_loadu_ps(sp.add((i + k) * cols + j)));
            // Pairs of rows interleaved, then pairs of pairs, then the 128-bit halves swapped.
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            let out = [
                _mm256_permute2f128_ps::<0x20>(u0, u4),
                _mm256_permute2f128_ps::<0x20>(u1, u5),
                _mm256_permute2f128_ps::<0x20>(u2, u6),
                _mm256_permute2f128_ps::<0x20>(u3, u7),
                _mm256_permute2f128_ps::<0x31>(u0, u4),
                _mm256_permute2f128_ps::<0x31>(u1, u5),
                _mm256_permute2f128_ps::<0x31>(u2, u6),
                _mm256_permute2f128_ps::<0x31>(u3, u7),
            ];
            for (k, v) in out.iter().enumerate() {
                _mm256_storeu_ps(dp.add((j + k) * rows + i), *v);
            }
        }
    }
    transpose_ref(src, rows, cols, dst, full_r, full_c)
}

/// # Safety
/// `src` and `dst` must hold `rows × cols` elements.
#[cfg(target_arch = "aarch64")]
unsafe fn transpose_neon(src: &[f32], rows: usize, cols: usize, dst: &mut [f32]) {
    use core::arch::aarch64::*;
    let (full_r, full_c) = (rows / 4 * 4, cols / 4 * 4);
    let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr());
    for i in (0..full_r).step_by(4) {
        for j in (0..full_c).step_by(4) {
            // SAFETY (loads and stores): i + 4 ≤ rows and j + 4 ≤ cols.
            let r: [float32x4_t; 4] =
                core::array::from_fn(|k| vld1q_f32(sp.add((i + k) * cols + j)));
            // Pairs of rows interleaved, then the 64-bit halves of pairs of pairs.
            let (t0, t1) = (vtrn1q_f32(r[0], r[1]), vtrn2q_f32(r[0], r[1]));
            let (t2, t3) = (vtrn1q_f32(r[2], r[3]), vtrn2q_f32(r[2], r[3]));
            let lo = |a: float32x4_t, b: float32x4_t| {
                vreinterpretq_f32_f64(vtrn1q_f64(
                    vreinterpretq_f64_f32(a),
                    vreinterpretq_f64_f32(b),
                ))
            };
            let hi = |a: float32x4_t, b: float32x4_t| {
                vreinterpretq_f32_f64(vtrn2q_f64(
                    vreinterpretq_f64_f32(a),
                    vreinterpretq_f64_f32(b),
                ))
            };
            let out = [lo(t0, t2), lo(t1, t3), hi(t0, t2), hi(t1, t3)];
            for (k, v) in out.iter().enumerate() {
                vst1q_f32(dp.add((j + k) * rows + i), *v);
            }
        }
    }
    transpose_ref(src, rows, cols, dst, full_r, full_c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::too_many_arguments)]
    fn naive(
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
        a: &[f32],
        b: &[f32],
        beta: f32,
        c: &mut [f32],
    ) {
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k)
                    .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                    .sum();
                c[i * n + j] = (alpha as f64 * s + beta as f64 * c[i * n + j] as f64) as f32;
            }
        }
    }

    /// `C` from every kernel this CPU can run: the generic body, then AVX2 and AVX-512 where detected.
    fn every_path(x: &Args, c0: &[f32]) -> Vec<(&'static str, Vec<f32>)> {
        let mut out = Vec::new();
        let mut c = c0.to_vec();
        gemm_body::<false>(x, &mut c, 0, 0);
        out.push(("generic", c));
        #[cfg(target_arch = "x86_64")]
        {
            let f = |feature: bool, name, kernel: unsafe fn(&Args, &mut [f32])| {
                feature.then(|| {
                    let mut c = c0.to_vec();
                    // SAFETY: the kernel's features were just detected.
                    unsafe { kernel(x, &mut c) };
                    (name, c)
                })
            };
            let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
            out.extend(f(avx2, "avx2", gemm_avx2));
            out.extend(f(
                avx2 && is_x86_feature_detected!("avx512f"),
                "avx512",
                gemm_avx512,
            ));
        }
        out
    }

    /// Every shape's transpose, blocks and edges, element for element.
    #[test]
    fn transpose_moves_every_element() {
        for (rows, cols) in [
            (1, 1),
            (8, 8),
            (16, 24),
            (64, 128),
            (128, 64),
            (9, 17),
            (13, 5),
            (4, 12),
        ] {
            let src: Vec<f32> = (0..rows * cols).map(|v| v as f32).collect();
            let mut want = vec![f32::NAN; rows * cols];
            transpose_ref(&src, rows, cols, &mut want, 0, 0);
            let mut got = vec![f32::NAN; rows * cols];
            transpose(&src, rows, cols, &mut got);
            for i in 0..rows {
                for j in 0..cols {
                    assert_eq!(want[j * rows + i], src[i * cols + j]);
                }
            }
            assert_eq!(got, want, "{rows}x{cols}");
        }
    }

    #[test]
    fn gemm_matches_naive_on_every_shape_edge() {
        let mut seed = 7u32;
        let mut rnd = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        for (m, n, k) in [
            (1, 1, 1),
            (4, 16, 8),
            (5, 17, 3),
            (64, 128, 128),
            (37, 37, 128),
            (3, 40, 0),
            (8, 32, 5),
            (17, 70, 33),
            (64, 64, 128),
            (16, 128, 48),
            (9, 31, 0),
        ] {
            let a: Vec<f32> = (0..m * k).map(|_| rnd()).collect();
            let b: Vec<f32> = (0..k * n).map(|_| rnd()).collect();
            let c0: Vec<f32> = (0..m * n).map(|_| rnd()).collect();
            for (alpha, beta) in [(1.0, 0.0), (-1.0, 1.0), (0.5, 0.25)] {
                let mut want = c0.clone();
                naive(m, n, k, alpha, &a, &b, beta, &mut want);
                let x = Args {
                    m,
                    n,
                    k,
                    alpha,
                    a: &a,
                    lda: k,
                    b: &b,
                    ldb: n,
                    beta,
                    ldc: n,
                };
                for (path, got) in every_path(&x, &c0) {
                    for (g, w) in got.iter().zip(&want) {
                        assert!(
                            (g - w).abs() <= 1e-5 * (k as f32).max(1.0),
                            "{path} {m}x{n}x{k}: {g} vs {w}"
                        );
                    }
                }
                let mut got = c0.clone();
                gemm(m, n, k, alpha, &a, k, &b, n, beta, &mut got, n);
                assert!(got
                    .iter()
                    .zip(&want)
                    .all(|(g, w)| (g - w).abs() <= 1e-5 * (k as f32).max(1.0)));
            }
        }
    }
}
