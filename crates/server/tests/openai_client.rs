//! The official `openai` Python client against a live server over the fake engine
//! (tests/clients/openai_client.py): the wire format is what real clients parse. Needs
//! python3 with `openai` installed (`pip install openai`); without it the test fails saying
//! so, never skips.

mod common;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_client_works() {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = std::process::Command::new(&python).args(["-c", "import openai"]).output();
    match probe {
        Ok(out) if out.status.success() => {}
        _ => {
            panic!("`{python} -c 'import openai'` failed: run `pip install openai` (or set PYTHON)")
        }
    }
    let want = "Hello from the fake engine.";
    let engine = FakeEngine::new(Script::Say(ids(want)));
    let mut cfg = config();
    cfg.api_key = Some("test-key".into());
    let live = live(&engine, cfg).await;
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/openai_client.py");
    let base = format!("http://{}/v1", live.addr);
    let out = tokio::process::Command::new(&python)
        .arg(&script)
        .args([base.as_str(), "test-key", "smollm2-test", want])
        .output()
        .await
        .expect("run python");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
