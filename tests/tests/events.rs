//! Any event, as perf's language names it: counted over a run (`bpfprof stat`), sampled every N
//! occurrences (`-e EVENT -c N`), listed (`bpfprof list`), refused with the nearest names when
//! unknown. Ground truth: a workload whose software events are known (fresh pages it touches,
//! sleeps it takes) and the kernel's own count of its faults (getrusage).
use std::collections::HashMap;

use bpfprof_tests::*;

fn events_bin() -> String {
    workload("events").to_str().unwrap().to_string()
}

#[test]
fn stat_counts_the_pages_a_workload_touches() {
    let pages = 20_000;
    let (report, out) = stat(
        &["-e", "page-faults,minor-faults,task-clock"],
        &[&events_bin(), "pages", &pages.to_string()],
    );
    let truth = truth(&out);
    let minor = counter(&report, "minor-faults")["value"].as_f64().unwrap();
    let faults = counter(&report, "page-faults")["value"].as_f64().unwrap();
    println!(
        "{pages} pages touched; the process's own minor faults {}; stat: minor-faults {minor}, page-faults {faults}",
        truth["minflt"]
    );
    assert!(
        (minor - pages as f64).abs() <= 0.02 * pages as f64,
        "minor faults {minor} for {pages} pages"
    );
    // The kernel's own count of the process's faults, read just before it exited (it counts the
    // few of the paused child before the counters opened; these count the few of its exit).
    assert!(
        (minor - truth["minflt"]).abs() <= 50.0,
        "{minor} vs getrusage {}",
        truth["minflt"]
    );
    assert!(faults >= minor, "page-faults counts minor and major faults");
    assert!(counter(&report, "task-clock")["value"].as_f64().unwrap() > 0.0);
    assert_eq!(report["runs"], 1);
    assert_eq!(
        counter(&report, "minor-faults")["running"],
        1.0,
        "software counters never multiplex"
    );
    assert_no_programs_left();
}

