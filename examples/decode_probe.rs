//! A fixed decode workload for profilers: `cargo run --release --example decode_probe -- [N] [MODEL]`
//! feeds an 8-token prompt, then decodes `N` tokens greedily (default 32; demo model by default) and
//! prints a checksum of the last logits.
//!
//! Per-token costs are the difference between two runs, e.g. `N = 32` and `N = 0`, divided by 32:
//! heap allocations with `valgrind --tool=dhat` ("Total: ... in B blocks"), instructions with
//! `valgrind --tool=callgrind` ("Collected").

use anyhow::Result;
use deltaq::gguf::GgufFile;
use deltaq::model::{Model, Session};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(Ok(32), |s| s.parse())?;
    let path = args
        .next()
        .unwrap_or_else(|| "models/tiny-kjv-mtp-Q8_0.gguf".into());
    let f = GgufFile::open(&path)?;
    let model = Model::load(&f)?;
    let mut s = Session::new(&model, Some(256));
    let prompt = [1u32, 2, 3, 4, 5, 6, 7, 8];
    let mut logits = s.forward_last_ref(&prompt)?;
    for _ in 0..n {
        let next = argmax(logits);
        logits = s.forward_last_ref(&[next])?;
    }
    let sum: f64 = logits.iter().map(|&x| x as f64).sum();
    println!(
        "decoded {n} tokens, next {}, logit sum {sum:.6}",
        argmax(logits)
    );
    Ok(())
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}
