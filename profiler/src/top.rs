//! `bpfprof top`: a live view in the terminal, like `perf top`. The collection is a run's (the
//! same kernel programs, drained every second); every drain redraws the screen with the last
//! `--window` seconds:
//! - hotspot: the hottest functions;
//! - sched: the tasks that waited longest for a CPU;
//! - lock: the locks waited on longest (contended futex waits).
//!
//! Each frame is composed off-screen and written at once over the previous one (no clearing in
//! between: no flicker), in the alternate screen, so the shell's screen comes back untouched on
//! exit. `q`, Esc or Ctrl-C quit: the key is turned into SIGINT, which ends a run cleanly (every
//! program detached).
use std::{
    collections::{HashMap, VecDeque},
    io::{self, IsTerminal as _, Write},
    sync::atomic::{AtomicBool, Ordering::SeqCst},
};

use crossterm::{
    cursor::{Hide, MoveTo, Show},
    event::{Event, KeyCode, KeyEvent, KeyModifiers},
    queue,
    style::Print,
    terminal::{self, Clear, ClearType, EnterAlternateScreen, LeaveAlternateScreen},
};

use crate::{
    cli::{Mode, TopArgs},
    collect::add_batch,
    driver::{Drained, Sink},
    error::UserError,
    model::RunMeta,
    modes::{
        hotspot,
        lock::{self, LockBatch, LockCollection},
        sched::{self, TaskRecord},
    },
    plan::Plan,
    process::Processes,
    profile::{Health, RawProfile, RawSample},
    report::human_ns,
    session::run_live,
    sources::{samples::Rate, sched::SchedBatch, Batch, Wants},
    symbolize::{debuginfod::Debuginfod, DebugLocator, Symbolizer},
};

pub fn run(args: TopArgs) -> anyhow::Result<i32> {
    if !io::stdout().is_terminal() {
        return Err(UserError::Usage(
            "bpfprof top draws in a terminal, and standard output is not one: for a report, run `bpfprof -d 10` (or add -o FILE)".into(),
        )
        .into());
    }
    let plan = Plan::for_top(&args)?;
    // Said on the shell's screen, before the view takes the terminal.
    crate::preflight::check_privileges()?;
    let mut view = TopView::new(&plan, args.window as usize)?;
    view.screen.draw(&[format!(
        "bpfprof top: {} of {}: loading…",
        plan.mode.name(),
        plan.target_description()
    )])?;
    listen_for_quit();
    let result = run_live(&plan, &mut view);
    // The terminal is given back before anything is printed.
    drop(view);
    for note in result? {
        // The run's notes speak of a report ("what was collected until then"): not here.
        eprintln!("bpfprof top: {}", note.split(':').next().unwrap_or(&note));
    }
    Ok(0)
}

/// The terminal in the state the view needs, restored when dropped (on errors and panics too).
struct Screen {
    out: io::Stdout,
}

impl Screen {
    fn enter() -> io::Result<Screen> {
        terminal::enable_raw_mode()?;
        let mut out = io::stdout();
        if let Err(e) = queue!(out, EnterAlternateScreen, Hide).and_then(|()| out.flush()) {
            let _ = terminal::disable_raw_mode();
            return Err(e);
        }
        Ok(Screen { out })
    }

    /// One frame: every line rewritten in place and cut to the width, the rest of the screen
    /// cleared, all in one write.
    fn draw(&mut self, lines: &[String]) -> io::Result<()> {
        let (width, height) = terminal::size().unwrap_or((80, 24));
        let mut frame = Vec::new();
        for (row, line) in lines.iter().take(height as usize).enumerate() {
            queue!(
                frame,
                MoveTo(0, row as u16),
                Print(crate::report::cut(line, width as usize)),
                Clear(ClearType::UntilNewLine)
            )?;
        }
        queue!(
            frame,
            MoveTo(0, lines.len().min(height as usize) as u16),
            Clear(ClearType::FromCursorDown)
        )?;
        self.out.write_all(&frame)?;
        self.out.flush()
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = queue!(self.out, Show, LeaveAlternateScreen);
        let _ = self.out.flush();
        let _ = terminal::disable_raw_mode();
    }
}

