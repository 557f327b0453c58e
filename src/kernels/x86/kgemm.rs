//! Prefill GEMM for the K-quants on AVX-512 VNNI: 16 weight rows in the 16 i32 lanes of a zmm.
//!
//! The tile kernels of [`super::kquants`] put the 32 elements of a chunk in a vector's lanes and pay a
//! `maddubs` + `vpdpwssd` pair per 32 products, a scale shuffle per row and chunk, and a horizontal sum
//! per (row, token) and block. Here a panel of 16 rows is unpacked once per call into a layout where
//! lane `r` of quad vector `q` holds row `r`'s codes `4q..4q+4` (u8), next to the rows' sub-block scales
//! as i32 lanes. Then every 4 activation bytes of a token, broadcast from memory, meet 16 rows in one
//! `vpdpbusd` (64 products), and a sub-block's 16 integer sums are scaled by one `vpmulld`. The panel
//! (about 5.6 KiB per 256 columns) is reused by every token of the call.
//!
//! The integer sums per (row, block, token) are the same exact i32 values the tile and decode kernels
//! form, and the float epilogue performs the same operations in the same order, so the results are
//! bit-identical to theirs (prefill equals decode).

use core::arch::x86_64::*;
use std::cell::Cell;

use super::kquants::{KFormat, AB, ABSUMS, AQS};
use super::{read_f32, read_u32, PanelPrefetch};
use crate::kernels::GemmOut;

/// Rows per panel (the i32 lanes of a zmm).
pub(super) const ROWS: usize = 16;

/// One super-block (256 columns) of a 16-row panel, unpacked.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct PanelBlock {
    /// Quad `q` (columns `4q..4q+4`): lane `r` holds row `r`'s four codes (u8).
    codes: [__m512i; 64],
    /// Sub-block `j`'s scale of every row (i32 lanes; 8 sub-blocks of 32 or 16 of 16 columns).
    sc: [__m512i; 16],
    /// Block-sum factor pairs `(corr[2i], corr[2i+1])` of every row (i16 pairs), see `Pre::corr`.
    corr: [__m512i; 8],
    d: __m512,
    dmin: __m512,
}

thread_local! {
    /// The calling thread's unpacked panel, grown to the longest row seen.
    static PANEL: Cell<Vec<PanelBlock>> = const { Cell::new(Vec::new()) };
}

/// A weight format's 16-row panel kernel, run by [`drive`]: the unpacked block type, how 16 rows' block
/// `b` is unpacked into it, and the register tile of `T` tokens over a whole panel.
///
/// # Safety
/// `Block` must be plain vectors, valid as all-zero bytes (the panel buffer grows with zeroed blocks).
pub(super) unsafe trait PanelKernel {
    type Block: Copy + 'static;
    /// Bytes of one weight block.
    const WB: usize;
    /// The calling thread's panel buffer, grown to the longest row seen.
    fn buffer() -> &'static std::thread::LocalKey<Cell<Vec<Self::Block>>>;
    /// Block `b` of `rows` (≤ 16) rows starting at `w` (`rb` bytes apart); lanes past `rows` zero.
    ///
    /// # Safety
    /// Rows `0..rows` must hold at least `b + 1` blocks of `WB` bytes; the CPU features as [`drive`].
    unsafe fn unpack(w: *const u8, rb: usize, rows: usize, b: usize, out: &mut Self::Block);
    /// `T` tokens × the panel's 16 rows over all its blocks, stored (lanes in `mask`) at `out[t]`.
    ///
    /// # Safety
    /// Each `a[t]` must point to `panel.len()` Q8_K blocks and `out[t]` to writable floats for the
    /// lanes in `mask`; the CPU features as [`drive`].
    unsafe fn tile<const T: usize>(
        panel: &[Self::Block],
        a: [*const u8; T],
        out: [*mut f32; T],
        mask: __mmask16,
    );
}

