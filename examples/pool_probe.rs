//! Fork/join cost of one parallel region on 2 threads, rayon against a minimal spin-waiting worker:
//! `cargo run --release --example pool_probe -- [regions] [gap_us]`.
//!
//! Decoding runs a few hundred small parallel regions per token (a matmul, the delta rule's heads, ...)
//! with short serial stretches between them. Each region here hands both threads a trivial share; `gap_us`
//! busy-waits that long on the calling thread between regions, as the serial work between a token's
//! regions does. Prints the median cost per region over 5 runs for:
//! - `rayon`: `par_iter().for_each` over two items in a 2-thread pool (what `matmuls` does);
//! - `spin`: one extra thread spinning on an epoch counter, the calling thread running the other share
//!   (the purpose-built pool the kernels issue asks to measure rayon against).

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rayon::prelude::*;

fn busy(us: u64) {
    let end = Instant::now() + Duration::from_micros(us);
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn share(i: usize) -> u64 {
    // A few hundred ns of work, so neither side finishes before the other has started.
    let mut x = i as u64;
    for _ in 0..200 {
        x = black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
    }
    x
}

fn main() {
    let mut args = std::env::args().skip(1);
    let regions: usize = args.next().map_or(20_000, |s| s.parse().unwrap());
    let gap: u64 = args.next().map_or(0, |s| s.parse().unwrap());
    let per_region = |secs: f64| secs / regions as f64 * 1e9;

    // Baseline: one share on the calling thread, with the same gaps (a region's time if the other share
    // ran alongside for free).
    let base = median(
        (0..5)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..regions {
                    black_box(share(0));
                    busy(gap);
                }
                per_region(t.elapsed().as_secs_f64())
            })
            .collect(),
    );

    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let rayon_ns = median(
        (0..5)
            .map(|_| {
                pool.install(|| {
                    let t = Instant::now();
                    for _ in 0..regions {
                        (0..2usize).into_par_iter().for_each(|i| {
                            black_box(share(i));
                        });
                        busy(gap);
                    }
                    per_region(t.elapsed().as_secs_f64())
                })
            })
            .collect(),
    );

    // Spin worker: waits for `epoch` to move, runs share 1, publishes the epoch it finished in `done`.
    let epoch = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (epoch, done, stop) = (epoch.clone(), done.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seen = 0;
            while !stop.load(Ordering::Acquire) {
                let e = epoch.load(Ordering::Acquire);
                if e == seen {
                    std::hint::spin_loop();
                    continue;
                }
                seen = e;
                black_box(share(1));
                done.store(e, Ordering::Release);
            }
        })
    };
    let mut e = 0;
    let spin_ns = median(
        (0..5)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..regions {
                    e += 1;
                    epoch.store(e, Ordering::Release);
                    black_box(share(0));
                    while done.load(Ordering::Acquire) != e {
                        std::hint::spin_loop();
                    }
                    busy(gap);
                }
                per_region(t.elapsed().as_secs_f64())
            })
            .collect(),
    );
    stop.store(true, Ordering::Release);
    worker.join().unwrap();

    println!(
        "gap {gap} us: per region, one share alone {base:.0} ns, rayon {rayon_ns:.0} ns (+{:.0}), spin {spin_ns:.0} ns (+{:.0})",
        rayon_ns - base,
        spin_ns - base
    );
}
