//! A `sched record` file: JSON Lines, the recording's header first, then an event per line (in
//! nearly time order: each CPU's in order, CPUs interleaved as the ring gave them), then the
//! totals. Read back in time order through a window of `REORDER_NS`, so a view's memory is a
//! second's events, whatever the file's length.
use std::{
    collections::BinaryHeap,
    io::{self, BufRead, Read as _},
    path::Path,
};

use profiler_common::timeline::{event_kind, SchedEvent, TaskSnap};
use serde::{Deserialize, Serialize};

use crate::{collect::comm_string, error::UserError};

/// Events are put in time order within this window (the ring hands over each CPU's in order,
/// and one drain's events all precede the next drain's but for those written as it read).
pub const REORDER_NS: u64 = 1_000_000_000;
/// No line of a file is longer (an event is about 400 bytes).
const MAX_LINE_BYTES: u64 = 64 << 10;
/// Events held for ordering at most: a file whose times do not advance is not read whole into
/// memory (past this, the earliest is handed out whatever the window says).
const MAX_WINDOW: usize = 1 << 18;
/// CPUs a recording may claim: the views draw a column per CPU.
pub const MAX_CPUS: u32 = 8192;

/// The first line: what a view needs before the events.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Header {
    /// CLOCK_MONOTONIC when the recording started: event times are shown from here.
    pub started_ns: u64,
    pub cpus: u32,
    /// The events carry the kernel's own runs, run-queue delay and time on a CPU per task (else
    /// only the tracepoints' times).
    pub kernel_figures: bool,
}

/// The last line: what was recorded and what was lost.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Totals {
    pub target: String,
    pub seconds: f64,
    pub events: u64,
    pub lost: u64,
    pub notes: Vec<String>,
}

/// A task as an event saw it, with the kernel's totals for it then.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Task {
    pub tid: u32,
    pub pid: u32,
    pub comm: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub target: bool,
    #[serde(default)]
    pub pcount: u64,
    #[serde(default)]
    pub run_delay_ns: u64,
    #[serde(default)]
    pub sum_exec_ns: u64,
}

/// One event: when (CLOCK_MONOTONIC ns), on which CPU, what.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Event {
    pub t: u64,
    pub cpu: u32,
    #[serde(flatten)]
    pub what: What,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum What {
    /// `prev` leaves the CPU in `state` (perf's letter: R when preempted), `next` comes on.
    Switch {
        prev: Task,
        next: Task,
        state: String,
    },
    Wakeup {
        task: Task,
        waker: Task,
    },
    WakeupNew {
        task: Task,
        waker: Task,
    },
    Migrate {
        task: Task,
        to: u32,
    },
    Fork {
        child: Task,
        parent: Task,
    },
    Exit {
        task: Task,
    },
}

impl Event {
    /// The kernel's record, as a line of the file (`None`: a kind this build does not know).
    pub fn from_kernel(raw: &SchedEvent) -> Option<Event> {
        let (a, b) = (task(&raw.a), task(&raw.b));
        let what = match raw.kind {
            event_kind::SWITCH => What::Switch {
                prev: a,
                next: b,
                state: state_letter(raw.arg).to_string(),
            },
            event_kind::WAKEUP => What::Wakeup { task: a, waker: b },
            event_kind::WAKEUP_NEW => What::WakeupNew { task: a, waker: b },
            event_kind::MIGRATE => What::Migrate {
                task: a,
                to: raw.arg as u32,
            },
            event_kind::FORK => What::Fork { child: a, parent: b },
            event_kind::EXIT => What::Exit { task: a },
            _ => return None,
        };
        Some(Event {
            t: raw.time_ns,
            cpu: raw.cpu,
            what,
        })
    }
}

fn task(snap: &TaskSnap) -> Task {
    Task {
        tid: snap.tid,
        pid: snap.tgid,
        comm: comm_string(&snap.comm),
        target: snap.target != 0,
        pcount: snap.totals.sched_info.pcount,
        run_delay_ns: snap.totals.sched_info.run_delay_ns,
        sum_exec_ns: snap.totals.sum_exec_ns,
    }
}

