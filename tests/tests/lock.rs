//! Lock mode against a workload that times its own waits: threads contend for one global mutex
//! (held 1 ms at a time in `critical_section`) and take private mutexes nobody else touches;
//! the same for each source that can see it, a lock destroyed and its memory reused, kernel
//! lock contention, and bad input.
use bpfprof_tests::*;
use serde_json::Value;

const TOLERANCE: f64 = 0.10;

/// `bpfprof --mode lock -o OUTPUT EXTRA -- COMMAND`, which must succeed: its output and the
/// report's path.
fn lock_command(
    output: &str,
    extra: &[&str],
    command: &[&str],
) -> (std::process::Output, std::path::PathBuf) {
    let path = temp_path(output);
    let mut args = vec!["--mode", "lock", "-o", path.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(command);
    let out = run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    (out, path)
}

fn lock_run(
    name: &str,
    extra: &[&str],
    workload_args: &[&str],
) -> (std::collections::HashMap<String, f64>, Value) {
    let bin = workload("lockload");
    let mut command = vec![bin.to_str().unwrap()];
    command.extend_from_slice(workload_args);
    let (out, json) = lock_command(name, extra, &command);
    let truth = truth(&stdout(&out));
    let report = read_json(&json);
    (truth, report)
}

fn functions(frames: &Value) -> Vec<&str> {
    frames
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["function"].as_str().unwrap())
        .collect()
}

fn address_of(truth: &std::collections::HashMap<String, f64>, key: &str) -> String {
    format!("{:#x}", truth[key] as u64)
}

/// The shared lock of `lockload 3 2` as `source` reports it, checked against the workload's
/// own timing; returns it with the run's truth.
fn check_shared_lock(source: &str) -> (std::collections::HashMap<String, f64>, Value) {
    let (truth, report) = lock_run(
        &format!("lock-{source}.json"),
        &["--lock-source", source],
        &["3", "2", "1.5"],
    );
    assert_eq!(report["mode"], "lock");
    assert_eq!(report["source"], source);
    let pid = truth["pid"] as u32;
    let locks = report["locks"].as_array().unwrap();
    let shared = address_of(&truth, "shared");
    let lock = locks
        .iter()
        .find(|l| l["address"] == shared.as_str())
        .unwrap_or_else(|| panic!("shared lock {shared} not reported: {locks:?}"))
        .clone();
    assert_eq!(lock["pid"], pid);
    assert_eq!(
        lock["symbol"], "shared_lock",
        "named from the symbol table (.bss)"
    );
    assert_eq!(lock["kind"], "mutex");
    let waited = lock["total_wait_ns"].as_f64().unwrap();
    let truth_wait = truth["wait_ns"];
    assert!(truth_wait > 1e9, "the workload should contend: {truth_wait} ns");
    assert!(
        (waited - truth_wait).abs() <= TOLERANCE * truth_wait,
        "{source}: shared_lock {waited} ns waited, the workload timed {truth_wait} ns"
    );
    let contentions = lock["contentions"].as_u64().unwrap();
    assert!(
        contentions > 100 && contentions as f64 <= 1.5 * truth["acquisitions"],
        "{contentions} waits"
    );

    // Waiting stacks name the function that called the lock function.
    let named: f64 = lock["waiters"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| {
            let f = functions(&w["frames"]);
            f.windows(2)
                .any(|p| p[0] == "critical_section" && p[1].contains("pthread_mutex_lock"))
        })
        .map(|w| w["total_wait_ns"].as_f64().unwrap())
        .sum();
    assert!(
        named >= 0.90 * waited,
        "critical_section -> pthread_mutex_lock on {named} of {waited} ns"
    );

    // Never-contended private locks never show up.
    for i in 0..3 {
        let private = address_of(&truth, &format!("private{i}"));
        assert!(
            locks.iter().all(|l| l["address"] != private.as_str()),
            "private lock {private} reported as contended"
        );
    }
    assert!(report["health"]["lock_waits"].as_u64().unwrap() >= contentions);
    assert_no_programs_left();
    (truth, lock)
}

