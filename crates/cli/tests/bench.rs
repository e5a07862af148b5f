//! `tensorfold bench` through the real binary: `--chunk` sets the prefill step's rows, the
//! greedy tokens do not depend on it, and a chunk outside 1..=8,192 is refused by name.

mod common;

use std::process::Command;

use common::model;

fn bench(chunk: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tensorfold"))
        .args([
            "bench",
            "--pp",
            "40",
            "--tg",
            "4",
            "--reps",
            "1",
            "--threads",
            "2",
            "--chunk",
            chunk,
        ])
        .arg("-m")
        .arg(model())
        .output()
        .unwrap()
}

/// The JSON line of a successful run.
fn line(chunk: &str) -> serde_json::Value {
    let out = bench(chunk);
    assert!(out.status.success(), "bench failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(text.lines().next().expect("no JSON line")).unwrap()
}

#[test]
fn bench_chunk_sets_the_step_rows_not_the_tokens() {
    let (a, b) = (line("7"), line("64"));
    assert_eq!(a["chunk"], 7);
    assert_eq!(b["chunk"], 40, "a chunk past the prompt is the prompt");
    let toks = a["first_tokens"].as_array().unwrap();
    assert_eq!(toks.len(), 4);
    assert_eq!(a["first_tokens"], b["first_tokens"]);
    let bad = bench("0");
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("--chunk 0 is outside 1..=8192"), "{err}");
}
