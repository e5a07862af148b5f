//! HF `config.json` -> `ModelSpec` (skeleton: filled in by the helper owning it).