/// A quit key arrived; the run is listening for SIGINT. The run's handler is only installed
/// once loading is done, and a SIGINT before then would kill bpfprof with the terminal still
/// raw: whichever of the two comes second sends it (both may: a second one is harmless).
static QUIT: AtomicBool = AtomicBool::new(false);
static LISTENING: AtomicBool = AtomicBool::new(false);

fn interrupt() {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGINT);
}

/// `q`, Esc or Ctrl-C (a key in raw mode, not a signal) ends the run as SIGINT would.
fn listen_for_quit() {
    std::thread::spawn(|| loop {
        match crossterm::event::read() {
            Ok(Event::Key(KeyEvent { code, modifiers, .. })) => {
                let quit = matches!(code, KeyCode::Char('q' | 'Q') | KeyCode::Esc)
                    || (code == KeyCode::Char('c') && modifiers.contains(KeyModifiers::CONTROL));
                if quit {
                    QUIT.store(true, SeqCst);
                    if LISTENING.load(SeqCst) {
                        interrupt();
                    }
                    return;
                }
            }
            Ok(_) => {}
            Err(_) => return,
        }
    });
}

struct TopView {
    meta: RunMeta,
    mode: Mode,
    /// Lock: the classes of waits shown.
    lock_waits: crate::cli::Waits,
    symbolizer: Symbolizer,
    screen: Screen,
    hot: Sliding<FunctionKey>,
    waits: Sliding<TaskKey>,
    locks: Sliding<LockKey>,
    /// Sched records are totals since the start: each refresh shows the increase.
    task_totals: Totals<TaskKey>,
    /// The records of the threads that exited so far (live ones are read at each drain).
    exited: Vec<TaskRecord>,
    /// What a row shows beside its sums, from the latest records.
    task_info: HashMap<TaskKey, TaskInfo>,
    lock_info: HashMap<LockKey, LockInfo>,
}

/// (function, module)
type FunctionKey = (String, String);
/// (pid, tid)
type TaskKey = (u32, u32);
/// (pid, lock label)
type LockKey = (u32, String);

struct TaskInfo {
    comm: String,
    max_delay_ns: u64,
}

struct LockInfo {
    comm: String,
    kind: &'static str,
    max_wait_ns: u64,
    caller: String,
}

impl TopView {
    fn new(plan: &Plan, window: usize) -> anyhow::Result<TopView> {
        Ok(TopView {
            meta: RunMeta {
                mode: plan.mode.name(),
                event: plan.events[0].spelled(),
                frequency_hz: plan.frequency_hz,
                period: match plan.rate {
                    Rate::Period(n) => Some(n),
                    Rate::Frequency(_) => None,
                },
                duration_s: 0.0,
                target: plan.target_description(),
                cpus: 0,
                notes: Vec::new(),
                counters: Vec::new(),
                weight: None,
            },
            mode: plan.mode,
            lock_waits: plan.waits,
            // debuginfod's files come in the background: a later window has their names.
            symbolizer: Symbolizer::long_lived(DebugLocator::new(
                plan.debug_dirs.clone(),
                Debuginfod::shared(plan.debuginfod.as_ref())?.map(|d| d as _),
            )),
            screen: Screen::enter()?,
            hot: Sliding::new(window),
            waits: Sliding::new(window),
            locks: Sliding::new(window),
            task_totals: Totals::default(),
            exited: Vec::new(),
            task_info: HashMap::new(),
            lock_info: HashMap::new(),
        })
    }

    fn hotspot(&mut self, samples: Vec<RawSample>, procs: &mut Processes) {
        // This second's stacks are the view's: nothing else reports them.
        let mut second = RawProfile::new();
        add_batch(samples, &mut second, procs, &mut Default::default());
        let symbols = self.symbolizer.symbolize(&second, &*procs);
        let report = hotspot::report(self.meta.clone(), &second, &symbols);
        let functions = report
            .functions
            .iter()
            .map(|f| {
                (
                    (f.function.clone(), f.module.clone()),
                    [f.self_samples, f.total_samples],
                )
            })
            .collect();
        self.hot.push(report.samples, functions);
    }

