use super::*;
use crate::quant::BlockFormat;
use bytemuck::Zeroable;

fn quantize<B: BlockFormat>(x: &[f32]) -> Vec<B> {
    let mut out = vec![B::zeroed(); x.len() / B::BLOCK];
    B::quantize(x, &mut out);
    out
}

fn dequantize<B: BlockFormat>(blocks: &[B]) -> Vec<f32> {
    let mut out = vec![0.0; blocks.len() * B::BLOCK];
    B::dequantize(blocks, &mut out);
    out
}

/// ggml's test-quantize-fns data: `0.1 + 2·cos(i + offset)`.
fn cos_data(n: usize, offset: f32) -> Vec<f32> {
    (0..n)
        .map(|i| 0.1 + 2.0 * (i as f32 + offset).cos())
        .collect()
}

/// A small deterministic generator whose f32 outputs involve only exact or singly-rounded operations, so the
/// same sequence can be reproduced bit for bit by a C program running ggml's reference code.
struct Gen(u32);

impl Gen {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        self.0
    }
    fn unif(&mut self) -> f32 {
        (self.next() >> 8) as f32 * (1.0 / 16_777_216.0)
    }
    fn gauss(&mut self) -> f32 {
        let mut g = self.unif();
        g += self.unif();
        g += self.unif();
        g += self.unif();
        g - 2.0
    }

    /// Element `i` of a block of kind `shape`: ordinary, offset, one-signed, outliers, sparse, tiny (f16
    /// subnormal or zero super-scales), zero sub-blocks, huge, constant, grid-valued, all zero, a single
    /// spike, and sub-blocks of very different magnitude (scales that round to zero).
    fn sample(&mut self, shape: usize, i: usize) -> f32 {
        match shape {
            0 => self.gauss(),
            1 => self.gauss() * 0.02 + 0.01,
            2 => self.unif() * 3.0,
            3 => self.unif() * -2.0,
            4 => {
                let g = self.gauss();
                if i.is_multiple_of(37) {
                    g * 20.0
                } else {
                    g
                }
            }
            5 => {
                if self.next().is_multiple_of(5) {
                    self.gauss()
                } else {
                    0.0
                }
            }
            6 => self.gauss() * 1e-6,
            7 => {
                if (i / 16).is_multiple_of(3) {
                    0.0
                } else {
                    self.gauss()
                }
            }
            8 => self.gauss() * 3000.0,
            9 => ((i / 16) as i32 - 8) as f32 * 0.25,
            10 => (self.next() % 16) as f32 * 0.5 - 3.0,
            11 => self.gauss() * 1e-20,
            12 => 0.0,
            13 => self.gauss() + 5.0,
            14 => {
                if i == 77 {
                    1.5
                } else {
                    0.0
                }
            }
            _ => {
                let g = self.gauss();
                if (i / 32) % 2 == 1 {
                    g
                } else {
                    g * 1e-4
                }
            }
        }
    }

    /// `nblocks` super-blocks cycling through the 16 shapes.
    fn blocks(seed: u32, nblocks: usize) -> Vec<f32> {
        let mut g = Gen(seed);
        (0..nblocks * QK_K)
            .map(|e| g.sample((e / QK_K) % 16, e % QK_K))
            .collect()
    }

    /// A finite f16 (never Inf/NaN), zero and subnormals included.
    fn finite_f16(&mut self) -> u16 {
        let sign = ((self.next() & 1) << 15) as u16;
        let exp = ((self.next() % 31) << 10) as u16;
        sign | exp | (self.next() & 0x3FF) as u16
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn rms_error(a: &[f32], b: &[f32]) -> f64 {
    let sum: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum();
    sum.sqrt() / a.len() as f64
}

/// ggml's round-trip test: `sqrt(Σ diff²)/n` below its per-type threshold.
fn check_round_trip<B: BlockFormat>(max_err: f64) {
    for offset in [0.0, 1.0] {
        let x = cos_data(4096, offset);
        let err = rms_error(&x, &dequantize(&quantize::<B>(&x)));
        assert!(
            err < max_err,
            "{}: round-trip error {err} ≥ {max_err} (offset {offset})",
            B::TYPE
        );
    }
}

#[test]
fn round_trip_error_within_ggml_thresholds() {
    check_round_trip::<BlockQ2K>(0.0075);
    check_round_trip::<BlockQ3K>(0.0040);
    check_round_trip::<BlockQ4K>(0.002);
    check_round_trip::<BlockQ5K>(0.002);
    check_round_trip::<BlockQ6K>(0.002);
    check_round_trip::<BlockQ8K>(0.002);
}

fn check_zero_block<B: BlockFormat>() {
    let q = quantize::<B>(&[0.0; 2 * QK_K]);
    assert!(
        bytemuck::cast_slice::<B, u8>(&q).iter().all(|&b| b == 0),
        "{}: zero input gave non-zero bytes",
        B::TYPE
    );
    assert!(dequantize(&q).iter().all(|&v| v == 0.0));
}

#[test]
fn zero_input_gives_zero_bytes() {
    check_zero_block::<BlockQ2K>();
    check_zero_block::<BlockQ3K>();
    check_zero_block::<BlockQ4K>();
    check_zero_block::<BlockQ5K>();
    check_zero_block::<BlockQ6K>();
    check_zero_block::<BlockQ8K>();
}

/// `vec_dot_ref` against (1) the f64 dot of the dequantized weights and dequantized activations, which
/// only float rounding separates from it, and (2) ggml's test: the unquantized dot, |err|/n < threshold.
fn check_dot<B: BlockFormat<VecDot = BlockQ8K>>(max_err: f64) {
    let n = 16 * QK_K;
    for seed in [7, 8] {
        let (w, a) = (Gen::blocks(seed, 16), Gen::blocks(seed + 100, 16));
        let (wq, aq) = (quantize::<B>(&w), quantize::<BlockQ8K>(&a));
        let (wd, ad) = (dequantize(&wq), dequantize(&aq));
        let want: f64 = wd.iter().zip(&ad).map(|(&x, &y)| x as f64 * y as f64).sum();
        let wmax = wd.iter().fold(0.0f64, |m, &x| m.max((x as f64).abs()));
        let scale: f64 = ad.iter().map(|&y| y.abs() as f64).sum::<f64>() * wmax;
        let got = B::vec_dot_ref(&wq, &aq) as f64;
        assert!(
            (got - want).abs() <= 1e-5 * scale,
            "{}: dot {got} vs dequantized {want}",
            B::TYPE
        );
    }
    let (x, y) = (cos_data(n, 0.0), cos_data(n, 1.0));
    let exact: f64 = x.iter().zip(&y).map(|(&a, &b)| a as f64 * b as f64).sum();
    let got = B::vec_dot_ref(&quantize::<B>(&x), &quantize::<BlockQ8K>(&y)) as f64;
    let err = (got - exact).abs() / n as f64;
    assert!(err < max_err, "{}: dot error {err} ≥ {max_err}", B::TYPE);
}

#[test]
fn vec_dot_matches_dequantized_dot() {
    check_dot::<BlockQ2K>(0.04);
    check_dot::<BlockQ3K>(0.02);
    check_dot::<BlockQ4K>(0.02);
    check_dot::<BlockQ5K>(0.02);
    check_dot::<BlockQ6K>(0.02);
}

#[test]
fn q8k_dot_with_itself() {
    let x = Gen::blocks(9, 16);
    let q = quantize::<BlockQ8K>(&x);
    let d = dequantize(&q);
    let want: f64 = d.iter().map(|&v| v as f64 * v as f64).sum();
    let got = BlockQ8K::vec_dot_ref(&q, &q) as f64;
    assert!((got - want).abs() <= 1e-5 * want, "{got} vs {want}");
}

#[test]
fn q8k_bsums_are_sums_of_quants() {
    let x = Gen::blocks(11, 32);
    for (i, b) in quantize::<BlockQ8K>(&x).iter().enumerate() {
        for j in 0..16 {
            let sum: i32 = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i32).sum();
            assert_eq!(b.bsums[j] as i32, sum, "block {i} group {j}");
        }
        assert!(b.qs.iter().all(|&q| q >= -127), "block {i}: quant −128");
    }
}

