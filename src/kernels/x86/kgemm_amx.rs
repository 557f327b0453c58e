//! Prefill GEMM for the K-quants with AMX-INT8 tile products (Sapphire Rapids and later Xeons).
//!
//! The AVX-512 GEMM ([`super::kgemm`]) spends about a third of its vector µops scaling integer sums by
//! the sub-block scales, and the rest on `vpdpbusd` at 64 products each. A tile product (`tdpbssd`)
//! makes 16 × 16 × 64 products in one instruction, but sums whole 64-column rows, across sub-blocks. So
//! the scale goes into the weights: per row and column, `w' = sc·q` (with the code offset of the formats
//! without mins folded in: `w' = sc·q − corr << SHIFT`), at most 14 bits, is split into two signed bytes
//! `w' = 128·hi + lo`, and two tile products per 64 columns give `Σ hi·a` and `Σ lo·a`. For every
//! (token, row, super-block), `128·Σhi·a + Σlo·a` is exactly the integer the AVX-512 GEMM and the row
//! kernels form, and the float epilogue (the mins' block sums, `d`, `dmin`) is theirs, in their order:
//! the results are bit-identical to them (prefill still equals decode).
//!
//! Layout: tile A is 16 tokens × 64 activation bytes (one token's quants per tile row, from the 64-byte
//! aligned copies of them that `matmuls` makes once per call, [`Q8kQuants`]),
//! tile B 16 quads × 16 weight rows × 4 bytes (the AVX-512 panel's quad layout), tile C 16 tokens × 16
//! rows of i32. Double-buffered source tiles let a step's loads go ahead of the previous products; the
//! epilogue of a super-block runs on the vector units while the tiles multiply the next one. The columns
//! are cut into chunks whose unpacked weights stay in L2 for all tokens. Tokens past the last 16: the
//! AVX-512 GEMM.

use core::arch::asm;
use core::arch::x86_64::*;
use std::cell::Cell;
use std::sync::OnceLock;

use super::kgemm::{dpwssd_bcast, pack_epilogue, read_rows, transpose16x8, ROWS};
use super::kquants::{KFormat, AB, ABSUMS};
use super::{read_f32, PanelPrefetch};
use crate::kernels::{GemmOut, Q8kQuants};

/// Values per Q8_K block.
const QK: usize = 256;

/// Whether the CPU has AMX-TILE and AMX-INT8 and the OS lets this process use the tile registers
/// (Linux: `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, asked once).
pub fn detected() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| super::avx512::detected() && cpu_has_amx_int8() && os_grants_tiles())
}

fn cpu_has_amx_int8() -> bool {
    // CPUID.(EAX=7, ECX=0):EDX bit 24 = AMX-TILE, bit 25 = AMX-INT8.
    let leaf7 = __cpuid_count(7, 0);
    leaf7.edx & (3 << 24) == 3 << 24
}

#[cfg(target_os = "linux")]
fn os_grants_tiles() -> bool {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: the arch_prctl system call with a request that only changes this process's permission to
    // use the AMX state; it reads no memory of ours. `syscall` clobbers rcx and r11.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack)
        );
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn os_grants_tiles() -> bool {
    false
}

/// A super-block of a 16-row panel, ready for the tiles: quad `q` (columns `4q..4q+4`), lane `r` holds row
/// `r`'s four `hi` (or `lo`) digits, as [`super::kgemm::PanelBlock::codes`] holds the codes; and what the float epilogue
/// takes.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct AmxBlock {
    hi: [__m512i; 64],
    lo: [__m512i; 64],
    /// For the formats with one min per 32 columns (Q4_K, Q5_K): the i16 pairs `(min_2k, min_2k+1)` of
    /// every row, to meet the activations' sums per 32 ([`Q8kQuants::sums32`]).
    mins32: [__m512i; 4],
    /// As [`super::kgemm::PanelBlock`]'s.
    corr: [__m512i; 8],
    d: __m512,
    dmin: __m512,
}

