//! The guide on the demo model's vocabulary: generated answers are in the language whatever the
//! logits say, the mask matches a brute-force check, bad constraints are refused, thinking is free.

use serde_json::{json, Value};

use super::*;
use crate::gguf::GgufFile;
use crate::sampling::Rng;

const DEMO: &str = "models/tiny-kjv-mtp-Q8_0.gguf";

fn demo() -> (Tokenizer, Compiler) {
    let f = GgufFile::open(DEMO).expect("the demo model");
    let tok = Tokenizer::from_gguf(&f).expect("its tokenizer");
    let compiler = Compiler::new(&tok, tok.n_vocab()).expect("the constraint vocabulary");
    (tok, compiler)
}

/// Generates with random logits (a model that knows nothing) under the guide; returns the text and
/// whether it ended within `max` tokens.
fn generate(tok: &Tokenizer, guide: &mut Guide, rng: &mut Rng, max: usize) -> (String, bool) {
    generate_biased(tok, guide, rng, max, &[])
}

/// [`generate`] with a bonus for the tokens of `liked` (one token each).
fn generate_biased(
    tok: &Tokenizer,
    guide: &mut Guide,
    rng: &mut Rng,
    max: usize,
    liked: &[&str],
) -> (String, bool) {
    let liked: Vec<u32> = liked
        .iter()
        .flat_map(|s| tok.encode(s, false).unwrap())
        .collect();
    let mut ids = Vec::new();
    for _ in 0..max {
        if guide.is_complete() {
            return (tok.decode(&ids, false), true);
        }
        let mut logits: Vec<f32> = (0..tok.n_vocab())
            .map(|_| rng.next_f64() as f32 * 8.0)
            .collect();
        for &id in &liked {
            logits[id as usize] += 4.0;
        }
        guide.mask_logits(&mut logits).unwrap();
        let id = crate::sampling::argmax(
            &logits
                .iter()
                .enumerate()
                .map(|(i, &logit)| crate::sampling::Candidate {
                    id: i as u32,
                    logit,
                })
                .collect::<Vec<_>>(),
        )
        .unwrap();
        guide.advance(id).unwrap();
        if tok.is_eog(id) {
            return (tok.decode(&ids, false), true);
        }
        ids.push(id);
    }
    (tok.decode(&ids, false), false)
}

#[test]
fn random_answers_follow_json_schemas() {
    let (tok, compiler) = demo();
    let schemas = [
        json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 10},
            "age": {"type": "integer", "minimum": 18, "maximum": 99},
            "kind": {"enum": ["a", "bb", "ccc"]}},
            "required": ["name", "age", "kind"], "additionalProperties": false}),
        json!({"type": "array", "items": {"type": "integer", "minimum": -3, "maximum": 3},
               "minItems": 1, "maxItems": 4}),
        json!({"type": "object", "properties": {"p": {"type": "object", "properties": {
            "ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false}},
            "required": ["p"], "additionalProperties": false}),
    ];
    let mut rng = Rng::new(7);
    for (i, schema) in schemas.iter().enumerate() {
        for _ in 0..5 {
            let mut g = compiler
                .compile(&OutputConstraint::JsonSchema(schema.clone()))
                .unwrap();
            let (text, done) = generate(&tok, &mut g, &mut rng, 300);
            assert!(done, "schema {i}: unfinished {text:?}");
            let v: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("schema {i}: {text:?} is not JSON: {e}"));
            match i {
                0 => {
                    assert!(v["name"].as_str().unwrap().chars().count() <= 10, "{text}");
                    let age = v["age"].as_i64().unwrap();
                    assert!((18..=99).contains(&age), "{text}");
                    assert!(["a", "bb", "ccc"].contains(&v["kind"].as_str().unwrap()));
                    assert_eq!(v.as_object().unwrap().len(), 3, "{text}");
                }
                1 => {
                    let a = v.as_array().unwrap();
                    assert!((1..=4).contains(&a.len()), "{text}");
                    assert!(a.iter().all(|x| (-3..=3).contains(&x.as_i64().unwrap())));
                }
                _ => assert!(v["p"]["ok"].is_boolean(), "{text}"),
            }
        }
    }
}

