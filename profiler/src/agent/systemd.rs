//! systemd's notify protocol (`Type=notify`, `WatchdogSec=`). READY=1 is sent after the first
//! drain: the programs are attached and their maps were read, so a window can be cut. The
//! watchdog is fed from the drain too, at half the unit's interval, so a stuck event loop gets the
//! agent restarted rather than a silent gap in the profiles. Nothing is sent when systemd did not
//! start the agent (no `NOTIFY_SOCKET`).
use std::time::{Duration, Instant};

use sd_notify::NotifyState;

pub struct Notifier {
    ready: bool,
    /// Told STOPPING=1: the closing drain feeds nothing after it.
    stopping: bool,
    /// How often to feed the watchdog (half of `WATCHDOG_USEC`), if the unit has one.
    feed_every: Option<Duration>,
    fed: Instant,
}

impl Notifier {
    pub fn from_env() -> Notifier {
        Notifier {
            ready: false,
            stopping: false,
            feed_every: sd_notify::watchdog_enabled().map(|d| d / 2),
            fed: Instant::now(),
        }
    }

    /// A drain went through: ready (the first time), and the watchdog fed when due.
    pub fn drained(&mut self, status: impl FnOnce() -> String) {
        if self.stopping {
            return;
        }
        if !self.ready {
            self.ready = true;
            self.send(&[NotifyState::Ready, NotifyState::Status(&status())]);
        }
        if let Some(every) = self.feed_every {
            if self.fed.elapsed() >= every {
                self.fed = Instant::now();
                self.send(&[NotifyState::Watchdog]);
            }
        }
    }

    pub fn stopping(&mut self) {
        self.stopping = true;
        self.send(&[NotifyState::Stopping]);
    }

    fn send(&self, states: &[NotifyState]) {
        // A manager that went away is not the agent's problem: it keeps profiling.
        if let Err(e) = sd_notify::notify(states) {
            log::warn!("systemd notify: {e}");
        }
    }
}
