//! The emulated Neoverse N1 (issue 21): the one machine here with a hardware PMU. Debian's arm64
//! cloud kernel (6.1: the older LTS line many Graviton fleets run) boots under
//! `qemu-system-aarch64 -cpu neoverse-n1 -icount shift=0` from an initramfs holding busybox,
//! Debian's arm64 C library, the arm64 `bpfprof`, the arm64 workloads and the arm64 builds of the
//! end-to-end test files. The guest's init runs those test binaries and prints their harness
//! output on the serial console, which is read here line by line as the host suites are.
//!
//! Under `-icount shift=0` every instruction takes one virtual nanosecond, and QEMU's PMU counts
//! CPU_CYCLES at 1 GHz of virtual time: instructions and cycles are equal, so IPC is exactly 1.0
//! and each function's instruction count is exact ground truth. The stall events read 0.
//!
//! One vCPU: under `-icount` QEMU runs the vCPUs in turn and counts INST_RETIRED (and virtual
//! time, hence CPU_CYCLES) from one instruction count they all advance, so with two the first
//! CPU's counters also count the second's work (measured: a thread's functions summed 3.44e9
//! instructions in a 3 s window that holds 3.0e9). With one, a thread's counts are its own.
use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::{
    cargo, sh,
    tally::{timed, Outcome, Tally},
    workspace_root, ARM64_TRIPLE,
};

/// The end-to-end test files the guest runs, in this order, each with the test harness's
/// arguments that pick its tests there (`None`: all of them). The guest is for what the host
/// cannot show: the PMU, kprobes, AArch64 (its registers, unwind tables, machine code, system
/// calls) and the 6.1 kernel (its fields, its verifier). The longer tests of what is the same on
/// every machine (rendering, formats, process lifecycles) run on the host only: under emulation
/// each costs 15-75 s of the guest's 30 minutes (measured per test in stop 62).
pub const GUEST_SUITES: &[(&str, Option<&str>)] = &[
    ("pmu", None),
    // The host's kernel has no kprobes.
    ("kprobes", None),
    // Not mappings removed under the walker. (The kernel's log lines stay: the only run of the
    // programs with their log sites kept, through the 6.1 verifier.)
    ("unwind", Some("--skip mappings_that_disappear")),
    // The kernel's fields and the off-CPU walks; not the outputs' rendering, a reused thread
    // id, or the per-CPU split (the guest has one CPU).
    (
        "sched",
        Some("--skip heatmap --skip a_reused_thread_id --skip each_cpu_has"),
    ),
    // The recording and its views; not the migrations: the guest has one CPU.
    ("sched_record", Some("--skip migrations")),
    // The sources' walks and waits; not Debian's xz and Redis (the guest is busybox), a target
    // exiting, a static binary refused, or the stack formats.
    (
        "lock",
        Some(
            "--skip a_compressors_worker_pool --skip a_key_value_server --skip a_target_exiting \
             --skip on_a_stripped_static_binary --skip stack_formats",
        ),
    ),
    // Of `views`, annotate on AArch64 machine code: its `top` tests drive a terminal through
    // tmux, which the guest has not.
    ("views", Some("annotate_puts")),
    // Of `symbols`, the stripped workload: the guest has neither Debian's xz nor Go's pprof.
    ("symbols", Some("--skip go_tool --skip debian_xz")),
    // Debug files found elsewhere (the fixtures are made at build time): beside the binary, in
    // its MiniDebugInfo, with zstd-compressed DWARF; not a build-ID tree, a refused debug link,
    // or a saved profile named later.
    (
        "debuginfo",
        Some("--skip a_build_id_tree --skip to_another_build --skip named_later"),
    ),
    // JIT code a perf map names (AArch64's own machine code for the loop); Node.js and the JVM
    // are not in the guest.
    ("jit", Some("jit_code_is_named")),
    // Python frames walked with Debian's arm64 python3.11 (the only interpreter the guest has);
    // not in a pid namespace.
    ("python", Some("--skip own_pid_namespace")),
    // Of `trace`, the sleeps (arm64's own system-call table; also latency between two
    // tracepoints, timing sleeps), the slow calls and intervals with their arguments and stacks,
    // and latency keyed by a probe's argument (x0): the guest has neither strace nor fio.
    ("trace", Some("sleep duration_min keyed_by")),
    // Of `probes`, a source line and the values fetched at it (arm64's registers, a global by its
    // distance from the probe), and a USDT probe's arguments where AArch64's compiler put them,
    // Debian's python3.11's among them: the rest reads no register.
    (
        "probes",
        Some(
            "--skip every_hit --skip what_cannot --skip tracepoint --skip a_filter_records \
             --skip a_library_by_name",
        ),
    ),
];

