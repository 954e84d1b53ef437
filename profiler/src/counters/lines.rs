//! Source lines as probe sites, from the file's DWARF line tables: `uprobe:FILE:SOURCE:LINE`
//! fires at the first instruction of the line's statement (`perf probe -x FILE SOURCE:LINE`), and
//! `list --probes FILE --lines FUNCTION` shows which lines of a function have one (`perf probe
//! -L`). A row counts where the compiler marked a statement's start (`is_stmt`), as a debugger's
//! line breakpoint does.
use std::{
    borrow::Cow,
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use object::{Object as _, ObjectSymbol as _, SymbolKind};

use super::probe::ProbeError;

type Reader<'a> = gimli::EndianSlice<'a, gimli::RunTimeEndian>;

/// Every statement row of the line tables: its source file, line and address.
fn each_row(object: &object::File<'_>, mut visit: impl FnMut(&Path, u64, u64)) -> Result<(), String> {
    let load = |id: gimli::SectionId| -> Result<Cow<'_, [u8]>, String> {
        match object.section_by_name(id.name()) {
            Some(section) => crate::process::section_data(&section).map_err(|e| format!("{} {e}", id.name())),
            None => Ok(Cow::Borrowed(&[])),
        }
    };
    let sections = gimli::DwarfSections::load(load)?;
    let endian = match object.is_little_endian() {
        true => gimli::RunTimeEndian::Little,
        false => gimli::RunTimeEndian::Big,
    };
    let dwarf = sections.borrow(|s| Reader::new(s, endian));
    let broken = |e: gimli::Error| format!("its DWARF cannot be read: {e}");
    let mut units = dwarf.units();
    while let Some(header) = units.next().map_err(broken)? {
        let unit = dwarf.unit(header).map_err(broken)?;
        let Some(program) = unit.line_program.clone() else {
            continue;
        };
        let mut paths: BTreeMap<u64, Option<PathBuf>> = BTreeMap::new();
        let mut rows = program.rows();
        while let Some((header, row)) = rows.next_row().map_err(broken)? {
            let Some(line) = row.line().filter(|_| row.is_stmt() && !row.end_sequence()) else {
                continue;
            };
            let path = paths
                .entry(row.file_index())
                .or_insert_with(|| file_path(&dwarf, &unit, header, row.file_index()));
            if let Some(path) = path {
                visit(path, line.get(), row.address());
            }
        }
    }
    Ok(())
}

/// A line table's file `index`, as a path: the unit's directory, the file's, its name.
fn file_path(
    dwarf: &gimli::Dwarf<Reader<'_>>,
    unit: &gimli::Unit<Reader<'_>>,
    header: &gimli::LineProgramHeader<Reader<'_>>,
    index: u64,
) -> Option<PathBuf> {
    let file = header.file(index)?;
    let text = |value| (dwarf.attr_string(unit, value).ok()).map(|s| s.to_string_lossy().into_owned());
    let mut path = PathBuf::new();
    if let Some(dir) = &unit.comp_dir {
        path.push(dir.to_string_lossy().as_ref());
    }
    if let Some(dir) = file.directory(header) {
        path.push(text(dir)?);
    }
    path.push(text(file.path_name())?);
    Some(path)
}

/// `source` names `path`: its last components (`lines.c`, `workloads/lines.c`).
fn names(source: &str, path: &Path) -> bool {
    path.ends_with(Path::new(source))
}

/// The defined functions of the file, every name: (start, size, name).
fn all_functions(object: &object::File<'_>) -> Vec<(u64, u64, String)> {
    (object.symbols().chain(object.dynamic_symbols()))
        .filter(|s| s.kind() == SymbolKind::Text && !s.is_undefined() && s.address() != 0)
        .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_string())))
        .collect()
}

/// The same, one per start (the largest of its aliases), by start.
fn functions(object: &object::File<'_>) -> Vec<(u64, u64, String)> {
    let mut functions = all_functions(object);
    functions.sort_by(|a, b| (a.0, std::cmp::Reverse(a.1), &a.2).cmp(&(b.0, std::cmp::Reverse(b.1), &b.2)));
    functions.dedup_by_key(|f| f.0);
    functions
}

/// The function `address` is in.
fn function_at(functions: &[(u64, u64, String)], address: u64) -> Option<&(u64, u64, String)> {
    let at = functions.partition_point(|f| f.0 <= address).checked_sub(1)?;
    let function = &functions[at];
    (address < function.0.saturating_add(function.1.max(1))).then_some(function)
}

