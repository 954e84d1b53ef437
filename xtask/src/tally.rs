//! What a suite did, read from its test harness's own lines: the tally every runner of suites
//! (the host's, the guest's) shares. Besides the counts: how long each test took (from one
//! verdict to the next: a test's own time where the harness runs one at a time, as the
//! end-to-end suites do) and, for a test that failed, where and why it panicked, so that the
//! summary a CI log ends with says it.
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use anyhow::Result;

/// What one suite did.
#[derive(Default)]
pub struct Outcome {
    pub suite: String,
    pub passed: u32,
    pub failed: u32,
    /// Names of the failed tests (with where and why they panicked), or why the suite did not
    /// finish.
    pub failures: Vec<String>,
    pub took: Duration,
    /// Each test's name and time, in the order they ran (none for a suite run in parallel).
    pub times: Vec<(String, Duration)>,
}

/// What a test harness said it did, from its own lines (`running N tests`, `test NAME ... ok`,
/// `thread 'NAME' panicked at PLACE:` and its message, `test result: ... N passed; N failed`).
#[derive(Default)]
pub struct Tally {
    passed: u32,
    failed: u32,
    failures: Vec<String>,
    times: Vec<(String, Duration)>,
    /// The harness runs its tests in parallel: the time between two verdicts is no test's own.
    parallel: bool,
    /// When the harness started its tests, or the last one ended.
    since: Option<Instant>,
    /// The test whose name was printed and whose verdict was not yet.
    running: Option<String>,
    /// A failed test's panic: its place and the first lines of its message.
    why: HashMap<String, String>,
    /// The test whose panic message is being read, and the lines read so far.
    panic: Option<(String, Vec<String>)>,
}

/// The lines of a panic message kept for the summary, and their length at most.
const WHY_LINES: usize = 3;
const WHY_CHARS: usize = 300;

impl Tally {
    /// For a harness that runs its tests in parallel (the unit suite): no test is timed.
    pub fn in_parallel() -> Tally {
        Tally {
            parallel: true,
            ..Tally::default()
        }
    }

    /// Read one line of the harness; for a test's result line, how long the test took.
    pub fn read(&mut self, line: &str) -> Option<Duration> {
        self.read_panic(line);
        if line.starts_with("running ") && (line.ends_with(" tests") || line.ends_with(" test")) {
            self.since = Some(Instant::now());
        }
        if let Some(result) = line.strip_prefix("test result: ") {
            self.passed += count(result, " passed");
            self.failed += count(result, " failed");
        }
        // `test NAME ... ` is printed as the test starts and its verdict as it ends: a child's
        // output (the guest's console) can come between, leaving the verdict on a line of its own.
        let verdict = match line.strip_prefix("test ").and_then(|l| l.split_once(" ... ")) {
            Some((test, verdict)) => {
                self.running = Some(test.to_string());
                verdict
            }
            None => line,
        };
        let failed = match verdict {
            "FAILED" => true,
            "ok" => false,
            _ if verdict.starts_with("ignored") => false,
            _ => return None,
        };
        let test = self.running.take()?;
        if failed {
            self.failures.push(test.clone());
        }
        if self.parallel {
            return None;
        }
        let now = Instant::now();
        let took = now - self.since.replace(now)?;
        self.times.push((test, took));
        Some(took)
    }

    /// `thread 'NAME' (TID) panicked at PLACE:`, then the message up to a blank line.
    fn read_panic(&mut self, line: &str) {
        if let Some((test, lines)) = &mut self.panic {
            let end = line.is_empty() || line.starts_with("note: ") || line == "stack backtrace:";
            if !end && lines.len() <= WHY_LINES {
                lines.push(line.trim().to_string());
                return;
            }
            let why: String = lines.join(" | ").chars().take(WHY_CHARS).collect();
            self.why.insert(std::mem::take(test), why);
            self.panic = None;
        }
        let Some(rest) = line.strip_prefix("thread '") else {
            return;
        };
        if let Some((test, rest)) = rest.split_once('\'') {
            if let Some((_, place)) = rest.split_once(" panicked at ") {
                let place = place.trim_end_matches(':').to_string();
                self.panic = Some((test.to_string(), vec![place]));
            }
        }
    }

    /// The suite's outcome; `failed_with`: how its harness failed (exit status), if it did.
    pub fn outcome(mut self, suite: &str, failed_with: Option<String>, took: Duration) -> Outcome {
        self.read_panic("");
        if let (Some(how), 0) = (failed_with, self.failed) {
            // It did not get as far as a test failing: a build error, or a harness that crashed.
            self.failed = 1;
            self.failures.push(format!("the suite did not finish ({how})"));
        }
        let why = &self.why;
        let failures = (self.failures.into_iter())
            .map(|test| match why.get(&test) {
                Some(why) => format!("{test} ({why})"),
                None => test,
            })
            .collect();
        Outcome {
            suite: suite.to_string(),
            passed: self.passed,
            failed: self.failed,
            failures,
            took,
            times: self.times,
        }
    }
}

