//! One file per subcommand.

pub mod bench;
pub mod check;
pub mod contract;
pub mod export;
pub mod golden;
pub mod info;
pub mod judge;
pub mod plan;
pub mod run;
pub mod serve;
pub mod synth;
pub mod text;

/// Writes to stdout, ignoring a closed pipe (`tensorfold info | head` must not panic).
pub fn print_out(s: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(s.as_bytes()).and_then(|_| out.flush());
}
