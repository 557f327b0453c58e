//! The per-token cost of constrained sampling next to a decoding step, measured in the same run and
//! interleaved (every token: one step, then the mask and the matcher's advance), so a loaded machine
//! slows both alike:
//!
//!     cargo run --release --example constraint_overhead -- MODEL.gguf [TOKENS]
//!
//! Answers follow a JSON schema (nested objects, arrays, bounded strings, enums, number ranges); a
//! finished answer starts a new guide (its compile time is reported apart: once per request). Prints
//! the medians and the ratio. Use a model with a large vocabulary (the synthetic 0.8B: 248k tokens).

use std::time::Instant;

use anyhow::Result;
use deltaq::constraint::{Compiler, OutputConstraint};
use deltaq::gguf::GgufFile;
use deltaq::model::{Drafter, Model, Session};
use deltaq::sampling::{Sampler, SamplingParams};
use deltaq::tokenizer::Tokenizer;
use serde_json::json;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .unwrap_or_else(|| "models/tiny-kjv-mtp-Q8_0.gguf".into());
    let n: usize = args.next().map_or(Ok(200), |s| s.parse())?;
    let f = GgufFile::open(&path)?;
    let model = Model::load(&f)?;
    let tok = Tokenizer::from_gguf(&f)?;
    let t = Instant::now();
    let compiler = Compiler::new(&tok, model.n_vocab())?;
    println!(
        "vocabulary {} tokens: constraint vocabulary built in {:.0} ms (once per model)",
        model.n_vocab(),
        t.elapsed().as_secs_f64() * 1e3
    );
    let constraint = OutputConstraint::JsonSchema(json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "kind": {"enum": ["psalm", "proverb", "song"]},
            "verses": {"type": "array", "maxItems": 4,
                       "items": {"type": "integer", "minimum": 1, "maximum": 176}},
            "meta": {"type": "object",
                     "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1},
                                    "ok": {"type": "boolean"}},
                     "required": ["score", "ok"], "additionalProperties": false}
        },
        "required": ["name", "kind", "verses", "meta"],
        "additionalProperties": false
    }));

    let mut session = Session::new(&model, Some(n + 64));
    let prompt = tok.encode("Answer in JSON:", false)?;
    let mut logits = session.forward_last_ref(&prompt)?.to_vec();
    let mut sampler = Sampler::new(SamplingParams {
        seed: Some(1),
        ..SamplingParams::qwen35(false)
    });
    let mut drafter = Drafter::off();
    let (mut step_ms, mut guide_ms, mut compile_ms) = (Vec::new(), Vec::new(), Vec::new());
    let mut guide = None;
    let mut answers = 0;
    for _ in 0..n {
        let g = match &mut guide {
            Some(g) => g,
            None => {
                let t = Instant::now();
                let g = guide.insert(compiler.compile(&constraint)?);
                compile_ms.push(t.elapsed().as_secs_f64() * 1e3);
                g
            }
        };
        let t = Instant::now();
        g.mask_logits(&mut logits)?;
        let masked = t.elapsed();
        let id = sampler.sample(&logits);
        let t = Instant::now();
        g.advance(id)?;
        guide_ms.push((masked + t.elapsed()).as_secs_f64() * 1e3);
        sampler.accept(id);
        if tok.is_eog(id) || g.is_complete() {
            answers += 1;
            guide = None;
        }
        let t = Instant::now();
        logits.copy_from_slice(session.step(id, &mut drafter)?);
        step_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let (step, mask) = (median(&mut step_ms), median(&mut guide_ms));
    println!(
        "{n} tokens ({answers} complete answers): decoding step median {step:.2} ms, \
         constraint (mask + advance) median {mask:.3} ms = {:.1} % of a step; \
         p90 constraint {:.3} ms; compiling a guide median {:.1} ms",
        100.0 * mask / step,
        percentile(&mut guide_ms, 0.9),
        median(&mut compile_ms)
    );
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    percentile(v, 0.5)
}

fn percentile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}