thread_local! {
    /// The calling thread's unpacked blocks (`[panel][block of the K-chunk]`), grown as needed.
    static BLOCKS: Cell<Vec<AmxBlock>> = const { Cell::new(Vec::new()) };
}

/// The most bytes of unpacked blocks one K-chunk keeps (all panels of a call): they stay in L2 while
/// every 16 tokens' quants of the chunk meet them.
const CHUNK_BYTES: usize = 512 << 10;

/// The tile configuration: palette 1, all 8 tiles 16 rows × 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const CONFIG: TileConfig = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64;
        c[48 + t] = 16;
        t += 1;
    }
    TileConfig(c)
};

/// `out(t, r) = W[r] · A[t]` for K-quant rows `w` (`out.rows()` of them) and Q8_K activations `a`
/// (`out.n_tok()` rows).
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C, AVX-512 F/BW/VL/VNNI (the caller's target features) and AMX-INT8
/// with the tile state granted ([`detected`]).
///
/// For callers other than `matmuls`, which copies the quants once per call and calls [`gemm_quants`]:
/// the copy is made here.
#[inline(always)]
pub(super) unsafe fn gemm<K: KFormat>(w: &[u8], a: &[u8], out: GemmOut<'_>) {
    if out.n_tok() < 16 {
        return super::kgemm::gemm::<K>(w, a, out);
    }
    let n_in = out.blocks(w, a, K::WB, AB).1 * QK;
    let mut buf = (Vec::new(), Vec::new());
    crate::kernels::q8k_quants(a, n_in, &mut buf);
    let qs = Q8kQuants {
        lines: &buf.0,
        sums32: &buf.1,
        n_in,
    };
    gemm_quants::<K>(w, a, qs, out)
}

/// Where a tile's activation rows come from: token `t`'s quants of block `b` at `base + t·stride + b·QK`,
/// its sums per 32 at `sums32 + t·nb + b`.
#[derive(Clone, Copy)]
struct ActRows {
    base: *const u8,
    stride: usize,
    sums32: *const [i16; 8],
}

/// [`gemm`] with the activations' quants also as aligned rows `qs` (the tiles load from them: a 64-byte
/// piece of a Q8_K row straddles two cache lines) with their sums per 32.
///
/// The rows are cut into 16-row panels and the columns into chunks of super-blocks whose unpacked blocks
/// (all panels') fit [`CHUNK_BYTES`]; per chunk, every 16 tokens' quants (from L1) meet every panel, and
/// the float sums wait in the output between chunks (the same operations in the same order).
///
/// # Safety
/// As [`gemm`].
#[inline(always)]
pub(super) unsafe fn gemm_quants<K: KFormat>(
    w: &[u8],
    a: &[u8],
    qs: Q8kQuants<'_>,
    mut out: GemmOut<'_>,
) {
    let (n_rows, n_tok) = (out.rows(), out.n_tok());
    let n_amx = n_tok / 16 * 16;
    if n_amx == 0 || n_rows == 0 {
        return super::kgemm::gemm::<K>(w, a, out);
    }
    let (rb, nb) = out.blocks(w, a, K::WB, AB);
    assert!(
        qs.n_in == nb * QK
            && qs.lines.len() * 64 >= n_tok * qs.n_in
            && qs.sums32.len() >= n_tok * nb,
        "kgemm_amx: {} quant lines and {} sums of {} for {n_tok} tokens of {nb} blocks",
        qs.lines.len(),
        qs.sums32.len(),
        qs.n_in
    );
    let tok_stride = nb * AB;
    if n_amx < n_tok {
        // The tokens past the last 16: the AVX-512 GEMM.
        let rest = out.tokens(n_amx, n_tok - n_amx);
        super::kgemm::gemm::<K>(w, &a[n_amx * tok_stride..], rest);
    }
    let n_panels = n_rows.div_ceil(ROWS);
    let chunk = (CHUNK_BYTES / (n_panels * size_of::<AmxBlock>())).clamp(1, nb);
    let mut blocks = BLOCKS.take();
    if blocks.len() < n_panels * chunk {
        // SAFETY: `AmxBlock` is vectors only, valid as all-zero bytes.
        blocks.resize(n_panels * chunk, unsafe { core::mem::zeroed() });
    }
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    // SAFETY: reads the 64-byte configuration.
    asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(readonly, nostack, preserves_flags));
    for k0 in (0..nb).step_by(chunk) {
        let kn = chunk.min(nb - k0);
        for p in 0..n_panels {
            let rows = ROWS.min(n_rows - p * ROWS);
            for (b, blk) in blocks[p * chunk..p * chunk + kn].iter_mut().enumerate() {
                let rr = read_rows::<K>(wp.add(p * ROWS * rb), rb, rows, k0 + b);
                (blk.corr, blk.d, blk.dmin) = pack_epilogue(&rr);
                split_digits::<K>(&rr, blk);
            }
        }
        // The next chunk's weight bytes (or, after the last, the rows past this call's, which
        // `matmul`'s next work item starts with) stream into L2 while this chunk is multiplied.
        let mut prefetch = if k0 + kn < nb {
            let kn2 = chunk.min(nb - k0 - kn);
            PanelPrefetch::new(wp.add((k0 + kn) * K::WB), rb, n_rows, kn2 * K::WB)
        } else {
            PanelPrefetch::new(wp.wrapping_add(n_rows * rb), rb, ROWS, nb * K::WB)
        };
        let per_tile = prefetch.left().div_ceil(n_amx / 16 * n_panels);
        for t in (0..n_amx).step_by(16) {
            let quants = ActRows {
                base: (qs.lines.as_ptr() as *const u8).add(t * qs.n_in + k0 * QK),
                stride: qs.n_in,
                sums32: qs.sums32.as_ptr().add(t * nb + k0),
            };
            for p in 0..n_panels {
                let rows = ROWS.min(n_rows - p * ROWS);
                let mask: __mmask16 = if rows == ROWS { !0 } else { (1u16 << rows) - 1 };
                let dst: [*mut f32; 16] =
                    core::array::from_fn(|i| out.token_ptr(t + i).wrapping_add(p * ROWS));
                prefetch.step(per_tile);
                tile::<K>(
                    &blocks[p * chunk..p * chunk + kn],
                    ap.add(t * tok_stride + k0 * AB),
                    tok_stride,
                    nb,
                    quants,
                    dst,
                    mask,
                    k0 == 0,
                );
            }
        }
        prefetch.step(usize::MAX);
    }
    // SAFETY: touches the tile state only.
    asm!("tilerelease", options(nomem, nostack, preserves_flags));
    BLOCKS.set(blocks);
}

