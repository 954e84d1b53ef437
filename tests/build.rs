//! Builds the test workloads with the flags the tests depend on (frame pointers, debug info),
//! into OUT_DIR, and tells the tests where they are.
use std::{env, path::PathBuf, process::Command};

fn main() {
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-changed=workloads");
    println!("cargo:rustc-env=BPFPROF_WORKLOADS={}", out.display());

    for name in ["hotspot", "schedload"] {
        compile_c(&out, name);
    }

    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let status = Command::new(rustc)
        .args([
            "--edition",
            "2021",
            "-O",
            "-g",
            "-C",
            "force-frame-pointers=yes",
            "-o",
        ])
        .arg(out.join("spin"))
        .arg("workloads/spin.rs")
        .status()
        .expect("running rustc");
    assert!(status.success(), "building workloads/spin.rs failed");
}

/// A C workload, with frame pointers everywhere (leaves included) and debug info.
fn compile_c(out: &std::path::Path, name: &str) {
    let status = cc::Build::new()
        .get_compiler()
        .to_command()
        .args([
            "-O2",
            "-g",
            "-pthread",
            "-fno-omit-frame-pointer",
            "-mno-omit-leaf-frame-pointer",
            "-o",
        ])
        .arg(out.join(name))
        .arg(format!("workloads/{name}.c"))
        .status()
        .expect("running the C compiler");
    assert!(status.success(), "building workloads/{name}.c failed");
}