    /// Every task's waits settled so far: totals that only grow, so that what grew since the
    /// last look is what happened since (a wait still in progress, or the one before a run
    /// still going, counts once settled: at the latest at the next switch).
    fn sched(&mut self, batch: SchedBatch) {
        self.exited.extend(batch.exited);
        let mut records = self.exited.clone();
        records.extend(batch.live.unwrap_or_default());
        let tasks = sched::latencies(&records, batch.started_ns);
        let mut now: HashMap<TaskKey, [u64; 2]> = HashMap::new();
        for task in &tasks {
            let key = (task.pid, task.tid);
            // One thread's records (its exit recorded, then a last switch) are one total.
            let total = now.entry(key).or_default();
            total[0] += task.total_delay_ns;
            total[1] += task.waits;
            // The longest of all its waits seen, whichever record holds it now.
            let info = self.task_info.entry(key).or_insert_with(|| TaskInfo {
                comm: task.comm.clone(),
                max_delay_ns: 0,
            });
            info.max_delay_ns = info.max_delay_ns.max(task.max_delay_ns);
        }
        let increase = self.task_totals.increase(now);
        let total = increase.values().map(|v| v[0]).sum();
        self.waits.push(total, increase);
        let waits = &self.waits;
        self.task_info.retain(|key, _| waits.holds(key));
    }

    /// This second's lock waits (drained as they end).
    fn lock(&mut self, batch: LockBatch, procs: &mut Processes, health: Health) {
        let mut collection = LockCollection::default();
        collection.add_batch(batch, procs);
        let symbols = self.symbolizer.symbolize(&collection.stacks, &*procs);
        let report = lock::report(
            self.meta.clone(),
            crate::cli::LockSource::Futex,
            self.lock_waits,
            health,
            &collection,
            &symbols,
            procs,
        );
        let mut second = HashMap::new();
        for l in report.locks.iter().filter(|l| l.class.shown_in(self.lock_waits)) {
            let key = (l.pid, lock::lock_label(l));
            let caller = l.waited_in.as_deref().unwrap_or("?").to_string();
            let entry = second.entry(key.clone()).or_insert([0, 0]);
            entry[0] += l.total_wait_ns;
            entry[1] += l.contentions;
            let max_wait_ns = self
                .lock_info
                .get(&key)
                .map_or(0, |i| i.max_wait_ns)
                .max(l.max_wait_ns);
            let info = LockInfo {
                comm: l.comm.clone(),
                kind: l.kind,
                max_wait_ns,
                caller,
            };
            self.lock_info.insert(key, info);
        }
        let total = second.values().map(|v| v[0]).sum();
        self.locks.push(total, second);
        let locks = &self.locks;
        self.lock_info.retain(|key, _| locks.holds(key));
    }

    fn lines(&self, rows: usize, status: &str) -> Vec<String> {
        let mut lines = Vec::new();
        match self.mode {
            Mode::Hotspot => {
                lines.push(format!(
                    "[q] bpfprof top: hotspot, {}, {}, last {} s: {} samples{status}",
                    self.meta.target,
                    self.meta.sampling().unwrap_or_default(),
                    self.hot.seconds(),
                    self.hot.total()
                ));
                lines.extend(hot_lines(&self.hot, rows));
            }
            Mode::Sched => {
                lines.push(format!(
                    "[q] bpfprof top: sched, {}, waits for a CPU in the last {} s{status}",
                    self.meta.target,
                    self.waits.seconds()
                ));
                lines.extend(sched_lines(&self.waits, &self.task_info, rows));
            }
            Mode::Lock => {
                let which = match self.lock_waits {
                    crate::cli::Waits::Contention => "lock contention (futex)",
                    crate::cli::Waits::All => "futex waits, contention and events",
                };
                lines.push(format!(
                    "[q] bpfprof top: lock, {}, {which} in the last {} s{status}",
                    self.meta.target,
                    self.locks.seconds()
                ));
                lines.extend(lock_lines(&self.locks, &self.lock_info, rows));
            }
            Mode::Topdown | Mode::Stat | Mode::Trace | Mode::Latency | Mode::Record | Mode::SchedRecord => {}
        }
        lines
    }
}

impl Sink for TopView {
    /// Sched: the live threads' records; lock: the threads joins wait for.
    fn before_drain(&mut self, _procs: &Processes) -> Wants {
        Wants {
            current: self.mode != Mode::Hotspot,
        }
    }

