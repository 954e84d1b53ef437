//! `--annotate FUNCTION`: where inside one function its samples landed, by source line and by
//! instruction, like `perf annotate --stdio`. Samples count where the function's own code (or
//! code inlined into it) was running: its self samples. Lines come from the debug information
//! blazesym read at symbolization; machine code is read from the binary (x86-64) when it is
//! still there.
use std::{
    collections::{BTreeMap, HashMap},
    io::{self, Write},
};

use crate::{
    error::UserError,
    model::{StackReport, Weight},
    symbolize::{Frame, FunctionBounds},
};

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceLine {
    pub file: String,
    pub line: u32,
}

#[derive(Debug)]
pub struct Annotation {
    pub function: String,
    pub module: String,
    /// The function's self samples, and all of the profile's.
    pub samples: u64,
    pub total: u64,
    pub weight: Weight,
    /// What a sample is, for sampled profiles: `page-faults every event`, `cycles at 99 Hz`.
    pub sampling: Option<String>,
    /// Hottest first.
    pub lines: Vec<(SourceLine, u64)>,
    /// Samples whose frame had no line information.
    pub without_line: u64,
    /// Function start (file address) and offset of each sampled instruction, by address.
    pub instructions: BTreeMap<(u64, u64), u64>,
    /// Samples whose frame had no instruction offset (profiles saved by other tools).
    pub without_offset: u64,
    /// The source line of each sampled instruction, where known.
    pub instruction_lines: HashMap<(u64, u64), SourceLine>,
}

/// The frames at the executing address: the function whose machine code ran, and the functions
/// inlined into it there (innermost last). Empty for an empty stack.
fn executing(frames: &[Frame]) -> &[Frame] {
    let physical = frames.iter().rposition(|f| !f.inlined).unwrap_or(0);
    &frames[physical.min(frames.len())..]
}

/// The function to annotate: an exact name, else the one function whose name contains `wanted`.
fn resolve<'a>(report: &'a StackReport, wanted: &str) -> Result<&'a str, UserError> {
    let mut samples: HashMap<&str, u64> = HashMap::new();
    for stack in &report.stacks {
        for frame in executing(&stack.frames) {
            *samples.entry(frame.function.as_str()).or_default() += stack.count;
        }
    }
    if let Some((name, _)) = samples.get_key_value(wanted) {
        return Ok(name);
    }
    let mut matching: Vec<(&str, u64)> = samples
        .iter()
        .filter(|(name, _)| name.contains(wanted))
        .map(|(name, n)| (*name, *n))
        .collect();
    matching.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    match matching.as_slice() {
        [(only, _)] => Ok(only),
        [] => {
            let mut hottest: Vec<(&str, u64)> = samples.into_iter().collect();
            hottest.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
            let names: Vec<&str> = hottest.iter().take(5).map(|(n, _)| *n).collect();
            Err(UserError::Usage(format!(
                "--annotate {wanted}: no samples ran in a function of that name; the hottest were: {}",
                if names.is_empty() {
                    "(none: the profile is empty)".to_string()
                } else {
                    names.join(", ")
                }
            )))
        }
        several => {
            let names: Vec<String> = several
                .iter()
                .take(8)
                .map(|(n, s)| format!("{n} ({s})"))
                .collect();
            Err(UserError::Usage(format!(
                "--annotate {wanted}: several functions match, give one exactly: {}",
                names.join(", ")
            )))
        }
    }
}