/// `$vis struct $panel<K>` implementing [`PanelKernel`] for every `K: $bound` with the calling
/// module's `PanelBlock`, its `PANEL` buffer and its `unpack::<K>` / `tile::<K, T>`.
macro_rules! panel_kernel {
    ($(#[$doc:meta])* $vis:vis $panel:ident, $bound:path) => {
        $(#[$doc])*
        $vis struct $panel<K>(core::marker::PhantomData<K>);

        // SAFETY: `PanelBlock` is vectors only.
        unsafe impl<K: $bound> PanelKernel for $panel<K> {
            type Block = PanelBlock;
            const WB: usize = K::WB;
            fn buffer() -> &'static std::thread::LocalKey<Cell<Vec<PanelBlock>>> {
                &PANEL
            }
            #[inline(always)]
            unsafe fn unpack(w: *const u8, rb: usize, rows: usize, b: usize, out: &mut PanelBlock) {
                unpack::<K>(w, rb, rows, b, out)
            }
            #[inline(always)]
            unsafe fn tile<const T: usize>(
                panel: &[PanelBlock],
                a: [*const u8; T],
                out: [*mut f32; T],
                mask: __mmask16,
            ) {
                tile::<K, T>(panel, a, out, mask)
            }
        }
    };
}
pub(super) use panel_kernel;

panel_kernel!(
    /// The K-quant format `K` as a [`PanelKernel`].
    pub(super) KPanel,
    KFormat
);

/// `out(t, r) = W[r] · A[t]` for K-quant rows `w` (`out.rows()` of them) and Q8_K activations `a`
/// (`out.n_tok()` rows).
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI (the caller's target features).
#[inline(always)]
pub(super) unsafe fn gemm<K: KFormat>(w: &[u8], a: &[u8], out: GemmOut<'_>) {
    drive::<KPanel<K>>(w, a, out)
}

/// `out(t, r) = W[r] · A[t]` for weight rows `w` of panel kernel `P` (`out.rows()` of them) and Q8_K
/// activations `a` (`out.n_tok()` rows): 16-row panels unpacked once per call, multiplied 8, 4, 2, 1
/// tokens at a time.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI (the caller's target features).
#[inline(always)]
pub(super) unsafe fn drive<P: PanelKernel>(w: &[u8], a: &[u8], mut out: GemmOut<'_>) {
    let (n_rows, n_tok) = (out.rows(), out.n_tok());
    if n_tok == 0 || n_rows == 0 {
        return;
    }
    let (rb, nb) = out.blocks(w, a, P::WB, AB);
    let mut panel = P::buffer().take();
    if panel.len() < nb {
        // SAFETY: `P::Block` is vectors only (the trait's contract), valid as all-zero bytes.
        panel.resize(nb, unsafe { core::mem::zeroed() });
    }
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let arow = |t: usize| ap.add(t * nb * AB);
    let mut r0 = 0;
    while r0 < n_rows {
        let rows = ROWS.min(n_rows - r0);
        for (b, blk) in panel[..nb].iter_mut().enumerate() {
            P::unpack(wp.add(r0 * rb), rb, rows, b, blk);
        }
        let panel = &panel[..nb];
        // The next panel's rows stream into L2 while this one is multiplied, 8 tokens at a time.
        // After the last panel those are the rows past this call's, which `matmul`'s next work item
        // (usually run next by the same thread) starts with; past the matrix's end they are never read
        // (prefetches do not fault).
        let mut prefetch =
            PanelPrefetch::new(wp.wrapping_add((r0 + rows) * rb), rb, ROWS, nb * P::WB);
        let per_tile = prefetch.left().div_ceil(n_tok.div_ceil(8));
        // Token t's 16 results go to its output row at column r0 (`token_ptr` checks t).
        let mut o = |t: usize| out.token_ptr(t).wrapping_add(r0);
        let mask: __mmask16 = if rows == ROWS { !0 } else { (1u16 << rows) - 1 };
        let mut t = 0;
        while t + 8 <= n_tok {
            let dst = core::array::from_fn(|i| o(t + i));
            prefetch.step(per_tile);
            P::tile::<8>(panel, core::array::from_fn(|i| arow(t + i)), dst, mask);
            t += 8;
        }
        if t + 4 <= n_tok {
            let dst = core::array::from_fn(|i| o(t + i));
            P::tile::<4>(panel, core::array::from_fn(|i| arow(t + i)), dst, mask);
            t += 4;
        }
        if t + 2 <= n_tok {
            let dst = core::array::from_fn(|i| o(t + i));
            P::tile::<2>(panel, core::array::from_fn(|i| arow(t + i)), dst, mask);
            t += 2;
        }
        if t < n_tok {
            P::tile::<1>(panel, [arow(t)], [o(t)], mask);
        }
        prefetch.step(usize::MAX);
        r0 += rows;
    }
    P::buffer().set(panel);
}

/// Block `b` of up to 16 weight rows as read, before it is regrouped: row `r`'s codes of columns
/// `32c..32c+32` (`ch[c][r]`, u8), its sub-block scales and block-sum factors (i16), `d` and `dmin`.
/// Rows past the ones read are zero.
pub(super) struct RowsRead {
    pub(super) ch: [[__m256i; ROWS]; 8],
    pub(super) sc: [[i16; 16]; ROWS],
    pub(super) corr: [[i16; 16]; ROWS],
    pub(super) d: [f32; ROWS],
    pub(super) dmin: [f32; ROWS],
}

/// Reads block `b` of `rows` (≤ 16) rows starting at `w` (`rb` bytes apart).
///
/// # Safety
/// Rows `0..rows` must each hold at least `b + 1` blocks of `K::WB` bytes (`gemm` checks the lengths);
/// the CPU features as [`gemm`].
#[inline(always)]
pub(super) unsafe fn read_rows<K: KFormat>(
    w: *const u8,
    rb: usize,
    rows: usize,
    b: usize,
) -> RowsRead {
    let zero = _mm256_setzero_si256();
    let mut rr = RowsRead {
        ch: [[zero; ROWS]; 8],
        sc: [[0i16; 16]; ROWS],
        corr: [[0i16; 16]; ROWS],
        d: [0f32; ROWS],
        dmin: [0f32; ROWS],
    };
    for r in 0..rows {
        let p = w.add(r * rb + b * K::WB);
        let pre = K::prepare(p);
        rr.d[r] = pre.d;
        rr.dmin[r] = pre.dmin;
        // Scales 0..7 are the low lane of `sc_lo`, 8..15 that of `sc_hi` (16-scale formats).
        _mm_storeu_si128(
            rr.sc[r].as_mut_ptr() as *mut __m128i,
            _mm256_castsi256_si128(pre.sc_lo),
        );
        _mm_storeu_si128(
            rr.sc[r][8..].as_mut_ptr() as *mut __m128i,
            _mm256_castsi256_si128(pre.sc_hi),
        );
        _mm256_storeu_si256(rr.corr[r].as_mut_ptr() as *mut __m256i, pre.corr);
        for (c, chunk) in rr.ch.iter_mut().enumerate() {
            chunk[r] = K::chunk(p, c);
        }
    }
    rr
}

/// Unpacks block `b` of `rows` (≤ 16) rows starting at `w` (`rb` bytes apart); lanes past `rows` get zero
/// codes and scales.
///
/// # Safety
/// As [`read_rows`].
#[inline(always)]
unsafe fn unpack<K: KFormat>(w: *const u8, rb: usize, rows: usize, b: usize, out: &mut PanelBlock) {
    pack::<K>(&read_rows::<K>(w, rb, rows, b), out)
}

/// The panel block of rows read by [`read_rows`].
///
/// # Safety
/// The CPU features as [`gemm`].
#[inline(always)]
unsafe fn pack<K: KFormat>(rr: &RowsRead, out: &mut PanelBlock) {
    for (c, chunk) in rr.ch.iter().enumerate() {
        let q = transpose16x8(chunk);
        out.codes[8 * c..8 * c + 8].copy_from_slice(&q);
    }
    let n_sc = if K::SCALES16 { 16 } else { 8 };
    for (j, v) in out.sc[..n_sc].iter_mut().enumerate() {
        let lanes: [i32; ROWS] = core::array::from_fn(|r| rr.sc[r][j] as i32);
        *v = _mm512_loadu_si512(lanes.as_ptr() as *const __m512i);
    }
    (out.corr, out.d, out.dmin) = pack_epilogue(rr);
}

/// What the float epilogue of the rows read takes: the block-sum factor pairs `(corr[2i], corr[2i+1])`
/// (i16 pairs, lane = row), `d` and `dmin`.
///
/// # Safety
/// The CPU features as [`gemm`].
#[inline(always)]
pub(super) unsafe fn pack_epilogue(rr: &RowsRead) -> ([__m512i; 8], __m512, __m512) {
    let corr = core::array::from_fn(|i| {
        let lanes: [i32; ROWS] = core::array::from_fn(|r| {
            (rr.corr[r][2 * i] as u16 as u32 | ((rr.corr[r][2 * i + 1] as u16 as u32) << 16)) as i32
        });
        _mm512_loadu_si512(lanes.as_ptr() as *const __m512i)
    });
    (
        corr,
        _mm512_loadu_ps(rr.d.as_ptr()),
        _mm512_loadu_ps(rr.dmin.as_ptr()),
    )
}

/// 16 rows of 8 u32 → 8 vectors of 16 u32: `out[q]` lane `r` = `rows[r]` element `q`.
#[inline(always)]
pub(super) unsafe fn transpose16x8(rows: &[__m256i; ROWS]) -> [__m512i; 8] {
    // z[i] = [rows i | rows i+4] (i < 4), [rows 8+i | rows 12+i] (i ≥ 4), so that after the in-lane 4×4
    // transposes the 128-bit lanes land in row order with one shuffle each. Spelled out, not in
    // closures around intrinsics (a closure's body lacks the target features: they would be calls).
    let (u0, u1, u2, u3) = t4(
        join(rows[0], rows[4]),
        join(rows[1], rows[5]),
        join(rows[2], rows[6]),
        join(rows[3], rows[7]),
    );
    let (v0, v1, v2, v3) = t4(
        join(rows[8], rows[12]),
        join(rows[9], rows[13]),
        join(rows[10], rows[14]),
        join(rows[11], rows[15]),
    );
    // u[e] lanes: rows 0-3 elem e, rows 0-3 elem 4+e, rows 4-7 elem e, rows 4-7 elem 4+e; v[e] the same
    // for rows 8-15.
    const LO: i32 = 0b10_00_10_00;
    const HI: i32 = 0b11_01_11_01;
    [
        _mm512_shuffle_i32x4::<LO>(u0, v0),
        _mm512_shuffle_i32x4::<LO>(u1, v1),
        _mm512_shuffle_i32x4::<LO>(u2, v2),
        _mm512_shuffle_i32x4::<LO>(u3, v3),
        _mm512_shuffle_i32x4::<HI>(u0, v0),
        _mm512_shuffle_i32x4::<HI>(u1, v1),
        _mm512_shuffle_i32x4::<HI>(u2, v2),
        _mm512_shuffle_i32x4::<HI>(u3, v3),
    ]
}

/// `[lo | hi]` as one 512-bit vector.
#[inline(always)]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// 4×4 u32 transposes within each 128-bit lane: result `e` lane `L` = `[z0.L[e], z1.L[e], z2.L[e],
/// z3.L[e]]`.
#[inline(always)]
pub(super) unsafe fn t4(
    z0: __m512i,
    z1: __m512i,
    z2: __m512i,
    z3: __m512i,
) -> (__m512i, __m512i, __m512i, __m512i) {
    let t0 = _mm512_unpacklo_epi32(z0, z1);
    let t1 = _mm512_unpackhi_epi32(z0, z1);
    let t2 = _mm512_unpacklo_epi32(z2, z3);
    let t3 = _mm512_unpackhi_epi32(z2, z3);
    (
        _mm512_unpacklo_epi64(t0, t2),
        _mm512_unpackhi_epi64(t0, t2),
        _mm512_unpacklo_epi64(t1, t3),
        _mm512_unpackhi_epi64(t1, t3),
    )
}

/// `T` tokens × the panel's 16 rows over all `panel.len()` blocks; token `t`'s 16 results are stored
/// (lanes in `mask`) at `out[t]`.
///
/// # Safety
/// Each `a[t]` must point to `panel.len()` Q8_K blocks, and `out[t]` to writable floats for the lanes in
/// `mask`; the CPU features as [`gemm`].
#[inline(always)]
unsafe fn tile<K: KFormat, const T: usize>(
    panel: &[PanelBlock],
    a: [*const u8; T],
    out: [*mut f32; T],
    mask: __mmask16,
) {
    let zero = _mm512_setzero_si512();
    // Quads per sub-block, sub-blocks per block.
    let (qps, n_sub) = if K::SCALES16 { (4, 16) } else { (8, 8) };
    let chain = i16_chain::<K>(qps);
    let mut acc = [_mm512_setzero_ps(); T];
    for (b, pb) in panel.iter().enumerate() {
        let ab: [*const u8; T] = core::array::from_fn(|t| a[t].add(b * AB));
        let mut s = [zero; T];
        for j in 0..n_sub {
            if let Some(n_chains) = qps.checked_div(chain) {
                // The scale as the i16 pair (sc, 0): `vpdpwssd` then adds isum·sc for an isum that is
                // its own low i16 (sign-extended), exactly as `vpmulld` + `vpaddd` did.
                let sc = _mm512_and_si512(pb.sc[j], _mm512_set1_epi32(0xFFFF));
                for c in 0..n_chains {
                    let mut isum = [zero; T];
                    for q in j * qps + c * chain..j * qps + (c + 1) * chain {
                        let wq = pb.codes[q];
                        for t in 0..T {
                            let y = _mm512_set1_epi32(read_u32(ab[t].add(AQS + 4 * q)) as i32);
                            isum[t] = _mm512_dpbusd_epi32(isum[t], wq, y);
                        }
                    }
                    for t in 0..T {
                        s[t] = dpwssd(s[t], isum[t], sc);
                    }
                }
                continue;
            }
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
        // Σ corr·bsums per (row, token), 16 block sums as 8 pairs.
        let mut m = [zero; T];
        for (i, c) in pb.corr.iter().enumerate() {
            for t in 0..T {
                m[t] = dpwssd_bcast(m[t], *c, ab[t].add(ABSUMS + 4 * i));
            }
        }
        for t in 0..T {
            let dy = _mm512_set1_ps(read_f32(ab[t]));
            if K::MINS {
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t]), _mm512_mul_ps(pb.d, dy), acc[t]);
                acc[t] =
                    _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m[t]), _mm512_mul_ps(pb.dmin, dy), acc[t]);
            } else {
                // Codes stored with an offset: `S − (Σ corr·bsums) << SHIFT`.
                let st = _mm512_sub_epi32(s[t], shl(m[t], K::SHIFT));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(st), _mm512_mul_ps(pb.d, dy), acc[t]);
            }
        }
    }
    for (o, v) in out.iter().zip(&acc) {
        _mm512_mask_storeu_ps(*o, mask, *v);
    }
}

