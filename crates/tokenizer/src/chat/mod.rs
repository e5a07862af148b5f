//! Chat templates: the Jinja template a checkpoint ships, rendered as transformers'
//! `apply_chat_template(..., tokenize=False)` renders it.
//!
//! The environment matches transformers' (utils/chat_template_utils.py): trim_blocks and
//! lstrip_blocks on, trailing newline dropped, loop controls, `raise_exception`,
//! `strftime_now`, a `tojson` that is Python's `json.dumps` (see `pyjson`), Python string/dict
//! methods (minijinja-contrib pycompat), and `{% generation %}` blocks rendered as plain
//! content. The variables match too: `messages` (with None-valued keys dropped, and
//! `reasoning_content` / `thinking` filled from each other, as transformers does), `tools`,
//! `documents` (None), `add_generation_prompt`, the special token strings (`bos_token`, ...)
//! and any extra variables, which override the special tokens. Jinja2 prints None, True and
//! False as `None`, `True`, `False`; so does the formatter here.
//!
//! Rejected: a Python subprocess or a Jinja2 reimplementation. minijinja is a Jinja2 dialect
//! with a sandboxed, side-effect-free evaluator; the differences that matter for chat templates
//! are bridged here and checked against transformers on fixtures
//! (tools/fixtures/chat_templates.py).

mod pyjson;

use std::fmt::Write;

use minijinja::value::{from_args, Kwargs, Rest, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Output, State};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

use crate::codec::SpecialTokens;
use crate::error::{Result, TokenizerError};

/// One chat message as the OpenAI API and HF templates know it. Fields other than these pass
/// through `extra` to the template unchanged.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    /// A string, a list of content parts, or absent/null (an assistant turn with tool calls).
    #[serde(default)]
    pub content: Option<Json>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Json>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Json>,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage {
            role: role.into(),
            content: Some(Json::String(content.into())),
            ..Default::default()
        }
    }
}

/// What a template is rendered with.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    /// JSON schemas of the tools (a list), or None.
    #[serde(default)]
    pub tools: Option<Json>,
    #[serde(default)]
    pub add_generation_prompt: bool,
    /// Extra template variables (`enable_thinking`, `date_string`, ...).
    #[serde(default)]
    pub extra: Map<String, Json>,
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    specials: Map<String, Json>,
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles a template; syntax errors are reported here, not at render time.
    pub fn new(source: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python_formatter);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, rewrite_generation_tags(source))
            .map_err(|e| TokenizerError::Template { stage: "compile", message: describe(&e) })?;
        Ok(ChatTemplate { env, specials: Map::new() })
    }

    /// Makes `bos_token`, `eos_token`, `unk_token` and `pad_token` visible to the template.
    pub fn with_special_tokens(mut self, specials: &SpecialTokens) -> Self {
        let tokens = [
            ("bos_token", &specials.bos),
            ("eos_token", &specials.eos),
            ("unk_token", &specials.unk),
            ("pad_token", &specials.pad),
        ];
        for (name, token) in tokens {
            if let Some(t) = token {
                self.specials.insert(name.into(), Json::String(t.text.clone()));
            }
        }
        self
    }

    /// Renders the prompt text for a conversation.
    pub fn render(&self, request: &ChatRequest) -> Result<String> {
        let render_err =
            |e: Error| TokenizerError::Template { stage: "render", message: describe(&e) };
        let mut ctx = Map::new();
        ctx.insert("messages".into(), Json::Array(template_messages(&request.messages)));
        ctx.insert("tools".into(), request.tools.clone().unwrap_or(Json::Null));
        ctx.insert("documents".into(), Json::Null);
        ctx.insert("add_generation_prompt".into(), Json::Bool(request.add_generation_prompt));
        for (k, v) in self.specials.iter().chain(request.extra.iter()) {
            ctx.insert(k.clone(), v.clone());
        }
        let template = self.env.get_template(NAME).map_err(render_err)?;
        template.render(Value::from_serialize(&ctx)).map_err(render_err)
    }
}