/// The digit tiles of the rows read: `w' = sc·q` (formats with mins) or `sc·q − corr << SHIFT` per row
/// and column, as `128·hi + lo` with `lo` in `0..128` and `hi` signed.
///
/// # Safety
/// The CPU features as [`gemm`].
#[inline(always)]
unsafe fn split_digits<K: KFormat>(rr: &super::kgemm::RowsRead, out: &mut AmxBlock) {
    let low7 = _mm512_set1_epi16(127);
    for c in 0..8 {
        let mut hi = [_mm256_setzero_si256(); ROWS];
        let mut lo = [_mm256_setzero_si256(); ROWS];
        for r in 0..ROWS {
            // Columns 32c..32c+16 and 32c+16..32c+32: their sub-block scales and block-sum factors.
            let (s0, s1) = if K::SCALES16 {
                (rr.sc[r][2 * c], rr.sc[r][2 * c + 1])
            } else {
                (rr.sc[r][c], rr.sc[r][c])
            };
            let codes = _mm512_cvtepu8_epi16(rr.ch[c][r]);
            let mut wq = _mm512_mullo_epi16(codes, halves(s0, s1));
            if !K::MINS {
                let off = halves(
                    rr.corr[r][2 * c] << K::SHIFT,
                    rr.corr[r][2 * c + 1] << K::SHIFT,
                );
                wq = _mm512_sub_epi16(wq, off);
            }
            hi[r] = _mm512_cvtepi16_epi8(_mm512_srai_epi16::<7>(wq));
            lo[r] = _mm512_cvtepi16_epi8(_mm512_and_si512(wq, low7));
        }
        out.hi[8 * c..8 * c + 8].copy_from_slice(&transpose16x8(&hi));
        out.lo[8 * c..8 * c + 8].copy_from_slice(&transpose16x8(&lo));
    }
    if K::MINS && !K::SCALES16 {
        // The min of 32 columns is the factor of both their 16-column sums: corr[2j] = corr[2j + 1].
        for (k, v) in out.mins32.iter_mut().enumerate() {
            let lanes: [i32; ROWS] = core::array::from_fn(|r| {
                (rr.corr[r][4 * k] as u16 as u32 | ((rr.corr[r][4 * k + 2] as u16 as u32) << 16))
                    as i32
            });
            *v = _mm512_loadu_si512(lanes.as_ptr() as *const __m512i);
        }
    }
}

