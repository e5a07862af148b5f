//! The engine: model families written against the backend op set, paged KV blocks,
//! sampling, and the generation loop.
