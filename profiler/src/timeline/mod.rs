//! `bpfprof sched record | timehist | map`: the scheduler's events one by one, as perf sched
//! shows them. `record` streams every event of the run (the `timeline` source) into a file;
//! `timehist` lists each run of each task with its wait, run-queue delay and run time (the
//! kernel's own figures where it keeps them); `map` draws which task each CPU ran at every
//! switch.
use std::io::{self, Write};

use crate::{
    cli::{SchedArgs, SchedCommand, SchedRecordArgs},
    collect::monotonic_ns,
    driver::{Stream, Streaming},
    error::UserError,
    output::Streamed,
    plan::Plan,
    preflight,
    process::Processes,
    session::run_into,
    sources::{timeline::TimelineBatch, Batch},
};

pub mod file;
pub mod map;
#[cfg(test)]
mod tests;
pub mod timehist;

use file::{Event, Header, Line, Totals};

/// How often the ring is read: it holds about 120,000 events, which a machine switching
/// 500,000 times a second fills in a quarter of a second.
const READ_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

pub fn run(args: SchedArgs) -> anyhow::Result<i32> {
    match args.command {
        SchedCommand::Record(args) => record(args),
        SchedCommand::Timehist(args) => timehist::run(args),
        SchedCommand::Map(args) => map::run(args),
    }
}

fn record(args: SchedRecordArgs) -> anyhow::Result<i32> {
    let plan = Plan::for_sched_record(&args)?;
    preflight::check_privileges()?;
    let output_error = |e: io::Error| UserError::Output {
        path: args.output.clone(),
        reason: e.to_string(),
    };
    let mut streaming = Streaming::new(
        RecordSink {
            out: Streamed::create(&args.output).map_err(output_error)?,
            header: Some(Header {
                started_ns: monotonic_ns(),
                cpus: aya::util::nr_cpus().map_or(1, |n| n as u32),
                kernel_figures: crate::sources::sched::task_offsets()?.kernel_accounting(),
            }),
            events: 0,
            lost: 0,
            failed: None,
        },
        READ_EVERY,
    );
    let recording = run_into(&plan, &mut streaming)?;
    let mut sink = streaming.stream;
    if let Some(e) = sink.failed.take() {
        return Err(output_error(e).into());
    }
    let mut notes = recording.meta.notes;
    notes.extend(recording.stopped.health.warnings());
    if sink.lost > 0 {
        notes.push(format!(
            "{} events were lost: the ring was full (a view shows the runs around them from the kernel's totals, but not their switches)",
            sink.lost
        ));
    }
    let totals = Totals {
        target: plan.target_description(),
        seconds: recording.meta.duration_s,
        events: sink.events,
        lost: sink.lost,
        notes,
    };
    sink.end(&totals).map_err(output_error)?;
    eprintln!(
        "bpfprof: wrote {} ({} events, {} lost){}",
        args.output.display(),
        totals.events,
        totals.lost,
        totals
            .notes
            .iter()
            .map(|n| format!("\nbpfprof: {n}"))
            .collect::<String>()
    );
    Ok(recording.exit_code)
}

/// `sched record`'s sink: each drain's events written as they come.
struct RecordSink {
    out: Streamed,
    /// Written before the first events.
    header: Option<Header>,
    events: u64,
    lost: u64,
    /// The first write that failed: the run's error, once it ends.
    failed: Option<io::Error>,
}

impl RecordSink {
    fn write(&mut self, batch: TimelineBatch) {
        self.lost += batch.lost.unwrap_or(0);
        if self.failed.is_some() {
            return;
        }
        let mut events: Vec<Event> = batch.events.iter().filter_map(Event::from_kernel).collect();
        events.sort_by_key(|e| e.t);
        self.events += events.len() as u64;
        let mut written = self
            .header
            .take()
            .map_or(Ok(()), |header| self.line(&Line::Header { sched_record: header }));
        for event in events {
            written = written.and_then(|()| self.line(&Line::Event(event)));
        }
        if let Err(e) = written {
            self.failed = Some(e);
        }
    }

    fn line(&mut self, line: &Line) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, line).map_err(io::Error::other)?;
        writeln!(self.out)
    }

    /// The totals line, and the file put in place.
    fn end(mut self, totals: &Totals) -> io::Result<()> {
        self.write(TimelineBatch::default());
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        self.line(&Line::Totals {
            totals: totals.clone(),
        })?;
        self.out.finish()
    }
}

impl Stream for RecordSink {
    fn take(&mut self, batch: Batch, _procs: &mut Processes) {
        if let Batch::Timeline(batch) = batch {
            self.write(batch);
        }
    }
}

/// A view of a recording on standard output, as `draw` writes it (a `UserError` inside its
/// `io::Error`: the file is bad), then the recording's totals on standard error. A reader that
/// had enough (a broken pipe) is no error.
fn show(
    reader: &mut file::Reader,
    draw: impl FnOnce(&mut file::Reader, &mut dyn Write) -> io::Result<()>,
) -> anyhow::Result<i32> {
    let mut out = io::BufWriter::new(io::stdout().lock());
    match draw(reader, &mut out).and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(0),
        Err(e) => match e.downcast::<UserError>() {
            Ok(user) => return Err(user.into()),
            Err(e) => return Err(e.into()),
        },
        Ok(()) => {}
    }
    say_totals(reader);
    Ok(0)
}

/// What the recording says of itself, on standard error: its totals and notes, or that it did
/// not end.
fn say_totals(reader: &file::Reader) {
    match &reader.totals {
        Some(totals) => {
            eprintln!(
                "bpfprof: {}, {:.2} s: {} events, {} lost",
                totals.target, totals.seconds, totals.events, totals.lost
            );
            for note in &totals.notes {
                eprintln!("bpfprof: {note}");
            }
        }
        None => eprintln!("bpfprof: the file has no totals line: the recording that wrote it did not end"),
    }
}

/// A task as the views name it: `comm[tid/pid]`, or `<idle>`.
pub fn task_name(task: &file::Task) -> String {
    match task.tid {
        0 => "<idle>".to_string(),
        tid if tid == task.pid => format!("{}[{tid}]", task.comm),
        tid => format!("{}[{tid}/{}]", task.comm, task.pid),
    }
}
