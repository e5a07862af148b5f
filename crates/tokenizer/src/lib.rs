//! Tokenizers, chat templates and incremental detokenization (skeleton).
