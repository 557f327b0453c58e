//! The element-wise ops of the kernel table (`Kernels::ops`) on one row of 1024 and of 4096 floats:
//! the scalar reference against the best table this CPU runs, in elements per second.
//!
//! `ops/<op>/<isa>/<n>`; select with criterion filters, e.g. `cargo bench --bench ops -- 'ops/softmax'`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use deltaq::kernels::{self, ops, Kernels};

fn row(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 * 8.0 - 4.0
        })
        .collect()
}

/// Scalar and the best table (just scalar where it is the only one).
fn tables() -> Vec<&'static Kernels> {
    let all = kernels::available();
    let mut v = vec![all[0]];
    if all.len() > 1 {
        v.push(*all.last().unwrap());
    }
    v
}

fn bench_ops(c: &mut Criterion) {
    let mut g = c.benchmark_group("ops");
    for n in [1024usize, 4096] {
        let x0 = row(n, 1);
        let y = row(n, 2);
        let w = row(n, 3);
        let (cos, sin) = ops::rope_cos_sin(12_345, n, 1e7);
        g.throughput(Throughput::Elements(n as u64));
        for k in tables() {
            let o = k.ops;
            let isa = k.isa.name();
            let mut x = x0.clone();
            // Each op works in place: the row is reset from `x0` before every call (a copy of n floats,
            // the same for every table).
            let mut run = |name: &str, f: &dyn Fn(&mut [f32])| {
                g.bench_function(BenchmarkId::new(format!("{name}/{isa}"), n), |b| {
                    b.iter(|| {
                        x.copy_from_slice(&x0);
                        f(black_box(&mut x));
                    })
                });
            };
            run("rms_norm", &|x| (o.rms_norm)(x, &w, 1e-6));
            run("l2_norm", &|x| (o.l2_norm)(x, 1e-6));
            run("softmax", &|x| (o.softmax)(x));
            run("exp", &|x| (o.exp)(x));
            run("sigmoid", &|x| (o.sigmoid)(x));
            run("silu", &|x| (o.silu)(x));
            run("swiglu", &|x| (o.swiglu)(x, &y));
            run("silu_mul", &|x| (o.silu_mul)(x, &y));
            run("sigmoid_mul", &|x| (o.sigmoid_mul)(x, &y));
            run("rope", &|x| (o.rope)(x, &cos, &sin));
            run("copy_only", &|_| {});
        }
    }
    g.finish();
}

criterion_group!(benches, bench_ops);
criterion_main!(benches);
