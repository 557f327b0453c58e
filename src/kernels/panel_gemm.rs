//! Dense f32 products of many activation rows (an image's patches) with a matrix packed into column
//! panels: `C (+)= A·B`, `A` `[m × k]` row-major, `B` `[k × n]` packed once as panels of [`NR`] columns
//! (`panel[p][j]`, zero past `n`), so a register tile of `A` rows × one panel reuses every loaded `B`
//! vector for all its rows and every broadcast `A` element for all its columns.
//!
//! [`matmul_weight`] multiplies by a weight matrix in any GGUF type: each work item (a block of output
//! columns) widens its weight rows to f32 once and packs them, then sweeps all activation rows. The vision
//! tower uses it for its float (and Q8_0, ...) matrices and its attention; the text model keeps
//! `kernels::matmul`, whose prefill and decode results are bit-identical.
//!
//! Every element is one f32 FMA chain over `p` within each [`KC`] block, the blocks summed in order; the
//! AVX-512, AVX2 and generic kernels differ only in how many rows and columns a tile holds, so they agree
//! bitwise wherever the generic kernel uses FMA (aarch64); the scalar table's plain multiply-adds differ by
//! rounding. [`gemm_ref`] is the scalar reference the tests hold them to.

use std::cell::Cell;

use anyhow::{bail, Result};
use rayon::prelude::*;

use super::{bf16_gemm, kernels, Isa, Kernels, Weight};
use crate::quant::{self, GgmlType};

/// Columns per packed panel.
pub const NR: usize = 32;

/// Depth of one pass over `A`: a tile's `A` rows (12 × 256 floats) stay in L1 and the panels' rows in L2.
const KC: usize = 256;

/// Output columns per [`matmul_weight`] work item (two panels).
const NC: usize = 64;

/// Floats that `n` columns of depth `k` take packed.
pub fn packed_len(n: usize, k: usize) -> usize {
    n.div_ceil(NR) * NR * k
}

/// Packs `B[p][j] = src[j·ld + p]` (`B`'s columns are `src`'s rows: a weight matrix, or keys) for
/// `j < n`, `p < k` into `dst` (`packed_len(n, k)` floats).
pub fn pack_transposed(n: usize, k: usize, src: &[f32], ld: usize, dst: &mut [f32]) {
    assert!(n == 0 || (ld >= k && src.len() >= (n - 1) * ld + k));
    let dst = &mut dst[..packed_len(n, k)];
    for (q, panel) in dst.chunks_exact_mut(NR * k.max(1)).enumerate() {
        if k == 0 {
            break;
        }
        let cols = NR.min(n - q * NR);
        if cols < NR {
            panel.fill(0.0);
        }
        for jj in 0..cols {
            let col = &src[(q * NR + jj) * ld..][..k];
            for (p, &v) in col.iter().enumerate() {
                panel[p * NR + jj] = v;
            }
        }
    }
}

/// Packs `B[p][j] = src[p·ld + j]` (`B` row-major: values) for `j < n`, `p < k` into `dst`.
pub fn pack_rows(n: usize, k: usize, src: &[f32], ld: usize, dst: &mut [f32]) {
    assert!(k == 0 || (ld >= n && src.len() >= (k - 1) * ld + n));
    let dst = &mut dst[..packed_len(n, k)];
    for (q, panel) in dst.chunks_exact_mut(NR * k.max(1)).enumerate() {
        if k == 0 {
            break;
        }
        let cols = NR.min(n - q * NR);
        for (p, row) in panel.chunks_exact_mut(NR).enumerate() {
            row[..cols].copy_from_slice(&src[p * ld + q * NR..][..cols]);
            row[cols..].fill(0.0);
        }
    }
}

/// `c[i·ldc + j] (+)= Σ_p a[i·lda + p] · B[p][j]` for `i < m`, `j < n`, `p < k`, `B` packed by
/// [`pack_transposed`] / [`pack_rows`] with the same `n` and `k`; `accumulate = false` overwrites `c`.
#[allow(clippy::too_many_arguments)]
pub fn gemm_packed(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    gemm_packed_with(kernels(), m, n, k, a, lda, b, c, ldc, accumulate)
}