/// 32 i16 lanes: `a` in the first 16, `b` in the last 16.
#[inline(always)]
unsafe fn halves(a: i16, b: i16) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_set1_epi16(a)),
        _mm256_set1_epi16(b),
    )
}

/// Zeroes the sum tiles.
///
/// # Safety
/// The tile configuration [`CONFIG`] must be loaded.
#[inline(always)]
unsafe fn zero_sums() {
    // SAFETY: touches tiles only.
    asm!(
        "tilezero tmm0",
        "tilezero tmm1",
        options(nomem, nostack, preserves_flags)
    );
}

/// Adds K-steps `steps` (64 columns each) of one super-block to the sum tiles: `Σ hi·a` in `tmm0`, `Σ lo·a`
/// in `tmm1`, from 16 tokens' quants of one block at `a0` (`stride` bytes apart) and the
/// digits `dg`. Even steps load into `tmm2..=tmm4`, odd ones into `tmm5..=tmm7`, so that a step's loads
/// need not wait for the products of the step before to have read their tiles.
///
/// # Safety
/// The tile configuration [`CONFIG`] must be loaded; `a0` must point to 16 rows of 256 readable bytes,
/// `stride` bytes apart.
#[inline(always)]
unsafe fn products(dg: &AmxBlock, a0: *const u8, stride: usize, steps: core::ops::Range<usize>) {
    for ks in steps {
        let (hi, lo) = (dg.hi[16 * ks..].as_ptr(), dg.lo[16 * ks..].as_ptr());
        let a = a0.add(64 * ks);
        macro_rules! step {
            ($a:literal, $h:literal, $l:literal) => {
                // SAFETY: each tile load reads 16 rows of 64 bytes that the caller guarantees (the digits
                // are 16 consecutive quads of 64 bytes); the products touch tiles only.
                asm!(
                    concat!("tileloadd ", $a, ", [{a} + {s}*1]"),
                    concat!("tileloadd ", $h, ", [{hi} + {s64}*1]"),
                    concat!("tileloadd ", $l, ", [{lo} + {s64}*1]"),
                    concat!("tdpbssd tmm0, ", $a, ", ", $h),
                    concat!("tdpbssd tmm1, ", $a, ", ", $l),
                    a = in(reg) a,
                    s = in(reg) stride,
                    hi = in(reg) hi,
                    lo = in(reg) lo,
                    s64 = in(reg) 64usize,
                    options(readonly, nostack, preserves_flags)
                )
            };
        }
        if ks % 2 == 0 {
            step!("tmm2", "tmm3", "tmm4");
        } else {
            step!("tmm5", "tmm6", "tmm7");
        }
    }
}

/// 16 tokens × 16 rows of i32, as a tile store writes them.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Sums([__m512i; 16]);

