//! What a cold start pays to compile the CUDA kernels: each compile unit's NVRTC time on one
//! thread, then when each unit is ready when the set compiles the way a CUDA backend starts
//! (`compile::Cubins`: background threads, a core each, into an empty cache; a unit's time is
//! when the wait for it, in `UNITS` order, ended). Needs NVRTC, not a GPU:
//!
//! ```text
//! scripts/nvrtc-wheels.sh
//! cargo run --release -p tf-backend --example compile_times -- [ARCH] [UNIT]
//! ```
//!
//! ARCH defaults to `sm_90a`; UNIT limits the first part to one unit. The largest unit the
//! served path needs bounds the cold first token on a machine with a core a unit.

use std::time::Instant;

use tf_backend::cuda::{compile, loader};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arch = args.first().map_or("sm_90a", String::as_str);
    let only = args.get(1).map(String::as_str);
    if let Err(e) = loader::nvrtc(&[]) {
        eprintln!("{e}\nrun scripts/nvrtc-wheels.sh (or set TENSORFOLD_NVRTC_LIB)");
        std::process::exit(1);
    }
    let mut total = 0.0;
    for unit in compile::UNITS.iter().filter(|u| only.is_none_or(|o| o == u.name)) {
        let t = Instant::now();
        match compile::compile(unit, arch) {
            Ok(cubin) => {
                let s = t.elapsed().as_secs_f64();
                total += s;
                println!("{:<20} {s:6.2} s  {:>9} bytes", unit.name, cubin.len());
            }
            Err(log) => {
                eprintln!("{log}");
                std::process::exit(1);
            }
        }
    }
    println!("sum of the units, one thread: {total:.2} s");
    if only.is_some() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tf-compile-times-{}", std::process::id()));
    let t = Instant::now();
    let set = compile::Cubins::new(arch, Some(dir.clone()), true);
    let mut ready = true;
    for (i, unit) in compile::UNITS.iter().enumerate() {
        ready &= set.get(i).is_ok();
        println!("  {:<20} ready at {:6.2} s", unit.name, t.elapsed().as_secs_f64());
    }
    let wall = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&dir);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "cold start, every unit, {cores} cores: {wall:.2} s{}",
        if ready { "" } else { " (a unit failed)" }
    );
}
