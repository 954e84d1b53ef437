//! The views end to end: `diff` of two real runs whose split of CPU time is known, `--annotate`
//! of a workload with one deliberately hot line, and `top` driven in a real terminal (tmux).
//! These load BPF for real: run as root (`cargo xtask test`).
use std::{
    process::Command,
    time::{Duration, Instant},
};

use bpfprof_tests::*;
use serde_json::Value;

const TOLERANCE_PP: f64 = 3.0;

fn bin(name: &str) -> String {
    workload(name).to_str().unwrap().to_string()
}

/// burn_a's share of the three burn functions' CPU time, as the workload measured it.
fn share_a(stdout: &str) -> f64 {
    truth_shares(&truth(stdout), &["burn_a", "burn_b", "burn_c"])["burn_a"]
}

/// hot_loop's floating-point division, as the annotated machine code names it.
const DIVISION: &str = if cfg!(target_arch = "aarch64") {
    "fdiv"
} else {
    "divsd"
};

/// The `fill="rgb(r,g,b)"` of the widest frame named `name` in an inferno SVG.
fn fill_of(svg: &str, name: &str) -> [u32; 3] {
    let title = format!("<title>{name} (");
    let widest = svg
        .match_indices(&title)
        .max_by_key(|(at, _)| {
            let count = &svg[at + title.len()..];
            let count = &count[..count.find(' ').unwrap()];
            count.replace(',', "").parse::<u64>().unwrap()
        })
        .unwrap_or_else(|| panic!("{name} is not in the flamegraph"))
        .0;
    let rest = &svg[widest..];
    let rgb = &rest[rest.find("fill=\"rgb(").expect("a fill") + 10..];
    let parts: Vec<u32> = rgb[..rgb.find(')').unwrap()]
        .split(',')
        .map(|c| c.trim().parse().unwrap())
        .collect();
    [parts[0], parts[1], parts[2]]
}

#[test]
fn diff_of_two_runs_puts_the_changed_function_first_with_the_measured_change() {
    let hotspot = bin("hotspot");
    // burn_a takes 20% of the work before and 70% after; saved in two different formats.
    let (out_before, before) = profile_workload(
        "997",
        "before.json",
        &[&hotspot, "weights", "10", "20", "20", "3"],
    );
    let (out_after, after) =
        profile_workload("997", "after.pb.gz", &[&hotspot, "weights", "35", "10", "5", "3"]);
    let truth_pp = 100.0 * (share_a(&stdout(&out_after)) - share_a(&stdout(&out_before)));
    assert!(
        truth_pp > 30.0,
        "the workload did not shift: {truth_pp:.1} points"
    );

    let (b, a) = (before.to_str().unwrap(), after.to_str().unwrap());
    let json = run(&["diff", b, a, "--format", "json"]);
    assert!(json.status.success(), "{}", stderr(&json));
    let doc: Value = serde_json::from_str(&stdout(&json)).unwrap();
    let top = &doc["functions"][0];
    assert_eq!(top["function"], "burn_a", "the largest change first: {top}");
    let reported_pp = 100.0 * (top["self_after"].as_f64().unwrap() - top["self_before"].as_f64().unwrap());
    assert!(
        (reported_pp - truth_pp).abs() <= TOLERANCE_PP,
        "burn_a changed by {reported_pp:+.2} points in the diff, {truth_pp:+.2} by the workload's own clock"
    );

    eprintln!(
        "diff: burn_a {reported_pp:+.2} points in the diff, {truth_pp:+.2} by the workload's own clock"
    );
    let text = run(&["diff", b, a]);
    assert!(text.status.success(), "{}", stderr(&text));
    let table = stdout(&text);
    let first_row = table
        .lines()
        .skip_while(|l| !l.contains("function"))
        .nth(1)
        .unwrap_or_default();
    let self_change = first_row.split_whitespace().nth(2).unwrap_or_default();
    assert!(
        self_change.starts_with('+') && first_row.ends_with("burn_a"),
        "first row (self before, after, change, ...): {first_row:?}\n{table}"
    );
    assert!(
        table.lines().all(|l| l.chars().count() <= 80),
        "80 columns:\n{table}"
    );

    let svg_path = temp_path("diff.svg");
    let svg = run(&["diff", b, a, "-o", svg_path.to_str().unwrap()]);
    assert!(svg.status.success(), "{}", stderr(&svg));
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let [r, _, blue] = fill_of(&svg, "burn_a");
    assert!(
        r > blue,
        "burn_a grew: red in the differential flamegraph, got rgb({r},_,{blue})"
    );
    let [r, _, blue] = fill_of(&svg, "burn_c");
    assert!(blue > r, "burn_c shrank: blue, got rgb({r},_,{blue})");
}

