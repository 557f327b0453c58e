//! `deltaq bench` on the bundled demo model: llama-bench's JSON fields, sane values, clear errors.

use std::process::Command;

use serde_json::Value;

fn deltaq(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_deltaq"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

const MODEL: &str = "models/tiny-kjv-mtp-Q8_0.gguf";

#[test]
fn json_has_llama_bench_fields_and_sane_values() {
    let (ok, out, err) = deltaq(&[
        "bench", "-m", MODEL, "-p", "32", "-n", "8", "-t", "1,2", "-r", "3", "--bw-mib", "32",
        "--json",
    ]);
    assert!(ok, "{err}");
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    // pp32 and tg8 for each thread count, pp first, as llama-bench orders them.
    assert_eq!(lines.len(), 4, "{out}");
    let tests: Vec<(u64, u64, u64)> = lines
        .iter()
        .map(|v| {
            (
                v["n_threads"].as_u64().unwrap(),
                v["n_prompt"].as_u64().unwrap(),
                v["n_gen"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(tests, [(1, 32, 0), (1, 0, 8), (2, 32, 0), (2, 0, 8)]);
    for v in &lines {
        let ts: Vec<f64> = v["samples_ts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        let ns = v["samples_ns"].as_array().unwrap();
        assert_eq!((ts.len(), ns.len()), (3, 3), "{v}");
        assert!(ts.iter().all(|&t| t.is_finite() && t > 0.0), "{v}");
        let avg = v["avg_ts"].as_f64().unwrap();
        let mean = ts.iter().sum::<f64>() / 3.0;
        assert!((avg - mean).abs() <= 1e-9 * mean, "{v}");
        let sd = v["stddev_ts"].as_f64().unwrap();
        assert!(sd >= 0.0 && sd.is_finite(), "{v}");
        let med = v["median_ts"].as_f64().unwrap();
        let (lo, hi) = ts
            .iter()
            .fold((f64::MAX, 0f64), |(a, b), &t| (a.min(t), b.max(t)));
        assert!(med >= lo && med <= hi, "{v}");
        assert!(v["avg_ns"].as_u64().unwrap() > 0, "{v}");
        assert_eq!(v["model_filename"], MODEL);
        assert!(v["model_type"].as_str().unwrap().contains("Q8_0"), "{v}");
        // Tied embeddings: the whole table is the LM head, so every tensor is read per token but
        // the MTP block's (blk.8, read only when drafting).
        let size = v["model_size"].as_u64().unwrap();
        let f = deltaq::gguf::GgufFile::open(MODEL).unwrap();
        let mtp: u64 = f
            .tensors()
            .iter()
            .filter(|t| t.name.starts_with("blk.8."))
            .map(|t| t.nbytes)
            .sum();
        assert!(mtp > 0);
        assert_eq!(
            v["weight_bytes_per_token"].as_u64().unwrap(),
            size - mtp,
            "{v}"
        );
        assert!(v["peak_rss_bytes"].as_u64().unwrap() > 1 << 20, "{v}");
        assert!(v["read_bw_gbps"].as_f64().unwrap() > 0.1, "{v}");
        assert!(v["recurrent_state_bytes"].as_u64().unwrap() > 0, "{v}");
        assert!(v["kv_cache_bytes"].as_u64().unwrap() > 0, "{v}");
        assert!(!v["isa"].as_str().unwrap().is_empty());
        let tg = v["n_gen"].as_u64().unwrap() > 0;
        assert_eq!(v["weight_gbps"].is_number(), tg, "{v}");
        assert_eq!(v["bw_pct"].is_number(), tg, "{v}");
        if tg {
            let gbps = v["weight_gbps"].as_f64().unwrap();
            let per_token = (size - mtp) as f64;
            assert!(
                (gbps * 1e9 - per_token * med).abs() < 1e-6 * gbps * 1e9,
                "{v}"
            );
        }
    }
}

#[test]
fn table_output_and_bad_arguments() {
    let (ok, out, err) = deltaq(&[
        "bench", "-m", MODEL, "-p", "16", "-n", "4", "-t", "1", "-r", "1", "--bw-mib", "16",
    ]);
    assert!(ok, "{err}");
    let cells: Vec<&str> = out.split('|').map(str::trim).collect();
    assert!(cells.contains(&"pp16") && cells.contains(&"tg4"), "{out}");
    assert!(out.contains("read bandwidth"), "{out}");

    let (ok, _, err) = deltaq(&["bench", "-m", MODEL, "-p", "64", "-n", "0", "-c", "32"]);
    assert!(
        !ok && err.contains("does not fit in the context size"),
        "{err}"
    );
    let (ok, _, err) = deltaq(&["bench", "-m", MODEL, "-p", "0", "-n", "0"]);
    assert!(!ok && err.contains("nothing to measure"), "{err}");
    let (ok, _, err) = deltaq(&["bench", "-m", MODEL, "-t", "0"]);
    assert!(!ok && err.contains("-t must be at least 1"), "{err}");
    let (ok, _, err) = deltaq(&["bench", "-m", "no-such-file.gguf"]);
    assert!(!ok && err.contains("no-such-file.gguf"), "{err}");
}

/// `--kv-type`: llama-bench's `type_k`/`type_v` fields follow it, the F32 cache is twice the F16 one
/// (the default), and an unknown type is refused with the choices.
#[test]
fn kv_type_flag() {
    let kv_bytes = |kv: Option<&str>| -> (String, u64) {
        let mut args = vec![
            "bench", "-m", MODEL, "-p", "40", "-n", "0", "-r", "1", "--bw-mib", "16", "--json",
        ];
        if let Some(kv) = kv {
            args.extend(["--kv-type", kv]);
        }
        let (ok, out, err) = deltaq(&args);
        assert!(ok, "{err}");
        let v: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
        assert_eq!(v["type_k"], v["type_v"], "{v}");
        (
            v["type_k"].as_str().unwrap().to_string(),
            v["kv_cache_bytes"].as_u64().unwrap(),
        )
    };
    let (t16, b16) = kv_bytes(None);
    let (t32, b32) = kv_bytes(Some("f32"));
    assert_eq!((t16.as_str(), t32.as_str()), ("f16", "f32"));
    assert!(b16 > 0 && b32 == 2 * b16, "f16 {b16} B, f32 {b32} B");
    // Blocks of 32 values: 34 bytes (Q8_0) and 18 bytes (Q4_0) against 64 at f16.
    let (t8, b8) = kv_bytes(Some("q8_0"));
    let (t4, b4) = kv_bytes(Some("q4_0"));
    assert_eq!((t8.as_str(), t4.as_str()), ("q8_0", "q4_0"));
    assert_eq!((b8 * 64, b4 * 64), (b16 * 34, b16 * 18));
    assert_eq!(kv_bytes(Some("F16")), (t16, b16));
    let (ok, _, err) = deltaq(&["bench", "-m", MODEL, "--kv-type", "q5_1"]);
    assert!(
        !ok && err.contains("unknown KV cache type 'q5_1'") && err.contains("f16, f32, q8_0, q4_0"),
        "{err}"
    );
}

/// `-d`: every test runs at every depth (llama-bench's order: depths, then pp before tg), named
/// `pp16 @ d300`, with `n_depth` in the JSON; the depth's tokens are in the cache during the test (a
/// second KV page is allocated), and a test that does not fit after its depth is refused.
#[test]
fn depth_flag() {
    let (ok, out, err) = deltaq(&[
        "bench", "-m", MODEL, "-p", "16", "-n", "4", "-d", "0,300", "-c", "600", "-r", "2",
        "--bw-mib", "16", "--json",
    ]);
    assert!(ok, "{err}");
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let tests: Vec<(&str, u64)> = lines
        .iter()
        .map(|v| (v["test"].as_str().unwrap(), v["n_depth"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        tests,
        [
            ("pp16", 0),
            ("tg4", 0),
            ("pp16 @ d300", 300),
            ("tg4 @ d300", 300)
        ]
    );
    let kv = |i: usize| lines[i]["kv_cache_bytes"].as_u64().unwrap();
    // 256-position pages: 16 tokens fill part of one, 300 + 16 reach into a second.
    assert_eq!(kv(2), 2 * kv(0), "{out}");
    assert_eq!(kv(3), 2 * kv(1), "{out}");
    assert!(lines.iter().all(|v| v["n_ctx"] == 600), "{out}");

    let (ok, out, err) = deltaq(&[
        "bench", "-m", MODEL, "-p", "8", "-n", "0", "-d", "40", "-r", "1", "--bw-mib", "16",
    ]);
    assert!(ok, "{err}");
    let cells: Vec<&str> = out.split('|').map(str::trim).collect();
    assert!(cells.contains(&"pp8 @ d40"), "{out}");
    assert!(out.contains("sequence state after 48 tokens"), "{out}");

    let (ok, _, err) = deltaq(&[
        "bench", "-m", MODEL, "-p", "64", "-n", "0", "-d", "100", "-c", "128",
    ]);
    assert!(
        !ok && err.contains("pp64 at depth 100 does not fit in the context size 128"),
        "{err}"
    );
}