/// [`gemm_packed`] with the kernels of table `t` (tests run every table this CPU has).
#[allow(clippy::too_many_arguments)]
pub fn gemm_packed_with(
    t: &'static Kernels,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    assert!(
        m == 0 || n == 0 || (ldc >= n && c.len() >= (m - 1) * ldc + n),
        "gemm_packed: C too short"
    );
    // SAFETY: C's extent was just checked, and `c` is borrowed mutably for the call.
    unsafe { gemm_packed_raw(t, m, n, k, a, lda, b, c.as_mut_ptr(), ldc, accumulate) }
}

/// [`gemm_packed_with`] writing through a pointer (work items that own column blocks of one matrix).
///
/// # Safety
/// For `i < m`, `j < n`, `c + i·ldc + j` must be valid for reads and writes, and nothing else may access
/// those elements during the call (`ldc ≥ n`).
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_packed_raw(
    t: &'static Kernels,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        lda >= k && a.len() >= (m - 1) * lda + k,
        "gemm_packed: A too short"
    );
    assert!(b.len() >= packed_len(n, k), "gemm_packed: B too short");
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                // SAFETY: row i's n elements are inside the caller's extent.
                unsafe { std::slice::from_raw_parts_mut(c.add(i * ldc), n) }.fill(0.0);
            }
        }
        return;
    }
    let (mr, tile) = tile_kernel(t.isa);
    for k0 in (0..k).step_by(KC) {
        let kc = KC.min(k - k0);
        for i0 in (0..m).step_by(mr) {
            for q in 0..n.div_ceil(NR) {
                tile(&Tile {
                    rows: mr.min(m - i0),
                    cols: NR.min(n - q * NR),
                    kc,
                    a: &a[i0 * lda + k0..],
                    lda,
                    b: &b[(q * k + k0) * NR..][..kc * NR],
                    // SAFETY: the tile's first element, inside the caller's extent.
                    c: unsafe { c.add(i0 * ldc + q * NR) },
                    ldc,
                    load_c: accumulate || k0 > 0,
                });
            }
        }
    }
}

/// The register-tile kernel of an instruction set and its rows per tile.
fn tile_kernel(isa: Isa) -> (usize, fn(&Tile)) {
    match isa {
        // SAFETY: the AVX-512 table is only handed out after AVX-512F (and AVX2, FMA) were detected.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Amx => (12, |x| unsafe { x86::tile_avx512(x) }),
        // SAFETY: the AVX2 table is only handed out after AVX2 and FMA were detected.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => (6, |x| unsafe { x86::tile_avx2(x) }),
        Isa::Scalar => (generic::MR, generic::tile::<false>),
        _ => (generic::MR, generic::tile::<true>),
    }
}

/// One register tile: `rows × cols` of `C` (`rows` ≤ the kernel's, `cols ≤ NR`) over `kc` steps.
struct Tile<'a> {
    rows: usize,
    cols: usize,
    kc: usize,
    /// `A` from the tile's first row and step: row `r`, step `p` at `a[r·lda + p]`.
    a: &'a [f32],
    lda: usize,
    /// The panel from the tile's first step: `kc × NR`.
    b: &'a [f32],
    /// `C` at the tile's first element: `rows × cols` at stride `ldc` are the tile's alone (the callers
    /// of `gemm_packed_raw` guarantee it).
    c: *mut f32,
    ldc: usize,
    /// Add to `C` (else overwrite it).
    load_c: bool,
}

/// Calls `$f::<R>($x)` for the tile's row count `R` (1 ..= the listed maximum).
macro_rules! by_rows {
    ($f:ident, $x:expr, [$($r:literal),*]) => {
        match $x.rows {
            $($r => $f::<$r>($x),)*
            r => unreachable!("tile of {r} rows"),
        }
    };
}

/// Plain Rust over 4 rows × 16 columns (half a panel at a time): NEON (with FMA) and the scalar table.
mod generic {
    use super::{Tile, NR};

    pub const MR: usize = 4;
    const W: usize = 16;

