//! CI gate: every CUDA kernel family compiles with NVRTC for sm_80, sm_89 and sm_90a, on a
//! machine with no GPU and no CUDA toolkit.
//!
//! NVRTC comes from NVIDIA's pip wheel (`nvidia-cuda-nvrtc==13.0.88`), installed by
//! `scripts/nvrtc-wheels.sh` into `<repo>/.cache/nvrtc` (or `$TENSORFOLD_CACHE/nvrtc`); set
//! `TENSORFOLD_NVRTC_LIB` to use another directory. Without it the test FAILS, naming the
//! script: a kernel that does not compile must never pass CI silently.

use std::path::PathBuf;

use tf_backend::cuda::{compile, loader};

fn wheel_dir() -> PathBuf {
    let cache = std::env::var_os("TENSORFOLD_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache"));
    cache.join("nvrtc/nvidia/cu13/lib")
}

fn load_nvrtc() {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("TENSORFOLD_NVRTC_LIB") {
        dirs.push(PathBuf::from(d));
    }
    dirs.push(wheel_dir());
    if let Err(e) = loader::nvrtc(&dirs) {
        panic!("{e}\nThis test needs NVRTC from the pip wheel: run scripts/nvrtc-wheels.sh");
    }
}

/// A process that exits while its background compiles run must first let them finish (exit
/// runs NVRTC's destructors): a child of this test binary starts them into an empty kernel
/// cache and exits at once; every family's CUBIN must then be in the cache, and the child
/// must exit cleanly. For sm_80 and for sm_90a (the GPU machines' arch: there a child exiting
/// this way died by SIGSEGV in an `nvrtc-*` thread until `compile::warm_nvrtc`, session 34).
#[test]
fn exit_waits_for_background_compiles() {
    if let Some(dir) = std::env::var_os("TF_NVRTC_EXIT_CHILD") {
        load_nvrtc();
        let arch = std::env::var("TF_NVRTC_EXIT_ARCH").expect("the child's arch");
        let _set = compile::Cubins::shared(&arch, Some(PathBuf::from(dir)));
        // Long enough for NVRTC to be running in the threads (exiting at once, before they
        // start it, never showed the fault).
        std::thread::sleep(std::time::Duration::from_millis(400));
        std::process::exit(0);
    }
    for arch in ["sm_80", "sm_90a"] {
        let cache =
            std::env::temp_dir().join(format!("tf-nvrtc-exit-{arch}-{}", std::process::id()));
        let status = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args(["exit_waits_for_background_compiles", "--exact", "--nocapture"])
            .env("TF_NVRTC_EXIT_CHILD", &cache)
            .env("TF_NVRTC_EXIT_ARCH", arch)
            .status()
            .expect("child test process");
        let files = std::fs::read_dir(&cache).map_or(0, |d| d.count());
        let _ = std::fs::remove_dir_all(&cache);
        assert!(status.success(), "{arch}: the child exited with {status}");
        assert_eq!(files, compile::UNITS.len(), "{arch}: every unit compiled before exit");
    }
}

/// Whether the CUBIN (an ELF file) names symbol `name`: its string table holds `\0name\0`
/// (section names carry a prefix, `.text.name`, so they do not match).
fn has_symbol(cubin: &[u8], name: &str) -> bool {
    let pat = [&[0u8][..], name.as_bytes(), &[0u8][..]].concat();
    cubin.windows(pat.len()).any(|w| w == pat)
}

/// A unit that is part of a family defines the entry points its list names and none that
/// its sibling units list (the `-D` part and the list in `compile::UNITS` agree).
fn defines_its_entries(unit: &compile::Unit, cubin: &[u8]) {
    if unit.part.is_empty() {
        return;
    }
    for name in unit.entries {
        assert!(has_symbol(cubin, name), "{}: no entry point {name}", unit.name);
    }
    for other in compile::UNITS.iter().filter(|u| u.family == unit.family && u.name != unit.name) {
        for name in other.entries {
            assert!(!has_symbol(cubin, name), "{} also defines {}'s {name}", unit.name, other.name);
        }
    }
}

