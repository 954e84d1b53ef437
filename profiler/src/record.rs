//! `bpfprof record`: each hit (every Nth with `-c N`) of tracepoints and probes, collected by the
//! `records` source through a ring buffer and written as it comes: a line per hit (text, by
//! default on standard output) or a JSON line per hit then one of the totals (`-o FILE.json`),
//! which `bpfprof script` prints later. The totals say each event's hits and the records lost.
use std::{
    io::{self, BufRead, Read as _, Write},
    time::Duration,
};

use serde::{Deserialize, Serialize};

use crate::{
    cli::{Format, RecordArgs, ScriptArgs},
    driver::{Stream, Streaming},
    error::UserError,
    output::Streamed,
    plan::Plan,
    preflight,
    process::Processes,
    report::command,
    session::run_into,
    sources::{records::RecordBatch, Batch},
};

pub mod hit;
pub mod render;
pub mod stacks;
#[cfg(test)]
mod tests;

use hit::{Decoders, Hit};

/// How often the ring is read: it holds about 28,000 records, which a workload making 450,000
/// system calls a second fills in 60 ms.
const READ_EVERY: Duration = Duration::from_millis(25);
/// No line of a saved file is longer (a hit has at most a page of fields).
const MAX_LINE_BYTES: u64 = 1 << 20;

/// The run's last line: what it recorded and what it could not.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Totals {
    pub target: String,
    pub seconds: f64,
    pub records: u64,
    pub lost: u64,
    pub events: Vec<EventHits>,
    pub notes: Vec<String>,
}

/// One event's hits by the targets, and every how many one was recorded.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct EventHits {
    pub event: String,
    pub hits: u64,
    pub every: u64,
}

/// A line of a saved file: a hit, or (last) the totals.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Line {
    Totals { totals: Totals },
    Hit(Hit),
}

pub fn run(args: RecordArgs) -> anyhow::Result<i32> {
    let format = command::checked_format(&args.report, "record", &[])?;
    let plan = Plan::for_record(&args)?;
    preflight::check_privileges()?;
    let spec = plan.record.as_ref().expect("a record plan records");
    let out = match &plan.output {
        Some(path) => Out::File(Streamed::create(path).map_err(|e| UserError::Output {
            path: path.clone(),
            reason: e.to_string(),
        })?),
        None => Out::Stdout(io::stdout()),
    };
    let mut streaming = Streaming::new(
        RecordSink {
            decoders: Decoders::new(spec, crate::counters::tracepoint::tracefs_root()),
            out: Some(out),
            json: format == Format::Json,
            stacks: spec.stacks.then(stacks::StackNamer::default),
            records: 0,
            cut: 0,
            totals: None,
            failed: None,
        },
        READ_EVERY,
    );
    let recording = run_into(&plan, &mut streaming)?;
    let mut sink = streaming.stream;
    if let Some(e) = sink.failed.take() {
        return Err(output_error(&plan, e).into());
    }
    let kernel = sink.totals.take().unwrap_or_default();
    let mut notes = recording.meta.notes;
    notes.extend(recording.stopped.health.warnings());
    if let Some(unplaced @ 1..) = sink.stacks.as_ref().map(|s| s.unplaced) {
        notes.push(format!(
            "{unplaced} user stacks could not be placed in their process's files (it exited before bpfprof read its memory map, a few milliseconds after its first hit): their frames show as [unmapped]"
        ));
    }
    if sink.cut > 0 {
        notes.push(format!(
            "{} fetched strings were longer than the {} bytes a record holds: each keeps its start, and its field is listed in its hit's \"cut\" (text: its value ends in ...)",
            sink.cut,
            profiler_common::records::STRING_BYTES - 1
        ));
    }
    let totals = Totals {
        target: plan.target_description(),
        seconds: recording.meta.duration_s,
        records: sink.records,
        lost: kernel.lost,
        events: (spec
            .events
            .iter()
            .zip(kernel.hits.iter().chain(std::iter::repeat(&0))))
        .map(|(event, &hits)| EventHits {
            event: event.spelled(),
            hits,
            every: spec.period,
        })
        .collect(),
        notes,
    };
    sink.end(&totals).map_err(|e| output_error(&plan, e))?;
    if let Some(path) = &plan.output {
        eprintln!(
            "bpfprof: wrote {} ({} hits, {} lost)",
            path.display(),
            totals.records,
            totals.lost
        );
    }
    let _ = render::totals(&totals, &mut io::stderr());
    Ok(recording.exit_code)
}

fn output_error(plan: &Plan, e: io::Error) -> UserError {
    UserError::Output {
        path: plan.output.clone().unwrap_or_else(|| "standard output".into()),
        reason: e.to_string(),
    }
}