#[test]
fn json_object_gives_an_object() {
    let (tok, compiler) = demo();
    let mut rng = Rng::new(3);
    for _ in 0..5 {
        let mut g = compiler.compile(&OutputConstraint::JsonObject).unwrap();
        // Random logits nest without end: this "model" also likes to close what it opened.
        let (text, done) = generate_biased(&tok, &mut g, &mut rng, 300, &["}", "\"", "]"]);
        assert!(done, "unfinished {text:?}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(v.is_object(), "{text}");
    }
}

/// Every string of `root ::= [a-c] [0-9]{1,2} ("x" | "yz")`.
fn small_language() -> Vec<String> {
    let mut out = Vec::new();
    for head in ["a", "b", "c"] {
        for n in 0..110 {
            let digits = if n < 10 {
                n.to_string()
            } else {
                format!("{:02}", n - 10)
            };
            for tail in ["x", "yz"] {
                out.push(format!("{head}{digits}{tail}"));
            }
        }
    }
    out
}

#[test]
fn mask_matches_brute_force() {
    let (tok, compiler) = demo();
    let language = small_language();
    // No multi-byte text is forced anywhere in this language: llguidance allows only the canonical
    // tokens of forced text (e.g. "ab" but not "a" then "b"), which a byte-level check would not.
    let grammar = OutputConstraint::Grammar(r#"root ::= [a-c] [0-9]{1,2} ("x" | "yz")"#.into());
    let mut rng = Rng::new(11);
    for _ in 0..8 {
        let mut g = compiler.compile(&grammar).unwrap();
        let mut text: Vec<u8> = Vec::new();
        loop {
            if g.is_complete() {
                assert!(language.iter().any(|s| s.as_bytes() == text));
                break;
            }
            let mut logits = vec![0.0f32; tok.n_vocab()];
            g.mask_logits(&mut logits).unwrap();
            let mut allowed = Vec::new();
            for id in 0..tok.n_vocab() as u32 {
                let bytes = tok.token_to_piece(id, false);
                let plain = tok.token_type(id) == Some(crate::tokenizer::TokenType::Normal);
                let expect = if tok.is_eog(id) {
                    language.iter().any(|s| s.as_bytes() == text)
                } else if plain && !bytes.is_empty() {
                    let mut t = text.clone();
                    t.extend_from_slice(&bytes);
                    language.iter().any(|s| s.as_bytes().starts_with(&t))
                } else {
                    false
                };
                let got = logits[id as usize] != f32::NEG_INFINITY;
                assert_eq!(got, expect, "token {id} {bytes:?} after {text:?}");
                if got {
                    allowed.push(id);
                }
            }
            let id = allowed[(rng.next_u64() % allowed.len() as u64) as usize];
            g.advance(id).unwrap();
            if tok.is_eog(id) {
                break;
            }
            text.extend_from_slice(&tok.token_to_piece(id, false));
        }
    }
}

#[test]
fn bad_constraints_are_refused_with_the_reason() {
    let (_, compiler) = demo();
    let err = |c: OutputConstraint| compiler.compile(&c).err().expect("an error");
    match err(OutputConstraint::Grammar("root ::= \"a\" missing".into())) {
        ConstraintError::Grammar(m) => assert!(m.contains("missing"), "{m}"),
        e => panic!("{e:?}"),
    }
    // A keyword of JSON schema llguidance does not implement (unknown keywords are ignored, as the
    // JSON schema specification says).
    match err(OutputConstraint::JsonSchema(
        json!({"type": "object", "properties": {"x": {"type": "array", "uniqueItems": true}}}),
    )) {
        ConstraintError::Schema(m) => assert!(m.contains("uniqueItems"), "{m}"),
        e => panic!("{e:?}"),
    }
    assert!(matches!(
        err(OutputConstraint::JsonSchema(
            json!({"type": "integer", "minimum": 5, "maximum": 1})
        )),
        ConstraintError::Schema(_)
    ));
    assert!(matches!(
        err(OutputConstraint::JsonSchema(json!("not a schema"))),
        ConstraintError::Schema(_)
    ));
}

#[test]
fn thinking_is_free_and_the_answer_is_not() {
    let (tok, compiler) = demo();
    let (Some(open), Some(close)) = (
        tok.special_id(crate::chat::THINK_OPEN),
        tok.special_id(crate::chat::THINK_CLOSE),
    ) else {
        panic!("the demo model has think tokens");
    };
    assert!(compiler.starts_in_thinking(&[5, open, 9]));
    assert!(!compiler.starts_in_thinking(&[open, 9, close, 4]));
    assert!(!compiler.starts_in_thinking(&[1, 2]));
    let mut g = compiler
        .compile(&OutputConstraint::Grammar(r#"root ::= "yes""#.into()))
        .unwrap();
    g.wait_for_thinking();
    let mut logits = vec![1.0f32; tok.n_vocab()];
    g.mask_logits(&mut logits).unwrap();
    for (id, &l) in logits.iter().enumerate() {
        // Thinking is free, but it cannot end the generation before the answer.
        let want = if tok.is_eog(id as u32) {
            f32::NEG_INFINITY
        } else {
            1.0
        };
        assert_eq!(l, want, "token {id} while thinking");
    }
    let word = tok.encode("And God said", false).unwrap();
    for &id in &word {
        g.advance(id).unwrap();
    }
    g.advance(close).unwrap();
    assert!(!g.is_thinking());
    g.mask_logits(&mut logits).unwrap();
    let allowed: Vec<u32> = (0..tok.n_vocab() as u32)
        .filter(|&i| logits[i as usize] != f32::NEG_INFINITY)
        .collect();
    assert!(!allowed.is_empty());
    for id in allowed {
        assert!(b"yes".starts_with(&tok.token_to_piece(id, false)), "{id}");
    }
}

#[test]
fn strict_tool_calls_follow_the_parameters() {
    let (tok, compiler) = demo();
    let weather = tools::ToolSpec {
        name: "get_weather".into(),
        parameters: json!({"type": "object", "properties": {
            "city": {"enum": ["Paris", "Rome"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"], "additionalProperties": false}),
    };
    let calls = OutputConstraint::ToolCalls(tools::ToolCalls {
        tools: vec![weather],
        required: true,
    });
    let mut rng = Rng::new(5);
    for _ in 0..5 {
        let mut g = compiler.compile(&calls).unwrap();
        // Decoded with the tags as text, as the server's parser sees them.
        let mut ids = Vec::new();
        for _ in 0..200 {
            if g.is_complete() {
                break;
            }
            let mut logits: Vec<f32> = (0..tok.n_vocab()).map(|_| rng.next_f64() as f32).collect();
            g.mask_logits(&mut logits).unwrap();
            let best = (0..logits.len())
                .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
                .unwrap() as u32;
            g.advance(best).unwrap();
            if tok.is_eog(best) {
                break;
            }
            ids.push(best);
        }
        let text = String::from_utf8_lossy(&tok.decode_bytes(&ids, true)).into_owned();
        let parsed = crate::server::text::parse_tool_calls(&text);
        assert!(!parsed.is_empty(), "{text:?}");
        for c in parsed {
            assert_eq!(c.name, "get_weather", "{text:?}");
            let args: Value = serde_json::from_str(&c.arguments).unwrap();
            assert!(
                ["Paris", "Rome"].contains(&args["city"].as_str().unwrap()),
                "{args}"
            );
            assert!((1..=7).contains(&args["days"].as_i64().unwrap()), "{args}");
        }
    }
}

/// Objects without `additionalProperties` admit only their properties (llama.cpp's and Ollama's
/// reading): random answers never add a key, at any depth; an explicit `additionalProperties` and
/// the members of `allOf` are left as written.
#[test]
fn objects_without_additional_properties_are_closed() {
    let (tok, compiler) = demo();
    let schema = json!({"type": "object", "properties": {
        "a": {"type": "boolean"},
        "b": {"type": "object", "properties": {"c": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["c"]}},
        "required": ["a", "b"]});
    let mut rng = Rng::new(11);
    for _ in 0..8 {
        let mut g = compiler
            .compile(&OutputConstraint::JsonSchema(schema.clone()))
            .unwrap();
        let (text, done) = generate(&tok, &mut g, &mut rng, 300);
        assert!(done, "unfinished {text:?}");
        let v: Value = serde_json::from_str(&text).unwrap();
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["a", "b"], "{text}");
        assert_eq!(v["b"].as_object().unwrap().len(), 1, "{text}");
    }

    let mut open = json!({"properties": {"x": {}}, "additionalProperties": true,
                          "allOf": [{"properties": {"y": {}}}]});
    super::close_objects(&mut open, false);
    assert_eq!(open["additionalProperties"], json!(true));
    assert!(open["allOf"][0].get("additionalProperties").is_none());
}
