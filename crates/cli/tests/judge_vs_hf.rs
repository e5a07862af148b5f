//! The teacher-forced judge (`tensorfold judge`, DESIGN.md §2) through the real binary on the
//! real test model, against the committed HF reference fixture
//! `tests/fixtures/judge/ref_short_gguf_bf16.json` (HF transformers bf16, sdpa, on the GGUF
//! dequantized and cast to bf16; 384 positions = the first 128 ids of the chat, code and prose
//! segments of `tools/reference/history/`; top-64 + lse per position; made by
//! `tools/reference/hf_logits.py`, versions in `tests/fixtures/judge/README.md`).
//!
//! Two paths, each judged with the float64 pass (`--f64`):
//! - the bf16 checkpoint: the GGUF exported with `tensorfold export` (bf16 of the exact
//!   dequantized weights, the same weights HF runs);
//! - the GGUF itself (Q4_1 products on the exact dequantized weights; HF's reference rounds
//!   those weights to bf16 first, so the two compute on slightly different weights).
//!
//! Bounds held, and why (figures measured on this fixture, same judge, same method):
//! - KL is the top-k + rest lower bound (no full rows in a small fixture). The yardstick is the
//!   reference against itself: HF bf16 eager judged against HF bf16 sdpa measures 0.00160
//!   (exact: 0.00188), top-1 97.40%, 2 differences failing the near-tie rule. The engine
//!   measured 0.00153 / 96.88% (bf16 export) and 0.00162 / 98.18% (GGUF). Held: mean KL
//!   <= 0.0020 (bf16 export) and <= 0.0022 (GGUF: quantized products may differ more), top-1
//!   >= 96.0% on both.
//! - Against float64 (the same family in f64 on the same weights): the engine is no further
//!   from float64 than the HF reference is: KL(f64 || engine) <= 1.25 x KL(f64 || HF) on the
//!   same coarse-graining (measured 1.12 bf16 export, 0.98 GGUF), and float64's top-1 is the
//!   engine's at no more than 4 fewer positions (1%) than it is HF's.
//! - Every difference that fails the bf16 near-tie rule is a near-tie in float64: the two
//!   contenders are within one bf16 step in the model computed exactly, so neither order is
//!   an error of the engine's arithmetic.
//! - The exit status is 1 exactly when the judge counted a failure, and the receipt is the
//!   last line of stdout.
//!
//! NOT held: the targets (mean KL <= 0.0015, top-1 >= 99.0%, every difference a
//! near-tie). HF's own bf16 runs (sdpa vs eager) miss them on this fixture and on the
//! 2,174-position history (tools/reference/README.md, "judge"), so no independent bf16
//! implementation can be held to them.
//!
//! Control: the same reference with the history shifted by one token must break the bounds
//! (KL above 10x the bound, top-1 below 50%).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const FIXTURE: &str = "tests/fixtures/judge/ref_short_gguf_bf16.json";
const POSITIONS: u64 = 384;

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

/// A judge run: the report JSON, whether it exited 0, and stdout.
struct Run {
    report: Value,
    ok: bool,
    stdout: String,
}

fn judge(reference: &Path, model: &Path, f64: bool, dir: &Path, tag: &str) -> Run {
    let json = dir.join(format!("{tag}.json"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tensorfold"));
    cmd.args(["judge", "--reference"]).arg(reference).arg("-m").arg(model).arg("--json").arg(&json);
    if f64 {
        cmd.arg("--f64");
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let text = std::fs::read_to_string(&json).unwrap_or_else(|e| {
        panic!("{tag}: no report ({e}):\n{stdout}{}", String::from_utf8_lossy(&out.stderr))
    });
    Run { report: serde_json::from_str(&text).unwrap(), ok: out.status.success(), stdout }
}

fn f(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("report field {key} missing: {v}"))
}

/// The bounds stated in the module doc.
fn hold(tag: &str, run: &Run, max_kl: f64) {
    let r = &run.report;
    println!("{tag}: {}", run.stdout.lines().last().unwrap_or(""));
    assert_eq!(r["positions"], POSITIONS, "{tag}");
    assert_eq!(r["kl_method"], "topk_rest", "{tag}");
    let receipt = run.stdout.lines().last().unwrap();
    assert!(receipt.starts_with("judge: positions 384 | mean KL"), "{tag}: {receipt}");
    let diffs = r["differences"].as_array().unwrap();
    let failures = diffs.iter().filter(|d| d["verdict"]["kind"] != "near_tie").count();
    assert_eq!(run.ok, failures == 0, "{tag}: exit status vs {failures} failures");
    let top1 = 100.0 * f(r, "top1_agree") / POSITIONS as f64;
    assert!(f(r, "mean_kl") <= max_kl, "{tag}: mean KL {} > {max_kl}", f(r, "mean_kl"));
    assert!(top1 >= 96.0, "{tag}: top-1 {top1:.2}% < 96.0%");
    let x = &r["float64"];
    let (to_ref, to_eng) = (f(x, "kl_to_reference"), f(x, "kl_to_engine"));
    assert!(to_eng <= 1.25 * to_ref, "{tag}: KL(f64||engine) {to_eng} vs (f64||HF) {to_ref}");
    let (t_ref, t_eng) = (f(x, "top1_reference"), f(x, "top1_engine"));
    assert!(t_eng + 4.0 >= t_ref, "{tag}: float64 top-1 = engine {t_eng}, = HF {t_ref}");
    for d in diffs.iter().filter(|d| d["verdict"]["kind"] != "near_tie") {
        assert_eq!(d["float64_near_tie"], true, "{tag}: not a near-tie even in float64: {d}");
    }
}

#[test]
fn judge_bf16_export_and_gguf_against_hf_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let (m, fixture) = (model(), repo().join(FIXTURE));
    let export = dir.path().join("bf16");
    let out = Command::new(env!("CARGO_BIN_EXE_tensorfold"))
        .args(["export", m.to_str().unwrap(), "--out", export.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "export: {}", String::from_utf8_lossy(&out.stderr));
    let bf16 = judge(&fixture, &export, true, dir.path(), "bf16");
    let gguf = judge(&fixture, &m, true, dir.path(), "gguf");
    hold("bf16 export", &bf16, 0.0020);
    hold("gguf", &gguf, 0.0022);
}

#[test]
fn judge_control_shifted_history_breaks_the_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(repo().join(FIXTURE)).unwrap();
    let mut doc: Value = serde_json::from_str(&text).unwrap();
    let tokens = doc["tokens"].as_array_mut().unwrap();
    tokens.rotate_left(1);
    let shifted = dir.path().join("shifted.json");
    std::fs::write(&shifted, serde_json::to_string(&doc).unwrap()).unwrap();
    let run = judge(&shifted, &model(), false, dir.path(), "shifted");
    let r = &run.report;
    println!("control: {}", run.stdout.lines().last().unwrap_or(""));
    assert!(f(r, "mean_kl") > 0.02, "control KL {} not above 10x the bound", f(r, "mean_kl"));
    assert!(f(r, "top1_agree") < POSITIONS as f64 / 2.0, "control top-1 {}", r["top1_agree"]);
    assert!(!run.ok, "the control must fail the judge");
}