/// 16 tokens (`a0`, `stride` bytes apart) × a panel's 16 rows over the blocks `blocks` of a K-chunk
/// (token `t`'s Q8_K blocks from `a0 + t·stride`, its sums per 32 `nb` apart); token `t`'s float sums are
/// continued from `out[t]` (unless `first`) and stored there (lanes in `mask`).
///
/// # Safety
/// The tile configuration [`CONFIG`] must be loaded; `a0` must point to 16 rows of `blocks.len()` Q8_K
/// blocks, `stride` bytes apart, `quants` to their quants, and `out[t]` to readable and writable floats
/// for the lanes in `mask`; the CPU features as [`gemm`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn tile<K: KFormat>(
    blocks: &[AmxBlock],
    a0: *const u8,
    stride: usize,
    nb: usize,
    quants: ActRows,
    out: [*mut f32; 16],
    mask: __mmask16,
    first: bool,
) {
    let zero = _mm512_setzero_si512();
    let mut acc: [__m512; 16] = if first {
        [_mm512_setzero_ps(); 16]
    } else {
        core::array::from_fn(|t| _mm512_maskz_loadu_ps(mask, out[t]))
    };
    let block_quants = |b: usize| quants.base.add(b * QK);
    // [hi, lo]
    let mut sums = [Sums([zero; 16]); 2];
    zero_sums();
    products(&blocks[0], block_quants(0), quants.stride, 0..4);
    for (b, blk) in blocks.iter().enumerate() {
        store(&mut sums);
        let next = (b + 1 < blocks.len()).then(|| (&blocks[b + 1], block_quants(b + 1)));
        if next.is_some() {
            zero_sums();
        }
        // The next block's products run on the tiles while this block's epilogue runs on the vector
        // units, in two halves each, so that the epilogue's µops behind a waiting tile instruction fit
        // the reorder buffer.
        for half in 0..2 {
            if let Some((dg, a)) = next {
                products(dg, a, quants.stride, 2 * half..2 * half + 2);
            }
            for t in half * 8..(half + 1) * 8 {
                let acc = &mut acc[t];
                let (hi, lo) = (sums[0].0[t], sums[1].0[t]);
                // The exact sum Σ w'·a of (token, row): as the AVX-512 GEMM's `s` (or `s − m << SHIFT`).
                let s = _mm512_add_epi32(_mm512_slli_epi32::<7>(hi), lo);
                let ab = a0.add(t * stride + b * AB);
                let dy = _mm512_set1_ps(read_f32(ab));
                if K::MINS {
                    // Σ corr·bsums (the same integer as the AVX-512 GEMM's): with the sums per 32 for
                    // one min per 32 columns, 4 pairs instead of 8.
                    let mut m = zero;
                    if K::SCALES16 {
                        for (i, c) in blk.corr.iter().enumerate() {
                            m = dpwssd_bcast(m, *c, ab.add(ABSUMS + 4 * i));
                        }
                    } else {
                        let sums = quants.sums32.add(t * nb + b) as *const u8;
                        for (k, c) in blk.mins32.iter().enumerate() {
                            m = dpwssd_bcast(m, *c, sums.add(4 * k));
                        }
                    }
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(blk.d, dy), *acc);
                    *acc =
                        _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(blk.dmin, dy), *acc);
                } else {
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(blk.d, dy), *acc);
                }
            }
        }
    }
    for (o, v) in out.iter().zip(&acc) {
        _mm512_mask_storeu_ps(*o, mask, *v);
    }
}

/// Stores the sum tiles `tmm0` (hi) and `tmm1` (lo) into `dst`.
///
/// # Safety
/// The tile configuration [`CONFIG`] must be loaded.
#[inline(always)]
unsafe fn store(dst: &mut [Sums; 2]) {
    let (hi, lo) = (dst[0].0.as_mut_ptr(), dst[1].0.as_mut_ptr());
    // SAFETY: each store writes 16 rows of 64 bytes into a `Sums` (1 KiB) we hold mutably.
    asm!(
        "tilestored [{hi} + {s}*1], tmm0",
        "tilestored [{lo} + {s}*1], tmm1",
        hi = in(reg) hi,
        lo = in(reg) lo,
        s = in(reg) 64usize,
        options(nostack, preserves_flags)
    );
}
