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
    assert!(
        first_row.trim_start().starts_with('+') && first_row.ends_with("burn_a"),
        "first row: {first_row:?}\n{table}"
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
    let (screen, _) = tmux.wait_for("exit after q", EVENTUALLY, |s| {
        s.lines().any(|l| l.starts_with("TOP-EXIT="))
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
/// loading took (BPF verification: CPU work a busy machine stretches), and then the row.
fn top_shows_then_quits(args: &str, expected: &str) -> (Duration, Duration) {
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
    (loading, took)
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
    let (loading, took) = top_shows_then_quits(&format!("-p {}", workload.pid()), "burn_a");
    eprintln!("top: loaded in {loading:.1?}, then burn_a on top after {took:.1?}");
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
