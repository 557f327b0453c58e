//! A fixed speculative-verification workload for profilers: `cargo run --release --example verify_probe
//! -- MODEL [K] [N]` fills 64 tokens, then runs `N` times (default 20) a (K+1)-token verification pass
//! (default K = 2) and rolls it back; with K = 0 a plain 1-token step instead. Compare the profiles of
//! K = 0 and K = 2 to see what a verification adds.

use std::time::Instant;

use anyhow::Result;
use deltaq::gguf::GgufFile;
use deltaq::model::{Model, Session};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("MODEL");
    let k: usize = args.next().map_or(Ok(2), |s| s.parse())?;
    let n: usize = args.next().map_or(Ok(20), |s| s.parse())?;
    let f = GgufFile::open(&path)?;
    let model = Model::load(&f)?;
    let mut s = Session::new(&model, Some(128));
    let prompt: Vec<u32> = (0..64).map(|i| 1000 + 7 * i).collect();
    s.forward_last(&prompt)?;
    let at_depth = s.clone();
    let toks: Vec<u32> = (0..=k as u32).map(|i| 500 + i).collect();
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        if k == 0 {
            s.forward_last_ref(&toks)?;
        } else {
            s.verify(&toks)?;
            s.settle()?;
        }
        times.push(t0.elapsed().as_secs_f64() * 1e3);
        s.rewind_to(&at_depth)?;
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("{} tokens: median {:.2} ms", k + 1, times[n / 2]);
    Ok(())
}