pub fn annotate(report: &StackReport, wanted: &str) -> Result<Annotation, UserError> {
    let function = resolve(report, wanted)?.to_string();
    let mut annotation = Annotation {
        module: String::new(),
        samples: 0,
        total: report.samples,
        weight: report.weight,
        sampling: (report.weight == Weight::Samples)
            .then(|| report.meta.sampling())
            .flatten(),
        lines: Vec::new(),
        without_line: 0,
        instructions: BTreeMap::new(),
        without_offset: 0,
        instruction_lines: HashMap::new(),
        function,
    };
    let mut lines: HashMap<SourceLine, u64> = HashMap::new();
    for stack in &report.stacks {
        let running = executing(&stack.frames);
        // The innermost frame of that name: its line is where in it the sample was.
        let Some(frame) = running.iter().rev().find(|f| f.function == annotation.function) else {
            continue;
        };
        annotation.samples += stack.count;
        if annotation.module.is_empty() {
            annotation.module = frame.module.clone();
        }
        let place = match (&frame.file, frame.line) {
            (Some(file), Some(line)) if line > 0 => Some(SourceLine {
                file: file.clone(),
                line,
            }),
            _ => None,
        };
        match &place {
            Some(place) => *lines.entry(place.clone()).or_default() += stack.count,
            None => annotation.without_line += stack.count,
        }
        // The instruction is the executing function's (an inlined function has no code of its own).
        match (running[0].start, running[0].offset) {
            (Some(start), Some(offset)) => {
                *annotation.instructions.entry((start, offset)).or_default() += stack.count;
                if let Some(place) = place {
                    annotation.instruction_lines.insert((start, offset), place);
                }
            }
            _ => annotation.without_offset += stack.count,
        }
    }
    annotation.lines = lines.into_iter().collect();
    annotation
        .lines
        .sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Ok(annotation)
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn share(n: u64, of: u64) -> f64 {
    crate::report::percent(n, of)
}

/// The annotation as text, at most `limit` source lines; the machine code around the sampled
/// instructions when the binary can be read.
pub fn render(annotation: &Annotation, limit: usize, out: &mut dyn Write) -> io::Result<()> {
    let a = annotation;
    let unit = match a.weight {
        Weight::Samples => "samples",
        Weight::OffCpuNanoseconds => "ns off CPU",
        Weight::LockWaitNanoseconds => "ns waiting",
    };
    let sampled = a.sampling.as_ref().map_or(String::new(), |s| format!(" of {s}"));
    writeln!(
        out,
        "Annotation of {} ({}): {} {unit}{sampled}, {:.2}% of the profile's {}",
        a.function,
        if a.module.is_empty() {
            "module unknown"
        } else {
            &a.module
        },
        a.samples,
        share(a.samples, a.total),
        a.total
    )?;
    writeln!(out, "Where its own code (or code inlined into it) was running.\n")?;
    if a.lines.is_empty() {
        writeln!(
            out,
            "No line information: {} has no DWARF line table for {} (built without -g, or its debug info stripped; install its -dbg/-debuginfo package). Shares per instruction only.",
            if a.module.is_empty() { "the binary" } else { &a.module },
            a.function
        )?;
    } else {
        writeln!(out, "Source lines, hottest first:")?;
        writeln!(
            out,
            "{:>7} {:>9}  line",
            "share",
            unit.split(' ').next().unwrap_or(unit)
        )?;
        let mut sources = SourceFiles::default();
        for (place, n) in a.lines.iter().take(limit) {
            let name = file_name(&place.file);
            let text = sources.line(&place.file, place.line).unwrap_or_default();
            let line = format!(
                "{:>6.2}% {:>9}  {name}:{}  {}",
                share(*n, a.samples),
                n,
                place.line,
                text.trim()
            );
            writeln!(out, "{}", line.trim_end())?;
        }
        if a.lines.len() > limit {
            writeln!(out, "  ... {} more lines", a.lines.len() - limit)?;
        }
        if a.without_line > 0 {
            writeln!(
                out,
                "{:>6.2}% {:>9}  (no line information)",
                share(a.without_line, a.samples),
                a.without_line
            )?;
        }
    }
    writeln!(out)?;
    instructions(a, out)
}

fn instructions(a: &Annotation, out: &mut dyn Write) -> io::Result<()> {
    if a.instructions.is_empty() {
        return writeln!(
            out,
            "No instruction addresses: the profile does not say where in the function each sample was (saved by another tool?)."
        );
    }
    let code = machine_code(&a.module, &a.instructions);
    writeln!(out, "Instructions (offset from the function's start):")?;
    match &code {
        Ok(listing) => {
            // The whole function when it is short, else the sampled instructions and their
            // neighbours.
            let sampled: Vec<usize> = listing
                .iter()
                .enumerate()
                .filter(|(_, i)| a.instructions.contains_key(&(i.start, i.offset)))
                .map(|(k, _)| k)
                .collect();
            let near = |k: usize| listing.len() <= 120 || sampled.iter().any(|&s| s.abs_diff(k) <= 3);
            let mut skipped = false;
            for (k, insn) in listing.iter().enumerate() {
                if !near(k) {
                    skipped = true;
                    continue;
                }
                if skipped {
                    writeln!(out, "{:>7}   ...", "")?;
                    skipped = false;
                }
                let n = a
                    .instructions
                    .get(&(insn.start, insn.offset))
                    .copied()
                    .unwrap_or(0);
                let shown = match n {
                    0 => String::new(),
                    n => format!("{:.2}%", share(n, a.samples)),
                };
                let source = match a.instruction_lines.get(&(insn.start, insn.offset)) {
                    Some(place) => format!("   # {}:{}", file_name(&place.file), place.line),
                    None => String::new(),
                };
                let offset = format!("<+{}>", insn.offset);
                let code = format!("{}{source}", insn.text);
                writeln!(
                    out,
                    "{shown:>7}  {:#8x} {offset:<7}  {code}",
                    insn.start.wrapping_add(insn.offset)
                )?;
            }
            // A sample outside the code read (another build of the binary) is still shown.
            let listed: std::collections::HashSet<(u64, u64)> =
                listing.iter().map(|i| (i.start, i.offset)).collect();
            for (&(start, offset), &n) in &a.instructions {
                if !listed.contains(&(start, offset)) {
                    writeln!(
                        out,
                        "{:>6.2}%  {:#8x} <+{offset:<4}>  (not in the code read)",
                        share(n, a.samples),
                        start.wrapping_add(offset)
                    )?;
                }
            }
        }
        Err(why) => {
            writeln!(out, "(no machine code: {why})")?;
            let mut hottest: Vec<(&(u64, u64), &u64)> = a.instructions.iter().collect();
            hottest.sort_by(|x, y| y.1.cmp(x.1).then(x.0.cmp(y.0)));
            for (&(start, offset), &n) in hottest.into_iter().take(20) {
                writeln!(
                    out,
                    "{:>6.2}%  {:#8x} <+{offset}>",
                    share(n, a.samples),
                    start.wrapping_add(offset)
                )?;
            }
        }
    }
    if a.without_offset > 0 {
        writeln!(out, "{:>6.2}%  (no address)", share(a.without_offset, a.samples))?;
    }
    Ok(())
}

/// Source files read once each; a file that is not on this machine has no text.
#[derive(Default)]
struct SourceFiles(HashMap<String, Option<Vec<String>>>);

impl SourceFiles {
    fn line(&mut self, path: &str, line: u32) -> Option<String> {
        let lines = self.0.entry(path.to_string()).or_insert_with(|| {
            let text = read_regular(path, MAX_SOURCE_BYTES).ok()?;
            Some(
                String::from_utf8_lossy(&text)
                    .lines()
                    .map(str::to_string)
                    .collect(),
            )
        });
        lines.as_ref()?.get(line.checked_sub(1)? as usize).cloned()
    }
}

pub struct Instruction {
    pub start: u64,
    pub offset: u64,
    pub text: String,
}

/// A saved profile names the files annotate reads (its modules, its source files): only regular
/// files are read, and only so much of them.
const MAX_SOURCE_BYTES: u64 = 64 << 20;
const MAX_BINARY_BYTES: u64 = 4 << 30;

/// The bytes of `path`, a regular file (not a device or a FIFO a profile may name) of at most
/// `max` bytes.
fn read_regular(path: &str, max: u64) -> Result<Vec<u8>, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{path}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("{path} is not a regular file"));
    }
    if meta.len() > max {
        return Err(format!(
            "{path} is larger than the {} MiB annotate reads",
            max >> 20
        ));
    }
    std::fs::read(path).map_err(|e| format!("{path}: {e}"))
}