/// perf's letter for a task leaving its CPU (`sched_switch`'s `prev_state`, bit 32: preempted).
fn state_letter(arg: u64) -> &'static str {
    let state = arg as u32;
    if arg >> 32 & 1 != 0 || state == 0 {
        return "R";
    }
    // TASK_IDLE: uninterruptible, not counted in the load average.
    if state & 0x402 == 0x402 {
        return "I";
    }
    let letters = [
        (0x1, "S"),
        (0x2, "D"),
        (0x4, "T"),
        (0x8, "t"),
        (0x10, "X"),
        (0x20, "Z"),
        (0x40, "P"),
        (0x80, "X"),
    ];
    // Others (waking, a real-time lock's wait, frozen): blocked, as perf shows them.
    letters
        .iter()
        .find(|(bit, _)| state & bit != 0)
        .map_or("D", |(_, letter)| letter)
}

/// A line of the file.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
pub enum Line {
    Header { sched_record: Header },
    Totals { totals: Totals },
    Event(Event),
}

/// A file's events in time order, its header read first and its totals kept when reached.
pub struct Reader {
    input: io::BufReader<std::fs::File>,
    path: std::path::PathBuf,
    pub header: Header,
    pub totals: Option<Totals>,
    /// Events read but not yet handed out (earliest first), and the latest time read.
    window: BinaryHeap<std::cmp::Reverse<Ordered>>,
    latest: u64,
    line: u64,
    done: bool,
}

/// An event ordered by time, then by its place in the file.
struct Ordered(u64, u64, Event);

impl PartialEq for Ordered {
    fn eq(&self, other: &Self) -> bool {
        (self.0, self.1) == (other.0, other.1)
    }
}
impl Eq for Ordered {}
impl PartialOrd for Ordered {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ordered {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.0, self.1).cmp(&(other.0, other.1))
    }
}

impl Reader {
    pub fn open(path: &Path) -> Result<Reader, UserError> {
        let file = std::fs::File::open(path).map_err(|e| unreadable(path, e.to_string()))?;
        let mut reader = Reader {
            input: io::BufReader::new(file),
            path: path.to_path_buf(),
            header: Header {
                started_ns: 0,
                cpus: 0,
                kernel_figures: false,
            },
            totals: None,
            window: BinaryHeap::new(),
            latest: 0,
            line: 0,
            done: false,
        };
        match reader.read_line() {
            Ok(Some(Line::Header { sched_record })) if (1..=MAX_CPUS).contains(&sched_record.cpus) => {
                reader.header = sched_record
            }
            _ => {
                return Err(unreadable(
                    path,
                    "its first line is not a header `bpfprof sched record` writes".into(),
                ))
            }
        }
        Ok(reader)
    }

    /// The next event in time order; `None` at the end.
    pub fn next_event(&mut self) -> Result<Option<Event>, UserError> {
        while !self.done
            && self
                .window
                .peek()
                .is_none_or(|e| e.0 .0.saturating_add(REORDER_NS) > self.latest)
            && self.window.len() < MAX_WINDOW
        {
            match self.read_line()? {
                Some(Line::Event(event)) => {
                    self.latest = self.latest.max(event.t);
                    self.window
                        .push(std::cmp::Reverse(Ordered(event.t, self.line, event)));
                }
                Some(Line::Totals { totals }) => self.totals = Some(totals),
                Some(Line::Header { .. }) => return Err(self.bad("a second header")),
                None => self.done = true,
            }
        }
        Ok(self.window.pop().map(|e| e.0 .2))
    }

    fn read_line(&mut self) -> Result<Option<Line>, UserError> {
        let mut line = Vec::new();
        let read = (&mut self.input)
            .take(MAX_LINE_BYTES)
            .read_until(b'\n', &mut line)
            .map_err(|e| unreadable(&self.path, e.to_string()))?;
        self.line += 1;
        if read == 0 {
            return Ok(None);
        }
        if line.last() != Some(&b'\n') && read as u64 >= MAX_LINE_BYTES {
            return Err(self.bad(&format!("longer than {MAX_LINE_BYTES} bytes")));
        }
        serde_json::from_slice(&line)
            .map(Some)
            .map_err(|e| self.bad(&format!("not an event `bpfprof sched record` writes ({e})")))
    }

    fn bad(&self, what: &str) -> UserError {
        unreadable(&self.path, format!("line {}: {what}", self.line))
    }
}

fn unreadable(path: &Path, reason: String) -> UserError {
    UserError::Usage(format!("{}: {reason}", path.display()))
}
