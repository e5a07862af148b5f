//! A raw request body becomes a validated [`Plan`]: prompt token ids, sampling parameters,
//! limits, stop strings and response options. Nothing downstream re-checks a field.
//!
//! Invariants: every refusal is an [`ApiError`] naming the field (`param`) and what was wrong,
//! never a panic or a 500; numbers are range-checked before any cast (ranges mirror
//! `SamplingParams::validate`, which runs again as a backstop); `n`, `best_of` and features the
//! engine lacks (`logprobs`, `echo`, `suffix`, JSON mode, forced tool calls) are refused by
//! name rather than silently ignored. Unknown fields are ignored, as most OpenAI-compatible servers
//! do, so clients that send `user`, `store` or `metadata` work.
//! Rejected: `#[derive(Deserialize)]` request structs. serde's messages ("invalid type:
//! string, expected f32 at line 1 column 40") lose the field name OpenAI's `param` carries;
//! reading fields one by one from a `serde_json::Map` keeps it.

use serde_json::{Map, Value};
use tf_engine::serve::api::GenerateRequest;
use tf_engine::SamplingParams;
use tf_tokenizer::{ChatMessage, ChatRequest, ChatTemplate, TextCodec};

use crate::errors::ApiError;
use crate::fields::Fields;

/// Which OpenAI endpoint a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// What validation needs to know about the served model.
#[derive(Clone, Copy)]
pub struct ValidateCtx<'a> {
    pub model_id: &'a str,
    pub codec: &'a TextCodec,
    pub template: Option<&'a ChatTemplate>,
    /// Tokens that end a reply (EOS), unless the request sets `ignore_eos`.
    pub stop_tokens: &'a [u32],
    /// Longest prompt + completion, tokens.
    pub context: usize,
    /// Token ids a prompt may hold are `0..vocab_size`.
    pub vocab_size: usize,
    /// Sampling used for fields the request leaves out (the seed is drawn per request).
    pub defaults: &'a SamplingParams,
}

/// A validated request: what to submit, and how to answer.
#[derive(Clone, Debug)]
pub struct Plan {
    pub endpoint: Endpoint,
    pub request: GenerateRequest,
    /// Stop strings, matched on the detokenized text; none is empty.
    pub stop: Vec<String>,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk carries `usage`.
    pub include_usage: bool,
    /// Extension: token ids of the prompt and the completion in the response.
    pub return_token_ids: bool,
}

/// `max_tokens` of `/v1/completions` when absent (OpenAI's default for that endpoint).
pub const COMPLETION_DEFAULT_MAX_TOKENS: usize = 16;
/// Most stop strings per request, and the longest one, bytes.
pub const MAX_STOP_STRINGS: usize = 16;
pub const MAX_STOP_BYTES: usize = 1024;
/// Most `logit_bias` entries per request.
pub const MAX_LOGIT_BIAS: usize = 1024;

/// Validates a request body for `endpoint`.
pub fn plan(endpoint: Endpoint, body: &[u8], ctx: &ValidateCtx<'_>) -> Result<Plan, ApiError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::MalformedJson(e.to_string()))?;
    let Value::Object(map) = value else {
        return Err(ApiError::MalformedJson("the body must be a JSON object".into()));
    };
    let f = Fields(&map);
    if let Some(model) = f.str("model")? {
        if model != ctx.model_id {
            return Err(ApiError::ModelNotFound {
                requested: model.to_string(),
                served: ctx.model_id.to_string(),
            });
        }
    }
    refuse_unsupported(&f, endpoint)?;
    let prompt = match endpoint {
        Endpoint::Chat => chat_prompt(&f, ctx)?,
        Endpoint::Completion => completion_prompt(&f, ctx)?,
    };
    if prompt.is_empty() {
        return Err(ApiError::field("prompt", "the prompt is empty (it encodes to no tokens)"));
    }
    let max_tokens = max_tokens(&f, endpoint, prompt.len(), ctx.context)?;
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.object("stream_options")? {
        Some(o) => Fields(o).bool("include_usage")?.unwrap_or(false),
        None => false,
    };
    f.bool("draft")?; // accepted; drafting is not wired yet and changes no token anyway
    let stop_tokens =
        if f.bool("ignore_eos")?.unwrap_or(false) { Vec::new() } else { ctx.stop_tokens.to_vec() };
    Ok(Plan {
        endpoint,
        request: GenerateRequest {
            prompt,
            max_tokens,
            sampling: sampling(&f, ctx.defaults, ctx.vocab_size)?,
            stop_tokens,
            use_prompt_cache: true,
        },
        stop: stop_strings(&f)?,
        stream,
        include_usage,
        return_token_ids: f.bool("return_token_ids")?.unwrap_or(false),
    })
}

