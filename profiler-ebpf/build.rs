use which::which;

/// Rebuild the BPF object when bpf-linker changes (e.g. reinstalled for a new nightly).
fn main() {
    let bpf_linker = which("bpf-linker").expect("bpf-linker not found: run `cargo xtask setup`");
    println!("cargo:rerun-if-changed={}", bpf_linker.display());
    // Set by aya-build from the target being built for (see `arch.rs`).
    println!("cargo::rustc-check-cfg=cfg(bpf_target_arch, values(\"x86_64\", \"aarch64\"))");
}
