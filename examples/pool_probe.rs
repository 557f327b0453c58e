//! Fork/join cost of one parallel region on 2 threads, rayon against a minimal spin-waiting worker:
//! `cargo run --release --example pool_probe -- [regions] [gap_us]`, or, on a model's real matrices,
//! `cargo run --release --example pool_probe -- decode FILE [tokens]`.
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
    if std::env::args().nth(1).as_deref() == Some("decode") {
        return decode_replay();
    }
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

/// The spin-waiting pool of the probe, for jobs that own what they use (`'static`): the calling thread
/// bumps `epoch`, then it and the worker claim items from `next` until `n` are taken.
struct Spin {
    epoch: AtomicUsize,
    next: AtomicUsize,
    n: AtomicUsize,
    pending: AtomicUsize,
    job: std::sync::Mutex<Option<Job>>,
    stop: AtomicBool,
}

type Job = Arc<dyn Fn(usize) + Send + Sync>;

impl Spin {
    fn start() -> (Arc<Spin>, std::thread::JoinHandle<()>) {
        let pool = Arc::new(Spin {
            epoch: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            n: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
            job: std::sync::Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        let p = pool.clone();
        let worker = std::thread::spawn(move || {
            let mut seen = 0;
            loop {
                let e = p.epoch.load(Ordering::Acquire);
                if e == seen {
                    if p.stop.load(Ordering::Acquire) {
                        return;
                    }
                    std::hint::spin_loop();
                    continue;
                }
                seen = e;
                let job = p.job.lock().unwrap().clone().expect("a job per epoch");
                p.claim(&job);
                p.pending.fetch_sub(1, Ordering::Release);
            }
        });
        (pool, worker)
    }

    fn claim(&self, job: &Job) {
        let n = self.n.load(Ordering::Acquire);
        loop {
            let i = self.next.fetch_add(1, Ordering::AcqRel);
            if i >= n {
                return;
            }
            job(i);
        }
    }

    fn region(&self, n: usize, job: &Job) {
        *self.job.lock().unwrap() = Some(job.clone());
        self.next.store(0, Ordering::Release);
        self.n.store(n, Ordering::Release);
        self.pending.store(1, Ordering::Release);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.claim(job);
        while self.pending.load(Ordering::Acquire) != 0 {
            std::hint::spin_loop();
        }
    }
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Replays a decoded token's matrix-vector products on a model's real matrices (every quantized 2-D
/// tensor of the trunk, one region each, cut into `matmul`'s decode items of at most 256 KiB), with the
/// work handed out by rayon (as `matmuls` does) and by the spin pool, alternating token by token; prints
/// the median ms per token of each. Only the pool differs: the same items, kernels and activations.
fn decode_replay() {
    use deltaq::gguf::GgufFile;
    use deltaq::kernels;
    let mut args = std::env::args().skip(2);
    let path = args.next().expect("decode FILE [tokens]");
    let tokens: usize = args.next().map_or(30, |s| s.parse().unwrap());
    let file: &'static GgufFile = Box::leak(Box::new(GgufFile::open(&path).expect("open")));
    let k = kernels::kernels();
    let mut jobs: Vec<(usize, Job)> = Vec::new();
    for t in file.tensors() {
        let is_trunk = t.name.starts_with("blk.") || t.name == "output.weight";
        let quant = deltaq::quant::GgmlType::WEIGHT_QUANTS.contains(&t.ty);
        if !is_trunk || !quant || t.ne.len() != 2 || t.ne[1] < 64 {
            continue;
        }
        let (n_in, n_out) = (t.ne[0] as usize, t.ne[1] as usize);
        let data: &'static [u8] = file.tensor_data(t);
        let act_ty = t.ty.vec_dot_type();
        let mut act = vec![0u8; act_ty.row_bytes(n_in as u64).unwrap() as usize];
        let x: Vec<f32> = (0..n_in)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        (k.quantize_act)(act_ty, &x, &mut act);
        let act: &'static [u8] = Box::leak(act.into_boxed_slice());
        let rb = data.len() / n_out;
        let items = data.len().div_ceil(256 << 10).div_ceil(2) * 2;
        let rows = n_out.div_ceil(items).next_multiple_of(4);
        let ty = t.ty;
        let job: Job = Arc::new(move |i: usize| {
            let r0 = i * rows;
            let rr = rows.min(n_out - r0);
            SCRATCH.with(|s| {
                let mut s = s.borrow_mut();
                s.resize(rr, 0.0);
                (k.quant_rows)(ty, &data[r0 * rb..(r0 + rr) * rb], act, 1, &mut s[..rr]);
                black_box(&s[..]);
            });
        });
        jobs.push((n_out.div_ceil(rows), job));
    }
    let regions = jobs.len();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let (mut tr, mut ts) = (Vec::new(), Vec::new());
    for tok in 0..tokens + 2 {
        let t = Instant::now();
        pool.install(|| {
            for (n, job) in &jobs {
                (0..*n).into_par_iter().for_each(|i| job(i));
            }
        });
        let r = t.elapsed().as_secs_f64() * 1e3;
        // The spin worker runs only for its own phase (it would take a core from rayon's otherwise).
        let (spin, worker) = Spin::start();
        let t = Instant::now();
        for (n, job) in &jobs {
            spin.region(*n, job);
        }
        let s = t.elapsed().as_secs_f64() * 1e3;
        spin.stop.store(true, Ordering::Release);
        worker.join().unwrap();
        if tok >= 2 {
            tr.push(r);
            ts.push(s);
        }
    }
    println!(
        "{regions} regions per token: rayon {:.2} ms, spin {:.2} ms per token (medians of {tokens})",
        median(tr),
        median(ts)
    );
}
