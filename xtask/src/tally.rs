//! What a suite did, read from its test harness's own lines: the tally every runner of suites
//! (the host's, the guest's) shares.
use std::time::{Duration, Instant};

use anyhow::Result;

/// What one suite did.
pub struct Outcome {
    pub suite: String,
    pub passed: u32,
    pub failed: u32,
    /// Names of the failed tests, or why the suite did not finish.
    pub failures: Vec<String>,
    pub took: Duration,
}

/// What a test harness said it did, from its own lines (`test NAME ... FAILED`,
/// `test result: ... N passed; N failed`).
#[derive(Default)]
pub struct Tally {
    passed: u32,
    failed: u32,
    failures: Vec<String>,
}

impl Tally {
    pub fn read(&mut self, line: &str) {
        if let Some(test) = line
            .strip_prefix("test ")
            .and_then(|l| l.strip_suffix(" ... FAILED"))
        {
            self.failures.push(test.to_string());
        }
        if let Some(result) = line.strip_prefix("test result: ") {
            self.passed += count(result, " passed");
            self.failed += count(result, " failed");
        }
    }

    /// The suite's outcome; `failed_with`: how its harness failed (exit status), if it did.
    pub fn outcome(mut self, suite: &str, failed_with: Option<String>, took: Duration) -> Outcome {
        if let (Some(how), 0) = (failed_with, self.failed) {
            // It did not get as far as a test failing: a build error, or a harness that crashed.
            self.failed = 1;
            self.failures.push(format!("the suite did not finish ({how})"));
        }
        Outcome {
            suite: suite.to_string(),
            passed: self.passed,
            failed: self.failed,
            failures: self.failures,
            took,
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
        }
    }
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
    use super::count;

    #[test]
    fn counts_are_read_from_the_harness_result_line() {
        let ok = "ok. 100 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.27s";
        assert_eq!((count(ok, " passed"), count(ok, " failed")), (100, 0));
        let bad = "FAILED. 5 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 58.10s";
        assert_eq!((count(bad, " passed"), count(bad, " failed")), (5, 1));
        assert_eq!(count("ok. 0 passed; 0 failed;", " passed"), 0);
    }
}
