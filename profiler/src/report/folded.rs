//! Folded stacks (`comm;outer;...;leaf count`), the input of flamegraph tools.
use std::{
    collections::BTreeMap,
    io::{self, Write},
};

use super::Renderer;
use crate::{
    model::StackReport,
    symbolize::{Frame, UNKNOWN},
};

pub struct Folded;

impl Renderer for Folded {
    fn hotspot(&self, report: &StackReport, out: &mut dyn Write) -> io::Result<()> {
        for line in folded_lines(report) {
            writeln!(out, "{line}")?;
        }
        Ok(())
    }
}

/// One line per distinct stack (threads of a process with the same name merge), sorted.
pub fn folded_lines(report: &StackReport) -> Vec<String> {
    let mut merged: BTreeMap<String, u64> = BTreeMap::new();
    for stack in &report.stacks {
        let mut line = clean(&stack.comm);
        for frame in &stack.frames {
            line.push(';');
            line.push_str(&frame_name(frame));
        }
        let count = merged.entry(line).or_default();
        *count = count.saturating_add(stack.count);
    }
    merged
        .into_iter()
        .map(|(stack, count)| format!("{stack} {count}"))
        .collect()
}

/// Kernel frames get perf's `_[k]` suffix so flamegraphs can colour them apart; an unknown
/// frame is named by its module, as stackcollapse-perf names it; a placed one by its module and
/// address (`liblzma.so.5.4.1+0x16900`), as it is everywhere.
fn frame_name(frame: &Frame) -> String {
    let mut name = match frame.function == UNKNOWN && !frame.module.is_empty() {
        true => clean(&unknown_frame_name(&frame.module)),
        false => clean(&frame.function),
    };
    if frame.kernel {
        name.push_str("_[k]");
    }
    name
}

/// An unknown frame's name where only names are kept: its module's file name in brackets
/// (`[liblzma.so.5]`; `[vdso]` as it is), so unknown code in two modules stays apart.
pub fn unknown_frame_name(module: &str) -> String {
    if module.starts_with('[') {
        return module.to_string();
    }
    format!("[{}]", super::short_module(module))
}

/// `;` separates frames and the last space separates the count: neither may appear in a name.
fn clean(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            ';' => ':',
            '\n' | '\r' => ' ',
            c => c,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::{cli::Format, report::tests::*};

    #[test]
    fn folded_lines_carry_every_sample() {
        let text = String::from_utf8(render(Format::Folded, &sample_report())).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines.contains(&"w;main;run;hot_a 60"), "{lines:?}");
        assert!(lines.contains(&"w;main;hot_c;ksys_read_[k] 10"), "{lines:?}");
        let total: u64 = lines
            .iter()
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum();
        assert_eq!(total, 100);
    }

    /// A placed frame is named as everywhere (`module+0x<start>`), so a stripped library's
    /// functions stay apart; an unknown one by its module.
    #[test]
    fn placed_frames_keep_their_module_and_address() {
        let mut report = sample_report();
        let frames = crate::symbolize::stripped_frames();
        report.stacks[0].frames.push(frames[1].clone());
        report.stacks[1].frames.push(frames[2].clone());
        report.stacks[2].frames.push(crate::symbolize::Frame::unknown(
            "/usr/lib/libx.so.1",
            0x10,
            false,
        ));
        let text = String::from_utf8(render(Format::Folded, &report)).unwrap();
        println!("{text}");
        assert!(text.contains(";hot_a;liblzma.so.5.4.1+0x16900 60\n"), "{text}");
        assert!(text.contains(";hot_b;liblzma.so.5.4.1+0x4100 30\n"), "{text}");
        assert!(text.contains(";[libx.so.1] 10\n"), "{text}");
    }
}