#[test]
fn scale_min_packing_round_trips() {
    for s in 0..64u8 {
        for m in 0..64u8 {
            // Every (S, M) pair at every position.
            let sv: [u8; 8] = std::array::from_fn(|k| (s + 7 * k as u8) % 64);
            let mv: [u8; 8] = std::array::from_fn(|k| (m + 13 * k as u8) % 64);
            assert_eq!(unpack_scale_min(&pack_scale_min(&sv, &mv)), (sv, mv));
        }
    }
    // Layout of §3.8: S5 = 0b11_0101 and M6 = 0b10_1010.
    let mut sv = [0u8; 8];
    let mut mv = [0u8; 8];
    sv[5] = 0b11_0101;
    mv[6] = 0b10_1010;
    let mut want = [0u8; 12];
    want[1] = 0b11 << 6;
    want[9] = 0b0101;
    want[6] = 0b10 << 6;
    want[10] = 0b1010 << 4;
    assert_eq!(pack_scale_min(&sv, &mv), want);
}

#[test]
fn two_bit_packing_round_trips() {
    let mut g = Gen(5);
    let l: [u8; QK_K] = std::array::from_fn(|_| (g.next() & 3) as u8);
    let qs = pack_2bit(&l);
    assert!((0..QK_K).all(|e| unpack_2bit(&qs, e) == l[e]));
    // Element 32 + 128 sits in bits 2–3 of byte 32.
    let mut one = [0u8; QK_K];
    one[160] = 3;
    assert_eq!(pack_2bit(&one)[32], 0b1100);
}