    fn drained(&mut self, data: Drained<'_>) -> anyhow::Result<()> {
        // The run's loop (and its SIGINT handler) is running now.
        LISTENING.store(true, SeqCst);
        if QUIT.load(SeqCst) {
            interrupt();
        }
        let (_, height) = terminal::size().unwrap_or((80, 24));
        let health = data.commons.health()?;
        let status = match health.lost() {
            0 => String::new(),
            n => format!(", {n} samples lost"),
        };
        for batch in data.batches {
            match batch {
                Batch::Samples(samples) => self.hotspot(samples, data.procs),
                Batch::Sched(batch) => self.sched(batch),
                Batch::Locks(batch) => self.lock(batch, data.procs, health.clone()),
                Batch::Counts(_)
                | Batch::Stat(_)
                | Batch::Values(_)
                | Batch::Syscalls(_)
                | Batch::Latency(_)
                | Batch::Records(_)
                | Batch::Timeline(_) => {}
            }
        }
        let lines = self.lines((height as usize).saturating_sub(3).max(1), &status);
        self.screen.draw(&lines)?;
        Ok(())
    }
}

/// Sums over the last N one-second sets of values (two per key), and the seconds' totals.
pub struct Sliding<K> {
    seconds: VecDeque<(u64, HashMap<K, [u64; 2]>)>,
    capacity: usize,
}

