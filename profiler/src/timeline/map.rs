//! `bpfprof sched map FILE`: which task each CPU runs, a line per switch, as `perf sched map`
//! draws it: a column per CPU holding its task's two-character code (`.` idle), `*` at the CPU
//! that just switched, then the time and, when a task is first seen, its code's meaning. Cut to
//! the terminal's width (`--cpus` picks the columns).
use std::{
    collections::HashMap,
    io::{self, Write},
};

use super::{
    file::{Reader, What},
    task_name,
};
use crate::{cli::SchedMapArgs, error::UserError};

/// Columns before the CPUs' own: the time (`12.345678`) and the legend after it.
const ROOM_FOR_TIME: usize = 40;

/// Two-character codes, as perf gives them: A0..Z0, A1..Z1, ..., then lower case; then `**`.
pub fn code(n: usize) -> String {
    let (letters, digits) = (26, 10);
    match n {
        n if n < letters * digits => format!("{}{}", (b'A' + (n % letters) as u8) as char, n / letters),
        n if n < 2 * letters * digits => {
            let n = n - letters * digits;
            format!("{}{}", (b'a' + (n % letters) as u8) as char, n / letters)
        }
        _ => "**".into(),
    }
}

pub fn run(args: SchedMapArgs) -> anyhow::Result<i32> {
    let mut reader = Reader::open(&args.input)?;
    let cpus = reader.header.cpus;
    let shown = match &args.cpus {
        Some(list) => parse_cpus(list, cpus)?,
        None => {
            let width = args.width.unwrap_or_else(terminal_width);
            let fit = (width.saturating_sub(ROOM_FOR_TIME) / 3).max(1);
            if (cpus as usize) > fit {
                eprintln!(
                    "bpfprof: CPUs 0-{} of {cpus} shown (a terminal {width} columns wide): --cpus picks others",
                    fit - 1
                );
            }
            (0..cpus.min(fit as u32)).collect()
        }
    };
    super::show(&mut reader, |reader, out| draw(reader, &shown, out))
}

pub(crate) fn draw(reader: &mut Reader, shown: &[u32], out: &mut dyn Write) -> io::Result<()> {
    let started = reader.header.started_ns;
    let mut codes: HashMap<u32, String> = HashMap::new();
    let mut running: HashMap<u32, u32> = HashMap::new();
    while let Some(event) = reader.next_event().map_err(io::Error::other)? {
        let What::Switch { next, .. } = &event.what else {
            continue;
        };
        running.insert(event.cpu, next.tid);
        if !shown.contains(&event.cpu) {
            continue;
        }
        let mut legend = String::new();
        if next.tid != 0 && !codes.contains_key(&next.tid) {
            let new = code(codes.len());
            legend = format!(" {new} => {}", task_name(next));
            codes.insert(next.tid, new);
        }
        let mut line = String::new();
        for cpu in shown {
            line.push(if *cpu == event.cpu { '*' } else { ' ' });
            match running.get(cpu) {
                None => line.push_str("  "),
                Some(0) => line.push_str(" ."),
                Some(tid) => line.push_str(&codes[tid]),
            }
        }
        let since = event.t.saturating_sub(started);
        writeln!(out, "{line}  {:.6}{legend}", since as f64 / 1e9)?;
    }
    Ok(())
}

/// `--cpus 0-3,8`: those CPUs, each below `cpus`.
fn parse_cpus(list: &str, cpus: u32) -> Result<Vec<u32>, UserError> {
    let bad = |why: String| UserError::Usage(format!("--cpus {list}: {why}"));
    let mut shown = Vec::new();
    for part in list.split(',') {
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        let parse = |s: &str| {
            s.trim()
                .parse::<u32>()
                .map_err(|_| bad(format!("`{part}` is not a CPU or a range")))
        };
        let (first, last) = (parse(first)?, parse(last)?);
        if first > last || last >= cpus {
            return Err(bad(format!(
                "the recording has CPUs 0-{}",
                cpus.saturating_sub(1)
            )));
        }
        shown.extend(first..=last);
    }
    shown.sort_unstable();
    shown.dedup();
    Ok(shown)
}

fn terminal_width() -> usize {
    crossterm::terminal::size().map_or(120, |(columns, _)| columns as usize)
}
