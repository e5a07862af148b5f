//! The `tensorfold` command line.

fn main() {}