/// Wait charged to holder stacks that have `function`, and to all holder stacks.
fn held_by(lock: &Value, function: &str) -> (f64, f64) {
    let holders = lock["holders"].as_array().unwrap();
    let wait = |h: &&Value| h["total_wait_ns"].as_f64().unwrap();
    let named = holders
        .iter()
        .filter(|h| functions(&h["frames"]).contains(&function))
        .map(|h| wait(&h))
        .sum();
    (named, holders.iter().map(|h| wait(&h)).sum())
}

#[test]
fn futex_source_the_shared_lock_its_wait_its_waiters_and_its_holders() {
    let (_, lock) = check_shared_lock("futex");
    // Holders: the stack that released the lock to each waiter is the critical section's.
    let waited = lock["total_wait_ns"].as_f64().unwrap();
    let (released, _) = held_by(&lock, "critical_section");
    assert!(
        released >= 0.90 * waited,
        "released from critical_section for {released} of {waited} ns"
    );
}

#[test]
fn pthread_source_the_shared_lock_its_wait_its_holders_and_hold_times() {
    let (truth, lock) = check_shared_lock("pthread");
    let waited = lock["total_wait_ns"].as_f64().unwrap();
    // Holders: the stacks that held the lock while others waited, charged with that waiting.
    // What is not charged is the hand-over (released, not yet taken), when the woken waiter
    // waits for a CPU: on one CPU most of a wait. The workload's own spans give the truth.
    let (named, charged) = held_by(&lock, "critical_section");
    let truth_held = truth["held_while_waited_ns"];
    assert!(
        (charged - truth_held).abs() <= TOLERANCE * truth_held && charged <= 1.01 * waited,
        "holders charged {charged} of {waited} ns waited; the workload's holds overlap its waits for {truth_held} ns"
    );
    eprintln!(
        "holders charged {:.1} ms, the workload's holds overlap its waits for {:.1} ms ({:.1} ms waited)",
        charged / 1e6,
        truth_held / 1e6,
        waited / 1e6
    );
    assert!(
        named >= 0.95 * charged,
        "held in critical_section for {named} of {charged} ns"
    );
    let unlock = lock["holders"][0]["frames"].as_array().unwrap();
    let leaf = unlock.last().unwrap()["function"].as_str().unwrap();
    assert!(leaf.contains("pthread_mutex_unlock"), "holder leaf {leaf}");
    // Every acquisition's hold: ~1 ms of spinning, more when the holder lost its CPU; the
    // workload times each one.
    let holds = &lock["holds"];
    let count = holds["holds"].as_f64().unwrap();
    assert!(
        (count - truth["acquisitions"]).abs() <= 0.02 * truth["acquisitions"],
        "{count} holds, {} acquisitions",
        truth["acquisitions"]
    );
    let avg = holds["avg_hold_ns"].as_f64().unwrap();
    let truth_avg = truth["hold_ns"] / truth["acquisitions"];
    assert!(
        truth_avg >= 1e6,
        "the workload holds for 1 ms at least: {truth_avg} ns"
    );
    assert!(
        (avg - truth_avg).abs() <= 0.05 * truth_avg,
        "average hold {avg} ns, the workload timed {truth_avg} ns"
    );
}

#[test]
fn pthread_source_tells_a_lock_from_the_next_one_in_the_same_memory() {
    let (truth, report) = lock_run("lock-reuse.json", &["--lock-source", "pthread"], &["reuse", "2"]);
    assert_eq!(
        truth["first"], truth["second"],
        "the allocator should hand back the same memory"
    );
    let address = address_of(&truth, "first");
    let locks: Vec<&Value> = report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["address"] == address.as_str())
        .collect();
    assert_eq!(locks.len(), 2, "two locks at {address}: {locks:?}");
    for (instance, kind, function, truth_wait, truth_held) in [
        (0, "mutex", "first_use", truth["wait1_ns"], truth["held1_ns"]),
        (1, "rwlock", "second_use", truth["wait2_ns"], truth["held2_ns"]),
    ] {
        let lock = locks
            .iter()
            .find(|l| l["instance"].as_u64().unwrap_or(0) == instance)
            .unwrap_or_else(|| panic!("no lock number {instance} at {address}"));
        assert_eq!(lock["kind"], kind);
        let waited = lock["total_wait_ns"].as_f64().unwrap();
        assert!(
            (waited - truth_wait).abs() <= TOLERANCE * truth_wait,
            "{kind}: {waited} ns waited, the workload timed {truth_wait} ns"
        );
        for waiter in lock["waiters"].as_array().unwrap() {
            let f = functions(&waiter["frames"]);
            assert!(f.contains(&function), "{kind} waited for from {f:?}");
        }
        let (named, charged) = held_by(lock, function);
        assert!(
            (charged - truth_held).abs() <= TOLERANCE * truth_held && named >= 0.95 * charged,
            "{kind}: held in {function} for {named} of {charged} ns; the workload's holds overlap its waits for {truth_held} ns"
        );
        eprintln!(
            "{kind}: {:.1} ms waited (workload {:.1}), holders charged {:.1} ms (workload {:.1})",
            waited / 1e6,
            truth_wait / 1e6,
            charged / 1e6,
            truth_held / 1e6
        );
    }
}