/// Messages as transformers hands them to the template: keys holding None dropped, and a
/// message's reasoning (`reasoning_content`, `thinking` or `reasoning`) under both
/// `thinking` (first) and `reasoning_content` (last), as `_alias_reasoning_fields` does.
fn template_messages(messages: &[ChatMessage]) -> Vec<Json> {
    const REASONING: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];
    messages
        .iter()
        .map(|m| {
            let Ok(Json::Object(map)) = serde_json::to_value(m) else {
                return Json::Null; // a struct of JSON values always serializes to an object
            };
            let map: Map<String, Json> = map.into_iter().filter(|(_, v)| !v.is_null()).collect();
            let reasoning = REASONING.iter().find_map(|k| map.get(*k).cloned());
            let Some(reasoning) = reasoning else { return Json::Object(map) };
            // Python's {"thinking": r, **message, "reasoning_content": r}: a key already
            // present keeps its place (and, for `thinking`, the message's own value).
            let mut out = Map::new();
            out.insert("thinking".into(), reasoning.clone());
            out.extend(map);
            out.insert("reasoning_content".into(), reasoning);
            Json::Object(out)
        })
        .collect()
}

/// The message of a minijinja error, with its line: `raise_exception` texts come out verbatim.
fn describe(e: &Error) -> String {
    let mut msg = match (e.kind(), e.detail()) {
        (ErrorKind::InvalidOperation, Some(detail)) => detail.to_string(),
        _ => e.to_string(),
    };
    if let Some(line) = e.line() {
        let _ = write!(msg, " (template line {line})");
    }
    msg
}

/// `{% generation %}` / `{% endgeneration %}` (transformers' assistant-mask extension) become
/// `{% if true %}` / `{% endif %}`: same content, and the same trimming, since both are block
/// tags and the whitespace-control marks are kept.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let marks = ['-', '+'];
        let lead = &inner[..inner.len() - inner.trim_start_matches(marks).len()];
        let trail = &inner[inner.trim_end_matches(marks).len()..];
        let keyword = inner.trim_start_matches(marks).trim_end_matches(marks).trim();
        match keyword {
            "generation" => out.push_str(&format!("{{%{lead} if true {trail}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{lead} endif {trail}%}}")),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// Jinja2 prints Python's str(): `None`, `True`, `False`.
fn python_formatter(out: &mut Output, state: &State, value: &Value) -> Result<(), Error> {
    let text = match value.kind() {
        ValueKind::None => "None",
        ValueKind::Bool if value.is_true() => "True",
        ValueKind::Bool => "False",
        _ => return minijinja::escape_formatter(out, state, value),
    };
    out.write_str(text).map_err(Error::from)
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(value: Value, args: Rest<Value>) -> Result<Value, Error> {
    let (positional, kwargs): (&[Value], Kwargs) = from_args(&args)?;
    let names = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if positional.len() > names.len() {
        return Err(Error::new(ErrorKind::TooManyArguments, "tojson takes at most 4 arguments"));
    }
    let arg = |i: usize| -> Result<Option<Value>, Error> {
        let kw: Option<Value> = kwargs.get(names[i])?;
        Ok(positional.get(i).cloned().or(kw).filter(|v| !v.is_none() && !v.is_undefined()))
    };
    let ensure_ascii = arg(0)?.is_some_and(|v| v.is_true());
    let indent = match arg(1)? {
        None => None,
        Some(v) if v.kind() == ValueKind::String => {
            Some(v.as_str().unwrap_or_default().to_string())
        }
        Some(v) => Some(" ".repeat(usize::try_from(i64::try_from(v)?.max(0)).unwrap_or(0))),
    };
    let separators = match arg(2)? {
        None => None,
        Some(v) => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            let text = |v: &Value| v.as_str().map(String::from);
            match parts.as_slice() {
                [a, b] => text(a).zip(text(b)),
                _ => None,
            }
            .ok_or_else(|| {
                Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings")
            })
            .map(Some)?
        }
    };
    let mut style = pyjson::Style::new(ensure_ascii, indent, separators);
    style.sort_keys = arg(3)?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    Ok(Value::from(pyjson::dumps(&value, &style)?))
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `datetime.now().strftime(format)`, local time.
fn strftime_now(format: String) -> Result<Value, Error> {
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format(&format)).map_err(|_| {
        Error::new(ErrorKind::InvalidOperation, format!("strftime_now: bad format {format:?}"))
    })?;
    Ok(Value::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_keep_their_trim_marks() {
        let src = "a{%- generation -%}b{% endgeneration %}c{%generation%}{%+ endgeneration +%}";
        let want = "a{%- if true -%}b{% endif %}c{% if true %}{%+ endif +%}";
        assert_eq!(rewrite_generation_tags(src), want);
        assert_eq!(rewrite_generation_tags("{{ x }}{% if y %}"), "{{ x }}{% if y %}");
    }
}