/// A function's listing goes at most this far from its start, whatever size its symbol claims.
const MAX_FUNCTION_BYTES: u64 = 4 << 20;

/// The function's instructions, decoded from its binary: from its start through its symbol's
/// size (or just past the last sampled instruction, when the size is unknown).
fn machine_code(module: &str, sampled: &BTreeMap<(u64, u64), u64>) -> Result<Vec<Instruction>, String> {
    if !module.starts_with('/') {
        return Err(format!("{module} is not a file"));
    }
    let data = read_regular(module, MAX_BINARY_BYTES)?;
    machine_code_in(&data, module, sampled)
}

/// `machine_code` of the binary `module` whose bytes are `data`.
pub(crate) fn machine_code_in(
    data: &[u8],
    module: &str,
    sampled: &BTreeMap<(u64, u64), u64>,
) -> Result<Vec<Instruction>, String> {
    use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
    let file = object::File::parse(data).map_err(|e| format!("{module}: {e}"))?;
    // The binary's own architecture, not this build's: a saved arm64 profile annotates on x86-64.
    let arch = file.architecture();
    if decode(&[], 0, arch).is_none() {
        return Err(format!(
            "{module} is {arch:?} code; bpfprof decodes x86-64 and AArch64"
        ));
    }
    let mut listing = Vec::new();
    let mut bounds = None;
    let starts: std::collections::BTreeSet<u64> = sampled.keys().map(|(s, _)| *s).collect();
    for start in starts {
        let last = sampled
            .range((start, 0)..=(start, u64::MAX))
            .map(|((_, o), _)| *o)
            .max()
            .unwrap_or(0);
        let mut symbols = file.symbols().chain(file.dynamic_symbols()).peekable();
        let has_symbols = symbols.peek().is_some();
        let mut at_start: Vec<u64> = symbols
            .filter(|s| s.address() == start)
            .map(|s| s.size())
            .collect();
        // A function nothing names (`module+0x…`) is bounded by its unwind table's entry.
        if at_start.is_empty() {
            let bounds = bounds.get_or_insert_with(|| FunctionBounds::of_file(&file));
            at_start.extend(bounds.starting_at(start).map(|(start, end)| end - start));
        }
        // A file with symbols but none here is not the binary that was profiled.
        if has_symbols && at_start.is_empty() {
            return Err(format!(
                "no function starts at {start:#x} in {module}: has the binary changed since the profile was taken?"
            ));
        }
        let size = at_start
            .into_iter()
            .max()
            .filter(|&s| s > 0)
            .unwrap_or(last.saturating_add(16))
            .min(MAX_FUNCTION_BYTES);
        let section = file
            .sections()
            .find(|s| s.address() <= start && start < s.address().saturating_add(s.size()))
            .ok_or_else(|| format!("no section of {module} holds {start:#x} (the binary changed since?)"))?;
        let bytes = section
            .data_range(
                start,
                size.min(section.address().saturating_add(section.size()) - start),
            )
            .ok()
            .flatten()
            .ok_or_else(|| format!("{module} has no code at {start:#x}"))?;
        listing.extend(
            (decode(bytes, start, arch).unwrap_or_default())
                .into_iter()
                .map(|(offset, text)| Instruction { start, offset, text }),
        );
    }
    Ok(listing)
}