#[test]
fn kernel_source_finds_the_mmap_lock_with_kernel_stacks() {
    let (truth, report) = lock_run(
        "lock-kernel.json",
        &["--lock-source", "kernel"],
        &["mmap", "2", "2"],
    );
    assert_eq!(report["source"], "kernel");
    let pid = truth["pid"] as u32;
    let locks = report["locks"].as_array().unwrap();
    assert!(!locks.is_empty(), "no kernel lock contention seen");
    // Two threads mapping and unmapping contend on their process's mmap lock (an rwsem, in the
    // mm_struct: heap memory, no symbol), from the mmap/munmap/fault paths.
    let mmap_lock = locks
        .iter()
        .filter(|l| l["pid"] == pid && l["kind"] == "rwsem")
        .max_by_key(|l| l["total_wait_ns"].as_u64().unwrap())
        .unwrap_or_else(|| panic!("no rwsem contention: {locks:?}"));
    let waiters = mmap_lock["waiters"].as_array().unwrap();
    let in_mm = waiters.iter().any(|w| {
        functions(&w["frames"])
            .iter()
            .any(|f| f.contains("mmap") || f.contains("munmap") || f.contains("fault"))
    });
    assert!(in_mm, "mmap lock waiters: {waiters:?}");
    assert!(
        mmap_lock["symbol"].is_null(),
        "heap lock named {}",
        mmap_lock["symbol"]
    );
    // Two threads can wait at most two seconds each, and holders are not claimed.
    let total: u64 = locks.iter().map(|l| l["total_wait_ns"].as_u64().unwrap()).sum();
    assert!(total > 0 && total < 4_200_000_000, "{total} ns");
    assert!(locks.iter().all(|l| l["holders"].as_array().unwrap().is_empty()));
    assert_no_programs_left();
}

