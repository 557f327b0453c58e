//! Shared NEON machinery: the two integer dot-product flavours, the per-block kernel trait and the row
//! drivers that run a block kernel over several weight rows at once, reusing each activation block.
//!
//! Everything here is `#[inline(always)]` and generic over [`Dot`], so the whole call tree of a kernel
//! is inlined into its entry point in `mod.rs`; the `sdot` flavour is only ever instantiated inside a
//! `#[target_feature(enable = "dotprod")]` entry point.

use core::arch::aarch64::*;
use core::arch::asm;

/// Weight rows processed together: each activation block is loaded once for all of them.
pub(super) const ROWS: usize = 4;

/// `acc[i] += a[4i]·b[4i] + … + a[4i+3]·b[4i+3]`, or any other grouping of the 16 signed byte products
/// into the four lanes: callers only ever use the sum of the lanes (or scale whole vectors).
pub(super) trait Dot {
    /// # Safety
    /// The CPU must have the instructions of the implementation (`Sdot`: FEAT_DotProd).
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t;
}

/// Plain NEON (any ARMv8-A core, e.g. Cortex-A53/A72): widening multiplies and pairwise accumulation.
/// Exact for all inputs: |a·b| ≤ 2^14 fits in i16, pairs are added in i32.
pub(super) struct Smull;

impl Dot for Smull {
    #[inline(always)]
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
        let hi = vmull_high_s8(a, b);
        vpadalq_s16(vpadalq_s16(acc, lo), hi)
    }
}

/// FEAT_DotProd `sdot` (Cortex-A55/A76 and later): four products summed into each i32 lane.
/// The intrinsic is unstable, so the instruction is emitted with `asm!`.
pub(super) struct Sdot;

impl Dot for Sdot {
    #[inline(always)]
    unsafe fn dot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
        acc
    }
}

/// A row's running sum: per-block vector terms (summed across lanes at the end) plus scalar terms.
#[derive(Clone, Copy)]
pub(super) struct Acc {
    pub v: float32x4_t,
    pub s: f32,
}

impl Acc {
    #[inline(always)]
    pub unsafe fn zero() -> Acc {
        Acc {
            v: vdupq_n_f32(0.0),
            s: 0.0,
        }
    }

    #[inline(always)]
    pub unsafe fn finish(self) -> f32 {
        vaddvq_f32(self.v) + self.s
    }
}

/// One weight format's block kernel against its activation format.
pub(super) trait Block {
    /// Bytes of a weight block.
    const W: usize;
    /// Bytes of the matching activation block.
    const A: usize;
    /// Adds weight block `x` · activation block `y` to `acc`.
    ///
    /// # Safety
    /// `x` must be readable for `W` bytes and `y` for `A` bytes (no alignment needed); `D` must be
    /// supported by the CPU.
    unsafe fn dot<D: Dot>(acc: &mut Acc, x: *const u8, y: *const u8);

    /// The row's dot product from its accumulator. Formats whose reference scales the row's sum once at
    /// the end (the IQ2 and IQ3_XXS lattice formats) override this to do the same.
    ///
    /// # Safety
    /// NEON only (every aarch64 CPU).
    #[inline(always)]
    unsafe fn finish(acc: Acc) -> f32 {
        acc.finish()
    }
}

/// Little-endian u16 at `p` (unaligned).
#[inline(always)]
pub(super) unsafe fn ld_u16(p: *const u8) -> u16 {
    u16::from_le(core::ptr::read_unaligned(p as *const u16))
}

/// Little-endian u32 at `p` (unaligned).
#[inline(always)]
pub(super) unsafe fn ld_u32(p: *const u8) -> u32 {
    u32::from_le(core::ptr::read_unaligned(p as *const u32))
}

/// Little-endian f32 at `p` (unaligned).
#[inline(always)]
pub(super) unsafe fn ld_f32(p: *const u8) -> f32 {
    f32::from_bits(ld_u32(p))
}

/// 16 signed bytes at `p` (unaligned).
#[inline(always)]
pub(super) unsafe fn ld_s8(p: *const u8) -> int8x16_t {
    vld1q_s8(p as *const i8)
}

/// f16 bits → f32 with the base ARMv8 `fcvt` (exact for every value, like `half`).
#[inline(always)]
pub(super) unsafe fn h2f(h: u16) -> f32 {
    let out: f32;
    asm!(
        "fcvt {o:s}, {i:h}",
        i = in(vreg) h as i16,
        o = lateout(vreg) out,
        options(pure, nomem, nostack, preserves_flags)
    );
    out
}

/// `out[r·n_tok + t] = Σ_b K(w[r][b], a[t][b])` for every weight row `r` and activation row `t`.
/// Rows go in groups of [`ROWS`], so each activation block is read once per group.
///
/// # Safety
/// `D` must be supported by the CPU. (Lengths are checked here.)
#[inline(always)]
pub(super) unsafe fn quant_rows<K: Block, D: Dot>(
    w: &[u8],
    a: &[u8],
    n_tok: usize,
    out: &mut [f32],
) {
    if out.is_empty() {
        return;
    }
    assert!(n_tok > 0 && out.len().is_multiple_of(n_tok), "output shape");
    let n_rows = out.len() / n_tok;
    let ab = a.len() / n_tok;
    let nb = ab / K::A;
    let rb = nb * K::W;
    assert_eq!(
        a.len(),
        n_tok * nb * K::A,
        "activation rows are not whole blocks"
    );
    assert_eq!(
        w.len(),
        n_rows * rb,
        "weight rows do not match the activations"
    );
    let (wp, ap) = (w.as_ptr(), a.as_ptr());

    let mut r = 0;
    while r + ROWS <= n_rows {
        for t in 0..n_tok {
            let y = ap.add(t * ab);
            let mut acc = [Acc::zero(); ROWS];
            for b in 0..nb {
                let yb = y.add(b * K::A);
                for (i, acc) in acc.iter_mut().enumerate() {
                    K::dot::<D>(acc, wp.add((r + i) * rb + b * K::W), yb);
                }
            }
            for (i, acc) in acc.iter().enumerate() {
                out[(r + i) * n_tok + t] = K::finish(*acc);
            }
        }
        r += ROWS;
    }
    for r in r..n_rows {
        for t in 0..n_tok {
            let y = ap.add(t * ab);
            let mut acc = Acc::zero();
            for b in 0..nb {
                K::dot::<D>(&mut acc, wp.add(r * rb + b * K::W), y.add(b * K::A));
            }
            out[r * n_tok + t] = K::finish(acc);
        }
    }
}
