//! RoPE scaling (none, linear, YaRN) against tests/fixtures/rope-scaling.json, an independent float64
//! numpy computation of llama.cpp's parameter resolution and ggml's rope (tools/make_rope_fixture.py):
//! the resolved parameters, YaRN's correction dims and the rotated head vectors (within 1e-6).

use deltaq::kernels::ops::rope;
use deltaq::model::rope::{mrope_axis, Rope, RopeOverrides, RopeScaling, RopeScalingType};
use serde_json::Value;

fn f(v: &Value) -> f32 {
    v.as_f64().unwrap() as f32
}

fn kind(v: &Value) -> RopeScalingType {
    RopeScalingType::from_name(v.as_str().unwrap()).unwrap()
}

fn file_scaling(v: &Value) -> RopeScaling {
    let mut s = RopeScaling::default();
    if let Some(t) = v.get("type") {
        s.kind = kind(t);
    }
    if let Some(x) = v.get("factor") {
        s.factor = f(x);
    }
    if let Some(x) = v.get("orig_ctx") {
        s.orig_ctx = x.as_u64().unwrap() as usize;
    }
    if let Some(x) = v.get("attn_factor") {
        s.attn_factor = f(x);
    }
    s
}

fn overrides(v: &Value) -> RopeOverrides {
    let num = |k: &str| v.get(k).map(f);
    RopeOverrides {
        scaling: v.get("scaling").map(kind),
        scale: num("scale"),
        freq_base: num("freq_base"),
        yarn_orig_ctx: v.get("yarn_orig_ctx").map(|x| x.as_u64().unwrap() as usize),
        yarn_ext_factor: num("yarn_ext_factor"),
        yarn_beta_fast: num("yarn_beta_fast"),
        yarn_beta_slow: num("yarn_beta_slow"),
    }
}

#[test]
fn rope_scaling_matches_the_numpy_reference() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/rope-scaling.json"
    ))
    .unwrap();
    let cases: Vec<Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(cases.len(), 5);
    for c in &cases {
        let name = c["name"].as_str().unwrap();
        let n_rot = c["n_rot"].as_u64().unwrap() as usize;
        let r = Rope::resolve(
            n_rot,
            f(&c["base"]),
            c["n_ctx_train"].as_u64().unwrap() as usize,
            &file_scaling(&c["file"]),
            &overrides(&c["flags"]),
        )
        .unwrap();
        let want = &c["resolved"];
        assert_eq!(r.kind, kind(&want["kind"]), "{name}");
        assert_eq!(r.freq_base, f(&want["freq_base"]), "{name}");
        assert_eq!(r.freq_scale, f(&want["freq_scale"]), "{name}");
        assert_eq!(r.n_ctx_orig as u64, want["n_ctx_orig"].as_u64().unwrap());
        assert_eq!(r.ext_factor, f(&want["ext_factor"]), "{name}");
        assert_eq!(r.attn_factor, f(&want["attn_factor"]), "{name}");
        assert_eq!(
            (r.beta_fast, r.beta_slow),
            (f(&want["beta_fast"]), f(&want["beta_slow"]))
        );
        assert_eq!(
            r.corr_dims(),
            [f(&c["corr_dims"][0]), f(&c["corr_dims"][1])],
            "{name}"
        );

        let sections: Vec<usize> = c["sections"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        let sections = Some([sections[0], sections[1], sections[2], sections[3]]);
        let x: Vec<f32> = c["x"].as_array().unwrap().iter().map(f).collect();
        for row in c["rows"].as_array().unwrap() {
            let p: Vec<usize> = row["pos"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            let (cos, sin) = r.cos_sin_by(|i| p[mrope_axis(sections, i)]);
            let mut y = x.clone();
            rope(&mut y[..n_rot], &cos, &sin);
            for (i, (got, want)) in y.iter().zip(row["y"].as_array().unwrap()).enumerate() {
                let want = want.as_f64().unwrap();
                assert!(
                    (*got as f64 - want).abs() <= 1e-6,
                    "{name} at {p:?}, dim {i}: {got} vs {want}"
                );
            }
        }
    }
}
