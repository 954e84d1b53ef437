//! Builds the test workloads with the flags the tests depend on (frame pointers, debug info),
//! into OUT_DIR, and tells the tests where they are.
use std::{env, path::PathBuf, process::Command};

fn main() {
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-changed=workloads");
    println!("cargo:rustc-env=BPFPROF_WORKLOADS={}", out.display());

    const FRAME_POINTERS: &[&str] = &["-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer"];
    for name in ["hotspot", "schedload"] {
        compile_c(&out, name, FRAME_POINTERS);
    }
    // The lock workload is built like most binaries: no frame pointers (its waiters' stacks go
    // through libc's futex wait, which has none either).
    compile_c(&out, "lockload", &[]);
    // Contention beside waits for events (a condition variable, joins), no frame pointers either.
    compile_c(&out, "waits", &[]);
    // The agent's churn workload: short-lived processes, built like most binaries too.
    compile_c(&out, "churn", &[]);
    // The same, statically linked and stripped: no symbols for the pthread source to probe.
    compile_c_as(&out, "lockload", "lockload-static-stripped", &["-static", "-s"]);
    // The unwinding workload has no frame pointers at all, like most distribution binaries.
    compile_c(&out, "unwind", &["-fomit-frame-pointer", "-ldl"]);
    // The library it loads while running (dlopen), frameless too.
    compile_c_as(
        &out,
        "unwindlib",
        "libunwindlib.so",
        &["-fomit-frame-pointer", "-shared", "-fPIC"],
    );

    // One hot source line (--annotate); again without debug info, to be told there are no lines.
    compile_c(&out, "hotline", &[]);
    compile_c_as(&out, "hotline", "hotline-nodebug", &["-g0"]);

    compile_rust(&out, "spin", &["-C", "force-frame-pointers=yes"]);
    // Rust's default on x86-64 Linux: no frame pointers.
    compile_rust(&out, "spin-nofp", &[]);
}

fn compile_rust(out: &std::path::Path, name: &str, flags: &[&str]) {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let mut cmd = Command::new(rustc);
    let target = env::var("TARGET").unwrap();
    if target != env::var("HOST").unwrap() {
        // The arm64 guest's workloads: linked by the same cross compiler as the C ones.
        let linker = cc::Build::new().get_compiler().path().display().to_string();
        cmd.args(["--target", &target, "-C", &format!("linker={linker}")]);
    }
    let status = cmd
        .args(["--edition", "2021", "-O", "-g"])
        .args(flags)
        .arg("-o")
        .arg(out.join(name))
        .arg("workloads/spin.rs")
        .status()
        .expect("running rustc");
    assert!(status.success(), "building workloads/spin.rs as {name} failed");
}

/// A C workload with debug info and the given frame-pointer flags.
fn compile_c(out: &std::path::Path, name: &str, flags: &[&str]) {
    compile_c_as(out, name, name, flags);
}

fn compile_c_as(out: &std::path::Path, name: &str, output: &str, flags: &[&str]) {
    let status = cc::Build::new()
        .get_compiler()
        .to_command()
        .args(["-O2", "-g", "-pthread"])
        .arg("-o")
        .arg(out.join(output))
        .arg(format!("workloads/{name}.c"))
        // After the source: some flags are libraries to link.
        .args(flags)
        .status()
        .expect("running the C compiler");
    assert!(status.success(), "building workloads/{name}.c failed");
}