#[test]
fn diff_refuses_what_it_cannot_compare() {
    let missing = run(&["diff", "/nonexistent/a.json", "/nonexistent/b.json"]);
    assert!(!missing.status.success());
    assert!(
        stderr(&missing).contains("cannot read the profile /nonexistent/a.json"),
        "{}",
        stderr(&missing)
    );
    let topdown = temp_path("topdown.json");
    std::fs::write(&topdown, r#"{"mode":"topdown","threads":[]}"#).unwrap();
    let t = topdown.to_str().unwrap();
    let refused = run(&["diff", t, t]);
    assert!(stderr(&refused).contains("no stacks"), "{}", stderr(&refused));
}

/// A profile that is not one, or not one this bpfprof reads, gets one line saying which file and
/// why, and exit status 2 (the file given is the problem), from `report` and `diff` alike: a
/// truncated gzip, a pprof naming a location it does not hold, JSON of another mode or of a
/// future format, a 2 GiB file of one line (refused by its size, not read). Never a panic.
#[test]
fn a_bad_profile_gets_one_line_and_exit_2() {
    use std::io::Write as _;

    use profiler::report::pprof::proto::{Profile, Sample, ValueType};
    use prost::Message as _;
    let gzip = |raw: &[u8]| {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(raw).unwrap();
        encoder.finish().unwrap()
    };
    let dangling = Profile {
        sample_type: vec![ValueType { r#type: 1, unit: 2 }],
        sample: vec![Sample {
            location_id: vec![99],
            value: vec![1],
            label: vec![],
        }],
        string_table: vec!["".into(), "samples".into(), "count".into()],
        ..Default::default()
    }
    .encode_to_vec();
    let mut truncated = gzip(&dangling);
    truncated.truncate(truncated.len() / 2);
    let huge = temp_path("huge.folded");
    // Sparse: 2 GiB of one line, on no disk.
    std::fs::File::create(&huge).unwrap().set_len(2 << 30).unwrap();
    let cases: [(&str, Option<Vec<u8>>, &str); 6] = [
        ("truncated.pb.gz", Some(truncated), "gzip"),
        ("dangling.pb.gz", Some(gzip(&dangling)), "location"),
        (
            "topdown.json",
            Some(br#"{"mode":"topdown","threads":[]}"#.to_vec()),
            "no stacks",
        ),
        (
            "other.json",
            Some(br#"{"mode":"banana"}"#.to_vec()),
            "not a bpfprof report",
        ),
        (
            "future.json",
            Some(br#"{"format_version":99,"mode":"hotspot","stacks":[]}"#.to_vec()),
            "newer bpfprof",
        ),
        ("huge.folded", None, "larger than"),
    ];
    for (name, bytes, why) in cases {
        let path = temp_path(name);
        if let Some(bytes) = bytes {
            std::fs::write(&path, bytes).unwrap();
        }
        let p = path.to_str().unwrap();
        for args in [vec!["report", p], vec!["diff", p, p]] {
            let out = run(&args);
            let err = stderr(&out);
            let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
            eprintln!("{args:?}: {:?} {err}", out.status.code());
            assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
            assert_eq!(lines.len(), 1, "{args:?}: one line, not {err}");
            assert!(lines[0].contains(p) && lines[0].contains(why), "{args:?}: {err}");
        }
    }
}

/// Seconds within which the diff's CPU time of a function must match the workload's own clock:
/// 5% of it, and at least 30 ms (30 samples at 997 Hz).
fn seconds_tolerance(truth_s: f64) -> f64 {
    (0.05 * truth_s.abs()).max(0.03)
}

/// A function's `seconds` figure `key` (`self_before`, `total_change`, ...) in a diff's JSON.
fn diff_seconds(doc: &Value, function: &str, key: &str) -> f64 {
    let f = doc["functions"]
        .as_array()
        .and_then(|all| all.iter().find(|f| f["function"] == function))
        .unwrap_or_else(|| panic!("{function} is not in the diff: {doc}"));
    f["seconds"][key]
        .as_f64()
        .unwrap_or_else(|| panic!("no seconds.{key} for {function}: {f}"))
}

/// One function made 3x faster, the rest the same work: the diff's absolute figures follow the
/// workload's own clock (the unchanged function keeps its time while its share grows by points;
/// the sped-up one drops by the time it saved), where shares alone show the unchanged code grow.
#[test]
fn diff_after_a_speed_up_keeps_unchanged_code_at_its_time_while_its_share_grows() {
    let hotspot = bin("hotspot");
    // 40 rounds of CPU each: burn_a 30 ms a round before and 10 ms after, burn_b and burn_c 10 ms.
    let ((out_before, before), stolen_before) = stolen_during(|| {
        profile_workload(
            "997",
            "speedup-before.json",
            &[&hotspot, "weights", "30", "10", "10", "2"],
        )
    });
    let ((out_after, after), stolen_after) = stolen_during(|| {
        profile_workload(
            "997",
            "speedup-after.pb.gz",
            &[&hotspot, "weights", "10", "10", "10", "1.2"],
        )
    });
    eprintln!("steal: {stolen_before:.2} s during the run before, {stolen_after:.2} s after");
    let (t0, t1) = (truth(&stdout(&out_before)), truth(&stdout(&out_after)));
    let s = |t: &std::collections::HashMap<String, f64>, f: &str| t[f] / 1e9;
    let names = ["burn_a", "burn_b", "burn_c"];
    let b_share_pp = 100.0 * (truth_shares(&t1, &names)["burn_b"] - truth_shares(&t0, &names)["burn_b"]);
    assert!(
        b_share_pp > 8.0,
        "burn_b's share did not grow: {b_share_pp:+.1} points"
    );

    let (b, a) = (before.to_str().unwrap(), after.to_str().unwrap());
    // Every function: the unchanged ones rank last, below the noise of a few samples.
    let json = run(&["diff", b, a, "--format", "json", "--limit", "10000"]);
    assert!(json.status.success(), "{}", stderr(&json));
    let doc: Value = serde_json::from_str(&stdout(&json)).unwrap();
    assert_eq!(doc["ranked_by"], "seconds", "{doc}");
    assert_eq!(
        doc["functions"][0]["function"], "burn_a",
        "the largest change of time first"
    );
    for f in names {
        let [before_s, after_s, change_s] =
            ["total_before", "total_after", "total_change"].map(|key| diff_seconds(&doc, f, key));
        let truth = [s(&t0, f), s(&t1, f), s(&t1, f) - s(&t0, f)];
        let [t_before, t_after, t_change] = truth;
        eprintln!("diff: {f} {before_s:.3} s -> {after_s:.3} s ({change_s:+.3} s)");
        eprintln!("  its own clock: {t_before:.3} s -> {t_after:.3} s ({t_change:+.3} s)");
        // Samples may also hold time the host stole (above the clock's figure, never below it).
        for (what, reported, truth, (below, above)) in [
            ("before", before_s, truth[0], (0.0, stolen_before)),
            ("after", after_s, truth[1], (0.0, stolen_after)),
            ("change", change_s, truth[2], (stolen_before, stolen_after)),
        ] {
            let tolerance = seconds_tolerance(truth);
            assert!(
                reported >= truth - tolerance - below && reported <= truth + tolerance + above,
                "{f} {what}: {reported:.3} s in the diff, {truth:.3} s by the workload's own clock"
            );
        }
    }
    let b_change = diff_seconds(&doc, "burn_b", "total_change");
    assert!(
        b_change >= -0.05 - stolen_before && b_change <= 0.05 + stolen_after,
        "burn_b did not change, the diff says {b_change:+.3} s"
    );
    let f = doc["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["function"] == "burn_b")
        .unwrap();
    let share_pp = 100.0 * (f["total_after"].as_f64().unwrap() - f["total_before"].as_f64().unwrap());
    assert!(
        (share_pp - b_share_pp).abs() <= TOLERANCE_PP,
        "burn_b's share: {share_pp:+.2} points in the diff, {b_share_pp:+.2} by its own clock"
    );

    // The text shows each run's totals and length, and the same figures.
    let text = run(&["diff", b, a, "--limit", "10000"]);
    let table = stdout(&text);
    for (label, side) in [("before", "before"), ("after", "after")] {
        let total = doc[side]["total"].as_u64().unwrap();
        let secs = doc[side]["total_seconds"].as_f64().unwrap();
        let run_s = doc[side]["duration_s"].as_f64().unwrap();
        let want =
            format!("hotspot, {run_s:.1} s run: {total} samples of cpu-clock at 997 Hz = {secs:.2} s on CPU");
        assert!(table.contains(&want), "{label}: no {want:?} in\n{table}");
    }
    let [b_before, b_after] = ["self_before", "self_after"].map(|key| diff_seconds(&doc, "burn_b", key));
    let row = table.lines().find(|l| l.ends_with(" burn_b")).unwrap_or_default();
    assert!(
        row.trim_start()
            .starts_with(&format!("{b_before:.3} {:>8.3} ", b_after)),
        "burn_b's row: {row:?}\n{table}"
    );
}

/// The rows under "Source lines, hottest first:" (after its header).
fn source_rows(text: &str) -> Vec<&str> {
    text.lines()
        .skip_while(|l| !l.starts_with("Source lines"))
        .skip(2)
        .take_while(|l| !l.is_empty())
        .collect()
}

#[test]
fn annotate_puts_the_deliberately_hot_line_on_top_live_and_saved() {
    let hotline = bin("hotline");
    let out = run(&["-F", "997", "--annotate", "hot_loop", "--", &hotline, "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let hot = truth(&text)["hot_line"] as u32;
    let rows = source_rows(&text);
    let first = rows.first().unwrap_or_else(|| panic!("no source lines:\n{text}"));
    assert!(
        first.contains(&format!("hotline.c:{hot} ")),
        "line {hot} on top:\n{text}"
    );
    let share: f64 = first.trim_start().split('%').next().unwrap().parse().unwrap();
    assert!(share >= 50.0, "the hot line holds most samples:\n{text}");
    eprintln!("annotate: line {hot} on top with {share:.2}% of hot_loop's samples");
    // Its source text is shown, and the machine code was read from the binary.
    assert!(first.contains("x = x / 1.0000001"), "{first}");
    assert!(
        text.contains(DIVISION),
        "the division ({DIVISION}) in the instructions:\n{text}"
    );

    // The same from a saved profile.
    let (saved_out, json) = profile_workload("997", "hotline.json", &[&hotline, "2"]);
    let hot = truth(&stdout(&saved_out))["hot_line"] as u32;
    let again = run(&["report", json.to_str().unwrap(), "--annotate", "hot_loop"]);
    assert!(again.status.success(), "{}", stderr(&again));
    let rows_text = stdout(&again);
    let first = source_rows(&rows_text)
        .first()
        .copied()
        .unwrap_or_default()
        .to_string();
    assert!(
        first.contains(&format!("hotline.c:{hot} ")),
        "saved: line {hot} on top:\n{rows_text}"
    );
}

#[test]
fn annotate_says_plainly_when_there_is_no_line_information() {
    let out = run(&[
        "-F",
        "997",
        "--annotate",
        "hot_loop",
        "--",
        &bin("hotline-nodebug"),
        "1",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("No line information"), "{text}");
    // The instructions still carry the samples.
    assert!(text.contains(DIVISION), "{text}");
    let unknown = run(&[
        "-F",
        "997",
        "-d",
        "0.5",
        "--annotate",
        "no_such_function_here",
        "--",
        &bin("hotline"),
        "1",
    ]);
    assert!(!unknown.status.success());
    assert!(
        stderr(&unknown).contains("the hottest were: hot_loop"),
        "{}",
        stderr(&unknown)
    );
}

/// How long to wait for something that must happen (a prompt, an exit) before calling it a
/// failure: long, so that a busy machine is not mistaken for a broken program. What the view
/// promises about time is checked apart, from the moment it is loaded.
const EVENTUALLY: Duration = Duration::from_secs(30);

/// A tmux session of 80x24 running a shell, killed when dropped.
struct Tmux(String);

impl Tmux {
    fn start() -> Tmux {
        // One session per test, whether or not the harness runs them side by side.
        static SESSIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let number = SESSIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("bpfprof-test-{}-{number}", std::process::id());
        let ok = Command::new("tmux")
            .args([
                "new-session",
                "-d",
                "-s",
                &name,
                "-x",
                "80",
                "-y",
                "24",
                "bash --norc --noprofile",
            ])
            .status()
            .expect("tmux is installed (cargo xtask setup)");
        assert!(ok.success(), "tmux new-session failed");
        let tmux = Tmux(name);
        tmux.wait_for("the shell's prompt", EVENTUALLY, |screen| {
            screen.contains('#') || screen.contains('$')
        });
        tmux
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux").args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-t", &self.0])
    }

    fn send(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", &self.0];
        args.extend_from_slice(keys);
        self.tmux(&args);
    }

    fn show(&self, format: &str) -> String {
        self.tmux(&["display-message", "-p", "-t", &self.0, format])
            .trim()
            .to_string()
    }

    /// Polls the screen until `done` holds; fails with the screen after `limit`.
    fn wait_for(&self, what: &str, limit: Duration, done: impl Fn(&str) -> bool) -> (String, Duration) {
        let started = Instant::now();
        loop {
            let screen = self.screen();
            if done(&screen) {
                return (screen, started.elapsed());
            }
            assert!(started.elapsed() < limit, "no {what} within {limit:?}:\n{screen}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.tmux(&["kill-session", "-t", &self.0]);
    }
}

/// Types `bpfprof top ARGS` at the shell, followed by what reports its exit status and the
/// terminal's line settings.
fn type_top(tmux: &Tmux, args: &str) {
    tmux.send(&[
        &format!(
            "{} top {args}; echo TOP-EXIT=$?; stty -a | tr ';' '\\n' | grep -ow -- '-\\?icanon\\|-\\?echo' | tr '\\n' ' '; echo",
            bpfprof_bin().display()
        ),
        "Enter",
    ]);
}

/// After top exited: status 0, main screen back, cursor shown, line editing and echo on, and
/// nothing of bpfprof left in the kernel.
fn assert_exited_and_terminal_sane(tmux: &Tmux) {
    // The typed command itself can wrap so that a screen line starts with "TOP-EXIT=$?": only
    // the echo's own line, the word and digits alone, is the exit status.
    let (screen, _) = tmux.wait_for("exit after q", EVENTUALLY, |s| {
        s.lines().any(|l| {
            l.strip_prefix("TOP-EXIT=")
                .is_some_and(|code| !code.is_empty() && code.bytes().all(|b| b.is_ascii_digit()))
        })
    });
    assert!(screen.lines().any(|l| l == "TOP-EXIT=0"), "{screen}");
    let (screen, _) = tmux.wait_for("stty's answer", EVENTUALLY, |s| {
        s.lines().any(|l| l.contains("icanon ") && !l.contains("stty"))
    });
    assert!(
        screen.lines().any(|l| l.trim() == "icanon echo"),
        "line editing and echo back on:\n{screen}"
    );
    assert!(
        !screen.contains("[q] bpfprof top"),
        "the shell's screen is back:\n{screen}"
    );
    assert_eq!(
        tmux.show("#{alternate_on} #{cursor_flag}"),
        "0 1",
        "main screen, cursor shown"
    );
    assert_no_programs_left();
}

/// Runs `bpfprof top ARGS` in a terminal, waits for `expected` as the first row within 3 s of
/// the view being loaded, quits with `q` and checks the terminal is as it was. Returns how long
/// loading took (BPF verification: CPU work a busy machine stretches), then the row, and the
/// screen it was seen on.
fn top_shows_then_quits(args: &str, expected: &str) -> (Duration, Duration, String) {
    let tmux = Tmux::start();
    type_top(&tmux, args);
    let (_, loading) = tmux.wait_for("the view, loaded", EVENTUALLY, |screen| {
        screen.contains("bpfprof top:") && !screen.contains("loading…")
    });
    let (screen, took) = tmux.wait_for(&format!("{expected} on top"), Duration::from_secs(3), |screen| {
        let mut rows = screen.lines().skip_while(|l| !l.contains("bpfprof top:")).skip(2);
        rows.next().is_some_and(|row| row.contains(expected))
    });
    assert_eq!(tmux.show("#{alternate_on}"), "1", "drawn in the alternate screen");
    assert!(screen.lines().all(|l| l.chars().count() <= 80), "{screen}");
    tmux.send(&["q"]);
    assert_exited_and_terminal_sane(&tmux);
    (loading, took, screen)
}

#[test]
fn top_quit_while_still_loading_leaves_the_terminal_sane() {
    // `q` before the run listens for SIGINT: it must wait for it, not kill bpfprof mid-way.
    let tmux = Tmux::start();
    type_top(&tmux, "");
    tmux.wait_for("the view", EVENTUALLY, |s| s.contains("bpfprof top: hotspot"));
    tmux.send(&["q"]);
    assert_exited_and_terminal_sane(&tmux);
}

#[test]
fn top_shows_the_hot_function_within_3_seconds_and_q_leaves_the_terminal_sane() {
    let workload = start_workload("hotspot", &["split", "30"]);
    let (loading, took, _) = top_shows_then_quits(&format!("-p {}", workload.pid()), "burn_a");
    eprintln!("top: loaded in {loading:.1?}, then burn_a on top after {took:.1?}");
}

/// `top -e EVENT -c N` samples any event every N of it, and its header says which.
#[test]
fn top_samples_any_event_at_any_period_and_names_it() {
    let workload = start_workload("hotspot", &["split", "30"]);
    let args = format!("-e task-clock -c 1000000 -p {}", workload.pid());
    let (_, _, screen) = top_shows_then_quits(&args, "burn_a");
    let header = screen
        .lines()
        .find(|l| l.contains("bpfprof top:"))
        .unwrap_or_default();
    eprintln!("{header}");
    assert!(header.contains("task-clock every 1000000 events"), "{screen}");
}

#[test]
fn top_lock_shows_the_contended_lock() {
    let workload = start_workload("lockload", &["4", "30"]);
    top_shows_then_quits(&format!("--mode lock -p {}", workload.pid()), "shared_lock");
}

#[test]
fn top_is_off_when_standard_output_is_not_a_terminal() {
    let out = run(&["top"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("standard output is not one"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn top_sched_shows_the_tasks_waiting_for_a_cpu() {
    // Four spinning threads on two CPUs: they take turns waiting in the run queue.
    let workload = start_workload("schedload", &["30", "4"]);
    top_shows_then_quits(&format!("--mode sched -p {}", workload.pid()), "schedload");
}

/// `top --mode sched` over the whole machine books each wait once, when it ends: no row shows
/// an average wait above its longest, or waiting time without a wait (seen on this VM, whose init
/// has threads the kernel switches in every second without a switch-out tracepoint: each second
/// a different "wait" was counted, up to a second long), and threads already running before top
/// started (the workload's spinning threads, first seen mid-run) are booked only the run-queue
/// delay the kernel counted for them since, never their past.
#[test]
fn top_sched_books_each_wait_once_and_no_thread_its_past() {
    let workload = start_workload("schedload", &["30", "4"]);
    let tids = threads_of(workload.pid(), 5);
    bpfprof_tests::wait_for_cpu_time(workload.pid(), tids[1], 5e8);
    let tmux = Tmux::start();
    tmux.tmux(&["resize-window", "-t", &tmux.0, "-x", "100", "-y", "60"]);
    let before: std::collections::HashMap<u32, f64> = tids
        .iter()
        .map(|&t| (t, schedstat(workload.pid(), t)[1]))
        .collect();
    type_top(&tmux, "--mode sched");
    tmux.wait_for("the view, loaded", EVENTUALLY, |screen| {
        screen.contains("bpfprof top: sched") && !screen.contains("loading…")
    });
    let mut screens = Vec::new();
    for _ in 0..12 {
        std::thread::sleep(Duration::from_millis(500));
        screens.push(tmux.screen());
    }
    let delay_since: std::collections::HashMap<u32, f64> = tids
        .iter()
        .map(|&t| (t, schedstat(workload.pid(), t)[1] - before[&t]))
        .collect();
    tmux.send(&["q"]);
    assert_exited_and_terminal_sane(&tmux);
    let mut rows = 0;
    for screen in &screens {
        for row in screen.lines().skip_while(|l| !l.contains("bpfprof top:")).skip(2) {
            let f: Vec<&str> = row.split_whitespace().collect();
            if f.len() < 8 || f[2].parse::<u64>().is_err() {
                continue;
            }
            rows += 1;
            let (waited, _) = printed_ns(f[0], f[1]);
            let waits: u64 = f[2].parse().unwrap();
            let (avg, avg_digit) = printed_ns(f[3], f[4]);
            let (max, max_digit) = printed_ns(f[5], f[6]);
            assert!(
                waits > 0 || waited == 0.0,
                "waiting time without a wait: {row}\n{screen}"
            );
            assert!(
                avg <= max + avg_digit + max_digit,
                "an average wait above the longest: {row}\n{screen}"
            );
            let (pid, tid) = f[f.len() - 1].split_once('/').unwrap();
            if pid == workload.pid().to_string() {
                let tid: u32 = tid.parse().unwrap();
                if let Some(&truth) = delay_since.get(&tid) {
                    assert!(
                        waited <= truth * 1.05 + 1e6,
                        "{row}: more than the {truth} ns the kernel counted since top started"
                    );
                }
            }
        }
    }
    assert!(rows > 12, "rows read: {rows}\n{}", screens.last().unwrap());
}

/// A duration as the text reports print it (`850 ns`, `12.3 us`, `4.56 ms`, `1.23 s`): its
/// nanoseconds, and half a unit of its last digit (how far the printed figure may be from it).
fn printed_ns(value: &str, unit: &str) -> (f64, f64) {
    let value: f64 = value
        .parse()
        .unwrap_or_else(|_| panic!("not a number: {value:?}"));
    let (scale, half_digit) = match unit {
        "ns" => (1.0, 0.5),
        "us" => (1e3, 50.0),
        "ms" => (1e6, 5e3),
        "s" => (1e9, 5e6),
        _ => panic!("not a unit: {unit:?}"),
    };
    (value * scale, half_digit)
}

/// `bpfprof report PROFILE ARGS`, which must succeed: its standard output.
fn report_of(profile: &std::path::Path, args: &[&str]) -> String {
    let mut all = vec!["report", profile.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = run(&all);
    assert!(out.status.success(), "bpfprof {all:?}: {}", stderr(&out));
    stdout(&out)
}

/// A sched run saved as JSON renders again as its text report: the same tasks with the same
/// figures (each row's runs exactly, its total delay to the printed digit), the same context
/// switches; and as JSON, the very document saved.
#[test]
fn a_saved_sched_json_renders_again_as_its_text_report() {
    let json = temp_path("saved-sched.json");
    let schedload = bin("schedload");
    let out = run(&[
        "--mode",
        "sched",
        "-o",
        json.to_str().unwrap(),
        "--",
        &schedload,
        "2",
        "3",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let again: Value = serde_json::from_str(&report_of(&json, &["--format", "json"])).unwrap();
    assert_eq!(again, saved, "the JSON rendered again is the JSON saved");

    let text = report_of(&json, &[]);
    let header = text.lines().next().unwrap();
    assert!(header.starts_with("bpfprof sched: "), "{text}");
    let switches = saved["context_switches"].as_u64().unwrap();
    assert!(
        switches > 0 && header.ends_with(&format!("| {switches} context switches")),
        "{header}"
    );
    let tasks = saved["tasks"].as_array().unwrap();
    // Every thread of the workload (it names each as it exits) is in the table.
    let workload_tids: Vec<u64> = stdout(&out)
        .lines()
        .filter_map(|l| l.strip_prefix("TASK tid="))
        .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    assert!(workload_tids.len() >= 4, "{}", stdout(&out));
    for tid in &workload_tids {
        assert!(tasks.iter().any(|t| t["tid"] == *tid), "tid {tid} not saved");
    }
    for task in tasks.iter().take(30) {
        let (pid, tid) = (task["pid"].as_u64().unwrap(), task["tid"].as_u64().unwrap());
        let row: Vec<&str> = text
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|w| w.len() > 5 && w[1] == pid.to_string() && w[2] == tid.to_string())
            .unwrap_or_else(|| panic!("no row for tid {tid}:\n{text}"));
        assert_eq!(row[0], task["comm"].as_str().unwrap());
        assert_eq!(
            row[3],
            task["runs"].as_u64().unwrap().to_string(),
            "runs of {tid}"
        );
        let (total, digit) = printed_ns(row[4], row[5]);
        let want = task["total_delay_ns"].as_f64().unwrap();
        assert!(
            (total - want).abs() <= digit,
            "tid {tid}: {total} printed, {want} saved"
        );
    }
    eprintln!(
        "sched: {} tasks, {switches} context switches, read back whole",
        tasks.len()
    );
}

/// A lock run saved as JSON renders again as its text report: the shared lock first with its
/// waits and total (the total also against the workload's own clock); and as JSON, the very
/// document saved.
#[test]
fn a_saved_lock_json_renders_again_as_its_text_report() {
    let json = temp_path("saved-lock.json");
    let lockload = bin("lockload");
    let out = run(&[
        "--mode",
        "lock",
        "-o",
        json.to_str().unwrap(),
        "--",
        &lockload,
        "3",
        "2",
        "1.5",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let truth = truth(&stdout(&out));
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let again: Value = serde_json::from_str(&report_of(&json, &["--format", "json"])).unwrap();
    assert_eq!(again, saved, "the JSON rendered again is the JSON saved");

    let text = report_of(&json, &[]);
    assert!(text.starts_with("bpfprof lock (futex waits): "), "{text}");
    let shared = &saved["locks"][0];
    assert_eq!(shared["symbol"], "shared_lock", "{shared}");
    let entry = format!(
        "[1] shared_lock (mutex, {}) pid {} ",
        shared["address"].as_str().unwrap(),
        truth["pid"]
    );
    let line = text
        .lines()
        .find(|l| l.starts_with(&entry))
        .unwrap_or_else(|| panic!("no {entry:?}:\n{text}"));
    let contentions = shared["contentions"].as_u64().unwrap();
    let (_, figures) = line.split_once(": ").unwrap();
    let words: Vec<&str> = figures.split([' ', ',']).filter(|w| !w.is_empty()).collect();
    assert_eq!(
        &words[..3],
        [contentions.to_string().as_str(), "waits", "total"],
        "{line}"
    );
    let (total, digit) = printed_ns(words[3], words[4]);
    let want = shared["total_wait_ns"].as_f64().unwrap();
    assert!(
        (total - want).abs() <= digit,
        "{total} printed, {want} saved: {line}"
    );
    let truth_wait = truth["wait_ns"];
    assert!(
        (total - truth_wait).abs() <= 0.10 * truth_wait,
        "shared_lock: {total} ns in the text, the workload timed {truth_wait} ns"
    );
    eprintln!("lock: shared_lock {contentions} waits, {total:.0} ns (workload: {truth_wait:.0} ns), read back whole");
}

/// The pprof bpfprof writes reads back with its run's header (not "other at 0 Hz | 0 CPUs"), and
/// names the program it profiled first: xz spends its time in liblzma, yet its first mapping
/// (`go tool pprof`'s `File:`) is xz.
#[test]
fn a_saved_pprof_keeps_the_runs_header_and_names_the_program_first() {
    let data = temp_path("pprof-input.txt");
    let text: String = (0..2_000_000u64)
        .map(|i| format!("{} ", i.wrapping_mul(2654435761) % 9973))
        .collect();
    std::fs::write(&data, text).unwrap();
    let profile = temp_path("xz.pb.gz");
    let out = run(&[
        "-F",
        "499",
        "-o",
        profile.to_str().unwrap(),
        "--",
        "xz",
        "-T1",
        "-k",
        "-f",
        "-6",
        data.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let decoded = decode_pprof(&std::fs::read(&profile).unwrap());
    let first = &decoded.mapping[0];
    assert_eq!(first.id, 1);
    let file = &decoded.string_table[first.filename as usize];
    assert_eq!(file.rsplit('/').next(), Some("xz"), "first mapping: {file}");

    let header = report_of(&profile, &[]).lines().next().unwrap().to_string();
    let cpus = std::thread::available_parallelism().unwrap().get();
    assert!(
        header.starts_with("bpfprof hotspot: command `xz ") && header.contains("| cpu-clock at 499 Hz | "),
        "{header}"
    );
    assert!(header.ends_with(&format!(" s | {cpus} CPUs")), "{header}");
    let seconds = decoded.duration_nanos as f64 / 1e9;
    assert!(
        header.contains(&format!("| {seconds:.1} s |")),
        "{header} ({seconds} s)"
    );
    eprintln!("pprof: {header}; File: {file}");
}