    pub fn tile<const FMA: bool>(x: &Tile) {
        fn run<const R: usize, const FMA: bool>(x: &Tile) {
            for h in 0..x.cols.div_ceil(W) {
                let arow: [&[f32]; R] = std::array::from_fn(|r| &x.a[r * x.lda..][..x.kc]);
                let mut acc = [[0f32; W]; R];
                for (p, b) in x.b.chunks_exact(NR).enumerate() {
                    let b: &[f32; W] = b[h * W..][..W].try_into().unwrap();
                    for (acc, a) in acc.iter_mut().zip(&arow) {
                        let a = a[p];
                        for (s, &b) in acc.iter_mut().zip(b) {
                            *s = if FMA { a.mul_add(b, *s) } else { a * b + *s };
                        }
                    }
                }
                let cols = W.min(x.cols - h * W);
                for (r, acc) in acc.iter().enumerate() {
                    // SAFETY: r < rows and h·W + cols ≤ cols of the tile: inside the extent
                    // `gemm_packed_with` checked, which holds the `&mut` to C.
                    let c =
                        unsafe { std::slice::from_raw_parts_mut(x.c.add(r * x.ldc + h * W), cols) };
                    for (c, &v) in c.iter_mut().zip(acc) {
                        *c = if x.load_c { *c + v } else { v };
                    }
                }
            }
        }
        fn run_fma<const R: usize>(x: &Tile) {
            run::<R, true>(x)
        }
        fn run_plain<const R: usize>(x: &Tile) {
            run::<R, false>(x)
        }
        if FMA {
            by_rows!(run_fma, x, [1, 2, 3, 4])
        } else {
            by_rows!(run_plain, x, [1, 2, 3, 4])
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use core::arch::x86_64::*;

    use super::{Tile, NR};

    /// Up to 12 rows × 32 columns: 24 accumulators, each step two panel loads and one broadcast per row.
    #[target_feature(enable = "avx2,fma,avx512f")]
    pub(super) unsafe fn tile_avx512(x: &Tile) {
        #[target_feature(enable = "avx2,fma,avx512f")]
        unsafe fn run<const R: usize>(x: &Tile) {
            debug_assert!(x.a.len() >= (R - 1) * x.lda + x.kc && x.b.len() >= x.kc * NR);
            let arow: [*const f32; R] = core::array::from_fn(|r| x.a.as_ptr().add(r * x.lda));
            let b = x.b.as_ptr();
            let mut acc = [[_mm512_setzero_ps(); 2]; R];
            for p in 0..x.kc {
                // SAFETY: p < kc, R ≤ rows rows of A and the kc × NR panel: inside the slices
                // (`gemm_packed_raw` sized them).
                let b0 = _mm512_loadu_ps(b.add(p * NR));
                let b1 = _mm512_loadu_ps(b.add(p * NR + 16));
                // Spelled out per row (constant indices), so the accumulators stay in registers
                // whatever the optimizer's unrolling.
                macro_rules! row {
                    ($r:literal) => {
                        if $r < R {
                            let av = _mm512_set1_ps(*arow[$r].add(p));
                            acc[$r][0] = _mm512_fmadd_ps(av, b0, acc[$r][0]);
                            acc[$r][1] = _mm512_fmadd_ps(av, b1, acc[$r][1]);
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
            store_tile(&acc, x.cols, x.c, x.ldc, x.load_c);
        }
        by_rows!(run, x, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    }

    /// Writes a register tile's `R × 16·H` accumulators to `C` at `c` (row stride `ldc`), columns ≥ `cols`
    /// masked off, adding to what is there with `load_c`.
    ///
    /// # Safety
    /// AVX-512F; rows `< R` and columns `< cols` at `c` are valid for reads and writes.
    #[inline(always)]
    pub(crate) unsafe fn store_tile<const R: usize, const H: usize>(
        acc: &[[__m512; H]; R],
        cols: usize,
        c: *mut f32,
        ldc: usize,
        load_c: bool,
    ) {
        for (r, acc) in acc.iter().enumerate() {
            for (h, &v) in acc.iter().enumerate() {
                let m = ((1u32 << cols.saturating_sub(16 * h).min(16)) - 1) as __mmask16;
                // SAFETY: the mask covers columns < cols of row r < R (the caller's extent).
                let o = c.add(r * ldc + 16 * h);
                let v = if load_c {
                    _mm512_add_ps(_mm512_maskz_loadu_ps(m, o), v)
                } else {
                    v
                };
                _mm512_mask_storeu_ps(o, m, v);
            }
        }
    }

    /// Up to 6 rows × 16 columns (each half panel in turn): 12 accumulators.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile_avx2(x: &Tile) {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn run<const R: usize>(x: &Tile) {
            debug_assert!(x.a.len() >= (R - 1) * x.lda + x.kc && x.b.len() >= x.kc * NR);
            for h in 0..x.cols.div_ceil(16) {
                // Pointers stepped by adds, as in the AVX-512 kernel.
                let mut arow: [*const f32; R] =
                    core::array::from_fn(|r| x.a.as_ptr().add(r * x.lda));
                let mut b = x.b.as_ptr().add(16 * h);
                let mut acc = [[_mm256_setzero_ps(); 2]; R];
                for _ in 0..x.kc {
                    // SAFETY: kc steps of R ≤ rows rows of A and of the panel's half h: inside the
                    // slices.
                    let b0 = _mm256_loadu_ps(b);
                    let b1 = _mm256_loadu_ps(b.add(8));
                    b = b.add(NR);
                    for (acc, a) in acc.iter_mut().zip(arow.iter_mut()) {
                        let av = _mm256_broadcast_ss(&**a);
                        *a = a.add(1);
                        acc[0] = _mm256_fmadd_ps(av, b0, acc[0]);
                        acc[1] = _mm256_fmadd_ps(av, b1, acc[1]);
                    }
                }
                let mask = |e: usize| -> __m256i {
                    let n = x.cols.saturating_sub(e).min(8) as i32;
                    _mm256_cmpgt_epi32(
                        _mm256_set1_epi32(n),
                        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                    )
                };
                let masks = [mask(16 * h), mask(16 * h + 8)];
                for (r, acc) in acc.iter().enumerate() {
                    for (e, &v) in acc.iter().enumerate() {
                        // SAFETY: the mask covers columns < cols of row r < rows, inside C's extent.
                        let o = x.c.add(r * x.ldc + 16 * h + 8 * e);
                        let v = if x.load_c {
                            _mm256_add_ps(_mm256_maskload_ps(o, masks[e]), v)
                        } else {
                            v
                        };
                        _mm256_maskstore_ps(o, masks[e], v);
                    }
                }
            }
        }
        by_rows!(run, x, [1, 2, 3, 4, 5, 6])
    }
}

/// The scalar reference of [`gemm_packed`]: `c[i][j] (+)= Σ_p a[i][p] · B[p][j]` with `B` unpacked
/// (`b[p·ldb + j]`), one f32 multiply-add chain per element in the kernels' order (steps in [`KC`]
/// blocks, each block's sum added to `C`).
#[allow(clippy::too_many_arguments)]
pub fn gemm_ref(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    for i in 0..m {
        for j in 0..n {
            let mut out = if accumulate { c[i * ldc + j] } else { 0.0 };
            for k0 in (0..k).step_by(KC) {
                let s = (k0..k.min(k0 + KC)).fold(0f32, |s, p| a[i * lda + p] * b[p * ldb + j] + s);
                out = if k0 == 0 && !accumulate { s } else { out + s };
            }
            c[i * ldc + j] = out;
        }
    }
}

/// Whether [`matmul_weight`] takes weights of type `ty` (floats and the types with an f32 dequantizer).
pub fn supports(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
        || GgmlType::WEIGHT_QUANTS.contains(&ty)
}

thread_local! {
    /// A worker's widened weight rows and their packed panels (f32, or bf16 pairs), kept from one call
    /// to the next.
    static WEIGHT_BUFS: Cell<(Vec<f32>, Vec<f32>, Vec<u32>)> =
        const { Cell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// `out [n_rows × n_out] = x [n_rows × n_in] · Wᵀ` for a weight of any type [`supports`] takes, in f32
/// (quantized weights dequantized exactly, activations not quantized), over the rayon pool: work items of
/// [`NC`] output columns, each widening and packing its weight rows once for all `n_rows`.
pub fn matmul_weight(w: &Weight, x: &[f32], n_rows: usize, out: &mut [f32]) -> Result<()> {
    let k = w.n_in;
    by_column_blocks(w, x.len(), n_rows * k, n_rows, out, |rows, nc, bufs, c| {
        let packed = &mut bufs.1;
        packed.resize(packed_len(nc, k), 0.0);
        pack_transposed(nc, k, rows, k, packed);
        // SAFETY: `c` is this item's columns of `out` (see `by_column_blocks`).
        unsafe { gemm_packed_raw(kernels(), n_rows, nc, k, x, k, packed, c, w.n_out, false) };
    })
}

/// [`matmul_weight`] in bf16 arithmetic ([`bf16_gemm`]): `x` is the activations already rounded to bf16
/// pairs (`[n_rows × pairs(n_in)]`, [`bf16_gemm::to_pairs`]); each work item rounds its weight rows to
/// bf16 (exactly, for weights that are bf16 values) and packs them.
pub fn matmul_weight_bf16(w: &Weight, x: &[u32], n_rows: usize, out: &mut [f32]) -> Result<()> {
    let (k, k2) = (w.n_in, bf16_gemm::pairs(w.n_in));
    by_column_blocks(w, x.len(), n_rows * k2, n_rows, out, |rows, nc, bufs, c| {
        let packed = &mut bufs.2;
        packed.resize(bf16_gemm::packed_len(nc, k), 0);
        bf16_gemm::pack_transposed(nc, k, rows, k, packed);
        // SAFETY: `c` is this item's columns of `out` (see `by_column_blocks`).
        unsafe { bf16_gemm::gemm_raw(n_rows, nc, k2, x, k2, packed, c, w.n_out, false) };
    })
}

/// The frame of [`matmul_weight`] and [`matmul_weight_bf16`]: checks the shapes (`x_len` against
/// `want_x`), then over the rayon pool, per block of [`NC`] output columns, widens the weight's rows to
/// f32 and hands them (`[nc × n_in]`), the worker's buffers and `out` at the block's first column to
/// `product`, which writes the block's columns of every row (row stride `n_out`).
fn by_column_blocks(
    w: &Weight,
    x_len: usize,
    want_x: usize,
    n_rows: usize,
    out: &mut [f32],
    product: impl Fn(&[f32], usize, &mut (Vec<f32>, Vec<f32>, Vec<u32>), *mut f32) + Sync,
) -> Result<()> {
    let (k, n_out) = (w.n_in, w.n_out);
    if !supports(w.ty) {
        bail!("{}: type {} has no f32 widening", w.name, w.ty);
    }
    anyhow::ensure!(
        x_len == want_x
            && out.len() == n_rows * n_out
            && w.ty.row_bytes(k as u64).map(|b| b as usize * n_out) == Some(w.data.len()),
        "{}: matmul_weight shapes",
        w.name
    );
    if n_rows == 0 || n_out == 0 {
        return Ok(());
    }
    let out_ptr = OutPtr(out.as_mut_ptr());
    (0..n_out.div_ceil(NC))
        .into_par_iter()
        .try_for_each(|item| -> Result<()> {
            let (j0, nc) = (item * NC, NC.min(n_out - item * NC));
            let mut bufs = WEIGHT_BUFS.take();
            let mut rows = std::mem::take(&mut bufs.0);
            rows.resize(nc * k, 0.0);
            let widened = rows
                .chunks_exact_mut(k)
                .enumerate()
                .try_for_each(|(j, dst)| widen_row(w.ty, w.row(j0 + j), dst));
            if widened.is_ok() {
                // `out` is `[n_rows × n_out]` (checked above) and borrowed mutably for the whole call;
                // this item alone accesses columns `j0..j0 + nc` of its rows.
                // SAFETY: j0 < n_out: inside `out`.
                product(&rows, nc, &mut bufs, unsafe { out_ptr.get().add(j0) });
            }
            bufs.0 = rows;
            WEIGHT_BUFS.set(bufs);
            widened
        })
}

/// One weight row as f32: floats widened exactly, quantized types through their reference dequantizer.
fn widen_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    use half::slice::HalfFloatSliceExt;
    match ty {
        GgmlType::F16 => match bytemuck::try_cast_slice::<u8, half::f16>(src) {
            Ok(h) => h.convert_to_f32_slice(dst),
            Err(_) => quant::dequantize_row(ty, src, dst)?,
        },
        GgmlType::BF16 => match bytemuck::try_cast_slice::<u8, half::bf16>(src) {
            Ok(h) => h.convert_to_f32_slice(dst),
            Err(_) => quant::dequantize_row(ty, src, dst)?,
        },
        GgmlType::F32 => match bytemuck::try_cast_slice::<u8, f32>(src) {
            Ok(f) => dst.copy_from_slice(f),
            Err(_) => quant::dequantize_row(ty, src, dst)?,
        },
        _ => quant::dequantize_row(ty, src, dst)?,
    }
    Ok(())
}

/// The output matrix, written by column blocks from several threads.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every work item writes a disjoint set of columns (see `matmul_weight`); nothing reads through it
// concurrently with another item's writes to the same element.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::available;

    struct Rng(u32);
    impl Rng {
        fn f(&mut self) -> f32 {
            self.0 = self.0.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (self.0 >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        }
    }

    /// Every table's kernels against the reference on shapes with partial tiles, panels and K blocks,
    /// from both packings, overwriting and accumulating, with `C` strides wider than `n`.
    #[test]
    fn every_table_matches_the_reference() {
        let mut rng = Rng(3);
        for (m, n, k) in [
            (1, 1, 1),
            (12, 32, 256),
            (13, 33, 257),
            (7, 70, 64),
            (25, 5, 600),
            (48, 96, 72),
            (3, 31, 0),
            (37, 64, 513),
        ] {
            let (lda, ldc) = (k + 3, n + 5);
            let a: Vec<f32> = (0..m * lda).map(|_| rng.f()).collect();
            let b: Vec<f32> = (0..k * n).map(|_| rng.f()).collect(); // [k × n]
            let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect(); // [n × k]
            let c0: Vec<f32> = (0..m * ldc).map(|_| rng.f()).collect();
            let mut from_rows = vec![f32::NAN; packed_len(n, k)];
            pack_rows(n, k, &b, n, &mut from_rows);
            let mut from_cols = vec![f32::NAN; packed_len(n, k)];
            pack_transposed(n, k, &bt, k, &mut from_cols);
            assert_eq!(from_rows, from_cols, "{m}x{n}x{k}: packings");
            for accumulate in [false, true] {
                let mut want = c0.clone();
                gemm_ref(m, n, k, &a, lda, &b, n, &mut want, ldc, accumulate);
                for t in available() {
                    let mut got = c0.clone();
                    gemm_packed_with(t, m, n, k, &a, lda, &from_rows, &mut got, ldc, accumulate);
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        let tol = if i % ldc < n {
                            1e-6 * (k as f32).max(1.0)
                        } else {
                            0.0
                        };
                        assert!(
                            (g - w).abs() <= tol,
                            "{} {m}x{n}x{k} acc={accumulate} at {i}: {g} vs {w}",
                            t.isa.name()
                        );
                    }
                }
            }
        }
    }

    /// `matmul_weight` on F32, F16, BF16 and Q8_0 weights equals `x · dequantize(W)ᵀ` up to f32 rounding,
    /// with an output width that is not a multiple of the work item.
    #[test]
    fn matmul_weight_matches_dequantized_product() {
        let mut rng = Rng(11);
        let (n_rows, k, n_out) = (29, 96, 70);
        let wf: Vec<f32> = (0..n_out * k).map(|_| rng.f()).collect();
        let x: Vec<f32> = (0..n_rows * k).map(|_| rng.f()).collect();
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0] {
            let rb = ty.row_bytes(k as u64).unwrap() as usize;
            let mut data = vec![0u8; rb * n_out];
            for (r, d) in data.chunks_exact_mut(rb).enumerate() {
                quant::quantize_row(ty, &wf[r * k..(r + 1) * k], d).unwrap();
            }
            let w = Weight {
                name: "w",
                ty,
                n_in: k,
                n_out,
                data: &data,
            };
            let mut got = vec![0f32; n_rows * n_out];
            matmul_weight(&w, &x, n_rows, &mut got).unwrap();
            let mut deq = vec![0f32; k];
            for j in 0..n_out {
                quant::dequantize_row(ty, w.row(j), &mut deq).unwrap();
                for i in 0..n_rows {
                    let want: f64 = (0..k).map(|p| deq[p] as f64 * x[i * k + p] as f64).sum();
                    let g = got[i * n_out + j] as f64;
                    assert!(
                        (g - want).abs() <= 1e-5,
                        "{ty} row {i} col {j}: {g} vs {want}"
                    );
                }
            }
        }
        let bad = Weight {
            name: "w",
            ty: GgmlType::F32,
            n_in: k,
            n_out,
            data: &[0u8; 8],
        };
        let mut out = vec![0f32; n_rows * n_out];
        assert!(matmul_weight(&bad, &x, n_rows, &mut out).is_err());
    }
}