fn guest_suite(name: &str) -> Option<usize> {
    GUEST_SUITES.iter().position(|(suite, _)| *suite == name)
}

/// Of those, the ones written for a machine with a PMU and kprobes: the host (which has neither)
/// leaves them out.
pub const GUEST_ONLY: &[&str] = &["pmu", "kprobes"];

/// The whole guest run, boot to power-off, must end within this (a hung guest fails the suite)
/// on a quiet host: about 20 minutes.
const GUEST_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// How long the guest may take: beside `--noise` the emulated CPU gets half a host CPU and its
/// suites take twice as long (unwind 409 s against 217 s).
pub fn time_limit(noise: bool) -> Duration {
    GUEST_TIMEOUT * if noise { 2 } else { 1 }
}

/// Printed by the guest's init around each suite: `<MARK> begin NAME`, `<MARK> end NAME RC`.
const MARK: &str = "xtask-guest:";

/// Debian's arm64 packages the guest is made of, downloaded once into `target/arm64-guest`.
struct Packages {
    kernel: PathBuf,
    /// The extracted packages: busybox, the C library and libgcc, Debian's Python 3.11, as
    /// Debian installs them.
    root: PathBuf,
}

fn guest_dir() -> PathBuf {
    workspace_root().join("target/arm64-guest")
}

/// Debian's arm64 packages besides the kernel: busybox, the C library, and Python 3.11 (its static
/// interpreter, with USDT probes, and its minimal standard library) with the libraries it links.
const GUEST_PACKAGES: &[&str] = &[
    "busybox-static",
    "libc6",
    "libgcc-s1",
    "python3.11-minimal",
    "libpython3.11-minimal",
    "libexpat1",
    "zlib1g",
];

/// A file each download of `GUEST_PACKAGES` extracts, newest added last: an older download
/// without it is made again.
const GUEST_PACKAGES_HAVE: &str = "usr/bin/python3.11";

/// Download (once) and extract the kernel and `GUEST_PACKAGES`.
fn packages() -> Result<Packages> {
    let dir = guest_dir();
    let debs = dir.join("debs");
    let extracted = dir.join("packages");
    let kernel_of = |dir: &Path| -> Option<PathBuf> {
        std::fs::read_dir(dir.join("boot"))
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
            })
    };
    if let Some(kernel) = kernel_of(&extracted).filter(|_| extracted.join(GUEST_PACKAGES_HAVE).exists()) {
        return Ok(Packages {
            kernel,
            root: extracted,
        });
    }
    let _ = std::fs::remove_dir_all(&debs);
    std::fs::create_dir_all(&debs)?;
    // The metapackage names today's kernel package; the image itself is what is downloaded.
    let depends =
        crate::setup::output(Command::new("apt-cache").args(["depends", "linux-image-cloud-arm64:arm64"]))?;
    let image = depends
        .lines()
        .find_map(|l| l.trim().strip_prefix("Depends: "))
        .map(|p| p.trim().trim_end_matches(":arm64").to_string())
        .context("apt-cache names no kernel image for linux-image-cloud-arm64:arm64")?;
    let mut wanted = vec![format!("{image}:arm64")];
    wanted.extend(GUEST_PACKAGES.iter().map(|p| format!("{p}:arm64")));
    eprintln!("xtask guest: downloading {}", wanted.join(" "));
    sh(Command::new("apt-get")
        .arg("download")
        .args(&wanted)
        .current_dir(&debs))?;
    let _ = std::fs::remove_dir_all(&extracted);
    for deb in std::fs::read_dir(&debs)?.filter_map(|e| e.ok()) {
        sh(Command::new("dpkg-deb").arg("-x").arg(deb.path()).arg(&extracted))?;
    }
    let kernel = kernel_of(&extracted).context("the kernel package held no /boot/vmlinuz-*")?;
    Ok(Packages {
        kernel,
        root: extracted,
    })
}

/// The arm64 builds the guest runs.
struct Builds {
    bpfprof: PathBuf,
    workloads: PathBuf,
    /// (suite name, test executable)
    suites: Vec<(String, PathBuf)>,
}