/// Fields with a meaning the engine cannot honour: refused unless set to their neutral value.
fn refuse_unsupported(f: &Fields<'_>, endpoint: Endpoint) -> Result<(), ApiError> {
    let unsupported = |param: &str, what: &str| {
        Err(ApiError::field(param, format!("`{param}` {what} is not supported by this server")))
    };
    for param in ["n", "best_of"] {
        if f.uint(param, 0, u64::MAX)?.is_some_and(|n| n != 1) {
            return Err(ApiError::field(param, format!("`{param}` must be 1 (one choice)")));
        }
    }
    match endpoint {
        Endpoint::Chat => {
            if f.bool("logprobs")? == Some(true) {
                return unsupported("logprobs", "= true");
            }
            if f.uint("top_logprobs", 0, u64::MAX)?.is_some_and(|n| n > 0) {
                return unsupported("top_logprobs", "> 0");
            }
            match f.get("tool_choice") {
                None => {}
                Some(Value::String(s)) if s == "none" || s == "auto" => {}
                Some(_) => return unsupported("tool_choice", "other than \"none\" or \"auto\""),
            }
        }
        Endpoint::Completion => {
            if f.uint("logprobs", 0, u64::MAX)?.is_some_and(|n| n > 0) {
                return unsupported("logprobs", "> 0");
            }
            if f.bool("echo")? == Some(true) {
                return unsupported("echo", "= true");
            }
            if f.str("suffix")?.is_some_and(|s| !s.is_empty()) {
                return unsupported("suffix", "");
            }
        }
    }
    if let Some(format) = f.object("response_format")? {
        if Fields(format).str("type")? != Some("text") {
            return unsupported("response_format", "other than {\"type\": \"text\"}");
        }
    }
    Ok(())
}

fn max_tokens(
    f: &Fields<'_>,
    endpoint: Endpoint,
    prompt: usize,
    context: usize,
) -> Result<usize, ApiError> {
    let cap = context.max(1) as u64;
    let asked = match f.uint("max_completion_tokens", 1, cap)? {
        Some(n) => Some(n),
        None => f.uint("max_tokens", 1, cap)?,
    };
    Ok(match (asked, endpoint) {
        // Bounded by `cap`, a usize, above.
        (Some(n), _) => n as usize,
        (None, Endpoint::Completion) => COMPLETION_DEFAULT_MAX_TOKENS,
        // The rest of the context; at least 1, so a full prompt is refused as too long.
        (None, Endpoint::Chat) => context.saturating_sub(prompt).max(1),
    })
}

/// OpenAI's `logit_bias`: a map from token ids (as strings) to biases in -100..=100, added to
/// the logits before sampling. Returned ascending by id; an id named twice ("7" and "07") is
/// refused.
fn logit_bias(f: &Fields<'_>, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(map) = f.object("logit_bias")? else { return Ok(Vec::new()) };
    let field = |msg: String| ApiError::field("logit_bias", msg);
    if map.len() > MAX_LOGIT_BIAS {
        return Err(field(format!(
            "`logit_bias` has {} entries, at most {MAX_LOGIT_BIAS}",
            map.len()
        )));
    }
    let mut out = Vec::with_capacity(map.len());
    for (k, v) in map {
        let id = k.parse::<u32>().ok().filter(|&id| (id as usize) < vocab).ok_or_else(|| {
            field(format!("`logit_bias` key {k:?} is not a token id below {vocab}"))
        })?;
        let b = v.as_f64().filter(|b| (-100.0..=100.0).contains(b)).ok_or_else(|| {
            field(format!("`logit_bias[{k:?}]` must be a number from -100 to 100, got {v}"))
        })?;
        out.push((id, b as f32));
    }
    out.sort_by_key(|e| e.0);
    if let Some(w) = out.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(field(format!("`logit_bias` names token {} twice", w[0].0)));
    }
    Ok(out)
}

