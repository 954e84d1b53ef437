//! Feedback during a run on a terminal: one status line on standard error, rewritten each second
//! (time so far and of the run, what was recorded, what was lost), and a line while symbolizing.
//! Nothing at all when standard error is not a terminal: logs, pipes and CI see what they always
//! did.
use std::{
    io::{IsTerminal as _, Write as _},
    time::{Duration, Instant},
};

use crate::profile::Health;

/// Erase the line the cursor is on and go back to its start.
const CLEAR: &str = "\r\x1b[2K";

pub struct StatusLine {
    started: Instant,
    duration: Option<Duration>,
    /// Something is on the line that must be erased before anything else is written.
    shown: bool,
}

impl StatusLine {
    /// A status line for a run of `duration` (None: until stopped), if standard error is a
    /// terminal.
    pub fn on_terminal(duration: Option<Duration>) -> Option<StatusLine> {
        std::io::stderr().is_terminal().then(|| StatusLine {
            started: Instant::now(),
            duration,
            shown: false,
        })
    }

    /// The run's progress from the kernel's counters.
    pub fn progress(&mut self, health: &Health) {
        let text = progress_text(self.started.elapsed(), self.duration, health);
        self.show(&text);
    }

    /// Any one line in place of the status (e.g. what is being done after the run).
    pub fn show(&mut self, text: &str) {
        let mut err = std::io::stderr().lock();
        // A terminal gone away is no reason to fail a run.
        let _ = write!(err, "{CLEAR}bpfprof: {text}");
        let _ = err.flush();
        self.shown = true;
    }

    /// Erase the line, so what follows starts on a clean one.
    pub fn clear(&mut self) {
        if std::mem::take(&mut self.shown) {
            let _ = write!(std::io::stderr().lock(), "{CLEAR}");
        }
    }
}

impl Drop for StatusLine {
    fn drop(&mut self) {
        self.clear();
    }
}

/// `3 s of 10 s · 594 samples · 0 lost`: the counters a mode moves (samples, context switches,
/// lock waits), and every record the kernel could not keep.
pub fn progress_text(elapsed: Duration, duration: Option<Duration>, health: &Health) -> String {
    let mut text = format!("{} s", elapsed.as_secs());
    if let Some(duration) = duration {
        text += &format!(" of {} s", duration.as_secs_f64().round());
    }
    let counted = [
        (health.samples, "samples"),
        (health.sched_switches, "context switches"),
        (health.lock_waits, "lock waits"),
    ];
    for (count, what) in counted.iter().filter(|(count, _)| *count > 0) {
        text += &format!(" · {count} {what}");
    }
    let lost = health.lost_map_full
        + health.lock_map_full
        + health.task_map_full
        + health.offcpu_map_full
        + health.exited_map_full
        + health.slow_events_lost
        + health.delta_map_full
        + health.collisions();
    text += &format!(" · {lost} lost");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_says_time_what_was_recorded_and_every_loss() {
        let health = Health {
            samples: 594,
            lost_map_full: 2,
            user_stack_collisions: 1,
            ..Health::default()
        };
        let text = progress_text(
            Duration::from_millis(3400),
            Some(Duration::from_secs(10)),
            &health,
        );
        assert_eq!(text, "3 s of 10 s · 594 samples · 3 lost");
        let sched = Health {
            sched_switches: 1200,
            offcpu_map_full: 4,
            ..Health::default()
        };
        assert_eq!(
            progress_text(Duration::from_secs(61), None, &sched),
            "61 s · 1200 context switches · 4 lost"
        );
    }
}
