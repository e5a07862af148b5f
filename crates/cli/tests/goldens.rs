//! Byte-exact greedy goldens (issue 3 item 4): the test model's greedy replies to the prompts
//! of `tests/fixtures/golden/prompts.json`, for the GGUF file and for its bf16 export, are
//! regenerated with the built binary (`tensorfold golden`, CPU backend, 32 new tokens) and must
//! equal the committed ones (`gguf.json`, `bf16.json` there) byte for byte: the same prompt
//! ids, the same token ids (and so the same `sha256`), the same text, the same stop reason.
//!
//! A difference made on purpose is declared in `tests/fixtures/golden/DECLARED.json`: an entry
//! names the golden (`gguf/fact_france`), the committed sha (`old`), the sha it changes to
//! (`new`) and why. A difference passes only when an entry matches it exactly (old -> new);
//! per golden, the entries must chain (each `old` the previous `new`) and end at the committed
//! sha (applied: the golden was regenerated) or start from it (pending: the regenerated sha must
//! be its `new`), so a stale or mistyped entry fails too.
//!
//! `scripts/regen-goldens.sh` runs this test with `TENSORFOLD_REGEN_GOLDENS=1`: it then writes
//! the goldens instead of failing on a difference, but only when every difference is declared
//! (an undeclared one prints the entry to add and fails, writing nothing for that checkpoint).
//!
//! `planted_one_token_change_is_caught` is the control: one token changed in a copy of a
//! committed golden must fail, and only an exactly matching declaration may let it pass.
//!
//! Alternative rejected: comparing decoded text only. Two token sequences can decode to the
//! same text, and a token id is what the engine produces; text is compared as well, because
//! it is what a user sees.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

const DIR: &str = "tests/fixtures/golden";
const MAX_TOKENS: usize = 32;
const REGEN_ENV: &str = "TENSORFOLD_REGEN_GOLDENS";
const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// One prompt's greedy generation, as `tensorfold golden` records it (less its step logits).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Golden {
    name: String,
    messages: Value,
    prompt_ids: Vec<u32>,
    tokens: Vec<u32>,
    text: String,
    stop: String,
    sha256: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GoldenFile {
    #[allow(dead_code)] // documentation for readers of the file
    about: String,
    checkpoint: String,
    max_new_tokens: usize,
    goldens: Vec<Golden>,
}

/// A difference made on purpose.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Declared {
    /// `<checkpoint>/<prompt name>`, e.g. `gguf/fact_france`.
    golden: String,
    old: String,
    new: String,
    reason: String,
    /// The commit that made the change, once known.
    #[serde(default)]
    commit: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeclaredFile {
    #[allow(dead_code)] // documentation for readers of the file
    about: String,
    declared: Vec<Declared>,
}