/// The instructions of `bytes` (at `start`) by offset, for x86-64 and AArch64; None for code of
/// another architecture.
pub(crate) fn decode(bytes: &[u8], start: u64, arch: object::Architecture) -> Option<Vec<(u64, String)>> {
    match arch {
        object::Architecture::X86_64 => Some(decode_x86_64(bytes, start)),
        object::Architecture::Aarch64 => Some(decode_aarch64(bytes, start)),
        _ => None,
    }
}

/// x86-64 instructions in AT&T syntax (as objdump and perf annotate print them), by offset.
fn decode_x86_64(bytes: &[u8], start: u64) -> Vec<(u64, String)> {
    use iced_x86::{Decoder, DecoderOptions, Formatter as _, GasFormatter};
    let mut decoder = Decoder::with_ip(64, bytes, start, DecoderOptions::NONE);
    let mut formatter = GasFormatter::new();
    formatter.options_mut().set_uppercase_hex(false);
    formatter.options_mut().set_branch_leading_zeros(false);
    let mut out = Vec::new();
    for instruction in &mut decoder {
        let mut text = String::new();
        formatter.format(&instruction, &mut text);
        out.push((instruction.ip() - start, text));
    }
    out
}

/// AArch64 instructions (fixed 4-byte words) in Arm's syntax, by offset. A branch or address's
/// PC-relative target is printed as the absolute address, as objdump and the x86-64 listing do.
/// A word the decoder does not know is shown as `.inst`, and the listing goes on.
fn decode_aarch64(bytes: &[u8], start: u64) -> Vec<(u64, String)> {
    use yaxpeax_arch::{Decoder as _, U8Reader};
    use yaxpeax_arm::armv8::a64::{InstDecoder, Opcode, Operand};
    let decoder = InstDecoder::default();
    let mut out = Vec::new();
    for (index, word) in bytes.chunks_exact(4).enumerate() {
        let offset = 4 * index as u64;
        let pc = start.wrapping_add(offset);
        let text = match decoder.decode(&mut U8Reader::new(word)) {
            Ok(instruction) => {
                let mut text = instruction.to_string();
                // At most one PC-relative operand per instruction; adrp's is from the PC's page.
                let relative = instruction.operands.iter().find_map(|o| match o {
                    Operand::PCOffset(offset) => Some(*offset),
                    _ => None,
                });
                if let Some(relative) = relative {
                    let base = if instruction.opcode == Opcode::ADRP {
                        pc & !0xfff
                    } else {
                        pc
                    };
                    let shown = if relative < 0 {
                        format!("$-{:#x}", relative.wrapping_neg())
                    } else {
                        format!("$+{relative:#x}")
                    };
                    text = text.replace(&shown, &format!("{:#x}", base.wrapping_add_signed(relative)));
                }
                text
            }
            Err(_) => format!(".inst {:#010x}", u32::from_le_bytes(word.try_into().unwrap())),
        };
        out.push((offset, text));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A saved profile names the files annotate reads: a device or a FIFO is not read.
    #[test]
    fn only_regular_files_are_read() {
        let err = read_regular("/dev/zero", MAX_SOURCE_BYTES).unwrap_err();
        assert!(err.contains("not a regular file"), "{err}");
        assert!(read_regular("/proc/self/exe", MAX_BINARY_BYTES).is_ok());
        assert!(read_regular("/proc/self/exe", 0)
            .unwrap_err()
            .contains("larger than"));
    }
    use crate::{model::tests::frame, report::tests::sample_report};

    fn at(name: &str, line: u32, offset: u64, inlined: bool) -> Frame {
        Frame {
            file: Some("/src/w.c".into()),
            line: Some(line),
            inlined,
            start: (!inlined).then_some(0x1000),
            offset: (!inlined).then_some(offset),
            module: "/nonexistent/w".into(),
            ..frame(name)
        }
    }

    fn profile(leaves: &[(Vec<Frame>, u64)]) -> StackReport {
        let mut report = sample_report();
        report.stacks = leaves
            .iter()
            .map(|(frames, n)| crate::model::Stack {
                frames: [vec![frame("main")], frames.clone()].concat(),
                ..crate::model::tests::stack(&[], *n)
            })
            .collect();
        report.samples = leaves.iter().map(|(_, n)| n).sum();
        report
    }

    #[test]
    fn hottest_line_first_with_shares_of_the_function() {
        let report = profile(&[
            (vec![at("work", 12, 0x10, false)], 70),
            (vec![at("work", 13, 0x18, false)], 20),
            // Code of `step` inlined into `work`: the sample is at line 14 of work (the call).
            (vec![at("work", 14, 0x20, false), at("step", 40, 0, true)], 10),
            (vec![at("other", 3, 0x4, false)], 100),
        ]);
        let a = annotate(&report, "work").unwrap();
        assert_eq!((a.samples, a.total), (100, 200));
        let lines: Vec<(u32, u64)> = a.lines.iter().map(|(l, n)| (l.line, *n)).collect();
        assert_eq!(lines, vec![(12, 70), (13, 20), (14, 10)]);
        assert_eq!(a.instructions.get(&(0x1000, 0x20)), Some(&10));
        assert_eq!(a.instruction_lines[&(0x1000, 0x10)].line, 12);
        // The inlined function annotates at its own lines, on its host's instructions.
        let step = annotate(&report, "step").unwrap();
        assert_eq!(step.lines[0].0.line, 40);
        assert_eq!(step.instructions.get(&(0x1000, 0x20)), Some(&10));
        let mut text = Vec::new();
        render(&a, 10, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains(" 70.00%        70  w.c:12"), "{text}");
        assert!(text.contains("no machine code"), "{text}");
    }

    #[test]
    fn names_resolve_exactly_or_uniquely_and_say_why_not() {
        let report = profile(&[
            (vec![at("work_a", 1, 0, false)], 5),
            (vec![at("work_b", 2, 0, false)], 3),
            (vec![at("unique_thing", 2, 0, false)], 1),
        ]);
        assert_eq!(annotate(&report, "work_a").unwrap().samples, 5);
        assert_eq!(annotate(&report, "unique").unwrap().function, "unique_thing");
        let several = annotate(&report, "work").unwrap_err().to_string();
        assert!(
            several.contains("work_a (5)") && several.contains("work_b (3)"),
            "{several}"
        );
        let none = annotate(&report, "nothing").unwrap_err().to_string();
        assert!(none.contains("the hottest were: work_a"), "{none}");
    }

    #[test]
    fn no_line_information_is_said_plainly() {
        let mut bare = at("work", 0, 0x10, false);
        bare.file = None;
        bare.line = None;
        let a = annotate(&profile(&[(vec![bare], 9)]), "work").unwrap();
        assert_eq!(a.without_line, 9);
        let mut text = Vec::new();
        render(&a, 10, &mut text).unwrap();
        assert!(String::from_utf8(text).unwrap().contains("No line information"));
    }

    #[inline(never)]
    fn known_code(x: u64) -> u64 {
        std::hint::black_box(x).wrapping_mul(2654435761)
    }

    #[test]
    fn machine_code_is_decoded_from_the_binary() {
        // This test binary's own function, found through its symbol table.
        std::hint::black_box(known_code(3));
        use object::{Object as _, ObjectSymbol as _};
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let data = std::fs::read(&exe).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let symbol = file
            .symbols()
            .find(|s| s.name().is_ok_and(|n| n.contains("known_code")) && s.size() > 0)
            .expect("the test function's symbol");
        let sampled = BTreeMap::from([((symbol.address(), 0), 1)]);
        let listing = machine_code(exe.to_str().unwrap(), &sampled).unwrap();
        assert!(listing.len() >= 2, "{}", listing.len());
        assert_eq!(listing[0].offset, 0);
        assert!(listing.iter().any(|i| i.text.starts_with("ret")), "ends in ret");
    }

    #[test]
    fn aarch64_words_decode_with_absolute_targets() {
        // stp x29, x30, [sp, #-0x10]!; mov x29, sp; bl +0x10; adrp x0 (this page); b.ne -0x8;
        // ret; and a word no AArch64 instruction has.
        let words: [u32; 7] = [
            0xa9bf7bfd, 0x910003fd, 0x94000004, 0x90000000, 0x54ffffc1, 0xd65f03c0, 0xffffffff,
        ];
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let listing = decode_aarch64(&bytes, 0x40_1ff8);
        let texts: Vec<&str> = listing.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(
            listing.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
            [0, 4, 8, 12, 16, 20, 24]
        );
        assert!(texts[0].starts_with("stp x29, x30, [sp"), "{}", texts[0]);
        assert_eq!(texts[2], "bl 0x402010");
        assert_eq!(texts[3], "adrp x0, 0x402000");
        assert_eq!(texts[4], "b.ne 0x402000");
        assert_eq!(texts[5], "ret");
        assert_eq!(texts[6], ".inst 0xffffffff");
    }
}