#[test]
fn pthread_source_on_a_stripped_static_binary_says_what_to_use_instead() {
    let bin = workload("lockload-static-stripped");
    let out = run(&[
        "--mode",
        "lock",
        "--lock-source",
        "pthread",
        "--",
        bin.to_str().unwrap(),
        "2",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("no pthread lock functions") && err.contains("--lock-source futex"),
        "{err}"
    );
    // The same for a running process; the futex source still sees its lock.
    // Alive for both runs however long they take to start; stopped once they are done.
    let running = start_workload("lockload-static-stripped", &["2", "60"]);
    let pid = running.pid().to_string();
    let out = run(&[
        "--mode",
        "lock",
        "--lock-source",
        "pthread",
        "-p",
        &pid,
        "-d",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("no pthread lock functions"),
        "{}",
        stderr(&out)
    );
    let json = temp_path("lock-static-futex.json");
    let out = run(&[
        "--mode",
        "lock",
        "-p",
        &pid,
        "-d",
        "1",
        "-o",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: Value = read_json(&json);
    let truth = truth(&running.stop());
    let shared = address_of(&truth, "shared");
    assert!(
        report["locks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["address"] == shared.as_str()),
        "futex source on the static binary: {report}"
    );
    assert_no_programs_left();
}

#[test]
fn pthread_source_needs_a_target() {
    let out = run(&["--mode", "lock", "--lock-source", "pthread", "-d", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("give -p PID or a command"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_target_exiting_mid_run_still_gets_its_report() {
    for source in ["pthread", "futex"] {
        let running = start_workload("lockload", &["2", "60"]);
        let pid = running.pid();
        // Its workers running: past the dynamic loader, libc (and its lock functions) mapped.
        let worker = *threads_of(pid, 3).iter().find(|&&tid| tid != pid).unwrap();
        let json = temp_path(&format!("lock-exit-{source}.json"));
        let pid_arg = pid.to_string();
        let (bpfprof, stderr) = start_bpfprof(&[
            "--mode",
            "lock",
            "--lock-source",
            source,
            "-p",
            &pid_arg,
            "-d",
            "60",
            "-o",
            json.to_str().unwrap(),
        ]);
        // Contention under bpfprof (half a second of a worker's CPU), then the target exits.
        wait_for_cpu_time(pid, worker, 5e8);
        let stopped = std::time::Instant::now();
        let truth = truth(&running.stop());
        let (status, err) = finish_bpfprof(bpfprof, stderr);
        assert!(status.success(), "{err}");
        assert!(
            stopped.elapsed().as_secs() < 20,
            "the run should end with its target, not at -d 60"
        );
        let report: Value = read_json(&json);
        let shared = address_of(&truth, "shared");
        assert!(
            report["locks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|l| l["address"] == shared.as_str()),
            "{source}: {report}"
        );
        assert!(
            report["notes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|n| n.as_str().unwrap().contains("exited")),
            "{source}: {}",
            report["notes"]
        );
    }
}

#[test]
fn stack_formats_weigh_waiting_stacks_by_wait() {
    let bin = workload("lockload");
    // As much contention as the shared-lock tests, however busy the machine (see lockload).
    let (out, json) = lock_command("lock.folded", &[], &[bin.to_str().unwrap(), "3", "2", "1.5"]);
    let folded = std::fs::read_to_string(&json).unwrap();
    let shared: u64 = folded
        .lines()
        .filter(|l| l.contains("critical_section") && l.contains("[lock shared_lock]"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    let truth = truth(&stdout(&out));
    assert!(
        (shared as f64 - truth["wait_ns"]).abs() <= 0.15 * truth["wait_ns"],
        "folded weight under [lock shared_lock]: {shared} ns, truth {} ns",
        truth["wait_ns"]
    );
}

/// `waits 2` under lock mode, written as `output` (its format from the extension).
fn waits_run(output: &str, extra: &[&str]) -> (std::collections::HashMap<String, f64>, std::path::PathBuf) {
    let bin = workload("waits");
    let (out, path) = lock_command(output, extra, &[bin.to_str().unwrap(), "2"]);
    (truth(&stdout(&out)), path)
}

fn wait_of(entries: &[&Value]) -> f64 {
    entries.iter().map(|l| l["total_wait_ns"].as_f64().unwrap()).sum()
}

#[test]
fn contention_leads_and_waits_for_events_stand_apart() {
    let (truth, json) = waits_run("waits.json", &[]);
    let report: Value = read_json(&json);
    let pid = truth["pid"] as u32;
    let locks: Vec<&Value> = report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["pid"] == pid)
        .collect();
    let of = |class: &str| -> Vec<&Value> { locks.iter().copied().filter(|l| l["class"] == class).collect() };
    let (contention, waiting) = (of("contention"), of("waiting"));
    assert_eq!(
        contention.len() + waiting.len(),
        locks.len(),
        "every entry has a class: {locks:?}"
    );

    // The static (local symbol) mutex leads the contention, named, with its own wait.
    let top = contention.first().expect("a contended lock");
    assert_eq!(top["address"], address_of(&truth, "table_lock").as_str());
    assert_eq!(top["symbol"], "table_lock", "a local static named from .symtab");
    assert_eq!(top["kind"], "mutex");
    let waited = top["total_wait_ns"].as_f64().unwrap();
    assert!(
        (waited - truth["wait_ns"]).abs() <= TOLERANCE * truth["wait_ns"],
        "table_lock {waited} ns waited, the workload timed {} ns",
        truth["wait_ns"]
    );
    let in_update: f64 = top["waiters"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| functions(&w["frames"]).contains(&"update_table"))
        .map(|w| w["total_wait_ns"].as_f64().unwrap())
        .sum();
    assert!(
        in_update >= 0.90 * waited,
        "update_table waits {in_update} of {waited} ns"
    );
    assert_eq!(top["waited_in"], "update_table");

    // Joins and the condition variable are waits for events, never contention.
    for lock in &contention {
        assert!(
            !matches!(
                lock["kind"].as_str(),
                Some("join" | "condvar" | "barrier" | "futex")
            ),
            "an event wait among contention: {lock}"
        );
    }
    let joins: Vec<&Value> = waiting.iter().copied().filter(|l| l["kind"] == "join").collect();
    let joined = wait_of(&joins);
    assert!(
        (joined - truth["join_ns"]).abs() <= TOLERANCE * truth["join_ns"],
        "joins: {joined} ns waited, the main thread timed {} ns in pthread_join",
        truth["join_ns"]
    );
    // The first join began before bpfprof could read the process's memory map (it is the
    // process's first futex wait, right after it started its threads): its stack is still whole.
    for join in &joins {
        assert!(join["thread"].as_u64().is_some(), "the thread joined: {join}");
        for waiter in join["waiters"].as_array().unwrap() {
            let f = functions(&waiter["frames"]);
            assert!(f.contains(&"main"), "a join's stack without main: {f:?}");
        }
    }
    let condvars: Vec<&Value> = waiting
        .iter()
        .copied()
        .filter(|l| l["kind"] == "condvar")
        .collect();
    let cond_waited = wait_of(&condvars);
    // Two consumers sleep on either of the condition variable's two signal words: one entry, at
    // the condition variable's own address, named by its symbol.
    assert_eq!(condvars.len(), 1, "one condition variable: {condvars:?}");
    assert_eq!(
        condvars[0]["address"].as_str(),
        Some(format!("{:#x}", truth["ready"] as u64).as_str()),
        "at the condition variable's own address"
    );
    assert_eq!(condvars[0]["symbol"], "ready");
    assert!(
        (cond_waited - truth["cond_wait_ns"]).abs() <= TOLERANCE * truth["cond_wait_ns"],
        "condition variable: {cond_waited} ns waited, the consumer timed {} ns in pthread_cond_wait",
        truth["cond_wait_ns"]
    );
    // Who signalled: the producer's stack, for (nearly) all of the wait it ended.
    let (signalled, from) = condvars
        .iter()
        .map(|c| held_by(c, "producer"))
        .fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
    assert!(
        signalled >= 0.90 * from && from >= 0.80 * cond_waited,
        "signalled from producer for {signalled} of {from} ns attributed ({cond_waited} ns waited)"
    );
    // However long, the waits for events rank below the contention, which leads the list.
    let first_waiting = locks.iter().position(|l| l["class"] == "waiting").unwrap();
    assert_eq!(first_waiting, contention.len(), "contention first");
    assert!(
        wait_of(&waiting) > waited,
        "this workload waits longer for events than for the lock"
    );
}

#[test]
fn stack_formats_carry_contention_unless_asked_for_every_wait() {
    let (_, folded) = waits_run("waits.folded", &[]);
    let folded = std::fs::read_to_string(folded).unwrap();
    assert!(folded.contains("[lock table_lock]"), "{folded}");
    // The consumer's mutex, taken again as its condition variable wait returns, is contention;
    // the condition variable (`ready`, named at its own address whichever word was waited on)
    // and the joins are not.
    for line in folded.lines() {
        assert!(
            !line.contains("[lock ready]") && !line.contains("[lock thread "),
            "an event wait in the contention view: {line}"
        );
    }
    let (_, all) = waits_run("waits-all.folded", &["--waits", "all"]);
    let all = std::fs::read_to_string(all).unwrap();
    assert!(all.contains("[lock table_lock]"), "{all}");
    assert!(
        all.lines()
            .any(|l| l.contains("wait_for_work") && l.contains("[lock ready]")),
        "--waits all carries the condition variable's waits: {all}"
    );
    assert!(
        all.lines().any(|l| l.contains("[lock thread ")),
        "and the joins: {all}"
    );
}

/// Text that compresses, made here (so the test needs no data set).
fn compressible_text(bytes: usize) -> Vec<u8> {
    let words = [
        "lock", "wait", "futex", "thread", "mutex", "signal", "queue", "worker", "block", "xz",
    ];
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut text = Vec::with_capacity(bytes + 16);
    while text.len() < bytes {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        text.extend_from_slice(words[(state % 10) as usize].as_bytes());
        text.push(if state.is_multiple_of(13) { b'\n' } else { b' ' });
        text.extend_from_slice(format!("{}", state % 1000).as_bytes());
    }
    text
}

#[test]
fn a_compressors_worker_pool_waits_for_work_it_does_not_contend() {
    // Debian's xz, multi-threaded: workers wait on condition variables for blocks, the main thread
    // for their output; its mutexes are held for microseconds.
    let data = temp_path("xz-input.txt");
    std::fs::write(&data, compressible_text(24 << 20)).unwrap();
    let (_, json) = lock_command(
        "xz.json",
        &[],
        &[
            "xz",
            "-T2",
            "--block-size=2MiB",
            "-k",
            "-f",
            "-6",
            data.to_str().unwrap(),
        ],
    );
    assert!(temp_path("xz-input.txt.xz").exists(), "xz compressed");
    let report: Value = read_json(&json);
    let locks: Vec<&Value> = report["locks"].as_array().unwrap().iter().collect();
    let of = |class: &str| -> Vec<&Value> { locks.iter().copied().filter(|l| l["class"] == class).collect() };
    let (contention, waiting) = (of("contention"), of("waiting"));
    let condvars: Vec<&Value> = waiting
        .iter()
        .copied()
        .filter(|l| l["kind"] == "condvar")
        .collect();
    let (contended, cond_waited) = (wait_of(&contention), wait_of(&condvars));
    eprintln!(
        "xz -T2: {} contended locks {:.3} ms, {} condition variables {:.1} ms, {} waits for events {:.1} ms",
        contention.len(),
        contended / 1e6,
        condvars.len(),
        cond_waited / 1e6,
        waiting.len(),
        wait_of(&waiting) / 1e6
    );
    assert!(
        cond_waited > 1e8,
        "xz's threads wait on condition variables: {cond_waited} ns"
    );
    // One entry per condition variable: none within a `pthread_cond_t` (48 bytes) of another
    // (its two signal words were two entries, 4 bytes apart).
    let mut at: Vec<u64> = condvars
        .iter()
        .map(|c| u64::from_str_radix(c["address"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap())
        .collect();
    at.sort();
    assert!(
        at.windows(2).all(|w| w[1] - w[0] >= 48),
        "condition variables at {at:x?}"
    );
    // Their stacks are in pthread_cond_*: all but a wait that began and ended before xz's unwind
    // tables were in (a frame-pointer stack, cut in libc), a known limit.
    let in_cond: f64 = condvars
        .iter()
        .flat_map(|c| c["waiters"].as_array().unwrap())
        .filter(|w| {
            functions(&w["frames"])
                .iter()
                .any(|f| f.contains("pthread_cond_"))
        })
        .map(|w| w["total_wait_ns"].as_f64().unwrap())
        .sum();
    assert!(
        in_cond >= 0.90 * cond_waited,
        "condition variable waits in pthread_cond_*: {in_cond} of {cond_waited} ns"
    );
    assert!(
        contended <= 0.05 * cond_waited,
        "contention {contended} ns is small beside the waits for work ({cond_waited} ns)"
    );
}

/// Redis's one I/O thread (`io_thd_1`) of `redis-server --io-threads 2`, once it exists.
fn redis_io_thread(pid: u32) -> u32 {
    let mut io_thread = None;
    wait_until(
        "redis-server's I/O thread",
        std::time::Duration::from_secs(20),
        || {
            io_thread = threads_of(pid, 1).into_iter().find(|tid| {
                std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
                    .is_ok_and(|comm| comm.trim() == "io_thd_1")
            });
            io_thread.is_some()
        },
    );
    io_thread.unwrap()
}

#[test]
fn a_key_value_server_under_load_names_its_contended_lock_and_its_waiter() {
    // Debian's Redis with a second I/O thread, under its own benchmark client on loopback. When
    // the main thread has few replies pending it parks the I/O thread by holding
    // `io_threads_mutex[1]`; the I/O thread blocks in pthread_mutex_lock there until the main
    // thread hands it work again. Redis links with -rdynamic, so the array is in .dynsym.
    let port = free_port().to_string();
    let dir = temp_path("redis");
    std::fs::create_dir_all(&dir).unwrap();
    let quiet = || std::process::Stdio::null();
    // Server and client at a high priority: the I/O thread spins for work before it blocks, so
    // on a machine whose CPUs other processes fill it would be runnable all the time instead of
    // waiting on its mutex (what this test is about).
    #[rustfmt::skip]
    let server = Running::spawn(
        std::process::Command::new("nice")
            .args(["-n", "-15", "redis-server", "--port", &port, "--bind", "127.0.0.1",
                   "--save", "", "--appendonly", "no",
                   "--io-threads", "2", "--io-threads-do-reads", "yes", "--daemonize", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(quiet()),
    );
    let pid = server.pid();
    wait_until(
        "redis-server answering",
        std::time::Duration::from_secs(20),
        || {
            std::process::Command::new("redis-cli")
                .args(["-p", &port, "ping"])
                .output()
                .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("PONG"))
        },
    );
    let io_thread = redis_io_thread(pid);
    let _client = Running::spawn(
        std::process::Command::new("nice")
            .args([
                "-n",
                "-15",
                "redis-benchmark",
                "-p",
                &port,
                "-c",
                "50",
                "-P",
                "4",
                "-t",
                "set,get",
                "-l",
                "-q",
            ])
            .stdout(quiet())
            .stderr(quiet()),
    );
    // The I/O thread at work: the load has reached it.
    wait_for_cpu_time(pid, io_thread, 2e8);

    let json = temp_path("redis-lock.json");
    let pid_arg = pid.to_string();
    let window = std::time::Duration::from_secs(10);
    let (bpfprof, stderr) = start_bpfprof(&[
        "--mode",
        "lock",
        "-p",
        &pid_arg,
        "-d",
        &window.as_secs().to_string(),
        "-o",
        json.to_str().unwrap(),
    ]);
    // The kernel's account of the I/O thread over the same window: its time neither on a CPU
    // nor runnable is time blocked, and its only blocking call is that mutex.
    let (began, before) = (std::time::Instant::now(), schedstat(pid, io_thread));
    std::thread::sleep(window);
    let (wall, after) = (began.elapsed().as_nanos() as f64, schedstat(pid, io_thread));
    let (status, err) = finish_bpfprof(bpfprof, stderr);
    assert!(status.success(), "{err}");
    let (ran, queued) = (after[0] - before[0], after[1] - before[1]);
    let blocked = wall - ran - queued;

    let report: Value = read_json(&json);
    let top = report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["class"] == "contention")
        .unwrap_or_else(|| panic!("no contention in {report}"));
    let waited = top["total_wait_ns"].as_f64().unwrap();
    eprintln!(
        "redis io thread: {} in {}: {:.3} s in {} waits; kernel: blocked {:.3} s, runnable {:.3} s",
        top["symbol"],
        top["waited_in"],
        waited / 1e9,
        top["contentions"],
        blocked / 1e9,
        queued / 1e9
    );
    assert!(
        top["symbol"]
            .as_str()
            .is_some_and(|s| s.starts_with("io_threads_mutex")),
        "the top contention names Redis's lock: {}",
        top["symbol"]
    );
    assert_eq!(
        top["waited_in"], "IOThreadMain",
        "and the function that waits for it"
    );
    let waiter = functions(&top["waiters"][0]["frames"]);
    assert!(
        waiter.contains(&"IOThreadMain") && waiter.iter().any(|f| f.contains("pthread_mutex_lock")),
        "{waiter:?}"
    );
    // Released by the main thread's event loop.
    let total = |stacks: &Value, pick: &dyn Fn(&[&str]) -> bool| -> f64 {
        stacks
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| pick(&functions(&s["frames"])))
            .map(|s| s["total_wait_ns"].as_f64().unwrap())
            .sum()
    };
    let by_event_loop = total(&top["holders"], &|f| f.contains(&"aeMain"));
    assert!(
        by_event_loop >= (1.0 - TOLERANCE) * waited,
        "released from aeMain: {by_event_loop} of {waited} ns"
    );
    // Each wait is the time blocked plus, once woken, the wait for a CPU: between the kernel's
    // blocked time and that plus all the thread's run-queue time.
    assert!(waited > 1e8, "the I/O thread waited: {waited} ns");
    assert!(
        waited >= (1.0 - TOLERANCE) * blocked && waited <= (1.0 + TOLERANCE) * (blocked + queued),
        "wait {waited} ns against the kernel's blocked {blocked} ns (+ runnable {queued} ns)"
    );
}

/// The threads of `pid` in a futex call, each with the futex's address (from /proc: the call
/// and its first argument).
fn futex_waiters(pid: u32) -> Vec<(u32, u64)> {
    let futex = if cfg!(target_arch = "x86_64") { "202" } else { "98" };
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    let tids = tasks.filter_map(|t| t.ok()?.file_name().to_str()?.parse::<u32>().ok());
    tids.filter_map(|tid| {
        let line = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
        let mut fields = line.split_whitespace();
        (fields.next()? == futex).then_some(())?;
        let uaddr = u64::from_str_radix(fields.next()?.strip_prefix("0x")?, 16).ok()?;
        Some((tid, uaddr))
    })
    .collect()
}

/// A lock threads are stuck on, as in a deadlock: one thread blocked since before the run, one
/// from within it, neither done at the stop. Both waits are in the report, counted up to the
/// stop: the first from the moment the run began (its stack unknown, it was never seen start),
/// the second from its call (under its stack).
#[test]
fn waits_still_going_at_the_stop_are_counted_up_to_it() {
    let target = start_workload("lockload", &["stuck", "60"]);
    let pid = target.pid();
    let limit = std::time::Duration::from_secs(10);
    wait_until("stuck_early blocked", limit, || futex_waiters(pid).len() == 1);
    let lock = futex_waiters(pid)[0].1;
    let json = temp_path("lock-stuck.json");
    let (bpfprof, errors) = start_bpfprof(&[
        "--mode",
        "lock",
        "-p",
        &pid.to_string(),
        "-d",
        "3",
        "-o",
        json.to_str().unwrap(),
    ]);
    let began = std::time::Instant::now();
    let signalled = began.elapsed().as_secs_f64();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGUSR2,
    )
    .unwrap();
    wait_until("stuck_late blocked", limit, || futex_waiters(pid).len() == 2);
    let seen = began.elapsed().as_secs_f64();
    let (status, err) = finish_bpfprof(bpfprof, errors);
    assert!(status.success(), "{err}");

    let report = read_json(&json);
    let duration = report["duration_s"].as_f64().unwrap();
    let stuck = report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["address"] == format!("{lock:#x}"))
        .unwrap_or_else(|| panic!("no lock at {lock:#x} in {}", report["locks"]));
    assert!(
        stuck["symbol"]
            .as_str()
            .is_some_and(|s| s.starts_with("stuck_lock")),
        "{stuck}"
    );
    assert_eq!(stuck["contentions"], 2, "{stuck}");
    assert_eq!(stuck["waiting_at_stop"], 2, "{stuck}");
    let waiters = stuck["waiters"].as_array().unwrap();
    let wait_of = |late: bool| -> f64 {
        let waiter = waiters
            .iter()
            .find(|w| functions(&w["frames"]).contains(&"stuck_late") == late)
            .unwrap_or_else(|| panic!("late={late}: {stuck}"));
        waiter["total_wait_ns"].as_f64().unwrap() / 1e9
    };
    // From the attachment (just before the run's clock starts) to the stop.
    let early = wait_of(false);
    assert!(
        (early - duration).abs() <= 0.05,
        "stuck_early waited {early} s of a {duration} s run"
    );
    // From its call, between the signal and the moment it was seen blocked, to the stop.
    let late = wait_of(true);
    assert!(
        late >= duration - seen - 0.05 && late <= duration - signalled + 0.05,
        "stuck_late waited {late} s; signalled at {signalled} s, seen blocked at {seen} s of {duration} s"
    );
    let notes = report["notes"].to_string();
    assert!(
        notes.contains("futex waits already going at the start: 1,"),
        "{notes}"
    );
    // And said so in the text report.
    let out = run(&["report", json.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("2 of them still waiting at the stop"), "{text}");
}
