//! Crafted programs on a live machine: copies of the hotspot workload whose `.eh_frame` is
//! truncated, refers to itself or claims 64 GiB, one whose build-id note claims libc's, one that
//! moves its text to anonymous memory and back while sampled, and the
//! JIT workload with garbage appended to its perf map, all running while bpfprof profiles the
//! whole system and while the agent does. bpfprof finishes with its report, every crafted
//! program's time split as the program itself measured it (frame pointers where its table is
//! bad), each bad table named once with why; its peak RSS beside that of the same run over plain
//! copies; the agent keeps cutting windows.
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use bpfprof_tests::*;

/// A section of an ELF64 little-endian file: its name, where its header is, where its bytes are.
struct Section {
    name: String,
    header: usize,
    offset: usize,
    size: u64,
}

fn u16_at(data: &[u8], at: usize) -> usize {
    u16::from_le_bytes(data[at..at + 2].try_into().unwrap()) as usize
}

fn u64_at(data: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(data[at..at + 8].try_into().unwrap())
}

fn sections(data: &[u8]) -> Vec<Section> {
    let (table, size, count, names) = (
        u64_at(data, 0x28) as usize,
        u16_at(data, 0x3a),
        u16_at(data, 0x3c),
        u16_at(data, 0x3e),
    );
    let names_at = u64_at(data, table + names * size + 0x18) as usize;
    (0..count)
        .map(|n| {
            let header = table + n * size;
            let name_at =
                names_at + u32::from_le_bytes(data[header..header + 4].try_into().unwrap()) as usize;
            let end = data[name_at..].iter().position(|&b| b == 0).unwrap();
            Section {
                name: String::from_utf8_lossy(&data[name_at..name_at + end]).into_owned(),
                header,
                offset: u64_at(data, header + 0x18) as usize,
                size: u64_at(data, header + 0x20),
            }
        })
        .collect()
}

fn section(data: &[u8], name: &str) -> Section {
    (sections(data).into_iter().find(|s| s.name == name)).unwrap_or_else(|| panic!("no {name}"))
}

/// Say the section is `size` bytes long (its header's `sh_size`).
fn claim_size(data: &mut [u8], name: &str, size: u64) {
    let at = section(data, name).header + 0x20;
    data[at..at + 8].copy_from_slice(&size.to_le_bytes());
}

/// A copy of the hotspot workload named `name` in `dir`, edited.
fn crafted(dir: &Path, name: &str, edit: impl FnOnce(&mut Vec<u8>)) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let mut data = std::fs::read(workload("hotspot")).unwrap();
    edit(&mut data);
    let path = dir.join(name);
    std::fs::write(&path, &data).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// The build id in a file's `.note.gnu.build-id` (after the note's 12-byte header and "GNU\0").
fn build_id_range(data: &[u8]) -> std::ops::Range<usize> {
    let note = section(data, ".note.gnu.build-id");
    note.offset + 16..note.offset + note.size as usize
}

/// A program's name in the test, its file, and the hotspot mode it runs (`split`, or `remap`:
/// its text moved to anonymous memory and back before each round).
type Program = (&'static str, PathBuf, &'static str);

/// The crafted programs, the plain copy, and a plain copy remapping its text while sampled.
fn programs(dir: &Path) -> Vec<Program> {
    let libc = std::fs::read(own_libc()).unwrap();
    let libc_id = libc[build_id_range(&libc)].to_vec();
    let crafted_files = vec![
        ("plain", crafted(dir, "hotspot-plain", |_| {})),
        (
            "truncated",
            crafted(dir, "hotspot-truncated", |data| {
                let size = section(data, ".eh_frame").size;
                claim_size(data, ".eh_frame", size / 2 + 3);
            }),
        ),
        (
            "gigabytes",
            crafted(dir, "hotspot-gigabytes", |data| {
                claim_size(data, ".eh_frame", 1 << 36)
            }),
        ),
        (
            "self-referencing",
            crafted(dir, "hotspot-self-referencing", |data| {
                // Every entry (FDE) names, as its CIE, itself.
                let eh_frame = section(data, ".eh_frame");
                let (mut at, end) = (eh_frame.offset, eh_frame.offset + eh_frame.size as usize);
                while at + 8 <= end {
                    let length = u32::from_le_bytes(data[at..at + 4].try_into().unwrap()) as usize;
                    if length == 0 || length == 0xffff_ffff {
                        break;
                    }
                    if data[at + 4..at + 8] != [0; 4] {
                        data[at + 4..at + 8].copy_from_slice(&4u32.to_le_bytes());
                    }
                    at += 4 + length;
                }
            }),
        ),
        (
            "lying build id",
            crafted(dir, "hotspot-lying-id", |data| {
                let ours = build_id_range(data);
                let n = ours.len().min(libc_id.len());
                data[ours.start..ours.start + n].copy_from_slice(&libc_id[..n]);
            }),
        ),
    ];
    let mut programs: Vec<Program> = (crafted_files.into_iter())
        .map(|(name, path)| (name, path, "split"))
        .collect();
    programs.push((
        "remapping text",
        crafted(dir, "hotspot-remapping", |_| {}),
        "remap",
    ));
    programs
}