#[derive(Debug, PartialEq)]
enum Verdict {
    Same,
    Declared(String),
    /// No committed golden (regeneration of a new prompt only).
    New,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn model() -> PathBuf {
    let cache =
        std::env::var_os("TENSORFOLD_CACHE").map_or_else(|| repo().join(".cache"), PathBuf::from);
    let p = cache.join("models").join(MODEL_FILE);
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

/// Hex SHA-256 of token ids as consecutive little-endian u32 (as `tensorfold golden` states).
fn sha_hex(tokens: &[u32]) -> String {
    let mut h = Sha256::new();
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn is_sha(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The checkpoints with goldens: (tag, description, path). The bf16 export is made here, in
/// `tmp`, from the fetched GGUF, so a fresh machine needs nothing else.
fn checkpoints(tmp: &Path) -> Vec<(&'static str, String, PathBuf)> {
    let gguf = model();
    let export = tmp.join("bf16");
    tensorfold(&["export", gguf.to_str().unwrap(), "--out", export.to_str().unwrap()]);
    vec![
        ("gguf", format!("{MODEL_FILE} (scripts/fetch-model.sh), CPU backend"), gguf),
        ("bf16", format!("bf16 export of {MODEL_FILE} (tensorfold export), CPU backend"), export),
    ]
}

/// Regenerates the goldens of one checkpoint with the built binary.
fn generate(model: &Path, out: &Path) -> Vec<Golden> {
    let prompts = repo().join(DIR).join("prompts.json");
    let max = MAX_TOKENS.to_string();
    let (m, p, o) = (model.to_str().unwrap(), prompts.to_str().unwrap(), out.to_str().unwrap());
    tensorfold(&["golden", "-m", m, "--prompts", p, "--max-tokens", &max, "--out", o]);
    let doc: Value = serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap();
    let goldens: Vec<Golden> = serde_json::from_value(doc["prompts"].clone())
        .unwrap_or_else(|e| panic!("{}: every prompt needs a name: {e}", out.display()));
    for g in &goldens {
        assert_eq!(g.sha256, sha_hex(&g.tokens), "{}: `tensorfold golden` sha256", g.name);
    }
    goldens
}

fn load_committed(tag: &str) -> Option<GoldenFile> {
    let p = repo().join(DIR).join(format!("{tag}.json"));
    let bytes = std::fs::read(&p).ok()?;
    Some(serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
}

fn load_declared() -> Vec<Declared> {
    let p = repo().join(DIR).join("DECLARED.json");
    let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let f: DeclaredFile =
        serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    f.declared
}

/// Every declared entry is well formed, names a committed golden, and the entries of each
/// golden chain to its committed sha (applied) or from it (pending).
fn check_declared(declared: &[Declared], committed: &BTreeMap<String, String>) -> Vec<String> {
    let mut errors = Vec::new();
    let mut chains: BTreeMap<&str, Vec<&Declared>> = BTreeMap::new();
    for d in declared {
        if !is_sha(&d.old) || !is_sha(&d.new) || d.old == d.new || d.reason.trim().is_empty() {
            errors.push(format!(
                "{}: old/new must be two different 64-hex shas, with a reason: {d:?}",
                d.golden
            ));
        } else if !committed.contains_key(&d.golden) {
            errors.push(format!("{}: declared, but no such committed golden", d.golden));
        } else {
            chains.entry(&d.golden).or_default().push(d);
        }
    }
    for (key, chain) in chains {
        for w in chain.windows(2) {
            if w[1].old != w[0].new {
                errors.push(format!(
                    "{key}: entry {} -> {} does not follow {} -> {}",
                    w[1].old, w[1].new, w[0].old, w[0].new
                ));
            }
        }
        let (last, sha) = (chain[chain.len() - 1], &committed[key]);
        if last.new != *sha && last.old != *sha {
            errors.push(format!(
                "{key}: the last entry ({} -> {}) neither ends nor starts at the committed \
                 sha {sha}",
                last.old, last.new
            ));
        }
    }
    errors
}

/// The index of the first differing token (or the shorter length).
fn first_difference(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()))
}

/// Judges one regenerated golden against the committed one and the declared differences.
fn verdict(
    key: &str,
    old: Option<&Golden>,
    now: &Golden,
    declared: &[Declared],
) -> Result<Verdict, String> {
    if now.sha256 != sha_hex(&now.tokens) {
        return Err(format!(
            "{key}: sha256 {} is not the tokens' {}",
            now.sha256,
            sha_hex(&now.tokens)
        ));
    }
    let Some(old) = old else { return Ok(Verdict::New) };
    if old.messages != now.messages || old.prompt_ids != now.prompt_ids {
        return Err(format!(
            "{key}: the prompt changed (messages, tokenizer or chat template): prompt ids \
             {:?} -> {:?}; regenerate with scripts/regen-goldens.sh",
            old.prompt_ids, now.prompt_ids
        ));
    }
    if old.sha256 == now.sha256 {
        if old.tokens != now.tokens || old.text != now.text || old.stop != now.stop {
            return Err(format!(
                "{key}: same sha, different golden: tokens {:?} -> {:?}, text {:?} -> {:?}, \
                 stop {} -> {}",
                old.tokens, now.tokens, old.text, now.text, old.stop, now.stop
            ));
        }
        return Ok(Verdict::Same);
    }
    let hit =
        declared.iter().find(|d| d.golden == key && d.old == old.sha256 && d.new == now.sha256);
    if let Some(d) = hit {
        let commit = d.commit.as_deref().map_or(String::new(), |c| format!(", {c}"));
        return Ok(Verdict::Declared(format!("{}{commit}", d.reason)));
    }
    let i = first_difference(&old.tokens, &now.tokens);
    let (o, n) = (old.tokens.get(i), now.tokens.get(i));
    let entry = format!(
        "{{\"golden\": \"{key}\", \"old\": \"{}\", \"new\": \"{}\", \"reason\": \"...\"}}",
        old.sha256, now.sha256
    );
    Err(format!(
        "{key}: greedy output changed at token {i} ({o:?} -> {n:?}):\n  committed {} {:?}\n  \
         now       {} {:?}\n  if intended, declare in {DIR}/DECLARED.json: {entry}",
        old.sha256, old.text, now.sha256, now.text
    ))
}

/// Compact JSON of a value.
fn js<T: Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).unwrap()
}

/// Writes a golden file: one field per line, arrays inline, so diffs read per field.
fn write_goldens(tag: &str, checkpoint: &str, goldens: &[Golden]) {
    let mut s = String::from("{\n");
    s += " \"about\": \"Greedy goldens: made by scripts/regen-goldens.sh (tensorfold golden), \
          checked by crates/cli/tests/goldens.rs; see README.md.\",\n";
    s += &format!(" \"checkpoint\": {},\n", js(checkpoint));
    s += &format!(" \"max_new_tokens\": {MAX_TOKENS},\n \"goldens\": [\n");
    for (i, g) in goldens.iter().enumerate() {
        let fields = [
            ("name", js(&g.name)),
            ("messages", js(&g.messages)),
            ("prompt_ids", js(&g.prompt_ids)),
            ("tokens", js(&g.tokens)),
            ("text", js(&g.text)),
            ("stop", js(&g.stop)),
            ("sha256", js(&g.sha256)),
        ];
        let body: Vec<String> = fields.iter().map(|(k, v)| format!("   \"{k}\": {v}")).collect();
        let comma = if i + 1 < goldens.len() { "," } else { "" };
        s += &format!("  {{\n{}\n  }}{comma}\n", body.join(",\n"));
    }
    s += " ]\n}\n";
    let p = repo().join(DIR).join(format!("{tag}.json"));
    std::fs::write(&p, s).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    println!("wrote {}", p.display());
}

fn short(text: &str) -> String {
    let t: String = text.chars().take(48).collect();
    format!("{t:?}{}", if t.len() < text.len() { "..." } else { "" })
}

/// Regenerates one checkpoint's goldens and judges each; returns the failures. In
/// regeneration mode, writes the file when nothing failed.
fn check_checkpoint(
    (tag, about, path): &(&str, String, PathBuf),
    old: Option<&GoldenFile>,
    declared: &[Declared],
    tmp: &Path,
    regen: bool,
) -> Vec<String> {
    let mut failures = Vec::new();
    let now = generate(path, &tmp.join(format!("{tag}.json")));
    if let Some(f) = old {
        println!("{tag}: committed goldens of {}", f.checkpoint);
        assert_eq!(f.max_new_tokens, MAX_TOKENS, "{tag}.json: run scripts/regen-goldens.sh");
        for g in &f.goldens {
            if !regen && !now.iter().any(|n| n.name == g.name) {
                failures.push(format!("{tag}/{}: committed but not in prompts.json", g.name));
            }
        }
    }
    for g in &now {
        let key = format!("{tag}/{}", g.name);
        let prev = old.and_then(|f| f.goldens.iter().find(|c| c.name == g.name));
        let v = verdict(&key, prev, g, declared);
        let note = match &v {
            Ok(Verdict::Same) => "same".to_string(),
            Ok(Verdict::Declared(r)) => format!("DECLARED ({r})"),
            Ok(Verdict::New) => "NEW (not committed)".to_string(),
            Err(_) => "DIFFERS".to_string(),
        };
        let (sha, n, text) = (&g.sha256[..12], g.tokens.len(), short(&g.text));
        println!("{key:24} {sha} {n:2} tok {:6} {note:10} {text}", g.stop);
        match v {
            Ok(Verdict::New) if !regen => {
                failures.push(format!("{key}: no committed golden; run scripts/regen-goldens.sh"))
            }
            Err(e) => failures.push(e),
            Ok(_) => {}
        }
    }
    if regen && failures.is_empty() {
        write_goldens(tag, about, &now);
    }
    failures
}

#[test]
fn goldens_are_byte_exact() {
    let regen = std::env::var_os(REGEN_ENV).is_some();
    let declared = load_declared();
    let tmp = tempfile::tempdir().unwrap();
    let cks = checkpoints(tmp.path());
    let committed: BTreeMap<&str, GoldenFile> =
        cks.iter().filter_map(|(tag, ..)| Some((*tag, load_committed(tag)?))).collect();
    let shas: BTreeMap<String, String> = committed
        .iter()
        .flat_map(|(tag, f)| {
            f.goldens.iter().map(move |g| (format!("{tag}/{}", g.name), g.sha256.clone()))
        })
        .collect();
    let mut failures = check_declared(&declared, &shas);
    for ck in &cks {
        failures.extend(check_checkpoint(ck, committed.get(ck.0), &declared, tmp.path(), regen));
    }
    assert!(failures.is_empty(), "{} golden failure(s):\n{}", failures.len(), failures.join("\n"));
}

/// The control: a planted one-token change in a copy of a committed golden must fail, and only
/// an exactly matching declaration (old -> new sha) may let it pass.
#[test]
fn planted_one_token_change_is_caught() {
    let f = load_committed("gguf")
        .expect("tests/fixtures/golden/gguf.json missing: run scripts/regen-goldens.sh");
    let base = f.goldens.iter().max_by_key(|g| g.tokens.len()).unwrap();
    let key = format!("gguf/{}", base.name);
    let none: &[Declared] = &[];
    assert_eq!(verdict(&key, Some(base), base, none), Ok(Verdict::Same));

    let mut planted = base.clone();
    let i = planted.tokens.len() / 2;
    planted.tokens[i] ^= 1;
    planted.sha256 = sha_hex(&planted.tokens);
    let err = verdict(&key, Some(base), &planted, none).unwrap_err();
    println!("planted token {i}: {err}");
    assert!(err.contains(&key) && err.contains(&format!("at token {i} ")), "{err}");

    let decl = |golden: &str, old: &str, new: &str| Declared {
        golden: golden.to_string(),
        old: old.to_string(),
        new: new.to_string(),
        reason: "planted".to_string(),
        commit: None,
    };
    let exact = [decl(&key, &base.sha256, &planted.sha256)];
    assert_eq!(
        verdict(&key, Some(base), &planted, &exact),
        Ok(Verdict::Declared("planted".into()))
    );
    let wrong_new = [decl(&key, &base.sha256, &sha_hex(&[1, 2, 3]))];
    assert!(verdict(&key, Some(base), &planted, &wrong_new).is_err());
    let other_golden = [decl("bf16/other", &base.sha256, &planted.sha256)];
    assert!(verdict(&key, Some(base), &planted, &other_golden).is_err());
    let reversed = [decl(&key, &planted.sha256, &base.sha256)];
    assert!(verdict(&key, Some(base), &planted, &reversed).is_err());

    // A token changed without its sha, or text alone changed, is caught too.
    let mut stale_sha = planted.clone();
    stale_sha.sha256 = base.sha256.clone();
    assert!(verdict(&key, Some(base), &stale_sha, none).is_err());
    let mut text = base.clone();
    text.text.push('!');
    assert!(verdict(&key, Some(base), &text, none).is_err());

    // The declared list's chain rule: pending and applied entries pass, a stale one fails.
    let shas = BTreeMap::from([(key.clone(), base.sha256.clone())]);
    assert!(check_declared(&exact, &shas).is_empty(), "pending");
    let applied = [decl(&key, &sha_hex(&[7]), &base.sha256)];
    assert!(check_declared(&applied, &shas).is_empty(), "applied");
    let stale = [decl(&key, &sha_hex(&[7]), &sha_hex(&[8]))];
    assert_eq!(check_declared(&stale, &shas).len(), 1, "stale");
    let broken =
        [decl(&key, &sha_hex(&[7]), &sha_hex(&[8])), decl(&key, &sha_hex(&[9]), &base.sha256)];
    assert_eq!(check_declared(&broken, &shas).len(), 1, "broken chain");
    assert_eq!(check_declared(&[decl("gguf/nope", &base.sha256, &planted.sha256)], &shas).len(), 1);
}