/// Where the hits go: standard output, or a file put in place at the end.
enum Out {
    Stdout(io::Stdout),
    File(Streamed),
}

impl Out {
    fn out(&mut self) -> &mut dyn Write {
        match self {
            Out::Stdout(out) => out,
            Out::File(out) => out,
        }
    }

    fn finish(self) -> io::Result<()> {
        match self {
            Out::Stdout(mut out) => out.flush(),
            Out::File(out) => out.finish(),
        }
    }
}

/// `record`'s sink: each drain's hits written as they come.
struct RecordSink {
    decoders: Decoders,
    /// None once standard output was closed (a reader that had enough: not an error).
    out: Option<Out>,
    json: bool,
    /// `-g`: names each record's stacks.
    stacks: Option<stacks::StackNamer>,
    records: u64,
    /// Strings longer than a record holds.
    cut: u64,
    totals: Option<crate::sources::records::RecordTotals>,
    /// The first write that failed: the run's error, once it ends.
    failed: Option<io::Error>,
}

impl RecordSink {
    fn write(&mut self, batch: RecordBatch, procs: &mut Processes) {
        self.records += batch.records.len() as u64;
        if let Some(totals) = batch.totals {
            self.totals = Some(totals);
        }
        let Some(out) = self.out.as_mut().map(Out::out) else {
            return;
        };
        let mut stacks = match &mut self.stacks {
            Some(namer) => namer.name(
                (batch.records.iter()).map(|r| (r.hit.tgid, r.stacks.as_ref())),
                procs,
            ),
            None => Vec::new(),
        }
        .into_iter();
        let mut written = Ok(());
        for record in &batch.records {
            let mut hit = self.decoders.hit(&record.hit);
            hit.stack = stacks.next().flatten();
            self.cut += hit.cut.len() as u64;
            written = match self.json {
                true => serde_json::to_writer(&mut *out, &hit)
                    .map_err(io::Error::other)
                    .and_then(|()| writeln!(out)),
                false => render::hit_line(&hit, &mut *out),
            };
            if written.is_err() {
                break;
            }
        }
        match written.and_then(|()| out.flush()) {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => self.out = None,
            Err(e) => {
                self.out = None;
                self.failed.get_or_insert(e);
            }
            Ok(()) => {}
        }
    }

    /// The totals line (JSON), and the file put in place.
    fn end(&mut self, totals: &Totals) -> io::Result<()> {
        let Some(mut out) = self.out.take() else {
            return Ok(());
        };
        if self.json {
            let line = Line::Totals {
                totals: totals.clone(),
            };
            serde_json::to_writer(out.out(), &line).map_err(io::Error::other)?;
            writeln!(out.out())?;
        }
        out.finish()
    }
}

impl Stream for RecordSink {
    fn take(&mut self, batch: Batch, procs: &mut Processes) {
        if let Batch::Records(batch) = batch {
            self.write(batch, procs);
        }
    }
}

/// `bpfprof script FILE`: the saved hits, a line each, then their totals.
pub fn script(args: ScriptArgs) -> anyhow::Result<i32> {
    let unreadable = |reason: String| UserError::Usage(format!("{}: {reason}", args.input.display()));
    let file = std::fs::File::open(&args.input).map_err(|e| unreadable(e.to_string()))?;
    let mut input = io::BufReader::new(file);
    let mut out = io::BufWriter::new(io::stdout().lock());
    let mut totals = None;
    let mut line = Vec::new();
    for number in 1.. {
        line.clear();
        let read = (&mut input).take(MAX_LINE_BYTES).read_until(b'\n', &mut line);
        match read.map_err(|e| unreadable(e.to_string()))? {
            0 => break,
            _ if line.last() != Some(&b'\n') && line.len() as u64 >= MAX_LINE_BYTES => {
                return Err(unreadable(format!(
                    "line {number} is longer than {MAX_LINE_BYTES} bytes: not a record file"
                ))
                .into())
            }
            _ => {}
        }
        let written = match serde_json::from_slice::<Line>(&line) {
            Ok(Line::Hit(hit)) => render::hit_line(&hit, &mut out),
            Ok(Line::Totals { totals: t }) => {
                totals = Some(t);
                Ok(())
            }
            Err(e) => {
                return Err(unreadable(format!(
                    "line {number} is not a hit `bpfprof record -o` wrote ({e})"
                ))
                .into())
            }
        };
        match written {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(0),
            other => other?,
        }
    }
    match out.flush() {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(0),
        other => other?,
    }
    match totals {
        Some(totals) => render::totals(&totals, &mut io::stderr())?,
        None => eprintln!(
            "bpfprof: {} has no totals line: the run that wrote it did not end",
            args.input.display()
        ),
    }
    Ok(0)
}