/// A block built from chosen fields is reproduced exactly by quantize(dequantize(block)) when its largest
/// scale is the quantizer's own choice (max 6-bit/4-bit scale, or −128/−32 for the signed formats) and each
/// sub-block uses both extreme quants, so the search recovers the scales and re-quantization the quants.
fn check_exact<B: BlockFormat>(make: impl Fn(&mut Gen) -> B) {
    let mut g = Gen(21);
    for _ in 0..50 {
        let block = make(&mut g);
        let x = dequantize(std::slice::from_ref(&block));
        let again = quantize::<B>(&x);
        assert_eq!(dequantize(&again), x, "{}: values not reproduced", B::TYPE);
        assert_eq!(
            bytemuck::bytes_of(&again[0]),
            bytemuck::bytes_of(&block),
            "{}: bytes not reproduced",
            B::TYPE
        );
    }
}

/// Random quants in `0..=nmax` with `lo` and `hi` placed in every `sub`-element sub-block.
fn quants_with_extremes(g: &mut Gen, nmax: u32, sub: usize) -> [u8; QK_K] {
    let mut l: [u8; QK_K] = std::array::from_fn(|_| (g.next() % (nmax + 1)) as u8);
    for k in 0..QK_K / sub {
        let (a, b) = (g.next() as usize % sub, g.next() as usize % sub);
        l[sub * k + a] = 0;
        l[sub * k + (a + 1 + b % (sub - 1)) % sub] = nmax as u8;
    }
    l
}