#[test]
fn stat_repeats_give_the_mean_and_its_spread() {
    let pages = 5_000;
    let (report, _) = stat(
        &["-r", "5", "-e", "minor-faults,task-clock"],
        &[&events_bin(), "pages", &pages.to_string()],
    );
    let minor = counter(&report, "minor-faults");
    let runs = minor["runs"].as_array().unwrap();
    println!(
        "minor faults per run {runs:?}, mean {} ( +- {}% )",
        minor["value"], minor["spread_pct"]
    );
    assert_eq!((report["runs"].as_u64(), runs.len()), (Some(5), 5));
    for run in runs {
        let n = run.as_f64().unwrap();
        assert!(
            (n - pages as f64).abs() <= 0.05 * pages as f64,
            "a run counted {n}"
        );
    }
    let spread = minor["spread_pct"].as_f64().expect("a spread over five runs");
    assert!(spread < 5.0, "{spread}%");
    assert!(report["seconds"]["spread_pct"].as_f64().is_some());
    let cpus = report["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "cpus_utilized");
    assert!(
        cpus.is_some(),
        "task-clock over time gives CPUs utilized: {}",
        report["metrics"]
    );
    // The text report says the spread as perf does.
    let out = run(&[
        "stat",
        "-r",
        "3",
        "-e",
        "minor-faults",
        "--",
        &events_bin(),
        "pages",
        "1000",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    println!("{text}");
    assert!(
        text.contains("(3 runs)") && text.contains("( +- ") && text.contains("minor-faults"),
        "{text}"
    );
}

#[test]
fn sampling_page_faults_every_one_splits_them_by_who_faulted() {
    let (out, path) = {
        let path = temp_path("faults.json");
        let out = run(&[
            "-e",
            "page-faults",
            "-c",
            "1",
            "-o",
            path.to_str().unwrap(),
            "--",
            &events_bin(),
            "split",
            "20000",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        (out, path)
    };
    let truth = truth(&stdout(&out));
    let report = Report::read(&path);
    assert_eq!(report.0["event"], "page-faults");
    assert_eq!(report.0["period"], 1);
    let pid = truth["pid"] as u32;
    let samples = report.samples_of(pid);
    let total = truth["alpha_pages"] + truth["beta_pages"];
    for name in ["alpha_pages", "beta_pages"] {
        let share = 100.0 * report.total_share(pid, name);
        let expected = 100.0 * truth[name] / total * (total / samples as f64);
        println!(
            "{name}: {share:.2}% of {samples} samples; touched {} pages ({expected:.2}% of them)",
            truth[name]
        );
        assert!(
            (share - expected).abs() <= SHARE_TOLERANCE_PP,
            "{name}: {share:.2}% vs {expected:.2}%"
        );
    }
    // One sample per fault: every page touched is a sample (and the process's other faults).
    assert!(samples as f64 >= total, "{samples} samples for {total} pages");
    assert!(
        samples as f64 <= total * 1.02 + 200.0,
        "{samples} samples for {total} pages"
    );
}

#[test]
fn sampling_context_switches_every_one_counts_each_sleep() {
    let naps: u64 = 300;
    let path = temp_path("switches.json");
    let out = run(&[
        "-e",
        "context-switches",
        "-c",
        "1",
        "-o",
        path.to_str().unwrap(),
        "--",
        &events_bin(),
        "naps",
        &naps.to_string(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let truth = truth(&stdout(&out));
    let report = Report::read(&path);
    let pid = truth["pid"] as u32;
    let stacks = report.stacks_of(pid);
    let count = |pick: &dyn Fn(&[&str]) -> bool| -> u64 {
        (stacks.iter())
            .filter(|s| pick(&Report::frames(s)))
            .map(|s| s["count"].as_u64().unwrap())
            .sum()
    };
    let asleep = count(&|f| f.contains(&"do_nanosleep"));
    let under_napper = count(&|f| f.contains(&"do_nanosleep") && f.contains(&"napper"));
    println!(
        "{naps} naps; {asleep} context-switch samples in do_nanosleep, {under_napper} of them under napper; health {}",
        report.0["health"]
    );
    // Each nap switches out once, in the kernel's sleep: one sample each, exactly, and one more
    // for each time the kernel preempted the napper inside a nap's own path (its own count).
    let preempted = truth["preempted"] as u64;
    assert!(
        asleep >= naps && asleep <= naps + preempted,
        "{asleep} samples for {naps} naps ({preempted} preemptions)"
    );
    // Under its caller, but for samples taken before the process's unwind tables were loaded,
    // or through tables given before its loader mapped libc (frame pointers skip the caller of
    // libc's frameless nanosleep), which the health counts: seen 11-26 of 300 here, more on a
    // busy machine (the tables come later); in a full run, 1 before the tables and 10 stale.
    let health = &report.0["health"];
    let before_tables = health["unwind_before_tables"].as_u64().unwrap();
    let stale = health["unwind_stale"].as_u64().unwrap();
    assert!(
        under_napper + before_tables + stale >= asleep,
        "{under_napper} of {asleep} under napper, {before_tables} taken before the tables, {stale} through tables without libc yet"
    );
}

#[test]
fn an_unknown_event_names_the_nearest_known_ones() {
    for (args, nearest) in [
        (vec!["-e", "cache-miss", "--", "true"], "cache-misses"),
        (vec!["-e", "page-fault", "--", "true"], "page-faults"),
        (
            vec!["stat", "-e", "contex-switches", "--", "true"],
            "context-switches",
        ),
    ] {
        let out = run(&args);
        let err = stderr(&out);
        println!("{args:?}: {err}");
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains(&format!("did you mean {nearest}")) || err.contains(nearest),
            "{err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
}

#[test]
fn hardware_events_are_refused_in_one_line_where_there_is_no_pmu() {
    let no_pmu = profiler::counters::pmu::missing_reason().is_some();
    let mut cases = vec![
        vec!["-e", "cycles", "--", "true"],
        vec!["stat", "-e", "instructions", "--", "true"],
    ];
    // The agent's counters signal (where there is a PMU the agent would run: the guest tests it).
    if no_pmu {
        cases.push(vec!["agent", "--signals", "cpu,counters", "--listen", "off"]);
    }
    for args in cases {
        let out = run(&args);
        let err = stderr(&out);
        println!("{args:?}: {:?} {err}", out.status.code());
        match no_pmu {
            true => {
                assert_eq!(out.status.code(), Some(1), "{err}");
                assert!(err.contains("needs a hardware PMU"), "{err}");
                assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
            }
            false => assert!(out.status.success(), "{err}"),
        }
    }
    assert_no_programs_left();
}

#[test]
fn list_shows_what_this_machine_has() {
    let out = run(&["list"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for name in [
        "page-faults",
        "cycles",
        "L1-dcache-load-misses",
        "sched:sched_switch",
    ] {
        assert!(text.contains(name), "{name} missing from the list");
    }
    if profiler::counters::pmu::missing_reason().is_some() {
        assert!(
            text.contains("hardware: not here: no hardware PMU"),
            "hardware events not marked"
        );
    }
    let out = run(&["list", "fault", "--format", "json"]);
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    println!("{names:?}");
    assert!(names.contains(&"page-faults") && names.contains(&"major-faults"));
    assert!(names.iter().all(|n| n.contains("fault")), "{names:?}");
}

#[test]
fn counter_diff_of_two_stat_reports_gives_the_known_difference_beyond_the_spread() {
    let side = |pages: &str| -> std::path::PathBuf {
        let path = temp_path(&format!("ab-{pages}.json"));
        let args = [
            "stat",
            "-r",
            "3",
            "-e",
            "minor-faults,task-clock",
            "-o",
            path.to_str().unwrap(),
            "--",
            &events_bin(),
            "pages",
            pages,
        ];
        let out = run(&args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        path
    };
    let (before, after) = (side("10000"), side("12000"));
    let out = run(&[
        "diff",
        before.to_str().unwrap(),
        after.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let diff: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let faults = diff["counters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "minor-faults")
        .unwrap()
        .clone();
    let delta = faults["after"].as_f64().unwrap() - faults["before"].as_f64().unwrap();
    println!(
        "minor faults {} -> {} (+{delta}), beyond the spread: {}",
        faults["before"], faults["after"], faults["beyond_spread"]
    );
    assert!(
        (delta - 2000.0).abs() <= 40.0,
        "{delta} more faults for 2000 more pages"
    );
    assert_eq!(faults["beyond_spread"], true);
    assert!(diff["answer"].is_null(), "no cycles counted here: no answer");
    // The text names each counter's change; a profile and a counter report are not compared.
    let text = run(&["diff", before.to_str().unwrap(), after.to_str().unwrap()]);
    assert!(stdout(&text).contains("minor-faults"), "{}", stdout(&text));
    let profile = temp_path("ab-profile.json");
    assert!(run(&["-d", "1", "-o", profile.to_str().unwrap()])
        .status
        .success());
    let mixed = run(&["diff", before.to_str().unwrap(), profile.to_str().unwrap()]);
    assert_eq!(mixed.status.code(), Some(2), "{}", stderr(&mixed));
}

/// `-I 200` on a workload that sleeps 4000 times (at least 0.8 s): an interval every 200 ms and
/// a last, shorter one, adding up to the run's total exactly, which holds every switch the
/// napper counted itself.
#[test]
fn stat_intervals_add_up_to_the_run() {
    let naps = 4000.0;
    let path = temp_path("intervals.json");
    let out = run(&[
        "stat",
        "-I",
        "200",
        "-e",
        "context-switches",
        "-o",
        path.to_str().unwrap(),
        "--",
        &events_bin(),
        "naps",
        "4000",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report = read_json(&path);
    let intervals = report["intervals"].as_array().unwrap();
    let at: Vec<f64> = intervals.iter().map(|i| i["at_s"].as_f64().unwrap()).collect();
    let each: Vec<f64> = intervals
        .iter()
        .map(|i| i["counts"][0][1].as_f64().unwrap())
        .collect();
    let total = counter(&report, "context-switches")["value"].as_f64().unwrap();
    println!("intervals at {at:?}: {each:?}; total {total}");
    assert!(
        intervals.len() >= 4,
        "{} intervals in at least 0.8 s at 200 ms",
        intervals.len()
    );
    // Every 200 ms (the driver wakes for each), but the last, which ends with the run. Loosely:
    // a busy machine wakes the driver late (what is exact is below: the counts).
    for pair in at[..at.len() - 1].windows(2) {
        assert!((0.05..0.5).contains(&(pair[1] - pair[0])), "intervals {at:?}");
    }
    let last = at[at.len() - 1] - at[at.len() - 2];
    assert!((0.0..0.5).contains(&last), "the last interval: {last} s");
    let summed: f64 = each.iter().sum();
    assert_eq!(summed, total, "the intervals add up to the run");
    // The napper's own count of its switches during the naps (a nap whose timer fired before
    // the thread could block, on a busy machine, has none); the rest of the run adds a few.
    let switched = truth(&stdout(&out))["switched"];
    assert!(
        total >= switched && total < switched + 50.0 && switched >= 0.95 * naps,
        "{total} switches counted, the napper switched {switched} times in {naps} sleeps"
    );
}

/// `:p` asks a hardware PMU for precise sampling: a software event is refused in one line (exit
/// 2) rather than sampled as if it meant something; the guest's Arm PMU, which has no precise
/// sampling, is refused the same way (tests/tests/pmu.rs).
#[test]
fn precise_sampling_of_a_software_event_is_refused_in_one_line() {
    for event in ["cpu-clock:p", "page-faults:pp"] {
        let out = run(&["-e", event, "--", "true"]);
        let err = stderr(&out);
        println!("-e {event}: {:?} {err}", out.status.code());
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("software event is sampled exactly already"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
    assert_no_programs_left();
}

/// `-e page-faults -e context-switches -c 1` in one run: one profile per event (named by the
/// event beside the file asked for), each holding its own event's samples only: every page the
/// splitting workload touched in the faults profile (split as it touched them), every nap of the
/// napping one in the switches profile, and neither event's samples in the other's.
#[test]
fn several_events_in_one_run_give_one_profile_each() {
    let path = temp_path("multi.json");
    let events = events_bin();
    let script = format!("{events} split 20000 && {events} naps 300");
    let args = [
        "-e",
        "page-faults",
        "-e",
        "context-switches",
        "-c",
        "1",
        "-o",
        path.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &script,
    ];
    let out = run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let truths: Vec<HashMap<String, f64>> = (text.lines())
        .filter(|l| l.starts_with("TRUTH "))
        .map(truth)
        .collect();
    let (split, naps) = (&truths[0], &truths[1]);
    let faults = Report::read(&temp_path("multi.page-faults.json"));
    let switches = Report::read(&temp_path("multi.context-switches.json"));
    assert_eq!(
        (&faults.0["event"], &faults.0["period"]),
        (&"page-faults".into(), &1.into())
    );
    assert_eq!(switches.0["event"], "context-switches");
    assert!(!path.exists(), "no file under the plain name: one per event");

    let (toucher, napper) = (split["pid"] as u32, naps["pid"] as u32);
    let pages = split["alpha_pages"] + split["beta_pages"];
    let faulted = faults.samples_of(toucher) as f64;
    let alpha = 100.0 * faults.total_share(toucher, "alpha_pages");
    let expected = 100.0 * split["alpha_pages"] / faulted;
    // In a nap: in do_nanosleep; or, where the kernel stack was lost to a collision in the
    // stack map (said in the stack and counted in the health: the nap's stack hashed to the
    // bucket of a stack stored before it, as one stack in a few hundred does in a run), in the
    // C library's clock_nanosleep on the user side.
    let in_sleep = |r: &Report, pid| -> u64 {
        (r.stacks_of(pid).iter())
            .filter(|s| {
                let frames = Report::frames(s);
                frames.contains(&"do_nanosleep")
                    || (frames.contains(&"[lost kernel stack: collision]")
                        && frames.iter().any(|f| f.contains("clock_nanosleep")))
            })
            .map(|s| s["count"].as_u64().unwrap())
            .sum()
    };
    let (slept, sleeps_as_faults) = (in_sleep(&switches, napper), in_sleep(&faults, napper));
    let touches_as_switches = switches.samples_of(toucher);
    println!(
        "faults profile: {faulted} samples of the toucher for {pages} pages, alpha {alpha:.2}% (touched {expected:.2}%), {sleeps_as_faults} in the napper's sleeps; switches profile: {slept} in do_nanosleep for {} naps, {touches_as_switches} of the toucher",
        naps["naps"]
    );
    assert!(
        faulted >= pages && faulted <= pages * 1.02 + 200.0,
        "{faulted} for {pages} pages"
    );
    assert!(
        (alpha - expected).abs() <= SHARE_TOLERANCE_PP,
        "alpha {alpha:.2}% vs {expected:.2}%"
    );
    // The napper's own count of its switches in the naps (a nap whose timer fired before it
    // could block has none); its preemptions may land in a nap's kernel path or outside it.
    let (nap_count, preempted, switched) = (naps["naps"], naps["preempted"], naps["switched"]);
    let napper_stacks: Vec<String> = (switches.stacks_of(napper).iter().take(3))
        .map(|s| format!("{} x {:?}", s["count"], Report::frames(s)))
        .collect();
    assert!(
        slept as f64 >= switched - preempted
            && slept as f64 <= switched
            && switched >= 0.95 * nap_count,
        "{slept} switch samples for {nap_count} naps ({switched} switches, {preempted} preemptions); the napper (pid {napper}) has {} switch samples in all, first stacks {napper_stacks:?}; health {}",
        switches.samples_of(napper),
        switches.0["health"]
    );
    assert_eq!(sleeps_as_faults, 0, "no sleep is a page fault");
    // A touching loop of 20000 pages is switched out only when preempted.
    assert!(
        touches_as_switches < 100,
        "{touches_as_switches} switches of the toucher"
    );
}

/// `--annotate` on a sampled event: each page touched faults once, at the one instruction that
/// writes it, so `touch` has exactly one sample per page and that store holds them all; the
/// header names the event and period.
#[test]
fn annotate_on_page_faults_puts_every_fault_on_the_storing_instruction() {
    let pages = 2000;
    let out = run(&[
        "-e",
        "page-faults",
        "-c",
        "1",
        "--annotate",
        "touch",
        "--",
        &events_bin(),
        "pages",
        &pages.to_string(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let header = text
        .lines()
        .find(|l| l.starts_with("Annotation of touch"))
        .unwrap_or_default();
    println!("{header}");
    assert!(
        header.contains(&format!(": {pages} samples of page-faults every event")),
        "{text}"
    );
    // The instruction table: `share  0xOFFSET <+N>  instruction`, hottest first.
    let hottest = (text.lines())
        .find(|l| l.split_whitespace().nth(1).is_some_and(|w| w.starts_with("0x")))
        .unwrap_or_default();
    println!("hottest instruction: {hottest}");
    assert!(hottest.trim_start().starts_with("100.00%"), "{text}");
}

/// Tracepoints counted: a workload that calls write(2) N times is counted N (and the one write
/// of its TRUTH line), on entry and on exit; a misspelt one gets its subsystem's nearest names.
#[test]
fn stat_counts_a_tracepoint_exactly() {
    let writes = 1000.0;
    let (report, out) = stat(
        &["-e", "syscalls:sys_enter_write,syscalls:sys_exit_write"],
        &[&events_bin(), "writes", "1000"],
    );
    assert_eq!(truth(&out)["writes"], writes);
    for event in ["syscalls:sys_enter_write", "syscalls:sys_exit_write"] {
        let count = counter(&report, event)["value"].as_f64().unwrap();
        println!("{event}: {count} for {writes} writes and the TRUTH line's");
        assert_eq!(count, writes + 1.0, "{event}");
    }
    refused_in_one_line(&["stat", "-e", "sched:sched_swich", "--", "true"], "did you mean");
    assert_no_programs_left();
}

/// `stat --filter`: the kernel's filter on the tracepoint's fields. The workload's 1000 writes
/// are of one byte each, the TRUTH line's of more: `count == 1` counts the 1000, `count > 1` the
/// one. A field the tracepoint has not is refused in one line, naming the nearest and its fields.
#[test]
fn stat_filters_a_tracepoint_on_its_fields() {
    let event = "syscalls:sys_enter_write";
    for (filter, expected) in [("count == 1", 1000.0), ("count > 1", 1.0)] {
        let (report, out) = stat(
            &["-e", event, "--filter", filter],
            &[&events_bin(), "writes", "1000"],
        );
        let count = counter(&report, event)["value"].as_f64().unwrap();
        println!(
            "{event} --filter '{filter}': {count} ({} one-byte writes and the TRUTH line)",
            truth(&out)["writes"]
        );
        assert_eq!(count, expected, "{filter}");
    }
    refused_in_one_line(
        &["stat", "-e", event, "--filter", "cnt > 1", "--", "true"],
        "no field `cnt` (did you mean count?)",
    );
    refused_in_one_line(
        &["stat", "-e", "page-faults", "--filter", "count > 1", "--", "true"],
        "names none",
    );
    assert_no_programs_left();
}

/// `stat --by`'s values of `event`: (the value or a range's first, its hits).
fn values_of(report: &serde_json::Value, event: &str) -> Vec<(i64, f64)> {
    let by = (report["by_value"].as_array().into_iter().flatten())
        .find(|e| e["event"] == event)
        .unwrap_or_else(|| panic!("no values of {event} in {report}"));
    assert_eq!(by["unkept"], 0.0, "{by}");
    (by["values"].as_array().unwrap().iter())
        .map(|v| {
            let value = v.get("value").unwrap_or(&v["from"]);
            (value.as_i64().unwrap(), v["count"].as_f64().unwrap())
        })
        .collect()
}

/// `stat --by`: the workload's 1000 one-byte writes to /dev/null and its TRUTH line to standard
/// output, counted per descriptor (1000 on one, 1 on fd 1) and per power-of-two size (1000 of
/// exactly 1 byte), the values adding up to the event's count; with `--filter 'count == 1'` only
/// the 1000, as the filtered count. Probes too: malloc's sizes, exactly as many 64-byte calls as
/// the workload made, and its 4096-byte ones (with, at most, stdio's buffer for the TRUTH line:
/// a pipe's block size is 4096). Bad input in one line.
#[test]
fn stat_by_counts_each_value_of_a_field_exactly() {
    let event = "syscalls:sys_enter_write";
    let sum = |values: &[(i64, f64)]| values.iter().map(|v| v.1).sum::<f64>();
    let hits = |values: &[(i64, f64)], value: i64| values.iter().find(|v| v.0 == value).map_or(0.0, |v| v.1);
    for (by, filter) in [("fd", None), ("count:log2", None), ("count", Some("count == 1"))] {
        let mut options = vec!["-e", event, "--by", by];
        options.extend(filter.iter().flat_map(|f| ["--filter", f]));
        let (report, out) = stat(&options, &[&events_bin(), "writes", "1000"]);
        let writes = truth(&out)["writes"];
        let values = values_of(&report, event);
        let count = counter(&report, event)["value"].as_f64().unwrap();
        println!("--by {by} --filter {filter:?}: {values:?}; counted {count}; {writes} writes");
        assert_eq!(sum(&values), count, "the values add up to the count");
        match (by, filter) {
            ("fd", _) => {
                assert_eq!(count, writes + 1.0);
                assert_eq!(hits(&values, 1), 1.0, "the TRUTH line");
                assert!(values.iter().any(|v| v.0 > 2 && v.1 == writes), "{values:?}");
            }
            (_, None) => assert_eq!(hits(&values, 1), writes, "the one-byte writes' range"),
            (_, Some(_)) => assert_eq!(values, [(1, writes)]),
        }
    }
    let (report, out) = stat(
        &["-e", "uprobe:libc:malloc", "--by", "arg1"],
        &[&events_bin(), "mallocs", "20000"],
    );
    let (truth, values) = (truth(&out), values_of(&report, "uprobe:libc:malloc"));
    println!(
        "malloc by size: 64 bytes {} times, 4096 {}; the workload: {} and {}",
        hits(&values, 64),
        hits(&values, 4096),
        truth["alpha_calls"],
        truth["beta_calls"]
    );
    assert_eq!(hits(&values, 64), truth["alpha_calls"]);
    assert!((0.0..=1.0).contains(&(hits(&values, 4096) - truth["beta_calls"])));
    assert_eq!(
        sum(&values),
        counter(&report, "uprobe:libc:malloc")["value"].as_f64().unwrap()
    );
    for (options, said) in [
        (
            vec!["-e", event, "--by", "cnt"],
            "no field `cnt`: did you mean count?",
        ),
        (vec!["-e", "page-faults", "--by", "fd"], "names none"),
        (vec!["-e", "uretprobe:libc:malloc", "--by", "arg1"], "retval"),
        (
            vec!["-e", event, "--by", "fd", "--filter", "fd == 1 || fd == 2"],
            "up to 4 comparisons",
        ),
    ] {
        refused_in_one_line(&[&["stat"], &options[..], &["--", "true"]].concat(), said);
    }
    assert_no_programs_left();
}

/// A program at a tracepoint must let the kernel go on to count the hit for the tracepoint's
/// perf events (return non-zero): else, while bpfprof runs, every perf user of that tracepoint on
/// the machine sees nothing. `stat` of the process tracepoints bpfprof itself follows (fork,
/// exec, exit) gives perf's own counts of the same command; and perf counting the workload's
/// writes as bpfprof's command, while bpfprof samples, records and times them, counts them all.
#[test]
fn tracepoints_bpfprof_runs_at_still_count_for_perf() {
    let events = "sched:sched_process_exec,sched:sched_process_fork,sched:sched_process_exit";
    let shell = ["bash", "-c", "/bin/true; /bin/true; exec /bin/true"];
    let perf_counts = |out: &str, event: &str| -> Option<f64> {
        let line = out.lines().find(|l| l.split(',').nth(2) == Some(event))?;
        line.split(',').next()?.parse().ok()
    };
    let perf = std::process::Command::new("perf")
        .args(["stat", "-x,", "-e", events, "--"])
        .args(shell)
        .output()
        .expect("perf (cargo xtask setup installs it)");
    let (report, _) = stat(&["-e", events], &shell);
    for event in events.split(',') {
        let (ours, perfs) = (
            counter(&report, event)["value"].as_f64(),
            perf_counts(&stderr(&perf), event),
        );
        println!("{event}: bpfprof {ours:?}, perf {perfs:?}");
        assert!(ours.is_some_and(|n| n > 0.0) && ours == perfs, "{event}");
    }
    let write = "syscalls:sys_enter_write";
    let out_path = temp_path(&format!("beside-perf-{}.json", rand_suffix()));
    let out_path = out_path.to_str().unwrap();
    for run in [
        vec!["-e", write, "-o", out_path],
        vec!["record", "-e", write, "-o", out_path],
        vec![
            "latency",
            "--from",
            write,
            "--to",
            "syscalls:sys_exit_write",
            "-o",
            out_path,
        ],
    ] {
        let perf_stat = [
            "perf",
            "stat",
            "-x,",
            "-e",
            write,
            "--",
            &events_bin(),
            "writes",
            "300",
        ];
        let out = crate::run(&[&run[..], &["--"], &perf_stat[..]].concat());
        assert!(out.status.success(), "{}", stderr(&out));
        let counted = perf_counts(&stderr(&out), write);
        println!(
            "perf stat under bpfprof {}: {counted:?} for 300 writes and the TRUTH line",
            run[0]
        );
        assert_eq!(counted, Some(301.0), "{}", stderr(&out));
    }
    assert_no_programs_left();
}

/// `-e EVENT [-c N]` on the events workload (`mode`, `n`): the report, its notes, the truth.
fn sample_every(event: &str, every: &str, mode: &str, n: &str) -> (Report, String, HashMap<String, f64>) {
    sample_hits_with(&["-e", event, "-c", every], mode, n)
}

/// The same with any options.
fn sample_hits_with(options: &[&str], mode: &str, n: &str) -> (Report, String, HashMap<String, f64>) {
    sample_hits(options, &[&events_bin(), mode, n])
}

/// The kernel's exact count of an event's hits, as the report's note says it.
fn hits_noted(notes: &str, event: &str) -> u64 {
    let at = notes
        .find(&format!("{event}: "))
        .unwrap_or_else(|| panic!("no hits of {event} in {notes}"));
    let rest = &notes[at + event.len() + 2..];
    rest.split_whitespace().next().unwrap().parse().unwrap()
}

/// Sampled with stacks: every hit (a sample per write, each under the writing `main`), and
/// every 10th: exactly a tenth of the hits the note counts, though the workload writes on two
/// CPUs in turn (19,999 writes and the TRUTH line: 2,000 samples, where a count kept per CPU
/// would take 1,999; the arm64 guest has one CPU, where both take 2,000). A frequency makes no sense for a tracepoint: refused in one line.
#[test]
fn a_tracepoint_is_sampled_at_every_hit_or_every_nth_with_its_hits_counted() {
    for every in [1, 10] {
        let (report, notes, truth) =
            sample_every("syscalls:sys_enter_write", &every.to_string(), "hops", "19999");
        let pid = truth["pid"] as u32;
        let writes = truth["writes"] as u64 + 1;
        let hits = hits_noted(&notes, "syscalls:sys_enter_write");
        let samples = report.samples_of(pid);
        let in_main = (report.total_share(pid, "main") * samples as f64).round() as u64;
        let early = report.0["health"]["unwind_before_tables"].as_u64().unwrap();
        let top = report.0["functions"][0]["function"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        println!(
            "-c {every}: {writes} writes ({} on CPU {}, {} on CPU {}), {hits} hits noted, {samples} samples, {in_main} under main, {early} before the tables; hottest {top}",
            truth["on_first"], truth["first_cpu"], truth["on_second"], truth["second_cpu"]
        );
        assert_eq!(hits, writes, "{notes}");
        assert_eq!(samples, hits / every, "every {every}th of {hits} hits: {notes}");
        // Frame pointers skip the caller of libc's frameless write: only samples taken before
        // the process's tables were given may miss main, and the TRUTH line's write (its
        // buffer is flushed at exit, after main returned) when it is sampled (with -c 10 too,
        // when it is the run's tenth hit).
        let at_exit = 1;
        assert!(
            in_main + early + at_exit >= samples,
            "{in_main} of {samples} under main, {early} early; health {}",
            report.0["health"]
        );
        // The table walk found main at all (how many samples come before the tables depends on
        // how busy the machine is: 809 of 2000 under the arm64 guest's emulation here).
        assert!(in_main > 0, "{in_main} of {samples} under main");
        // The kernel stack begins at the traced syscall's entry, not in the tracing machinery.
        assert_eq!(top, "syscall_trace_enter", "{}", report.0["functions"]);
    }
    refused_in_one_line(
        &["-e", "sched:sched_switch", "-F", "99", "--", "true"],
        "every Nth hit",
    );
    refused_in_one_line(
        &["-e", "sched:sched_switch,cpu-clock", "--", "true"],
        "separate runs",
    );
    assert_no_programs_left();
}

/// User probes counted exactly: a probe on each of the workload's two allocating functions (one
/// at its entry, one at its returns) counts its calls as the workload counted them; one on libc's
/// malloc counts those and the few of the C runtime's own.
#[test]
fn stat_counts_user_probes_exactly() {
    let bin = events_bin();
    let alpha = format!("uprobe:{bin}:alpha_alloc");
    let beta = format!("uretprobe:{bin}:beta_alloc");
    let (report, out) = stat(
        &["-e", &format!("{alpha},{beta},uprobe:libc:malloc")],
        &[&bin, "mallocs", "20000"],
    );
    let truth = truth(&out);
    let count = |event: &str| counter(&report, event)["value"].as_f64().unwrap();
    let mallocs = count("uprobe:libc:malloc");
    println!(
        "alpha_alloc {} calls, counted {}; beta_alloc {} returns, counted {}; malloc {mallocs} for 20000",
        truth["alpha_calls"],
        count(&alpha),
        truth["beta_calls"],
        count(&beta)
    );
    assert_eq!(count(&alpha), truth["alpha_calls"]);
    assert_eq!(count(&beta), truth["beta_calls"]);
    assert!((20_000.0..=20_100.0).contains(&mallocs), "{mallocs}");
    refused_in_one_line(
        &["stat", "-e", "uprobe:libc:mallc", "--", "true"],
        "did you mean malloc",
    );
    refused_in_one_line(
        &["stat", "-e", "uprobe:libnosuchthing:f", "--", "true"],
        "no file",
    );
    assert_no_programs_left();
}

/// "A backtrace every 10th allocation": `-e uprobe:libc:malloc -c 10` splits the samples between
/// the two call sites as the workload split its calls (70/30, in a pseudo-random order no
/// period can fall in step with), and the note counts every call.
#[test]
fn every_tenth_malloc_splits_by_call_site() {
    let (report, notes, truth) = sample_every("uprobe:libc:malloc", "10", "mallocs", "200000");
    let pid = truth["pid"] as u32;
    let calls = truth["alpha_calls"] + truth["beta_calls"];
    let hits = hits_noted(&notes, "uprobe:libc:malloc");
    let samples = report.samples_of(pid) as f64;
    let alpha = report.total_share(pid, "alpha_alloc") * samples;
    let beta = report.total_share(pid, "beta_alloc") * samples;
    let share = 100.0 * alpha / (alpha + beta);
    let expected = 100.0 * truth["alpha_calls"] / calls;
    println!(
        "{calls} mallocs, {hits} hits noted, {samples} samples: alpha_alloc {share:.2}% (called {expected:.2}%), {:.1}% under neither; health {}",
        100.0 * (1.0 - (alpha + beta) / samples),
        report.0["health"]
    );
    assert!(
        hits as f64 >= calls && hits as f64 <= calls + 100.0,
        "{hits} hits"
    );
    assert!((share - expected).abs() <= 3.0, "{share:.2}% vs {expected:.2}%");
    // Samples before the process's tables were given stop early, counted in the health (2-4%
    // of them on a quiet machine: its libraries' tables come after ld.so maps them, while the
    // workload mallocs already; more on a busy one). Every other sample is under a call site.
    let early = report.0["health"]["unwind_before_tables"].as_f64().unwrap();
    assert!(
        alpha + beta >= samples - early - 0.005 * samples && early <= 0.5 * samples,
        "{alpha} + {beta} of {samples}, {early} before the tables"
    );
    assert_no_programs_left();
}

/// `--filter` when sampling: the kernel program judges each hit before it counts it. Every
/// malloc of 64 bytes (alpha_alloc's, none of beta's 4096) is counted and sampled, exactly as
/// many as the workload made; a filter beyond what the program judges (`||`), on a field the
/// probe has not, or on an event sampled at a rate, is refused in one line.
#[test]
fn a_filter_samples_only_the_hits_it_passes() {
    let (report, notes, truth) = sample_hits_with(
        &["-e", "uprobe:libc:malloc", "--filter", "arg1 == 64"],
        "mallocs",
        "20000",
    );
    let pid = truth["pid"] as u32;
    let hits = hits_noted(&notes, "uprobe:libc:malloc");
    let samples = report.samples_of(pid);
    let beta = report.total_share(pid, "beta_alloc");
    println!(
        "{} mallocs of 64 bytes, {} of 4096: {hits} hits noted, {samples} samples, {beta} of them under beta_alloc",
        truth["alpha_calls"], truth["beta_calls"]
    );
    assert_eq!(hits as f64, truth["alpha_calls"]);
    assert_eq!(samples as f64, truth["alpha_calls"]);
    assert_eq!(beta, 0.0);
    for (filter, event, said) in [
        (
            "arg1 == 64 || arg1 == 1",
            "uprobe:libc:malloc",
            "up to 4 comparisons",
        ),
        (
            "arg9 > 1",
            "uprobe:libc:malloc",
            "a probe's numbers are arg1..arg6",
        ),
        (
            "count > 1",
            "cpu-clock",
            "only tracepoints and probes are filtered",
        ),
    ] {
        refused_in_one_line(&["-e", event, "--filter", filter, "--", "true"], said);
    }
    assert_no_programs_left();
}

/// `--weight arg1`: each sampled malloc counts the bytes it asked, so the call sites split as
/// their bytes do (alpha's 64-byte blocks are 70% of the calls but 3.6% of the bytes: within a
/// fifth of that), and ten times the report's counts is the bytes asked within 10%. Refused in
/// one line where there is no register to read: a tracepoint, a return value at a function's
/// entry.
#[test]
fn weighted_by_an_argument_every_tenth_malloc_splits_by_the_bytes_asked() {
    let (report, notes, truth) = sample_hits_with(
        &["-e", "uprobe:libc:malloc", "-c", "10", "--weight", "arg1"],
        "mallocs",
        "200000",
    );
    let pid = truth["pid"] as u32;
    let bytes = truth["alpha_bytes"] + truth["beta_bytes"];
    let weight = report.samples_of(pid) as f64;
    let alpha = report.total_share(pid, "alpha_alloc") * weight;
    let beta = report.total_share(pid, "beta_alloc") * weight;
    let share = 100.0 * alpha / (alpha + beta);
    let expected = 100.0 * truth["alpha_bytes"] / bytes;
    println!(
        "{bytes} bytes asked; samples weigh {weight} (x10 = {:.3} of the bytes): alpha_alloc {share:.2}% (asked {expected:.2}%); {notes}",
        10.0 * weight / bytes
    );
    assert!(notes.contains("each sample counts arg1"), "{notes}");
    assert!(
        (share / expected - 1.0).abs() <= 0.2,
        "{share:.2}% vs {expected:.2}%"
    );
    assert!(
        (10.0 * (alpha + beta) / bytes - 1.0).abs() < 0.1,
        "{alpha} + {beta} of {bytes} / 10"
    );
    refused_in_one_line(
        &["-e", "syscalls:sys_enter_write", "--weight", "arg1", "--", "true"],
        "a tracepoint's numbers are its number fields (__syscall_nr, fd, buf, count)",
    );
    refused_in_one_line(
        &[
            "-e",
            "syscalls:sys_enter_write",
            "--weight",
            "cuont",
            "--",
            "true",
        ],
        "no field `cuont`: did you mean count",
    );
    refused_in_one_line(
        &["-e", "uprobe:libc:malloc", "--weight", "retval", "--", "true"],
        "retval is a uretprobe's",
    );
    refused_in_one_line(
        &["-e", "uprobe:libc:malloc", "--weight", "arg7", "--", "true"],
        "a function's arguments are arg1..arg6",
    );
}

/// `--weight` by any number a hit has: a tracepoint's field (`sys_enter_write`'s `count`: the
/// bytes each write asked, the workload's 1-byte writes and its TRUTH line at exit), and a USDT
/// probe's argument, read at each site where its note puts it (`events:step`'s third is its
/// site's number: 1 at 2000 steps, 2 at 1000). Each sample weighs exactly that.
#[test]
fn weighted_by_a_tracepoints_field_or_a_usdt_argument() {
    let events = events_bin();
    let path = temp_path(&format!("weighed-{}.json", rand_suffix()));
    let out = run(&[
        "-e",
        "syscalls:sys_enter_write",
        "--weight",
        "count",
        "-o",
        path.to_str().unwrap(),
        "--",
        &events,
        "writes",
        "500",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (report, truth) = (Report::read(&path), truth(&stdout(&out)));
    let written = truth["writes"] + stdout(&out).len() as f64;
    let weighed = report.samples_of(truth["pid"] as u32) as f64;
    println!("wrote {written} bytes; the samples weigh {weighed}");
    assert_eq!(weighed, written);

    let step = format!("usdt:{events}:events:step");
    let (report, notes, truth) = sample_hits_with(&["-e", &step, "--weight", "arg2"], "usdt", "3000");
    let weighed = report.samples_of(truth["pid"] as u32) as f64;
    println!(
        "{} steps at site 1 and {} at site 2; the samples weigh {weighed}; {notes}",
        truth["site1"], truth["site2"]
    );
    assert_eq!(weighed, truth["site1"] + 2.0 * truth["site2"]);
    assert!(notes.contains("each sample counts arg2"), "{notes}");
}

/// USDT: Debian's python3.11 marks each garbage collection with `python:gc__start`, behind a
/// semaphore (it fires only while the kernel holds that raised). A script that disables the
/// collector, calls `gc.collect()` exactly K times, says how many collections of each generation
/// the interpreter made (K of generation 2; the few of generation 0 it made starting, before the
/// script could disable them) and leaves by `os._exit` (no collection at exit): stat counts
/// exactly the collections said, K more for K more calls. Counted in what the command starts
/// too: through a shell that runs the script twice, both runs' collections, the shell's forks
/// unharmed (a probe's counter copied into a forking process once made its fork fail).
#[test]
fn usdt_probes_count_pythons_collections_exactly() {
    let python = "/usr/bin/python3.11";
    let script = temp_path("collect.py");
    std::fs::write(
        &script,
        "import gc, os, sys\ngc.disable()\nfor _ in range(int(sys.argv[1])):\n    gc.collect()\n\
         s = [g['collections'] for g in gc.get_stats()]\n\
         print('TRUTH collections=%d gen0=%d gen2=%d' % (sum(s), s[0], s[2]), flush=True)\nos._exit(0)\n",
    )
    .unwrap();
    let event = format!("usdt:{python}:python:gc__start");
    let script = script.to_str().unwrap();
    let count = |k: &str| {
        let (report, out) = stat(&["-e", &event], &[python, script, k]);
        let count = counter(&report, &event)["value"].as_f64().unwrap();
        (count, truth(&out))
    };
    let (few, few_truth) = count("10");
    let (more, more_truth) = count("47");
    println!("gc__start: {few} for 10 calls ({few_truth:?} said), {more} for 47 ({more_truth:?} said)");
    assert_eq!((few_truth["gen2"], more_truth["gen2"]), (10.0, 47.0));
    assert_eq!(few, few_truth["collections"]);
    assert_eq!(more, more_truth["collections"]);
    assert_eq!(more - few, 37.0);
    let twice = format!("{python} {script} 10 && {python} {script} 5");
    let (report, out) = stat(&["-e", &event], &["sh", "-c", &twice]);
    let said: f64 = (out.lines())
        .filter_map(|l| l.strip_prefix("TRUTH collections="))
        .map(|l| l.split_whitespace().next().unwrap().parse::<f64>().unwrap())
        .sum();
    let counted = counter(&report, &event)["value"].as_f64().unwrap();
    println!("through sh -c: {counted} counted, {said} said by the two runs");
    assert_eq!(out.matches("TRUTH").count(), 2, "{out}");
    assert_eq!(counted, said);
    let path = temp_path("collections.json");
    let out = run(&[
        "-e",
        &event,
        "-o",
        path.to_str().unwrap(),
        "--",
        python,
        script,
        "47",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report = Report::read(&path);
    let said = truth(&stdout(&out))["collections"];
    let hits = hits_noted(&report.0["notes"].to_string(), &event);
    let samples = report.samples_of(said_pid(&report));
    println!("sampled: {hits} hits noted, {samples} samples, {said} collections said");
    assert!(
        hits as f64 == said && hits == samples,
        "{hits} hits, {samples} samples"
    );
    refused_in_one_line(
        &[
            "stat",
            "-e",
            &format!("usdt:{python}:python:gc_start"),
            "--",
            "true",
        ],
        "did you mean python:gc__start",
    );
    assert_no_programs_left();
}

/// The one process a report's stacks are of.
fn said_pid(report: &Report) -> u32 {
    report.stacks()[0]["pid"].as_u64().unwrap() as u32
}

/// This machine's kernel has no kprobes (the arm64 guest's has: kprobes.rs): a kernel probe is
/// refused in one line that says so, before anything is loaded.
#[test]
fn kprobes_where_the_kernel_has_none_are_refused_in_one_line() {
    let pmu = std::path::Path::new("/sys/bus/event_source/devices/kprobe");
    assert!(
        !pmu.exists(),
        "this kernel has kprobes: kprobes.rs is the test for it"
    );
    for args in [
        vec!["stat", "-e", "kprobe:do_nanosleep", "--", "true"],
        vec!["-e", "kretprobe:do_nanosleep", "--", "true"],
    ] {
        refused_in_one_line(&args, "this kernel has no kprobes");
    }
    assert_no_programs_left();
}