impl<K: std::hash::Hash + Eq + Clone + Ord> Sliding<K> {
    pub fn new(capacity: usize) -> Self {
        Self {
            seconds: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    pub fn push(&mut self, total: u64, values: HashMap<K, [u64; 2]>) {
        if self.seconds.len() == self.capacity {
            self.seconds.pop_front();
        }
        self.seconds.push_back((total, values));
    }

    pub fn seconds(&self) -> usize {
        self.seconds.len()
    }

    pub fn total(&self) -> u64 {
        self.seconds.iter().map(|(total, _)| total).sum()
    }

    fn holds(&self, key: &K) -> bool {
        self.seconds.iter().any(|(_, values)| values.contains_key(key))
    }

    /// Keys by their summed first value, largest first (ties by key), those above zero.
    pub fn largest(&self, rows: usize) -> Vec<(K, [u64; 2])> {
        let mut sums: HashMap<&K, [u64; 2]> = HashMap::new();
        for (_, values) in &self.seconds {
            for (key, v) in values {
                let sum = sums.entry(key).or_default();
                sum[0] += v[0];
                sum[1] += v[1];
            }
        }
        let mut largest: Vec<(K, [u64; 2])> = sums
            .into_iter()
            .filter(|(_, v)| v[0] > 0)
            .map(|(k, v)| (k.clone(), v))
            .collect();
        largest.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        largest.truncate(rows);
        largest
    }
}

/// The last totals seen per key, to turn running totals into increases.
pub struct Totals<K>(HashMap<K, [u64; 2]>);

impl<K> Default for Totals<K> {
    fn default() -> Self {
        Self(HashMap::new())
    }
}

impl<K: std::hash::Hash + Eq + Clone> Totals<K> {
    /// What grew since the last call (a key seen for the first time: all of it). A key missing
    /// from one call keeps its last totals: seen again, only its growth counts, not its past.
    pub fn increase(&mut self, now: HashMap<K, [u64; 2]>) -> HashMap<K, [u64; 2]> {
        let grown = now
            .iter()
            .filter_map(|(key, v)| {
                let was = self.0.get(key).copied().unwrap_or_default();
                let d = [v[0].saturating_sub(was[0]), v[1].saturating_sub(was[1])];
                (d != [0, 0]).then(|| (key.clone(), d))
            })
            .collect();
        self.0.extend(now);
        grown
    }
}

fn hot_lines(hot: &Sliding<FunctionKey>, rows: usize) -> Vec<String> {
    let samples = hot.total();
    let mut lines = vec![format!("{:>7} {:>7}  {:<40} module", "self", "total", "function")];
    for ((function, module), [own, total]) in hot.largest(rows) {
        let module = crate::report::short_module(&module).to_string();
        let function = crate::report::short_name(&function, 40);
        lines.push(format!(
            "{:>6.2}% {:>6.2}%  {function:<40} {module}",
            crate::report::percent(own, samples),
            crate::report::percent(total, samples)
        ));
    }
    if samples == 0 {
        lines.push("(no samples yet: the targets have not been on a CPU)".into());
    }
    lines
}

fn sched_lines(waits: &Sliding<TaskKey>, info: &HashMap<TaskKey, TaskInfo>, rows: usize) -> Vec<String> {
    let mut lines = vec![format!(
        "{:>9} {:>7} {:>9} {:>10}  task (pid/tid)",
        "waited", "waits", "avg", "max (all)"
    )];
    for ((pid, tid), [waited, count]) in waits.largest(rows) {
        let (comm, max) = info
            .get(&(pid, tid))
            .map_or(("?", 0), |i| (i.comm.as_str(), i.max_delay_ns));
        lines.push(format!(
            "{:>9} {:>7} {:>9} {:>10}  {comm} {pid}/{tid}",
            human_ns(waited),
            count,
            human_ns(waited / count.max(1)),
            human_ns(max),
        ));
    }
    if lines.len() == 1 {
        lines.push("(no task waited for a CPU)".into());
    }
    lines
}

fn lock_lines(locks: &Sliding<LockKey>, info: &HashMap<LockKey, LockInfo>, rows: usize) -> Vec<String> {
    let mut lines = vec![format!(
        "{:>9} {:>7} {:>10}  {:<20} waiting in (process pid)",
        "waited", "waits", "max (all)", "lock"
    )];
    for ((pid, label), [waited, count]) in locks.largest(rows) {
        let Some(i) = info.get(&(pid, label.clone())) else {
            continue;
        };
        lines.push(format!(
            "{:>9} {:>7} {:>10}  {:<20} {} ({} {pid})",
            human_ns(waited),
            count,
            human_ns(i.max_wait_ns),
            format!("{} {}", crate::report::short_name(&label, 40), i.kind),
            crate::report::short_name(&i.caller, 60),
            i.comm,
        ));
    }
    if lines.len() == 1 {
        lines.push("(no contended lock)".into());
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn functions(split: &[(&str, u64)]) -> HashMap<FunctionKey, [u64; 2]> {
        split
            .iter()
            .map(|(f, n)| ((f.to_string(), "/bin/w".to_string()), [*n, *n]))
            .collect()
    }

    #[test]
    fn the_window_keeps_the_last_seconds_only() {
        let mut hot = Sliding::new(2);
        hot.push(100, functions(&[("old", 100)]));
        hot.push(40, functions(&[("a", 30), ("b", 10)]));
        hot.push(60, functions(&[("a", 30), ("b", 30)]));
        assert_eq!((hot.seconds(), hot.total()), (2, 100));
        let lines = hot_lines(&hot, 10);
        assert!(lines[1].starts_with(" 60.00%  60.00%  a "), "{lines:?}");
        assert!(lines[2].starts_with(" 40.00%  40.00%  b "), "{lines:?}");
        assert!(lines[1].ends_with(" w"), "module's file name: {lines:?}");
        assert!(!lines.iter().any(|l| l.contains("old")), "{lines:?}");
        assert_eq!(hot_lines(&hot, 1).len(), 2, "header and one row");
    }

    #[test]
    fn running_totals_become_increases_per_second() {
        let mut totals = Totals::default();
        let first = totals.increase(HashMap::from([((1, 1), [500, 5]), ((1, 2), [10, 1])]));
        assert_eq!(first[&(1, 1)], [500, 5]);
        let second = totals.increase(HashMap::from([((1, 1), [800, 7]), ((1, 2), [10, 1])]));
        assert_eq!(
            second,
            HashMap::from([((1, 1), [300, 2])]),
            "unchanged tasks drop out"
        );
        let mut waits = Sliding::new(5);
        waits.push(510, first);
        waits.push(300, second);
        let info = HashMap::from([(
            (1, 1),
            TaskInfo {
                comm: "worker".into(),
                max_delay_ns: 200,
            },
        )]);
        let lines = sched_lines(&waits, &info, 10);
        assert!(
            lines[1].contains("800 ns") && lines[1].ends_with("worker 1/1"),
            "{lines:?}"
        );
        assert!(lines[2].ends_with("? 1/2"), "{lines:?}");
    }

    #[test]
    fn a_task_missing_from_one_look_is_not_booked_its_past_when_seen_again() {
        let mut totals = Totals::default();
        totals.increase(HashMap::from([((1, 1), [900_000, 90])]));
        assert!(totals.increase(HashMap::new()).is_empty());
        let again = totals.increase(HashMap::from([((1, 1), [900_500, 91])]));
        assert_eq!(again[&(1, 1)], [500, 1], "only what grew since it was last seen");
    }
}