#[test]
fn exactly_representable_blocks_round_trip() {
    let f16_near = |g: &mut Gen, v: f32| f16_from_f32(v * (1.0 + g.unif()));
    check_exact(|g| {
        let l = quants_with_extremes(g, 3, 16);
        let scales = std::array::from_fn(|k| {
            let s = if k == 3 { 15 } else { 1 + g.next() % 15 };
            let m = if k == 5 { 15 } else { g.next() % 16 };
            (s | (m << 4)) as u8
        });
        BlockQ2K {
            scales,
            qs: pack_2bit(&l),
            d: f16_near(g, 0.01),
            dmin: f16_near(g, 0.005),
        }
    });
    check_exact(|g| {
        let l = quants_with_extremes(g, 15, 32);
        let s: [u8; 8] = std::array::from_fn(|k| {
            if k == 2 {
                63
            } else {
                1 + (g.next() % 63) as u8
            }
        });
        let m: [u8; 8] = std::array::from_fn(|k| if k == 6 { 63 } else { (g.next() % 64) as u8 });
        let qs = std::array::from_fn(|i| {
            let e = 64 * (i / 32) + i % 32;
            l[e] | (l[e + 32] << 4)
        });
        BlockQ4K {
            d: f16_near(g, 0.001),
            dmin: f16_near(g, 0.001),
            scales: pack_scale_min(&s, &m),
            qs,
        }
    });
    check_exact(|g| {
        let l = quants_with_extremes(g, 31, 32);
        let s: [u8; 8] = std::array::from_fn(|k| {
            if k == 0 {
                63
            } else {
                1 + (g.next() % 63) as u8
            }
        });
        let m: [u8; 8] = std::array::from_fn(|k| if k == 7 { 63 } else { (g.next() % 64) as u8 });
        let mut b = BlockQ5K::zeroed();
        b.d = f16_near(g, 0.001);
        b.dmin = f16_near(g, 0.0005);
        b.scales = pack_scale_min(&s, &m);
        for (e, &le) in l.iter().enumerate() {
            b.qh[e % 32] |= (le >> 4) << (e / 32);
            b.qs[32 * (e / 64) + e % 32] |= (le & 0xF) << (4 * ((e / 32) % 2));
        }
        b
    });
    check_exact(|g| {
        // Signed quant −4 (stored 0) in every sub-block, largest |scale| −32 (stored 0).
        let l = quants_with_extremes(g, 7, 16);
        let u: [u8; 16] = std::array::from_fn(|k| match k {
            4 => 0,
            _ => [1 + g.next() % 31, 33 + g.next() % 31][k % 2] as u8,
        });
        let mut b = BlockQ3K::zeroed();
        b.d = f16_near(g, 0.01);
        b.scales = q3k::pack_q3_scales(&u);
        let low: [u8; QK_K] = std::array::from_fn(|e| l[e] & 3);
        b.qs = pack_2bit(&low);
        for (e, &le) in l.iter().enumerate() {
            b.hmask[e % 32] |= (le >> 2) << (e / 32);
        }
        b
    });
    check_exact(|g| {
        let l = quants_with_extremes(g, 63, 16);
        let mut b = BlockQ6K::zeroed();
        b.d = f16_near(g, 0.001);
        b.scales = std::array::from_fn(|k| {
            if k == 9 {
                -128
            } else {
                ((g.next() % 255) as i32 - 127) as i8
            }
        });
        // Keep every scale non-zero so no sub-block is skipped in re-quantization.
        for s in &mut b.scales {
            if *s == 0 {
                *s = 1;
            }
        }
        for h in 0..2 {
            for i in 0..32 {
                let e = 128 * h + i;
                b.ql[64 * h + i] = (l[e] & 0xF) | ((l[e + 64] & 0xF) << 4);
                b.ql[64 * h + 32 + i] = (l[e + 32] & 0xF) | ((l[e + 96] & 0xF) << 4);
                b.qh[32 * h + i] = (l[e] >> 4)
                    | (l[e + 32] >> 4) << 2
                    | (l[e + 64] >> 4) << 4
                    | (l[e + 96] >> 4) << 6;
            }
        }
        b
    });
    // Q8_K: a power-of-two scale with ±127 present maps back exactly (the sign of d may flip).
    let mut g = Gen(22);
    for _ in 0..50 {
        let d = 2.0f32.powi((g.next() % 20) as i32 - 10);
        let mut q: [i8; QK_K] = std::array::from_fn(|_| ((g.next() % 255) as i32 - 127) as i8);
        q[g.next() as usize % QK_K] = if g.next().is_multiple_of(2) {
            127
        } else {
            -127
        };
        let x: Vec<f32> = q.iter().map(|&v| d * v as f32).collect();
        assert_eq!(dequantize(&quantize::<BlockQ8K>(&x)), x);
    }
}

/// SHA-256 of the outputs of ggml's reference code (`quantize_row_*_ref`, `dequantize_row_*` and the generic
/// `ggml_vec_dot_*_q8_K` kernels, compiled for x86-64 without FMA) on [`Gen`] data: 320 super-blocks of
/// seed 1 as weights, seed 2 as activations (Q8_K), 20 rows of 16 blocks for the dots, and 64 blocks of
/// random bytes from seed 3 (f16 scales forced finite) for the dequantizers.
struct Golden {
    quant: &'static str,
    dot: &'static str,
    deq: &'static str,
}

fn check_golden<B: BlockFormat<VecDot = BlockQ8K>>(
    golden: &Golden,
    patch: impl Fn(&mut Gen, &mut B),
) {
    let x = Gen::blocks(1, 320);
    let q = quantize::<B>(&x);
    assert_eq!(
        sha256_hex(bytemuck::cast_slice(&q)),
        golden.quant,
        "{}: quantized bytes differ from ggml",
        B::TYPE
    );

    let a = quantize::<BlockQ8K>(&Gen::blocks(2, 320));
    let dots: Vec<f32> = (0..20)
        .map(|r| B::vec_dot_ref(&q[16 * r..16 * r + 16], &a[16 * r..16 * r + 16]))
        .collect();
    assert_eq!(
        sha256_hex(bytemuck::cast_slice(&dots)),
        golden.dot,
        "{}: vec_dot differs from ggml",
        B::TYPE
    );

    let mut g = Gen(3);
    let mut raw = vec![B::zeroed(); 64];
    for byte in bytemuck::cast_slice_mut::<B, u8>(&mut raw) {
        *byte = g.next() as u8;
    }
    for b in &mut raw {
        patch(&mut g, b);
    }
    assert_eq!(
        sha256_hex(bytemuck::cast_slice(&dequantize(&raw))),
        golden.deq,
        "{}: dequantized values differ from ggml",
        B::TYPE
    );
}