fn sampling(
    f: &Fields<'_>,
    defaults: &SamplingParams,
    vocab: usize,
) -> Result<SamplingParams, ApiError> {
    let d = defaults;
    let top_k = match f.int("top_k", -1, i64::from(u32::MAX))? {
        None => d.top_k,
        Some(k) if k <= 0 => 0, // -1 (vLLM) and 0 both mean off
        Some(k) => k as usize,  // 1..=u32::MAX, checked above
    };
    let top_p = f.float("top_p", 0.0, 1.0)?.unwrap_or(d.top_p);
    if top_p <= 0.0 {
        return Err(ApiError::field("top_p", "`top_p` must be greater than 0 (at most 1)"));
    }
    let repetition_penalty = f.float("repetition_penalty", 0.0, 10.0)?;
    if repetition_penalty.is_some_and(|r| r <= 0.0) {
        let msg = "`repetition_penalty` must be greater than 0 (at most 10)";
        return Err(ApiError::field("repetition_penalty", msg));
    }
    let params = SamplingParams {
        temperature: f.float("temperature", 0.0, 100.0)?.unwrap_or(d.temperature),
        top_k,
        top_p,
        min_p: f.float("min_p", 0.0, 1.0)?.unwrap_or(d.min_p),
        repetition_penalty: repetition_penalty.unwrap_or(d.repetition_penalty),
        presence_penalty: f.float("presence_penalty", -2.0, 2.0)?.unwrap_or(d.presence_penalty),
        frequency_penalty: f.float("frequency_penalty", -2.0, 2.0)?.unwrap_or(d.frequency_penalty),
        logit_bias: logit_bias(f, vocab)?,
        seed: match f.seed("seed")? {
            Some(s) => s,
            None => random_seed(),
        },
    };
    params.validate().map_err(|e| ApiError::BadRequest(e.to_string()))?;
    Ok(params)
}

/// A seed from the system RNG: std's `RandomState` keys come from the OS's randomness (once
/// per thread, then stepped), and hashing a fresh one yields an unpredictable u64. Not
/// reported back: a client that wants reproducibility sends its own seed.
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x7466_7365_6564); // any constant; the key is what is random
    h.finish()
}

fn stop_strings(f: &Fields<'_>) -> Result<Vec<String>, ApiError> {
    let list: Vec<&Value> = match f.get("stop") {
        None => return Ok(Vec::new()),
        Some(v @ Value::String(_)) => vec![v],
        Some(Value::Array(items)) => items.iter().collect(),
        Some(_) => return Err(ApiError::field("stop", "`stop` must be a string or a list")),
    };
    if list.len() > MAX_STOP_STRINGS {
        let msg = format!("`stop` holds {} strings; at most {MAX_STOP_STRINGS}", list.len());
        return Err(ApiError::field("stop", msg));
    }
    list.into_iter()
        .map(|v| match v {
            Value::String(s) if !s.is_empty() && s.len() <= MAX_STOP_BYTES => Ok(s.clone()),
            _ => Err(ApiError::field(
                "stop",
                format!(
                    "each stop string must be a non-empty string of at most {MAX_STOP_BYTES} bytes"
                ),
            )),
        })
        .collect()
}

/// `/v1/completions`: `prompt` as text, one-element list of text, token ids, or one list of
/// token ids. Text is encoded with the checkpoint's own specials (BOS where it adds one).
fn completion_prompt(f: &Fields<'_>, ctx: &ValidateCtx<'_>) -> Result<Vec<u32>, ApiError> {
    let one_prompt = || ApiError::field("prompt", "only one prompt per request is supported");
    let bad_shape = || {
        ApiError::field("prompt", "`prompt` must be a string, a list of one string, or token ids")
    };
    let encode = |text: &str| {
        ctx.codec.encode(text, true).map_err(|e| ApiError::field("prompt", e.to_string()))
    };
    match f.get("prompt") {
        None => Err(ApiError::field("prompt", "`prompt` is required")),
        Some(Value::String(s)) => encode(s),
        Some(Value::Array(items)) => match items.as_slice() {
            [] => Err(ApiError::field("prompt", "`prompt` is an empty list")),
            [Value::String(s)] => encode(s),
            [Value::Array(ids)] => token_ids(ids, ctx.vocab_size),
            [Value::Number(_), ..] => token_ids(items, ctx.vocab_size),
            [Value::String(_) | Value::Array(_), ..] => Err(one_prompt()),
            _ => Err(bad_shape()),
        },
        Some(_) => Err(bad_shape()),
    }
}

fn token_ids(items: &[Value], vocab_size: usize) -> Result<Vec<u32>, ApiError> {
    items
        .iter()
        .map(|v| match v.as_u64() {
            Some(id) if id < vocab_size as u64 => Ok(id as u32), // < vocab_size <= u32 range
            _ => Err(ApiError::field(
                "prompt",
                format!("token ids must be integers from 0 to {}, got {v}", vocab_size - 1),
            )),
        })
        .collect()
}