/// Start each program spinning (`split SECONDS`: its own CPU time) and wait until it runs.
fn start(programs: &[Program], seconds: &str) -> Vec<(&'static str, Running)> {
    let running: Vec<_> = (programs.iter())
        .map(|(name, path, mode)| {
            let child = Running::spawn(Command::new(path).args([*mode, seconds]).stdout(Stdio::piped()));
            (*name, child)
        })
        .collect();
    for (_, child) in &running {
        wait_for_cpu_time(child.pid(), child.pid(), 2e7);
    }
    running
}

/// Run bpfprof to its end, reading its peak RSS (`VmHWM`, kB) until it exits.
fn run_measuring_peak(args: &[&str]) -> (std::process::Output, u64) {
    let mut child = bpfprof()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    while child.try_wait().unwrap().is_none() {
        let text = std::fs::read_to_string(&status).unwrap_or_default();
        let hwm = text.lines().find_map(|l| l.strip_prefix("VmHWM:"));
        if let Some(kb) = hwm.and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok()) {
            peak = peak.max(kb);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert_no_programs_left();
    (out, peak)
}

/// The JIT workload, its perf map then given garbage: lines that are not entries, entries with
/// absurd addresses and sizes, a 256 KiB line, bytes that are not UTF-8. The entry it wrote
/// itself still names its code. It runs for `ms` milliseconds of its clock.
fn jit_with_a_garbage_map(ms: &str) -> Running {
    let jit = Running::spawn(Command::new(workload("jit")).arg(ms).stdout(Stdio::piped()));
    let map = format!("/tmp/perf-{}.map", jit.pid());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&map)
        .unwrap_or_default()
        .contains("jitted_spin")
    {
        assert!(Instant::now() < deadline, "no perf map from the JIT workload");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut garbage: Vec<u8> = Vec::new();
    garbage.extend_from_slice(b"garbage\nzzzz 10 nothing\nffffffffffffffff ffffffffffffffff wraps around\n");
    garbage.extend_from_slice(b"0 0 empty\n1 ffffffffffffffff everything\n");
    garbage.extend(std::iter::repeat_n(b'a', 256 * 1024));
    garbage.extend_from_slice(b"\n7f00 10 \xff\xfe not utf-8\n\n\n");
    let mut file = std::fs::OpenOptions::new().append(true).open(&map).unwrap();
    std::io::Write::write_all(&mut file, &garbage).unwrap();
    jit
}

#[test]
fn crafted_programs_are_profiled_and_their_bad_tables_named() {
    let dir = temp_path("crafted");
    std::fs::create_dir_all(&dir).unwrap();
    let programs = programs(&dir);
    let plain: Vec<_> = programs.iter().filter(|(n, ..)| *n == "plain").cloned().collect();
    let profile = |programs: &[Program], jit: bool| {
        let running = start(programs, "30");
        // Running until the profile is done, however long a busy machine takes to start it.
        let jit = jit.then(|| jit_with_a_garbage_map("60000"));
        let json = temp_path(&format!("crafted-{}.json", rand_suffix()));
        let (out, peak) = run_measuring_peak(&["-a", "-F", "999", "-d", "3", "-o", json.to_str().unwrap()]);
        assert!(out.status.success(), "{}", stderr(&out));
        let truths: Vec<_> = (running.into_iter())
            .map(|(name, child)| (name, truth(&child.stop())))
            .collect();
        let jit = jit.map(|jit| truth(&jit.stop()));
        (Report::read(&json), truths, peak, jit)
    };
    let (_, _, plain_peak, _) = profile(&plain, false);
    let (report, truths, peak, jit) = profile(&programs, true);
    let without: Vec<String> = (report.0["health"]["files_without_tables_named"].as_array())
        .into_iter()
        .flatten()
        .map(|f| f.as_str().unwrap().to_string())
        .collect();
    println!("peak RSS: {peak} kB with the crafted programs, {plain_peak} kB with a plain copy; without tables: {without:#?}");
    for (name, truth) in &truths {
        assert_split(&report, name, truth);
        if *name == "remapping text" {
            // Half its rounds ran from the anonymous copy: named as its file's code all the same.
            assert!(
                truth["remaps"] >= 20.0,
                "it remapped its text while sampled: {truth:?}"
            );
        }
    }
    for bad in [
        "hotspot-truncated",
        "hotspot-gigabytes",
        "hotspot-self-referencing",
    ] {
        let named: Vec<_> = without
            .iter()
            .filter(|f| f.contains(&format!("/{bad}:")))
            .collect();
        assert_eq!(named.len(), 1, "{bad} named once with why: {without:?}");
    }
    assert!(!without
        .iter()
        .any(|f| ["hotspot-plain", "hotspot-lying-id", "hotspot-remapping"]
            .iter()
            .any(|p| f.contains(p))));
    // The map's own entry still names the JIT code: its share as the workload measured it.
    let jit = jit.unwrap();
    let pid = jit["pid"] as u32;
    let want = truth_shares(&jit, &["jitted_spin", "native_spin", "anon"])["jitted_spin"];
    let (got, samples) = (
        report.self_share(pid, "jitted_spin"),
        report.samples_of(pid) as f64,
    );
    println!(
        "the JIT workload: {:.1}% of its {samples} samples in jitted_spin, named by its map; measured {:.1}%",
        got * 100.0,
        want * 100.0
    );
    let tolerance = (SHARE_TOLERANCE_PP / 100.0).max(3.0 * (want * (1.0 - want) / samples).sqrt());
    assert!(
        (got - want).abs() <= tolerance,
        "jitted_spin {got:.4} against {want:.4}"
    );
    // The crafted files cost no more than their own small tables and names.
    assert!(
        peak <= plain_peak + 64 * 1024,
        "{peak} kB against {plain_peak} kB"
    );
}

/// A program's burn functions split as it measured them, within 3 pp or three binomial standard
/// errors of its samples (seven programs share two CPUs: about 600 samples each).
fn assert_split(report: &Report, name: &str, truth: &std::collections::HashMap<String, f64>) {
    let pid = truth["pid"] as u32;
    let samples = report.samples_of(pid) as f64;
    let shares = truth_shares(truth, &["burn_a", "burn_b", "burn_c"]);
    for burn in ["burn_a", "burn_b", "burn_c"] {
        let (got, want) = (report.self_share(pid, burn), shares[burn]);
        let tolerance = (SHARE_TOLERANCE_PP / 100.0).max(3.0 * (want * (1.0 - want) / samples).sqrt());
        println!(
            "{name}: {burn} {:.2}% of {samples} samples, measured {:.2}%",
            got * 100.0,
            want * 100.0
        );
        assert!(
            (got - want).abs() <= tolerance,
            "{name}: {burn} {got:.4} against {want:.4}"
        );
    }
}

/// The agent, with the crafted programs and the garbage perf map running: a window every second,
/// whatever it reads.
#[test]
fn the_agent_keeps_cutting_windows_beside_crafted_programs() {
    let dir = temp_path("crafted-agent");
    std::fs::create_dir_all(&dir).unwrap();
    let programs = programs(&dir);
    let running = start(&programs, "30");
    let _jit = jit_with_a_garbage_map("15000");
    let windows = temp_path(&format!("crafted-windows-{}", rand_suffix()));
    let mut agent = Running::spawn(
        bpfprof()
            .args([
                "agent",
                "--window",
                "1",
                "--output-dir",
                windows.to_str().unwrap(),
            ])
            .stderr(Stdio::piped()),
    );
    let mut stderr = std::io::BufReader::new(agent.0.stderr.take().unwrap());
    wait_for_line(&mut stderr, "a window every");
    let deadline = Instant::now() + Duration::from_secs(30);
    let count = || std::fs::read_dir(&windows).map_or(0, |d| d.count());
    while count() < 4 {
        assert!(Instant::now() < deadline, "{} windows in 30 s", count());
        std::thread::sleep(Duration::from_millis(100));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let (status, said) = finish_bpfprof(agent, stderr);
    println!("{} windows; the agent said: {said}", count());
    assert!(status.success(), "{said}");
    drop(running);
}
