//! Installs what the build needs on a fresh machine, idempotently. When everything is there it
//! only looks (well under 2 s); it notices a bpf-linker built for an older nightly and rebuilds it.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use crate::sh;

const BPF_LINKER_VERSION: &str = "0.13.0";
const TRACEFS: &str = "/sys/kernel/tracing";

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Needs {
    /// Toolchain for building bpfprof.
    Build,
    /// Also cargo-fuzz, for the fuzz targets.
    Fuzz,
    /// Also the tools the tests and benchmarks compare against or read with.
    Test,
}

pub fn run(needs: Needs) -> Result<()> {
    let nightly = nightly_version()?;
    ensure_rust_src()?;
    ensure_bpf_linker(&nightly)?;
    ensure_tracefs();
    if needs >= Needs::Fuzz {
        ensure_cargo_fuzz()?;
    }
    if needs >= Needs::Test {
        // perf: the overhead baseline; runqlat: the sched bench's other reference; bpftrace: the
        // lock bench's uprobe reference; go: an independent pprof reader; setpriv: the not-root
        // test.
        ensure_packages(&[
            ("perf", "linux-perf"),
            ("runqlat", "libbpf-tools"),
            ("bpftrace", "bpftrace"),
            ("go", "golang-go"),
            ("setpriv", "util-linux"),
            // The lock suite profiles a real worker pool: Debian's multi-threaded xz.
            ("xz", "xz-utils"),
            // ... and a real server under its own benchmark client: Debian's Redis.
            ("redis-server", "redis-server"),
            ("redis-benchmark", "redis-tools"),
            // The live view's tests drive it in a real terminal.
            ("tmux", "tmux"),
            // The generated man pages are rendered with warnings on (`cargo xtask docs`).
            ("groff", "groff-base"),
            // The agent's https test makes its own CA and server certificate.
            ("openssl", "openssl"),
            // The debuginfod tests fetch a debug file from elfutils' own server.
            ("debuginfod", "debuginfod"),
            // `trace -s` is checked against `strace -c`, and benched against it.
            ("strace", "strace"),
            // `latency` on block requests is checked against fio's own completion latency.
            ("fio", "fio"),
            // JIT frames named from real runtimes' perf maps: Node.js and the JVM (javac
            // builds the workload, jcmd asks the JVM for its map).
            ("node", "nodejs"),
            ("javac", "openjdk-17-jdk-headless"),
            ("jcmd", "openjdk-17-jdk-headless"),
        ])?;
        // The arm64 suites run in an emulated Neoverse (and the AArch64 unwind-table unit test
        // reads the arm64 C library the cross compiler brings).
        ensure_arm64_guest_tools()?;
        ensure_otlp_receiver()?;
    }
    Ok(())
}

const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// cargo-fuzz, which builds and runs the fuzz targets (`cargo xtask fuzz`; a smoke of each in
/// `cargo xtask test`). Built from crates.io, about a minute.
fn ensure_cargo_fuzz() -> Result<()> {
    let version = Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if version.split_whitespace().nth(1) == Some(CARGO_FUZZ_VERSION) {
        return Ok(());
    }
    eprintln!("xtask setup: building cargo-fuzz {CARGO_FUZZ_VERSION} (about a minute)");
    sh(Command::new("cargo").args(["install", "--locked", &format!("cargo-fuzz@{CARGO_FUZZ_VERSION}")]))
}

/// What cross-building for arm64 needs: the Rust target's standard library and Debian's cross
/// linker (which brings the arm64 C library to link against).
pub fn ensure_arm64_cross() -> Result<()> {
    let installed = output(Command::new("rustup").args(["target", "list", "--installed"]))?;
    if !installed.lines().any(|t| t.trim() == crate::ARM64_TRIPLE) {
        sh(Command::new("rustup").args(["target", "add", crate::ARM64_TRIPLE]))?;
    }
    ensure_packages(&[(crate::ARM64_GCC, "gcc-aarch64-linux-gnu")])
}