fn build() -> Result<Builds> {
    crate::build_arm64()?;
    // The guest's test files' executables (only theirs: each links all of `profiler`) and the
    // workloads' directory, as cargo reports them.
    let out = cargo()
        .args([
            "test",
            "--release",
            "-p",
            "bpfprof-tests",
            "--target",
            ARM64_TRIPLE,
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .args(GUEST_SUITES.iter().flat_map(|(suite, _)| ["--test", suite]))
        .env(crate::ARM64_LINKER_ENV, crate::ARM64_GCC)
        .stderr(Stdio::inherit())
        .output()
        .context("starting cargo test --no-run for arm64")?;
    if !out.status.success() {
        bail!("building the arm64 end-to-end tests failed");
    }
    let mut suites = Vec::new();
    let mut workloads = None;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let is_tests_package = message["package_id"]
            .as_str()
            .is_some_and(|id| id.contains("/tests#") || id.contains("bpfprof-tests"));
        match message["reason"].as_str() {
            Some("build-script-executed") if is_tests_package => {
                workloads = message["out_dir"].as_str().map(PathBuf::from);
            }
            Some("compiler-artifact") if message["profile"]["test"] == true => {
                let name = message["target"]["name"].as_str().unwrap_or_default();
                if let (Some(_), Some(exe)) = (guest_suite(name), message["executable"].as_str()) {
                    suites.push((name.to_string(), PathBuf::from(exe)));
                }
            }
            _ => {}
        }
    }
    suites.sort_by_key(|(name, _)| guest_suite(name));
    if suites.len() != GUEST_SUITES.len() {
        bail!(
            "cargo built {} of the guest's {} test files",
            suites.len(),
            GUEST_SUITES.len()
        );
    }
    Ok(Builds {
        bpfprof: workspace_root()
            .join("target")
            .join(ARM64_TRIPLE)
            .join("release/bpfprof"),
        workloads: workloads.context("cargo did not report the arm64 workloads' directory")?,
        suites,
    })
}

/// The guest's init: mount what bpfprof reads, run each suite, power off. Under emulation a
/// perf interrupt takes long enough that the kernel would lower `perf_event_max_sample_rate`
/// (seen: to 250 Hz after one run at 499 Hz, refusing every later `-F 499`): that limit is off.
/// Thread ids start above the 300 the kernel never hands out again, as on a machine that has
/// been up a while, and wrap at 4096: the sched suite's reused-thread-id test (run in the guest
/// only when a filter names it) waits for its first thread's id to come back, which below 300
/// never happens (seen: 122,880 threads created in vain, most of the suite's 16 minutes).
/// `/tmp` stays on the initramfs, no tmpfs over it: the workloads' sources are there when the
/// clone is under `/tmp`.
fn init_script(suites: &[(String, PathBuf)], filter: &[String]) -> String {
    let filter: Vec<String> = filter
        .iter()
        .map(|f| format!("'{}'", f.replace('\'', "")))
        .collect();
    let mut script = String::from(
        "#!/bin/busybox sh\n\
         /bin/busybox --install -s /bin\n\
         export PATH=/bin HOME=/root TMPDIR=/tmp BPFPROF_BIN=/bpfprof BPFPROF_WORKLOADS=/workloads\n\
         mount -t proc proc /proc\n\
         mount -t sysfs sysfs /sys\n\
         mount -t devtmpfs devtmpfs /dev\n\
         mount -t tracefs tracefs /sys/kernel/tracing\n\
         ip link set lo up 2>/dev/null\n\
         echo 0 > /proc/sys/kernel/perf_cpu_time_max_percent\n\
         echo 4096 > /proc/sys/kernel/pid_max\n\
         echo 1000 > /proc/sys/kernel/ns_last_pid\n",
    );
    script +=
        &format!("echo \"{MARK} kernel $(uname -r), $(nproc) CPUs, $(grep -m1 'CPU part' /proc/cpuinfo)\"\n");
    for (name, _) in suites {
        // A filter given to xtask picks tests across the suites; else each suite's own.
        let own = guest_suite(name).and_then(|i| GUEST_SUITES[i].1);
        let filter = match (filter.is_empty(), own) {
            (true, Some(own)) => own.to_string(),
            _ => filter.join(" "),
        };
        script += &format!(
            "echo \"{MARK} begin {name}\"\n/tests/{name} --test-threads=1 {filter}\necho \"{MARK} end {name} $?\"\n"
        );
    }
    script += &format!("echo \"{MARK} done\"\npoweroff -f\n");
    script
}

/// The initramfs: Debian's packages, then ours on top.
fn initramfs(packages: &Packages, builds: &Builds, filter: &[String]) -> Result<PathBuf> {
    let root = guest_dir().join("root");
    let _ = std::fs::remove_dir_all(&root);
    sh(Command::new("cp").arg("-a").arg(&packages.root).arg(&root))?;
    // The kernel's modules are not needed (everything the tests use is built in): 100 MB less.
    let _ = std::fs::remove_dir_all(root.join("lib/modules"));
    let _ = std::fs::remove_dir_all(root.join("boot"));
    for dir in ["proc", "sys", "dev", "tmp", "root", "tests"] {
        std::fs::create_dir_all(root.join(dir))?;
    }
    std::fs::copy(&builds.bpfprof, root.join("bpfprof"))?;
    // The workloads' sources, where their debug info says they are: annotate shows source lines.
    let sources = root.join(workspace_root().strip_prefix("/")?).join("tests");
    std::fs::create_dir_all(&sources)?;
    sh(Command::new("cp")
        .arg("-a")
        .arg(workspace_root().join("tests/workloads"))
        .arg(&sources))?;
    sh(Command::new("cp")
        .arg("-a")
        .arg(&builds.workloads)
        .arg(root.join("workloads")))?;
    for (name, exe) in &builds.suites {
        std::fs::copy(exe, root.join("tests").join(name))?;
    }
    let init = root.join("init");
    std::fs::write(&init, init_script(&builds.suites, filter))?;
    sh(Command::new("chmod").arg("+x").arg(&init))?;
    let image = guest_dir().join("initramfs.cpio");
    let file = std::fs::File::create(&image)?;
    // newc, the format the kernel unpacks; uncompressed (the kernel reads it as is, and xz of
    // 50 MB would take longer than the boot).
    sh(Command::new("sh")
        .args(["-c", "find . | cpio -o -H newc --quiet"])
        .current_dir(&root)
        .stdout(file))?;
    Ok(image)
}

/// Build, boot, run every guest suite; one outcome per suite, as the host suites give.
pub fn run_suites(filter: &[String], limit: Duration) -> Result<Vec<Outcome>> {
    let packages = packages()?;
    let builds = build()?;
    let image = initramfs(&packages, &builds, filter)?;
    let mut qemu = Command::new("qemu-system-aarch64");
    qemu.args(["-M", "virt", "-cpu", "neoverse-n1", "-smp", "1", "-m", "1G"])
        // One instruction per virtual ns: cycles = instructions, exactly.
        .args(["-icount", "shift=0"])
        .args(["-nographic", "-no-reboot"])
        .arg("-kernel")
        .arg(&packages.kernel)
        .arg("-initrd")
        .arg(&image)
        .args(["-append", "console=ttyAMA0 quiet panic=-1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let started = Instant::now();
    let mut child = qemu.spawn().context("starting qemu-system-aarch64")?;
    let pid = child.id();
    // A hung guest is killed, and its suite fails with what it printed so far.
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        let _ = Command::new("kill").arg(pid.to_string()).status();
    });
    let mut outcomes = Vec::new();
    let mut current: Option<(String, Tally, Instant)> = None;
    let mut finished = false;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line?;
        let line = line.trim_end_matches('\r');
        let Some(mark) = line.strip_prefix(MARK).map(str::trim) else {
            let took = current.as_mut().and_then(|(_, tally, _)| tally.read(line));
            println!("{}", timed(line, took));
            continue;
        };
        println!("{line}");
        if let Some(name) = mark.strip_prefix("begin ") {
            current = Some((name.to_string(), Tally::default(), Instant::now()));
        } else if let Some(rest) = mark.strip_prefix("end ") {
            let code = rest.rsplit(' ').next().unwrap_or_default();
            let failed_with = (code != "0").then(|| format!("exit code {code}"));
            if let Some((name, tally, began)) = current.take() {
                outcomes.push(tally.outcome(&format!("arm64 {name}"), failed_with, began.elapsed()));
            }
        } else if mark == "done" {
            finished = true;
        }
    }
    let status = child.wait()?;
    if let Some((name, tally, began)) = current.take() {
        let failed_with = Some(format!("the guest stopped: {status}"));
        outcomes.push(tally.outcome(&format!("arm64 {name}"), failed_with, began.elapsed()));
    }
    if !finished {
        outcomes.push(Outcome {
            suite: "arm64 guest".into(),
            passed: 0,
            failed: 1,
            failures: vec![format!(
                "the guest did not finish its suites ({status} after {:.0} s)",
                started.elapsed().as_secs_f64()
            )],
            took: started.elapsed(),
            ..Default::default()
        });
    }
    Ok(outcomes)
}
