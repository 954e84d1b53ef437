//! `bpfprof sched record`, then `timehist` and `map` on what it wrote, against what the workload
//! knows: each thread's own schedstat (read as its last act), the two threads a pinned
//! ping-pong alternates, the CPUs a thread moved itself between.
use std::collections::HashMap;

use bpfprof_tests::{
    schedload::{schedload, tasks},
    *,
};

/// Each thread's runs, delay and run time against its schedstat: the kernel's own figures,
/// read at each switch (what the thread does after reading its own is the rest).
const TOLERANCE: f64 = 0.02;

/// Record `command`; its stdout and the recording.
fn record(name: &str, command: &[&str]) -> (String, std::path::PathBuf) {
    let path = temp_path(&format!("{name}-{}.json", rand_suffix()));
    let mut args = vec!["sched", "record", "-o", path.to_str().unwrap(), "--"];
    args.extend_from_slice(command);
    let out = run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains(", 0 lost)"), "{}", stderr(&out));
    (stdout(&out), path)
}

/// A view of a recording: its standard output.
fn view(args: &[&str]) -> String {
    let out = bpfprof().args(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    stdout(&out)
}

/// The `[tid/pid]` or `[tid]` of a task name.
fn tid_of(name: &str) -> Option<u32> {
    let inside = name.rsplit_once('[')?.1.strip_suffix(']')?;
    inside.split('/').next()?.parse().ok()
}

#[test]
fn timehist_runs_are_the_kernels_own_for_every_thread() {
    let (workload, path) = record("timehist", &[&schedload(), "2", "3"]);
    let path = path.to_str().unwrap();
    let listing = view(&["sched", "timehist", path, "-s"]);
    // Per thread: its lines' delay and run time (ns, in order), and the summary's runs, run
    // time and delay.
    let mut lines: HashMap<u32, Vec<(f64, f64)>> = HashMap::new();
    let mut summary: HashMap<u32, (f64, f64, f64)> = HashMap::new();
    let mut in_summary = false;
    for line in listing.lines() {
        in_summary |= line.starts_with("Runtime summary");
        let fields: Vec<&str> = line.split_whitespace().collect();
        // A field of milliseconds, in ns.
        let ms = |i: usize| fields[i].parse::<f64>().unwrap() * 1e6;
        if !in_summary && fields.len() == 6 && fields[1].starts_with('[') {
            if let Some(tid) = tid_of(fields[2]) {
                lines.entry(tid).or_default().push((ms(4), ms(5)));
            }
        } else if in_summary && fields.len() == 9 {
            if let (Some(tid), Ok(runs)) = (tid_of(fields[0]), fields[1].parse::<f64>()) {
                summary.insert(tid, (runs, ms(2), ms(6)));
            }
        }
    }
    let truth = tasks(&workload);
    assert_eq!(truth.len(), 4);
    for t in &truth {
        let (runs, run_ns, delay_ns) = summary[&t.tid];
        let own = &lines[&t.tid];
        assert_eq!(
            own.len() as f64,
            runs,
            "a line per run, as the summary counts them"
        );
        // The runs after the one that read schedstat (its exit), each a line: what the read
        // cannot know. The run that read is counted in pcount, its delay in run_delay.
        let after = own.get(t.pcount as usize..).unwrap_or_default();
        let (after_delay, after_run) = after.iter().fold((0.0, 0.0), |(d, r), l| (d + l.0, r + l.1));
        let (delay_ns, run_ns) = (delay_ns - after_delay, run_ns - after_run);
        eprintln!(
            "{} {}: {runs} runs vs pcount {}, run {run_ns:.0} vs {:.0} ns, delay {delay_ns:.0} vs {:.0} ns (after the read: {after:?})",
            t.role, t.tid, t.pcount, t.oncpu, t.run_delay
        );
        // Every run the kernel counted until the thread's read (begun after the recording did),
        // and what its exit after the read adds.
        assert!(
            runs >= t.pcount && runs <= t.pcount + 2.0,
            "{} tid {}: {runs} runs, pcount {}",
            t.role,
            t.tid,
            t.pcount
        );
        let near = |what: &str, got: f64, want: f64| {
            let (role, tid) = (&t.role, t.tid);
            assert!(
                (got - want).abs() <= TOLERANCE * want,
                "{role} tid {tid}: {what} {got} ns, schedstat {want}"
            );
        };
        near("run time", run_ns, t.oncpu);
        near("sch delay", delay_ns, t.run_delay);
    }
    let _ = std::fs::remove_file(path);
}

/// The ping-pong's two threads pinned to CPU 0 pass a byte back and forth: in the map they
/// appear only in CPU 0's column, each handing the CPU to the other (now and then something
/// else runs between).
#[test]
fn the_map_shows_a_pinned_pair_alternating_on_its_cpu() {
    let (workload, path) = record("map", &[&schedload(), "pingpong", "3000", "0"]);
    let pair: HashMap<String, u32> = (truth(&workload).into_iter())
        .map(|(k, v)| (k, v as u32))
        .collect();
    let map = view(&["sched", "map", path.to_str().unwrap(), "--width", "400"]);
    // The codes the legend gives the two threads.
    let mut codes: HashMap<String, u32> = HashMap::new();
    for line in map.lines() {
        if let Some((code, name)) = line
            .rsplit_once(" => ")
            .and_then(|(l, n)| Some((l.rsplit(' ').next()?, n)))
        {
            if let Some(tid) = tid_of(name).filter(|t| pair.values().any(|p| p == t)) {
                codes.insert(code.to_string(), tid);
            }
        }
    }
    assert_eq!(
        codes.len(),
        2,
        "both threads named in the legend: {codes:?}\n{map}"
    );
    // Each line: the CPU marked `*` and the code it switched to; from the pong thread's start
    // (the process pinned itself before starting it: until then it ran anywhere).
    let mut on_cpu0 = Vec::new();
    for line in map.lines() {
        // The CPUs' columns are three characters each, `*` first where the CPU switched.
        let Some(star) = line
            .char_indices()
            .step_by(3)
            .find(|&(_, c)| c == '*')
            .map(|(at, _)| at)
        else {
            continue;
        };
        let code = &line[star + 1..star + 3];
        let Some(&tid) = codes.get(code) else { continue };
        if on_cpu0.is_empty() && tid != pair["pong"] {
            continue;
        }
        assert_eq!(star / 3, 0, "a pinned thread on CPU {}: {line}", star / 3);
        on_cpu0.push(tid);
    }
    let handovers = on_cpu0.windows(2).filter(|w| w[0] != w[1]).count();
    eprintln!(
        "{} switches to the pair on CPU 0, {handovers} from one to the other",
        on_cpu0.len()
    );
    assert!(
        on_cpu0.len() >= 6000,
        "3000 round trips: {} switches",
        on_cpu0.len()
    );
    assert!(
        handovers as f64 >= 0.9 * (on_cpu0.len() - 1) as f64,
        "they alternate: {handovers} of {}",
        on_cpu0.len()
    );
    let _ = std::fs::remove_file(path);
}

/// A thread that moves itself between CPUs 0 and 1: `-M` lists each move it made, from the CPU
/// it ran on to the other. (Two CPUs at least: the guest has one.)
#[test]
fn migrations_are_listed_where_the_thread_moved() {
    let (workload, path) = record("hop", &[&schedload(), "hop", "20"]);
    let truth: HashMap<String, u32> = (truth(&workload).into_iter())
        .map(|(k, v)| (k, v as u32))
        .collect();
    let tid = truth["tid"].to_string();
    let listing = view(&["sched", "timehist", path.to_str().unwrap(), "-M", "--tid", &tid]);
    let moves: Vec<(u32, u32)> = listing
        .lines()
        .filter(|l| l.contains("migrated:"))
        .filter_map(|l| {
            let (_, cpus) = l.split_once(" cpu ")?;
            let (from, to) = cpus.split_once(" => ")?;
            Some((from.trim().parse().ok()?, to.trim().parse().ok()?))
        })
        .collect();
    eprintln!("{} moves listed, the thread made {}", moves.len(), truth["hops"]);
    assert!(truth["hops"] >= 10, "the workload could not move: {workload}");
    assert!(moves.len() as u32 >= truth["hops"], "{moves:?}\n{listing}");
    assert!(moves.iter().all(|(from, to)| from != to), "{moves:?}");
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_file_that_is_not_a_recording_is_refused_naming_it() {
    let path = temp_path(&format!("not-a-recording-{}.json", rand_suffix()));
    std::fs::write(&path, "{\"mode\":\"sched\"}\n").unwrap();
    for view in ["timehist", "map"] {
        let out = bpfprof()
            .args(["sched", view, path.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("is not a header `bpfprof sched record` writes"),
            "{}",
            stderr(&out)
        );
    }
    let _ = std::fs::remove_file(path);
}