/// What the emulated Neoverse needs besides the cross build: QEMU, cpio for its initramfs, and
/// apt knowing Debian's arm64 packages (the guest's kernel, busybox and C library come from them).
pub fn ensure_arm64_guest_tools() -> Result<()> {
    ensure_arm64_cross()?;
    ensure_packages(&[("qemu-system-aarch64", "qemu-system-arm"), ("cpio", "cpio")])?;
    let foreign = output(Command::new("dpkg").arg("--print-foreign-architectures"))?;
    if !foreign.lines().any(|a| a.trim() == "arm64") {
        eprintln!("xtask setup: adding Debian's arm64 architecture (for the arm64 guest's packages)");
        sh(Command::new("dpkg").args(["--add-architecture", "arm64"]))?;
        sh(Command::new("apt-get")
            .args(["update", "-qq"])
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    Ok(())
}

pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("starting {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `rustc +nightly -vV`: identifies the exact nightly (and its LLVM) bpf-linker must match.
fn nightly_version() -> Result<String> {
    output(Command::new("rustc").args(["+nightly", "-vV"]))
        .context("the nightly toolchain is missing: rustup toolchain install nightly")
}

fn nightly_sysroot() -> Result<PathBuf> {
    Ok(PathBuf::from(
        output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))?.trim(),
    ))
}

fn ensure_rust_src() -> Result<()> {
    let core = nightly_sysroot()?.join("lib/rustlib/src/rust/library/core");
    if core.is_dir() {
        return Ok(());
    }
    eprintln!("xtask setup: installing rust-src for nightly");
    sh(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
}

fn home() -> PathBuf {
    PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
}

fn stamp_path() -> PathBuf {
    home().join(".cache/bpfprof/bpf-linker.stamp")
}

/// bpf-linker is linked against the nightly's own libLLVM: the stamp records which nightly.
fn ensure_bpf_linker(nightly: &str) -> Result<()> {
    let wanted = format!("bpf-linker {BPF_LINKER_VERSION}\n{nightly}");
    let works = Command::new("bpf-linker")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    let stamp = std::fs::read_to_string(stamp_path()).unwrap_or_default();
    if works && stamp == wanted {
        return Ok(());
    }
    if works && stamp.is_empty() {
        eprintln!("xtask setup: bpf-linker found but not built by this setup; rebuilding against the nightly's LLVM");
    } else if works {
        eprintln!("xtask setup: the nightly toolchain changed since bpf-linker was built; rebuilding it");
    } else {
        eprintln!("xtask setup: building bpf-linker {BPF_LINKER_VERSION} against the nightly's LLVM (about 2 minutes)");
    }
    let sysroot = nightly_sysroot()?;
    let llvm_major = nightly
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .context("no LLVM version in rustc +nightly -vV")?
        .to_string();
    let lib = sysroot.join("lib");
    let llvm_so = std::fs::read_dir(&lib)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("libLLVM.so") || n.starts_with("libLLVM-"))
        .context("no libLLVM in the nightly sysroot")?;
    // bpf-linker's build looks for the unversioned name under LLVM_PREFIX/lib.
    let shim = home().join(".cache/bpf-linker-llvm-shim");
    std::fs::create_dir_all(shim.join("lib"))?;
    let link = shim.join("lib/libLLVM.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(lib.join(&llvm_so), &link)?;
    sh(Command::new("cargo")
        .args([
            "install",
            &format!("bpf-linker@{BPF_LINKER_VERSION}"),
            "--locked",
            "--force",
        ])
        .args([
            "--no-default-features",
            "--features",
            &format!("llvm-{llvm_major}"),
        ])
        .env("LLVM_PREFIX", &shim)
        // Lets the installed binary find the versioned library without rustup's environment.
        .env("RUSTFLAGS", format!("-C link-arg=-Wl,-rpath,{}", lib.display())))?;
    std::fs::create_dir_all(stamp_path().parent().unwrap())?;
    std::fs::write(stamp_path(), wanted)?;
    Ok(())
}

/// The OTLP profiles messages the agent's OTLP export is pinned to: PyPI's package of them.
pub const OTLP_PROTO_VERSION: &str = "1.45.2";
/// The gRPC server the OTLP/gRPC receiver runs on (its stubs need 1.63.2 or later).
const GRPCIO_VERSION: &str = "1.85.3";

/// A Python environment with PyPI's `opentelemetry-proto` (the pinned version) and `grpcio`, for
/// the OTLP receiver the agent's tests decode exports with (`tests/otlp/receiver.py`).
fn ensure_otlp_receiver() -> Result<()> {
    let venv = crate::workspace_root().join("target/otlp-receiver");
    let stamp = venv.join(format!(
        ".opentelemetry-proto-{OTLP_PROTO_VERSION}-grpcio-{GRPCIO_VERSION}"
    ));
    if stamp.is_file() {
        return Ok(());
    }
    eprintln!(
        "xtask setup: a Python environment with opentelemetry-proto {OTLP_PROTO_VERSION} and grpcio {GRPCIO_VERSION} in {}",
        venv.display()
    );
    let _ = std::fs::remove_dir_all(&venv);
    // Debian's Python: its venv module needs python3-venv.
    let created = Command::new("/usr/bin/python3")
        .arg("-m")
        .arg("venv")
        .arg(&venv)
        .status();
    if !matches!(created, Ok(s) if s.success()) {
        apt_install(&["python3-venv"])?;
        sh(Command::new("/usr/bin/python3").arg("-m").arg("venv").arg(&venv))?;
    }
    sh(Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check"])
        .arg(format!("opentelemetry-proto=={OTLP_PROTO_VERSION}"))
        .arg(format!("grpcio=={GRPCIO_VERSION}")))?;
    std::fs::write(stamp, "")?;
    Ok(())
}

fn ensure_tracefs() {
    if Path::new(TRACEFS).join("events").is_dir() || Path::new("/sys/kernel/debug/tracing/events").is_dir() {
        return;
    }
    let mounted = Command::new("mount")
        .args(["-t", "tracefs", "nodev", TRACEFS])
        .status();
    if !matches!(mounted, Ok(s) if s.success()) {
        eprintln!("xtask setup: could not mount tracefs at {TRACEFS} (bpfprof will try again as root)");
    }
}

pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false)
}

/// Debian packages for the tools that are missing (by command name).
fn ensure_packages(tools: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = tools
        .iter()
        .filter(|(cmd, _)| !on_path(cmd))
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    apt_install(&missing)
}

fn apt_install(missing: &[&str]) -> Result<()> {
    eprintln!("xtask setup: installing {}", missing.join(" "));
    let root = crate::is_root();
    let apt = |args: &[&str]| {
        let mut cmd = if root {
            Command::new("apt-get")
        } else {
            Command::new("sudo")
        };
        if !root {
            cmd.arg("apt-get");
        }
        cmd.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        cmd
    };
    sh(&mut apt(&["update", "-qq"]))?;
    sh(apt(&["install", "-y", "-qq"]).args(missing))
}