/// Where line `line` of `source` starts: the lowest statement address of the line in each
/// function it has code in (one site unless the line was inlined into several functions), each
/// with its function's name.
pub fn sites(
    object: &object::File<'_>,
    file: &Path,
    source: &str,
    line: u64,
) -> Result<Vec<(u64, String)>, ProbeError> {
    let invalid = |reason: String| ProbeError::Invalid(format!("{}: {reason}", file.display()));
    let functions = functions(object);
    let mut addresses = Vec::new();
    let mut paths = BTreeSet::new();
    let mut lines_of_source = BTreeSet::new();
    let mut sources = BTreeSet::new();
    each_row(object, |path, row_line, address| {
        // Rows of code the linker discarded (at address 0, or outside every function) are no site.
        if function_at(&functions, address).is_none() {
            return;
        }
        if !names(source, path) {
            sources.insert(
                path.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned(),
            );
        } else if row_line == line {
            addresses.push(address);
            paths.insert(path.to_path_buf());
        } else {
            lines_of_source.insert(row_line);
        }
    })
    .map_err(invalid)?;
    if addresses.is_empty() {
        return Err(no_code(file, source, line, &lines_of_source, sources));
    }
    if paths.len() > 1 {
        let paths: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        return Err(invalid(format!(
            "`{source}` names {} source files with code at line {line} ({}): give more of its path",
            paths.len(),
            paths.join(", ")
        )));
    }
    // The lowest address in each function (by its start: two functions may share a name).
    let mut first: BTreeMap<u64, (u64, String)> = BTreeMap::new();
    for address in addresses {
        if let Some((start, _, name)) = function_at(&functions, address) {
            let lowest = first.entry(*start).or_insert((address, name.clone()));
            lowest.0 = lowest.0.min(address);
        }
    }
    Ok(first.into_values().collect())
}

/// Why a line has no site: the file has no such source (the nearest names), or the line no
/// code (the nearest lines that have).
fn no_code(
    file: &Path,
    source: &str,
    line: u64,
    lines_of_source: &BTreeSet<u64>,
    sources: BTreeSet<String>,
) -> ProbeError {
    if lines_of_source.is_empty() {
        let what = match sources.is_empty() {
            true => format!(
                "{} has no line tables (DWARF .debug_line): build it with -g",
                file.display()
            ),
            false => format!(
                "no source file `{source}` in the line tables of {}",
                file.display()
            ),
        };
        let sources: Vec<String> = sources.into_iter().collect();
        return ProbeError::Missing {
            near: super::language::nearest(source, &sources),
            what,
        };
    }
    let before = lines_of_source.range(..line).rev().take(2);
    let after = lines_of_source.range(line..).take(2);
    let mut near: Vec<u64> = before.chain(after).copied().collect();
    near.sort();
    ProbeError::Missing {
        what: format!("line {line} of {source} has no code in {}", file.display()),
        near: near.iter().map(|l| format!("{source}:{l}")).collect(),
    }
}

/// A function longer than this many lines is listed to here.
const MAX_LISTED_LINES: u64 = 10_000;

/// A line of a function's source, for `list --lines`: its number, its text where the source
/// file can be read, and the event that probes it where it has code.
#[derive(Clone, Debug, serde::Serialize, PartialEq, Eq)]
pub struct SourceLine {
    pub line: u64,
    pub text: Option<String>,
    pub probe: Option<String>,
}

/// The lines of `function` in its own source file, from its first line with code to its last;
/// the source file's path.
pub fn function_lines(
    object: &object::File<'_>,
    file: &Path,
    given: &str,
    function: &str,
) -> Result<(PathBuf, Vec<SourceLine>), ProbeError> {
    let invalid = |reason: String| ProbeError::Invalid(format!("{}: {reason}", file.display()));
    let functions = all_functions(object);
    let Some(&(start, size, _)) = (functions.iter()).filter(|f| f.2 == function).max_by_key(|f| f.1) else {
        let names: Vec<String> = functions.into_iter().map(|f| f.2).collect();
        return Err(ProbeError::Missing {
            what: format!("no function `{function}` in {}", file.display()),
            near: super::language::nearest(function, &names),
        });
    };
    let mut by_file: BTreeMap<PathBuf, BTreeSet<u64>> = BTreeMap::new();
    let mut own: Option<(u64, PathBuf)> = None;
    each_row(object, |path, line, address| {
        if (start..start.saturating_add(size.max(1))).contains(&address) {
            by_file.entry(path.to_path_buf()).or_default().insert(line);
            if own.as_ref().is_none_or(|(at, _)| address < *at) {
                own = Some((address, path.to_path_buf()));
            }
        }
    })
    .map_err(invalid)?;
    let Some((_, source)) = own else {
        return Err(invalid(format!(
            "no line of `{function}` in its line tables (built without -g?)"
        )));
    };
    let with_code = &by_file[&source];
    let first = *with_code.first().unwrap_or(&1);
    let last = (*with_code.last().unwrap_or(&1)).min(first.saturating_add(MAX_LISTED_LINES));
    let text = source_text(&source);
    let name = source.file_name().unwrap_or_default().to_string_lossy();
    let lines = (first..=last)
        .map(|line| SourceLine {
            line,
            text: text.get(line as usize - 1).cloned(),
            probe: with_code
                .contains(&line)
                .then(|| format!("uprobe:{given}:{name}:{line}")),
        })
        .collect();
    Ok((source, lines))
}

/// A source file's lines, if it is a regular file of a sane size (a path in DWARF is the
/// binary's word: it may name a device or a FIFO).
fn source_text(path: &Path) -> Vec<String> {
    const MAX_SOURCE_BYTES: u64 = 64 << 20;
    let readable = std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() <= MAX_SOURCE_BYTES);
    let text = readable
        .then(|| std::fs::read(path).ok())
        .flatten()
        .unwrap_or_default();
    String::from_utf8_lossy(&text)
        .lines()
        .map(str::to_string)
        .collect()
}