#[test]
fn every_kernel_family_compiles_for_sm80_sm89_sm90a() {
    load_nvrtc();
    let (maj, min) = compile::nvrtc_version().expect("NVRTC version");
    println!("NVRTC {maj}.{min}");
    let mut failures = Vec::new();
    let mut n = 0;
    for arch in ["sm_80", "sm_89"] {
        for unit in compile::UNITS {
            match compile::compile(unit, arch) {
                Ok(cubin) => {
                    assert!(cubin.len() > 64, "{} for {arch}: empty CUBIN", unit.name);
                    n += 1;
                }
                Err(log) => failures.push(log),
            }
        }
    }
    // sm_90a the way a CUDA backend starts: every family at once on background threads
    // (`compile::Cubins`), into a kernel cache that a second set then reads back unchanged.
    let cache = std::env::temp_dir().join(format!("tf-nvrtc-cache-{}", std::process::id()));
    let parallel = compile::Cubins::new("sm_90a", Some(cache.clone()), true);
    let cached = compile::Cubins::new("sm_90a", Some(cache.clone()), false);
    for (i, unit) in compile::UNITS.iter().enumerate() {
        match parallel.get(i) {
            Ok(cubin) => {
                assert!(cubin.len() > 64, "{} for sm_90a: empty CUBIN", unit.name);
                let again = cached.get(i).expect("the cached CUBIN");
                assert!(again == cubin, "{}: the kernel cache gave other bytes", unit.name);
                defines_its_entries(unit, &cubin);
                n += 1;
            }
            Err(log) => failures.push(log),
        }
    }
    // What serve waits for before it listens (`Backend::ready`): every unit, or the failures.
    assert_eq!(parallel.wait_all(), Ok(()));
    let none = compile::Cubins::new("sm_10", None, false).wait_all().expect_err("no sm_10");
    let all = compile::UNITS.len();
    assert!(none.starts_with(&format!("{all} of {all} kernel units failed")), "{none}");
    assert!(none.contains("attention.cu [attention_hd128]") && none.contains("norm.cu"), "{none}");
    // Planted: a part listing an entry point its CUBIN lacks must fail the check.
    let hd64 = compile::UNITS.iter().position(|u| u.name == "attention_hd64").expect("unit");
    let planted = compile::Unit { entries: &["attention_hd128"], ..compile::UNITS[hd64] };
    let cubin = parallel.get(hd64).expect("attention_hd64's CUBIN");
    let caught = std::panic::catch_unwind(|| defines_its_entries(&planted, &cubin));
    assert!(caught.is_err(), "the planted entry list was not caught");
    let files = std::fs::read_dir(&cache).map_or(0, |d| d.count());
    // Backends of one process share one set a (arch, cache) (its threads read this cache).
    let (a, b) = (
        compile::Cubins::shared("sm_90a", Some(cache.clone())),
        compile::Cubins::shared("sm_90a", Some(cache.clone())),
    );
    assert!(a.shares_with(&b) && !a.shares_with(&parallel), "one shared set a key");
    for i in 0..compile::UNITS.len() {
        assert!(a.get(i).expect("shared CUBIN") == parallel.get(i).expect("CUBIN"));
    }
    // Every background thread ends (the exit handler waits for the same count).
    let ended = compile::wait_background(std::time::Duration::from_secs(600));
    assert!(ended, "background compiles still running after 600 s");
    let _ = std::fs::remove_dir_all(&cache);
    assert!(failures.is_empty(), "kernels failed to compile:\n{}", failures.join("\n\n"));
    assert_eq!(files, compile::UNITS.len(), "one cached CUBIN a unit");
    println!("{n} unit x arch compilations ok");
    // The measurement knobs' variants (TENSORFOLD_KERNEL_DEFINES on the GPU machine) compile
    // too, each knob set away from its default.
    // TF_SPLIT's other values take other decode code (V in K's buffers at 4 tiles a split), and
    // TF_DEC_TMA=0 the cp.async loads.
    let sets = [
        "TF_PREWAIT=0 TF_EARLY_TRIGGER=0 TF_D8_U=2 TF_NT_U=4 TF_ATTN_TRACE=1 TF_SPLIT_LOOP=1 TF_SPLIT=64 TF_WS_DEPTH=2 TF_WS_GROUP=16 TF_WS_KT=64",
        "TF_SPLIT=256 TF_DEC_TMA=0 TF_ATTN_DB=0 TF_VEC16=0",
        "TF_SPLIT=256 TF_SPLIT_LOOP=1 TF_D8_MAXREG=80",
        "TF_DEC_TMA=0 TF_GROUP_MINB=1 TF_X_DIRECT=0 TF_REGROUP_ONCE=1 TF_WS_FOLD=0 TF_ROPE_EARLY=1",
        "TF_DEC_SPREAD=0 TF_ROPE_TRIGGER=0 TF_AWS_NOINC=0 TF_WS_ACC2=0 TF_WS_STAGGER=0",
    ];
    for knobs in sets {
        for unit in compile::UNITS {
            if let Err(log) = compile::compile_with(unit, "sm_90a", knobs) {
                failures.push(log);
            }
        }
    }
    assert!(failures.is_empty(), "knob variants failed to compile:\n{}", failures.join("\n\n"));
}
