//! OpenAI wire types for responses: completions, chat completions, their stream chunks,
//! `usage`, and the model list. Requests are read field by field in `validate`.
//!
//! Invariants: field names and nesting follow the OpenAI API reference (`chat.completion`,
//! `chat.completion.chunk`, `text_completion`); `logprobs` is always null (not supported);
//! extensions (`prompt_token_ids`, `token_ids`) appear only when the request asked for them,
//! under vLLM's names, so clients that know them read them unchanged.

use serde::Serialize;
use tf_engine::serve::api::Usage;

use crate::validate::Endpoint;

/// Why a choice ended, as OpenAI spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token or stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The engine cancelled the request (e.g. the server is shutting down).
    Abort,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

impl Serialize for FinishReason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct UsageJson {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptDetails,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct PromptDetails {
    pub cached_tokens: usize,
}

impl From<Usage> for UsageJson {
    fn from(u: Usage) -> Self {
        UsageJson {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
            prompt_tokens_details: PromptDetails { cached_tokens: u.cached_tokens },
        }
    }
}

/// The identity shared by every object of one response.
#[derive(Clone, Debug)]
pub struct ReplyMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub endpoint: Endpoint,
}

impl ReplyMeta {
    pub fn new(endpoint: Endpoint, model: &str) -> Self {
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completion => "cmpl",
        };
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        ReplyMeta {
            id: format!("{prefix}-{:016x}", crate::validate::random_seed()),
            created,
            model: model.to_string(),
            endpoint,
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }

    fn envelope<C>(&self, chunk: bool, choices: Vec<C>) -> Envelope<'_, C> {
        Envelope {
            id: &self.id,
            object: self.object(chunk),
            created: self.created,
            model: &self.model,
            choices,
            usage: None,
            prompt_token_ids: None,
        }
    }

    /// The whole answer of a request that did not stream.
    pub fn full(
        &self,
        text: String,
        finish: FinishReason,
        usage: Usage,
        ids: Option<Ids>,
    ) -> String {
        let (prompt_ids, token_ids) =
            ids.map_or((None, None), |i| (Some(i.prompt), Some(i.completion)));
        let choice = match self.endpoint {
            Endpoint::Chat => Choice::Message(MessageChoice {
                index: 0,
                message: Message { role: "assistant", content: text },
                logprobs: None,
                finish_reason: finish,
                token_ids,
            }),
            Endpoint::Completion => Choice::Text(TextChoice {
                index: 0,
                text,
                logprobs: None,
                finish_reason: Some(finish),
                token_ids,
            }),
        };
        let mut env = self.envelope(false, vec![choice]);
        env.usage = Some(Some(usage.into()));
        env.prompt_token_ids = prompt_ids;
        to_json(&env)
    }

    /// One stream chunk: new text (chat: `delta.content`; the first chat chunk also carries
    /// `delta.role`), or, with `finish`, the choice's end.
    pub fn chunk(&self, part: ChunkPart) -> String {
        let choice = match self.endpoint {
            Endpoint::Chat => Choice::Delta(DeltaChoice {
                index: 0,
                delta: Delta {
                    role: part.first.then_some("assistant"),
                    content: (part.first || part.finish.is_none()).then_some(part.text),
                },
                logprobs: None,
                finish_reason: part.finish,
                token_ids: part.token_ids,
            }),
            Endpoint::Completion => Choice::Text(TextChoice {
                index: 0,
                text: part.text,
                logprobs: None,
                finish_reason: part.finish,
                token_ids: part.token_ids,
            }),
        };
        let mut env = self.envelope(true, vec![choice]);
        env.usage = part.usage_null.then_some(None);
        env.prompt_token_ids = part.prompt_token_ids;
        to_json(&env)
    }

    /// The last chunk of a stream with `include_usage`: no choices, the usage.
    pub fn usage_chunk(&self, usage: Usage) -> String {
        let mut env = self.envelope::<Choice>(true, Vec::new());
        env.usage = Some(Some(usage.into()));
        to_json(&env)
    }
}

/// What one stream chunk carries.
#[derive(Clone, Debug, Default)]
pub struct ChunkPart {
    pub text: String,
    /// The first chunk of a chat stream (announces the role).
    pub first: bool,
    pub finish: Option<FinishReason>,
    pub token_ids: Option<Vec<u32>>,
    pub prompt_token_ids: Option<Vec<u32>>,
    /// `"usage": null`, as OpenAI sends on every chunk but the last with `include_usage`.
    pub usage_null: bool,
}

/// Token ids for the `return_token_ids` extension.
#[derive(Clone, Debug)]
pub struct Ids {
    pub prompt: Vec<u32>,
    pub completion: Vec<u32>,
}

#[derive(Serialize)]
struct Envelope<'a, C> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<C>,
    /// Absent, `null`, or the usage.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<UsageJson>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_token_ids: Option<Vec<u32>>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Choice {
    Message(MessageChoice),
    Delta(DeltaChoice),
    Text(TextChoice),
}

#[derive(Serialize)]
struct MessageChoice {
    index: u32,
    message: Message,
    logprobs: Option<()>,
    finish_reason: FinishReason,
    #[serde(skip_serializing_if = "Option::is_none")]
    token_ids: Option<Vec<u32>>,
}

#[derive(Serialize)]
struct Message {
    role: &'static str,
    content: String,
}

#[derive(Serialize)]
struct DeltaChoice {
    index: u32,
    delta: Delta,
    logprobs: Option<()>,
    finish_reason: Option<FinishReason>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token_ids: Option<Vec<u32>>,
}

#[derive(Serialize)]
struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<String>,
}

#[derive(Serialize)]
struct TextChoice {
    index: u32,
    text: String,
    logprobs: Option<()>,
    finish_reason: Option<FinishReason>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token_ids: Option<Vec<u32>>,
}

/// `GET /v1/models` and `GET /v1/models/{id}`.
#[derive(Clone, Debug, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    /// Longest prompt + completion, tokens (vLLM's name).
    pub max_model_len: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

fn to_json<T: Serialize>(value: &T) -> String {
    // Serializing these plain structs (strings, integers, no maps with non-string keys)
    // cannot fail; the fallback keeps the stream well formed if it ever did.
    serde_json::to_string(value).unwrap_or_else(|e| {
        crate::errors::ApiError::Internal(format!("serializing a response: {e}"))
            .to_json()
            .to_string()
    })
}
