//! Text in and out of token ids for tensorfold: the checkpoint's tokenizer, its chat template,
//! and an incremental detokenizer for streaming.
//!
//! - [`TextCodec`] builds one `tokenizers::Tokenizer` from a `tokenizer.json` or from a GGUF
//!   vocabulary (`gguf`: byte-level BPE chosen by `tokenizer.ggml.pre`, or SentencePiece BPE),
//!   and can write it back out as `tokenizer.json` for an HF-layout copy of a GGUF checkpoint.
//! - [`ChatTemplate`] renders a conversation the way transformers' `apply_chat_template` does.
//! - [`DecodeStream`] turns ids into text chunks whose concatenation is exactly `decode(ids)`,
//!   never cutting a character in two.
//!
//! Every behaviour is pinned to an independent reference (HF `tokenizers`/`transformers`,
//! `sentencepiece`) by fixtures made with the scripts in tools/fixtures/.

pub mod chat;
pub mod codec;
pub mod error;
mod gguf;
pub mod stream;

pub use chat::{ChatMessage, ChatRequest, ChatTemplate};
pub use codec::{SpecialToken, SpecialTokens, TextCodec};
pub use error::{Result, TokenizerError};
pub use gguf::SUPPORTED_PRE;
pub use stream::DecodeStream;

// The engine shares one tokenizer and template across threads and keeps a DecodeStream per
// sequence; losing Send/Sync would be an API break, so it is checked at compile time.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<TextCodec>();
    shared::<ChatTemplate>();
    shared::<DecodeStream>();
};
