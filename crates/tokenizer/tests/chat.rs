//! Chat templates against transformers' apply_chat_template(tokenize=False) on the fixture
//! conversations (tests/fixtures/chat_templates.json, tools/fixtures/chat_templates.py): the
//! test model's own template and three written for the fixture (tools, tool calls, generation
//! blocks, tojson options, Python string methods, loop controls, raise_exception).

mod common;

use common::{checkpoint, fixture, smollm_codec};
use serde_json::Value;
use tf_tokenizer::{ChatMessage, ChatRequest, ChatTemplate, TokenizerError};

fn request(case: &Value) -> ChatRequest {
    ChatRequest {
        messages: serde_json::from_value(case["messages"].clone()).expect("messages"),
        tools: Some(case["tools"].clone()).filter(|t| !t.is_null()),
        add_generation_prompt: case["add_generation_prompt"].as_bool().expect("agp"),
        extra: case["extra"].as_object().cloned().unwrap_or_default(),
    }
}

fn template(doc: &Value, name: &str) -> ChatTemplate {
    let source = doc["templates"][name].as_str().expect("template source");
    smollm_codec().chat_template(source).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn renders_match_transformers() {
    let doc = fixture("chat_templates.json");
    let cases = doc["conversations"].as_array().expect("conversations");
    let mut checked = 0;
    for (i, case) in cases.iter().enumerate() {
        let name = case["template"].as_str().expect("template");
        let got = template(&doc, name).render(&request(case));
        match (&case["rendered"], &case["error"]) {
            (Value::String(want), _) => {
                let got = got.unwrap_or_else(|e| panic!("case {i} ({name}): {e}"));
                assert_eq!(&got, want, "case {i} ({name})");
            }
            (_, Value::String(want)) => match got {
                Err(TokenizerError::Template { stage: "render", message }) => {
                    assert!(
                        message.starts_with(want.as_str()),
                        "case {i}: {message:?} vs {want:?}"
                    );
                }
                other => panic!("case {i} ({name}): expected error {want:?}, got {other:?}"),
            },
            _ => continue, // checked against the clock below
        }
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} conversations compared");
}

/// The one conversation the fixture cannot pin: `strftime_now("%d %b %Y")` is today's date.
#[test]
fn strftime_now_is_todays_date() {
    let doc = fixture("chat_templates.json");
    let case = doc["conversations"]
        .as_array()
        .expect("conversations")
        .iter()
        .find(|c| c["rendered"].is_null() && c["error"].is_null())
        .expect("the clock case");
    let before = chrono::Local::now().format("%d %b %Y").to_string();
    let got = template(&doc, "llama_style").render(&request(case)).expect("render");
    let after = chrono::Local::now().format("%d %b %Y").to_string();
    assert!(
        got.contains(&format!("Today Date: {before}\n"))
            || got.contains(&format!("Today Date: {after}\n")),
        "{got}"
    );
}

/// The checkpoint's own template (from GGUF metadata) renders as the fixture's smollm2 cases.
#[test]
fn checkpoint_template_is_the_fixtures() {
    let doc = fixture("chat_templates.json");
    let source = checkpoint().chat_template.as_deref().expect("GGUF has a chat template");
    assert_eq!(source, doc["templates"]["smollm2"].as_str().expect("smollm2"));
    let tpl = smollm_codec().chat_template(source).expect("compile");
    let req = ChatRequest {
        messages: vec![ChatMessage::new("user", "Hello!")],
        add_generation_prompt: true,
        ..Default::default()
    };
    let want = doc["conversations"][0]["rendered"].as_str().expect("case 0");
    assert_eq!(tpl.render(&req).expect("render"), want);
}

#[test]
fn special_tokens_reach_the_template() {
    let tpl = smollm_codec()
        .chat_template("{{ bos_token }}|{{ eos_token }}|{{ pad_token }}")
        .expect("compile");
    assert_eq!(
        tpl.render(&ChatRequest::default()).expect("render"),
        "<|im_start|>|<|im_end|>|<|im_end|>"
    );
    // Extra variables override them, as template kwargs do in transformers.
    let mut req = ChatRequest::default();
    req.extra.insert("bos_token".into(), Value::String("B".into()));
    assert_eq!(tpl.render(&req).expect("render"), "B|<|im_end|>|<|im_end|>");
}

#[test]
fn syntax_errors_are_reported_at_compile_time() {
    let err = ChatTemplate::new("{% for x in %}").expect_err("bad template");
    assert!(matches!(err, TokenizerError::Template { stage: "compile", .. }), "{err}");
}
