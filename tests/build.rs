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
    // JIT code a perf map names, called from C built as runtimes are (frame pointers).
    compile_c(&out, "jit", FRAME_POINTERS);
    // Its callers stay on the stack (no tail calls), so each fault is under the function that
    // touched the page.
    compile_c(
        &out,
        "events",
        &[FRAME_POINTERS, &["-fno-optimize-sibling-calls"]].concat(),
    );
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

    // Names from elsewhere (#39): the 60/30/10 workload built as distributions build, without
    // frame pointers and with a build id, then stripped as they strip it, its debug file apart.
    compile_c_as(&out, "hotspot", "stripme", &["-Wl,--build-id"]);
    split_debug(&out, "stripme");
    // Its MiniDebugInfo (`stripme-mini`), and its debug file with zstd-compressed DWARF
    // (`stripme.zstd.debug`): made here, where binutils and xz are, not in the arm64 guest.
    minidebuginfo(&out, "stripme");
    tool(
        &out,
        &binutil("objcopy"),
        &[
            "--compress-debug-sections=zstd",
            "stripme.debug",
            "stripme.zstd.debug",
        ],
    );

    // Go, with Debian's Go (`cargo xtask setup` installs it): an executable at a fixed address
    // (its `.debug_frame` zlib-compressed), a position-independent one (its table in
    // `.data.rel.ro.gopclntab`), and one without symbols or DWARF (`-s -w`: only `.gopclntab`).
    compile_go(&out, "gohash", &["-buildmode=exe"]);
    compile_go(&out, "gohash-pie", &["-buildmode=pie"]);
    compile_go(&out, "gohash-sw", &["-ldflags=-s -w"]);

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

/// workloads/gohash as `output`, for the target's architecture (pure Go: no C cross compiler),
/// Go's caches kept in OUT_DIR.
fn compile_go(out: &std::path::Path, output: &str, flags: &[&str]) {
    let arch = match env::var("CARGO_CFG_TARGET_ARCH").unwrap().as_str() {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => panic!("no Go workload for {other}"),
    };
    let status = Command::new("go")
        .args(["build", "-buildvcs=false", "-trimpath"])
        .args(flags)
        .arg("-o")
        .arg(out.join(output))
        .arg(".")
        .current_dir("workloads/gohash")
        .env("GOARCH", arch)
        .env("CGO_ENABLED", "0")
        .env("GOCACHE", out.join("go-cache"))
        .env("GOPATH", out.join("go-path"))
        .status()
        .expect("running go (Debian's golang-go, which cargo xtask setup installs)");
    assert!(status.success(), "building workloads/gohash as {output} failed");
}

/// What a distribution makes of a binary NAME: `NAME-stripped` (`strip --strip-all`: no
/// `.symtab`, no DWARF, its `.eh_frame` kept), `NAME.debug` (`--only-keep-debug`, as a -dbgsym
/// package holds it) and `NAME-linked` (the stripped binary with a `.gnu_debuglink` to it).
fn split_debug(out: &std::path::Path, name: &str) {
    let objcopy = binutil("objcopy");
    let run = |program: &str, args: &[&str]| {
        tool(out, program, args);
    };
    let (stripped, debug, linked) = (
        format!("{name}-stripped"),
        format!("{name}.debug"),
        format!("{name}-linked"),
    );
    run(&objcopy, &["--only-keep-debug", name, &debug]);
    run(&binutil("strip"), &["--strip-all", "-o", &stripped, name]);
    run(
        &objcopy,
        &[&format!("--add-gnu-debuglink={debug}"), &stripped, &linked],
    );
}

/// `NAME-mini`: the gdb manual's MiniDebugInfo recipe ("MiniDebugInfo", Debugging with GDB).
/// The function symbols not already in `.dynsym`, kept in an xz-compressed `.gnu_debugdata` of
/// the stripped binary.
fn minidebuginfo(out: &std::path::Path, name: &str) {
    let nm = binutil("nm");
    let names = |args: &[&str], keep: &dyn Fn(&str) -> bool| -> Vec<String> {
        let mut names: Vec<String> = tool(out, &nm, args)
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let (name, kind) = (f.next()?, f.next()?);
                keep(kind).then(|| name.to_string())
            })
            .collect();
        names.sort();
        names
    };
    let dynsyms = names(&["-D", "--format=posix", "--defined-only", name], &|_| true);
    let funcsyms = names(&["--format=posix", "--defined-only", name], &|k| {
        matches!(k, "T" | "t" | "D")
    });
    let keep: Vec<String> = funcsyms.into_iter().filter(|f| !dynsyms.contains(f)).collect();
    assert!(keep.iter().any(|k| k == "burn_a"), "{keep:?}");
    let binary = format!("{name}-mini");
    let (symbols, debug, mini) = (
        format!("{binary}.keep_symbols"),
        format!("{binary}.full.debug"),
        format!("{binary}.mini_debuginfo"),
    );
    std::fs::write(out.join(&symbols), keep.join("\n") + "\n").unwrap();
    let objcopy = binutil("objcopy");
    tool(out, &objcopy, &["--only-keep-debug", name, &debug]);
    let keep_arg = format!("--keep-symbols={symbols}");
    tool(
        out,
        &objcopy,
        &[
            "-S",
            "--remove-section",
            ".gdb_index",
            "--remove-section",
            ".comment",
            &keep_arg,
            &debug,
            &mini,
        ],
    );
    let strip_args = ["--strip-all", "-R", ".comment", "-o", &binary, name];
    tool(out, &binutil("strip"), &strip_args);
    tool(out, "xz", &["-f", &mini]);
    let section = format!(".gnu_debugdata={mini}.xz");
    tool(out, &objcopy, &["--add-section", &section, &binary]);
}

/// Run `program` in `out`; its standard output.
fn tool(out: &std::path::Path, program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .current_dir(out)
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(output.status.success(), "{program} {args:?} failed");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A binutils program for the target: the cross compiler's prefix on it when there is one.
fn binutil(tool: &str) -> String {
    let compiler = cc::Build::new().get_compiler().path().display().to_string();
    match compiler.strip_suffix("gcc") {
        Some(prefix) if prefix.ends_with('-') => format!("{prefix}{tool}"),
        _ => tool.to_string(),
    }
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