/// Quads per integer sum in [`tile`] when a sub-block's sums can take their scale with `vpdpwssd`
/// (one µop) instead of `vpmulld` (two) + `vpaddd`: the sum of `4·n` products of a code
/// (`0..2^CODE_BITS`) and a Q8_K value (`−128..=127`) fits an i16 for `n` quads, and the sub-block's
/// `qps` quads split into at most two such sums. 0: the format keeps `vpmulld` (Q5_K, Q6_K).
const fn i16_chain<K: KFormat>(qps: usize) -> usize {
    let per_quad = 4 * 128 * ((1usize << K::CODE_BITS) - 1);
    let n = i16::MAX as usize / per_quad;
    if n >= qps {
        qps
    } else if 2 * n >= qps && qps.is_multiple_of(2) {
        qps / 2
    } else {
        0
    }
}

/// `acc + Σ₂ a·b` over the i16 pairs of each i32 lane, as one `vpdpwssd` (LLVM's generic tuning splits
/// the intrinsic into `vpmaddwd` + `vpaddd`).
///
/// # Safety
/// The CPU must have AVX-512 F and VNNI.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
pub(super) unsafe fn dpwssd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut acc = acc;
    // SAFETY: register operands only; the caller guarantees the CPU features.
    unsafe {
        core::arch::asm!(
            "vpdpwssd {acc}, {a}, {b}",
            acc = inout(zmm_reg) acc,
            a = in(zmm_reg) a,
            b = in(zmm_reg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// A VNNI dot product whose second operand is 4 bytes at `p` broadcast to every lane, as one fused µop
/// (`vpdp… zmm, zmm, dword ptr [p]{1to16}`).
macro_rules! dot_bcast {
    ($(#[$doc:meta])* $name:ident, $insn:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The 4 bytes at `p` must be readable; the CPU must have AVX-512 F and VNNI.
        #[inline]
        #[target_feature(enable = "avx512f,avx512vnni")]
        pub(super) unsafe fn $name(acc: __m512i, a: __m512i, p: *const u8) -> __m512i {
            let mut acc = acc;
            // SAFETY: the caller guarantees the 4 bytes at `p` are readable and the CPU features;
            // the instruction reads only those bytes and writes only `acc`.
            unsafe {
                core::arch::asm!(
                    concat!($insn, " {acc}, {a}, dword ptr [{p}]{{1to16}}"),
                    acc = inout(zmm_reg) acc,
                    a = in(zmm_reg) a,
                    p = in(reg) p,
                    options(pure, readonly, nostack, preserves_flags)
                );
            }
            acc
        }
    };
}

dot_bcast!(
    /// `acc + Σ₂ a·b` over i16 pairs, `b` the i16 pair at `p` broadcast to every lane. (The intrinsic
    /// with a `set1` operand is split by LLVM into `vpmaddwd` + `vpaddd` for generic x86-64 tuning, plus
    /// a separate broadcast: three µops.)
    dpwssd_bcast,
    "vpdpwssd"
);

#[inline(always)]
pub(super) unsafe fn shl(v: __m512i, n: i32) -> __m512i {
    _mm512_sll_epi32(v, _mm_cvtsi32_si128(n))
}
