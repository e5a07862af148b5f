//! Fidelity on the real test model, through the real binary: greedy generations of the GGUF
//! and of its bf16 export equal HF transformers' (fixtures made by
//! `tools/reference/hf_greedy.py`), or first differ at a near-tie on both sides, as judged by
//! `tools/reference/compare_greedy.py` (whose own planted controls run in `scripts/test.sh`).

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn model() -> PathBuf {
    let cache =
        std::env::var_os("TENSORFOLD_CACHE").map_or_else(|| repo().join(".cache"), PathBuf::from);
    let p = cache.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.is_file(), "test model missing at {}: run scripts/fetch-model.sh", p.display());
    p
}

fn tensorfold(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tensorfold")).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "tensorfold {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn compare(reference: &str, engine: &Path) {
    let r = repo();
    let out = Command::new("python3")
        .arg(r.join("tools/reference/compare_greedy.py"))
        .arg(r.join("tests/fixtures/reference").join(reference))
        .arg(engine)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(
        out.status.success(),
        "compare_greedy failed against {reference}:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn golden(model: &Path, out: &Path) {
    let prompts = repo().join("tools/reference/prompts.json");
    tensorfold(&[
        "golden",
        "-m",
        model.to_str().unwrap(),
        "--prompts",
        prompts.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
}

#[test]
fn gguf_france_reply_is_the_reference_reply() {
    let m = model();
    let out = tensorfold(&[
        "run",
        "-m",
        m.to_str().unwrap(),
        "--chat",
        "-p",
        "What is the capital of France?",
        "--max-tokens",
        "24",
    ]);
    assert_eq!(out.trim(), "The capital of France is Paris.");
}

#[test]
fn gguf_and_bf16_export_greedy_match_hf() {
    let dir = tempfile::tempdir().unwrap();
    let m = model();
    let gguf_json = dir.path().join("gguf.json");
    golden(&m, &gguf_json);
    compare("greedy_gguf_f32.json", &gguf_json);
    let export = dir.path().join("bf16");
    tensorfold(&["export", m.to_str().unwrap(), "--out", export.to_str().unwrap()]);
    let info = tensorfold(&["info", export.to_str().unwrap()]);
    assert!(info.contains("admitted"), "{info}");
    let bf16_json = dir.path().join("bf16.json");
    golden(&export, &bf16_json);
    compare("greedy_gguf_bf16.json", &bf16_json);
}