/// `/v1/chat/completions`: the messages rendered with the chat template, then encoded
/// without added specials (the template writes them), as transformers'
/// `apply_chat_template(tokenize=True)` does.
fn chat_prompt(f: &Fields<'_>, ctx: &ValidateCtx<'_>) -> Result<Vec<u32>, ApiError> {
    let Some(template) = ctx.template else {
        return Err(ApiError::BadRequest(
            "this model has no chat template: use /v1/completions, or start the server with \
             --chat-template FILE"
                .into(),
        ));
    };
    let messages = match f.get("messages") {
        Some(Value::Array(list)) if !list.is_empty() => list,
        Some(Value::Array(_)) => return Err(ApiError::field("messages", "`messages` is empty")),
        Some(_) => return Err(ApiError::field("messages", "`messages` must be a list")),
        None => return Err(ApiError::field("messages", "`messages` is required")),
    };
    let messages = messages
        .iter()
        .enumerate()
        .map(|(i, m)| chat_message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let tools = match f.get("tools") {
        None => None,
        Some(t @ Value::Array(_)) => Some(t.clone()),
        Some(_) => return Err(ApiError::field("tools", "`tools` must be a list")),
    };
    let extra = f.object("chat_template_kwargs")?.cloned().unwrap_or_default();
    let request = ChatRequest {
        messages,
        tools,
        add_generation_prompt: f.bool("add_generation_prompt")?.unwrap_or(true),
        extra,
    };
    // A template that refuses the conversation (`raise_exception`) is the client's error.
    let text = template.render(&request).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    ctx.codec.encode(&text, false).map_err(|e| ApiError::field("messages", e.to_string()))
}

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

fn chat_message(i: usize, value: &Value) -> Result<ChatMessage, ApiError> {
    let param = |key: &str| format!("messages[{i}].{key}");
    let Value::Object(map) = value else {
        return Err(ApiError::field(&format!("messages[{i}]"), "each message must be an object"));
    };
    let role = match map.get("role") {
        Some(Value::String(r)) if ROLES.contains(&r.as_str()) => r.as_str(),
        Some(Value::String(r)) => {
            let msg = format!("unknown role `{r}`; expected one of {}", ROLES.join(", "));
            return Err(ApiError::field(&param("role"), msg));
        }
        _ => return Err(ApiError::field(&param("role"), "`role` is required (a string)")),
    };
    let content = match map.get("content") {
        None | Some(Value::Null) if role == "assistant" => None,
        None | Some(Value::Null) => {
            return Err(ApiError::field(&param("content"), "`content` is required"));
        }
        Some(Value::String(s)) => Some(Value::String(s.clone())),
        Some(Value::Array(parts)) => Some(Value::String(text_parts(parts, &param("content"))?)),
        Some(_) => {
            let msg = "`content` must be a string or a list of text parts";
            return Err(ApiError::field(&param("content"), msg));
        }
    };
    let string = |key: &str| -> Result<Option<String>, ApiError> {
        match map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(ApiError::field(&param(key), format!("`{key}` must be a string"))),
        }
    };
    let tool_calls = match map.get("tool_calls") {
        None | Some(Value::Null) => None,
        Some(v @ Value::Array(_)) => Some(v.clone()),
        Some(_) => return Err(ApiError::field(&param("tool_calls"), "must be a list")),
    };
    let known = ["role", "content", "name", "tool_calls", "tool_call_id"];
    let extra: Map<String, Value> = map
        .iter()
        .filter(|(k, _)| !known.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok(ChatMessage {
        // OpenAI's `developer` is the newer name of `system`; templates know only `system`.
        role: if role == "developer" { "system".into() } else { role.into() },
        content,
        name: string("name")?,
        tool_calls,
        tool_call_id: string("tool_call_id")?,
        extra,
    })
}

/// A content list of `{"type": "text", "text": ...}` parts, joined with newlines (as vLLM
/// flattens them for string-content templates). Images and audio are refused.
fn text_parts(parts: &[Value], param: &str) -> Result<String, ApiError> {
    let mut texts = Vec::with_capacity(parts.len());
    for part in parts {
        let p = part.as_object().map(Fields);
        let kind = match &p {
            Some(p) => p.str("type").ok().flatten(),
            None => None,
        };
        match (kind, p.as_ref().and_then(|p| p.get("text"))) {
            (Some("text"), Some(Value::String(t))) => texts.push(t.as_str()),
            (Some(other), _) if other != "text" => {
                let msg = format!("content parts of type `{other}` are not supported (text only)");
                return Err(ApiError::field(param, msg));
            }
            _ => {
                let msg = "each content part must be {\"type\": \"text\", \"text\": \"...\"}";
                return Err(ApiError::field(param, msg));
            }
        }
    }
    Ok(texts.join("\n"))
}
