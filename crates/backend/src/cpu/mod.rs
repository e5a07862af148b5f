//! CPU backend (skeleton: filled in by the helper owning `cpu/`).
