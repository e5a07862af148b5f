//! `tensorfold contract`: the kernel contract (DESIGN.md §1, §4) on the chosen device.
//!
//! A thin shell over `tf_backend::contract`: it parses the flags, builds the backend through
//! `device::with_backend` (the one place a device becomes a backend, so `--device cuda` needs
//! no change here), streams the contract's lines to stdout as they are decided and exits
//! non-zero unless the SUMMARY has 0 fail and 0 missed. The gates, bounds and controls are
//! documented in `tf_backend::contract`.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use tf_backend::contract::{self, ContractConfig, Family, Geometry};
use tf_backend::Backend;

use super::print_out;
use crate::device::{with_backend, DeviceArgs, OnDevice, WithBackend};

/// The geometries `--like` names.
#[derive(Clone, Debug)]
pub struct Like(pub Vec<Geometry>);

fn parse_like(s: &str) -> Result<Like, String> {
    Geometry::parse_like(s).map(Like).ok_or_else(|| "expected smollm2, llama3-8b or all".into())
}

fn parse_family(s: &str) -> Result<Family, String> {
    Family::parse(s).ok_or_else(|| {
        let names: Vec<&str> = Family::ALL.iter().map(|f| f.name()).collect();
        format!("expected one of {} (kv_store names attention)", names.join(", "))
    })
}

#[derive(Args)]
pub struct ContractArgs {
    #[command(flatten)]
    pub dev: DeviceArgs,
    /// Check one op family only: embed, rms_norm, linear, rope, attention (kv_store and
    /// attention), swiglu, add or logits.
    #[arg(long, value_name = "FAMILY", value_parser = parse_family)]
    pub only: Option<Family>,
    /// Served geometries to check: smollm2, llama3-8b or all (llama3-8b is meant for a GPU;
    /// on a CPU it takes many minutes).
    #[arg(long, value_name = "smollm2|llama3-8b|all", default_value = "all", value_parser = parse_like)]
    pub like: Like,
    /// Seed of every input (bf16 draws of a seeded generator).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where the scratch safetensors files of weights and inputs go (removed afterwards;
    /// default: the system temporary directory). llama3-8b needs about 3 GB there.
    #[arg(long, value_name = "DIR")]
    pub scratch: Option<PathBuf>,
}

impl WithBackend for ContractArgs {
    type Out = ();
    fn run<B: Backend + 'static>(self, dev: &OnDevice<B>) -> Result<()> {
        let be = dev.backend()?;
        let cfg = ContractConfig {
            geometries: self.like.0,
            only: self.only,
            seed: self.seed,
            scratch: self.scratch.unwrap_or_else(std::env::temp_dir),
        };
        let summary = contract::run(&be, &cfg, &mut |line| print_out(&format!("{line}\n")));
        if !summary.ok() {
            bail!(
                "the kernel contract failed: {} of {} kernels fail a gate, {} of {} controls missed",
                summary.fail,
                summary.kernels,
                summary.missed,
                summary.controls
            );
        }
        Ok(())
    }
}

pub fn run(a: ContractArgs) -> Result<()> {
    let dev = a.dev;
    with_backend(&dev, a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: ContractArgs,
    }

    fn parse(args: &[&str]) -> Result<ContractArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("t").chain(args.iter().copied())).map(|c| c.a)
    }

    #[test]
    fn flags_parse_and_default_to_every_geometry() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.like.0.len(), 2);
        assert_eq!((a.only, a.seed), (None, 1));
        let a = parse(&["--only", "kv_store", "--like", "smollm2", "--seed", "7"]).unwrap();
        assert_eq!(a.only, Some(Family::Attention));
        assert_eq!(a.like.0.iter().map(|g| g.name).collect::<Vec<_>>(), ["smollm2"]);
        assert_eq!(a.seed, 7);
    }

    #[test]
    fn bad_values_name_the_choices() {
        let e = parse(&["--only", "matmul"]).err().unwrap().to_string();
        assert!(e.contains("rms_norm") && e.contains("logits"), "{e}");
        let e = parse(&["--like", "llama3"]).err().unwrap().to_string();
        assert!(e.contains("smollm2, llama3-8b or all"), "{e}");
    }
}
