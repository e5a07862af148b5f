//! One file per subcommand.

pub mod bench;
pub mod export;
pub mod info;
pub mod run;
pub mod text;