#[test]
fn bit_exact_with_ggml_reference() {
    check_golden::<BlockQ2K>(
        &Golden {
            quant: "4021f620f7a5c1398f61c3a5ccdd97def37c310beac56dd5faf07a4ddad4ba13",
            dot: "e3e6c6449a424b04c626503101ed0a751cb7d4a6e12f6205fd39be886522abc9",
            deq: "1edecbd30292344ed4b03b0542e8d32e2b4082fc257485587d0741eb92a24144",
        },
        |g, b| (b.d, b.dmin) = (g.finite_f16(), g.finite_f16()),
    );
    check_golden::<BlockQ3K>(
        &Golden {
            quant: "5f4bae59dbae5cb86adebc9789eef316f5ce47c9b8b935adb496e14b376a429a",
            dot: "61a919130e0e8d29dba7c79d842261ad22f122883c25b838225365faff792574",
            deq: "18cab7a4ae5af00fc364f35c9a56b1d4c8da9a4d394185cb24f2abc4b48a4637",
        },
        |g, b| b.d = g.finite_f16(),
    );
    check_golden::<BlockQ4K>(
        &Golden {
            quant: "fdbb5f729d45c8a25289e88c5306178bcb989879771741d34fe0079efb550bf1",
            dot: "19f46d757c2124407181b3e34240c2be6952f3f09dce751b6e01ea884dd4a784",
            deq: "1142f6c3db2da0db88e0c5fea0b1089c02c34fa3c1517a17d3cc57b99e3d7dbe",
        },
        |g, b| (b.d, b.dmin) = (g.finite_f16(), g.finite_f16()),
    );
    check_golden::<BlockQ5K>(
        &Golden {
            quant: "ad40268fd6bf54cc96b4a6372132a6a07aea67ef65bf8297a05ff0669fd78619",
            dot: "980c94568bd20632f965c12ec5f21a020f414bbef3fd006137d5c4b404e6c6a5",
            deq: "c08ed483aade82978238e5416b159fb8751e9803a6c4311be850c724f5ad6fe0",
        },
        |g, b| (b.d, b.dmin) = (g.finite_f16(), g.finite_f16()),
    );
    check_golden::<BlockQ6K>(
        &Golden {
            quant: "e2f1598f0f8ebaf84b575458c942ad9df4243cdf04687d95812379766bf91b87",
            dot: "8485c4d0a679dbdb62186ac6030152bd2f2528d6d0a0663b7a06285a26180e05",
            deq: "18949663c3bea10af0ecbc2ff32e8dd41aef44b42820d0b806ffe19c1c8c4345",
        },
        |g, b| b.d = g.finite_f16(),
    );
    // Q8_K of both data sets (ggml leaves bsums of all-zero blocks unwritten; the reference run zeroed them).
    let q8 = |seed| {
        sha256_hex(bytemuck::cast_slice(&quantize::<BlockQ8K>(&Gen::blocks(
            seed, 320,
        ))))
    };
    assert_eq!(
        q8(1),
        "7726171392c9d9ff7953af1ac19450a919a57e8001b74caf2034ad75d738e5a5"
    );
    assert_eq!(
        q8(2),
        "c0a8f5a4e616fe527de30cd260d4f1b6cad3f9b1f907ca72c0801561e41edb8b"
    );
}

fn quantize_and_dot<B: BlockFormat<VecDot = BlockQ8K>>(x: &[f32]) {
    let q = quantize::<B>(x);
    dequantize(&q);
    B::vec_dot_ref(&q, &quantize::<BlockQ8K>(x));
}

/// Non-finite and extreme inputs are garbage in, garbage out (spec §4.9), but must not panic.
#[test]
fn extreme_inputs_do_not_panic() {
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        -f32::MAX,
        1e-40,
        -1e-45,
        0.0,
    ];
    let mut g = Gen(31);
    let x: Vec<f32> = (0..8 * QK_K)
        .map(|e| match (e / QK_K, g.next() % 4) {
            (0, _) => f32::NAN,
            (b, 0) => specials[(b + e) % specials.len()],
            _ => g.gauss() * 1e30,
        })
        .collect();
    quantize_and_dot::<BlockQ2K>(&x);
    quantize_and_dot::<BlockQ3K>(&x);
    quantize_and_dot::<BlockQ4K>(&x);
    quantize_and_dot::<BlockQ5K>(&x);
    quantize_and_dot::<BlockQ6K>(&x);
}