impl Outcome {
    pub fn line(&self) -> String {
        let mut line = format!(
            "{:<16} {:>4} passed, {:>2} failed  {:>6.1} s",
            self.suite,
            self.passed,
            self.failed,
            self.took.as_secs_f64()
        );
        if !self.failures.is_empty() {
            line += &format!("  FAILED: {}", self.failures.join(", "));
        }
        line
    }
}

impl Outcome {
    /// A task that is one check: passed or failed, with its error.
    pub fn of_task(suite: &str, result: Result<()>, started: Instant) -> Outcome {
        Outcome {
            suite: suite.into(),
            passed: result.is_ok() as u32,
            failed: result.is_err() as u32,
            failures: result.err().map(|e| format!("{e:#}")).into_iter().collect(),
            took: started.elapsed(),
            ..Outcome::default()
        }
    }
}

/// A result line as a runner shows it: with the test's time when it took a second or more.
pub fn timed(line: &str, took: Option<Duration>) -> String {
    match took {
        Some(took) if took >= Duration::from_secs(1) => format!("{line} ({:.1} s)", took.as_secs_f64()),
        _ => line.to_string(),
    }
}

/// The `n` slowest tests of a run, a line each: where a suite's time goes.
pub fn slowest(outcomes: &[Outcome], n: usize) -> Vec<String> {
    let mut all: Vec<(&str, &str, Duration)> = (outcomes.iter())
        .flat_map(|o| {
            o.times
                .iter()
                .map(|(test, took)| (o.suite.as_str(), test.as_str(), *took))
        })
        .collect();
    all.sort_by_key(|&(.., took)| std::cmp::Reverse(took));
    (all.into_iter().take(n))
        .map(|(suite, test, took)| format!("{:>7.1} s  {suite}: {test}", took.as_secs_f64()))
        .collect()
}

/// The number before `what` in a harness result line (`ok. 5 passed; 1 failed; ...`).
fn count(result: &str, what: &str) -> u32 {
    result
        .split(';')
        .find_map(|part| part.trim().split_once(what))
        .and_then(|(before, _)| before.rsplit([' ', '.']).next()?.parse().ok())
        .unwrap_or(0)
}

pub fn totals_line(outcomes: &[Outcome]) -> String {
    let passed: u32 = outcomes.iter().map(|o| o.passed).sum();
    let failed: u32 = outcomes.iter().map(|o| o.failed).sum();
    format!("{passed} passed, {failed} failed")
}

#[cfg(test)]
mod tests {
    use super::{count, Tally};

    #[test]
    fn counts_are_read_from_the_harness_result_line() {
        let ok = "ok. 100 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.27s";
        assert_eq!((count(ok, " passed"), count(ok, " failed")), (100, 0));
        let bad = "FAILED. 5 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 58.10s";
        assert_eq!((count(bad, " passed"), count(bad, " failed")), (5, 1));
        assert_eq!(count("ok. 0 passed; 0 failed;", " passed"), 0);
    }

    #[test]
    fn a_failed_test_is_named_with_where_and_why_it_panicked() {
        let mut tally = Tally::default();
        for line in [
            "running 2 tests",
            "test slow_one ... ok",
            "test bad_one ... FAILED",
            "",
            "---- bad_one stdout ----",
            "thread 'bad_one' (13356) panicked at tests/tests/x.rs:273:5:",
            "jitted_spin NaN against 0.7434",
            "note: run with `RUST_BACKTRACE=1`",
            "",
            "test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out",
        ] {
            tally.read(line);
        }
        let outcome = tally.outcome("e2e x", Some("exit status: 101".into()), Default::default());
        assert_eq!((outcome.passed, outcome.failed), (1, 1));
        assert_eq!(
            outcome.failures,
            ["bad_one (tests/tests/x.rs:273:5 | jitted_spin NaN against 0.7434)"]
        );
        let timed: Vec<_> = outcome.times.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(timed, ["slow_one", "bad_one"]);
    }

    #[test]
    fn a_verdict_after_a_childs_output_is_the_tests_own() {
        let mut tally = Tally::default();
        tally.read("running 2 tests");
        assert!(tally.read("test t ... child said ... something").is_none());
        assert!(tally.read("more of what the child said").is_none());
        assert!(tally.read("FAILED").is_some());
        assert!(tally.read("test u ... ok").is_some());
        assert!(tally.read("ok").is_none(), "no test is running");
        let outcome = tally.outcome("e2e x", None, Default::default());
        assert_eq!(outcome.failures, ["t"]);
        let timed: Vec<_> = outcome.times.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(timed, ["t", "u"]);
    }

    #[test]
    fn a_suite_run_in_parallel_times_no_test_but_names_its_failures() {
        let mut tally = Tally::in_parallel();
        for line in ["running 2 tests", "test a ... ok", "test b ... FAILED"] {
            assert!(tally.read(line).is_none());
        }
        let outcome = tally.outcome("unit", None, Default::default());
        assert_eq!(outcome.failures, ["b"]);
        assert!(outcome.times.is_empty());
    }
}
