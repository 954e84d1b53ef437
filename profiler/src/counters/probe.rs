//! Probes as events: on user code, `uprobe:PATH:FUNC`, `uprobe:PATH:FUNC+OFFSET`,
//! `uprobe:PATH:0xADDR`, `uretprobe:PATH:FUNC` (at the function's returns) and USDT probes
//! (`usdt:PATH:PROVIDER:NAME`, see `usdt`); in the kernel, `kprobe:FUNC[+OFFSET]` and
//! `kretprobe:FUNC`. A perf event of the kernel's `uprobe` or `kprobe` PMU, whose `config1` is
//! the file's path (or the kernel function's name) and `config2` the offset (in the file, or
//! into the function). `PATH` is a file, a program on `$PATH` (`python3.11`) or a library by
//! name (`libc`, `libc.so.6`) in the system's library directories.
use std::{
    ffi::CString,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
};

use object::{Object as _, ObjectSegment as _, ObjectSymbol as _, SymbolKind};

use super::{cpu::parse_number, usdt};

/// Where a probe fires.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    /// `perf_event_attr.config1`: the file, resolved and canonical, or the kernel function.
    pub target: CString,
    /// In the kernel (the `kprobe` PMU's) rather than in user code.
    pub kernel: bool,
    /// At the function's returns rather than its entry.
    pub ret: bool,
    /// At a function's first instruction, where its arguments are in their registers (not at an
    /// offset, an address, a source line or a USDT site).
    pub entry: bool,
    /// Each instruction it fires at (one perf event each, counted as one event): one, or each
    /// of a USDT probe's sites, or each inlined copy of a source line; at most `MAX_SITES`.
    pub sites: Vec<ProbeSite>,
}

/// One instruction a probe fires at.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProbeSite {
    /// Its offset in the file, or into the kernel function (`perf_event_attr.config2`).
    pub offset: u64,
    /// A USDT site's semaphore, as an offset in the file: raised while the probe is attached.
    pub semaphore: Option<u64>,
    /// A USDT site's arguments, as its note spells them (`usdt::parse_arg_at`).
    pub usdt_args: Option<String>,
    /// Its `perf_event_attr.config` (the probe PMU's `retprobe` and `ref_ctr_offset` terms),
    /// set when the event is resolved on that PMU.
    pub config: u64,
}

/// Sites one probe fires at, at most: each is a perf event per probed process, and what is
/// read at its hits is kept per site (`profiler_common::MAX_PROBE_SITES`).
pub const MAX_SITES: usize = profiler_common::MAX_PROBE_SITES;

impl Probe {
    /// A USDT probe (its arguments are its own, `arg0..`).
    pub fn is_usdt(&self) -> bool {
        self.sites.iter().any(|s| s.usdt_args.is_some())
    }

    fn at(target: CString, kernel: bool, ret: bool, entry: bool, sites: Vec<ProbeSite>) -> Probe {
        Probe {
            target,
            kernel,
            ret,
            entry,
            sites,
        }
    }
}

/// Why a probe's spelling names no instruction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeError {
    /// Nothing by that name to probe (the nearest names, if any).
    Missing {
        what: String,
        near: Vec<String>,
    },
    Invalid(String),
}

/// A probe as spelled: what follows `uprobe:`, `uretprobe:`, `usdt:`, `kprobe:` or `kretprobe:`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spelled<'a> {
    /// `uprobe:FILE:FUNCTION` (`ret`: `uretprobe:`).
    Function {
        ret: bool,
        file: &'a str,
        function: &'a str,
    },
    /// `uprobe:FILE:SOURCE:LINE`: a source line (`ret`: `uretprobe:`, refused).
    Line {
        ret: bool,
        file: &'a str,
        source: &'a str,
        line: u64,
    },
    /// `usdt:FILE:PROVIDER:NAME`.
    Usdt {
        file: &'a str,
        provider: &'a str,
        name: &'a str,
    },
    /// `kprobe:FUNCTION[+OFFSET]` (`ret`: `kretprobe:`).
    Kernel { ret: bool, function: &'a str },
}

/// `text` if it spells a probe.
pub fn spelling(text: &str) -> Option<Spelled<'_>> {
    let (kind, rest) = text.split_once(':')?;
    let (head, last) = rest.rsplit_once(':').unwrap_or((rest, ""));
    match kind {
        "uprobe" | "uretprobe" if is_line_number(last) && head.contains(':') => {
            let (file, source) = head.rsplit_once(':')?;
            Some(Spelled::Line {
                ret: kind == "uretprobe",
                file,
                source,
                line: last.parse().ok()?,
            })
        }
        "uprobe" | "uretprobe" => Some(Spelled::Function {
            ret: kind == "uretprobe",
            file: head,
            function: last,
        }),
        "kprobe" | "kretprobe" => Some(Spelled::Kernel {
            ret: kind == "kretprobe",
            function: rest,
        }),
        "usdt" => {
            let (file, provider) = head.rsplit_once(':').unwrap_or((head, ""));
            Some(Spelled::Usdt {
                file,
                provider,
                name: last,
            })
        }
        _ => None,
    }
}

/// `LINE` of `uprobe:FILE:SOURCE:LINE`: decimal digits (an address is `0x...`).
fn is_line_number(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// The probe `spelled` names, resolved in the file system.
pub fn resolve(spelled: Spelled<'_>, targets: &[u32]) -> Result<Probe, ProbeError> {
    let (file, ret) = match spelled {
        Spelled::Kernel { ret, function } => return kernel_probe(ret, function),
        Spelled::Function { file, function, ret } if !file.is_empty() && !function.is_empty() => (file, ret),
        Spelled::Usdt { file, provider, name } if ![file, provider, name].contains(&"") => (file, false),
        Spelled::Line { ret: true, .. } => {
            return Err(ProbeError::Invalid(
                "a source line is probed where it starts: uprobe:FILE:SOURCE:LINE (uretprobe: fires at a function's returns)".into(),
            ))
        }
        Spelled::Line { file, source, .. } if !file.is_empty() && !source.is_empty() => (file, false),
        _ => {
            return Err(ProbeError::Invalid(
                "a probe is uprobe:FILE:FUNCTION (or FUNCTION+OFFSET, 0xADDRESS or SOURCE:LINE), uretprobe:FILE:FUNCTION, usdt:FILE:PROVIDER:NAME or kprobe:FUNCTION; FILE may be a library's name (libc)".into(),
            ))
        }
    };
    let path = match in_targets(file, targets) {
        Some(mapped) => mapped,
        None => binary(file)?,
    };
    let at = |offset| ProbeSite {
        offset,
        ..ProbeSite::default()
    };
    let sites = with_object(&path, |object, data| match spelled {
        Spelled::Usdt { provider, name, .. } => usdt_sites(object, data, &path, provider, name),
        Spelled::Line { source, line, .. } => Ok(line_sites(object, &path, source, line)?
            .into_iter()
            .map(at)
            .collect()),
        Spelled::Function { function, .. } | Spelled::Kernel { function, .. } => {
            Ok(vec![at(offset_in(object, &path, function)?)])
        }
    })?;
    if sites.len() > MAX_SITES {
        return Err(ProbeError::Invalid(format!(
            "{} sites in {}: at most {MAX_SITES} are probed as one event",
            sites.len(),
            path.display()
        )));
    }
    let target = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| ProbeError::Invalid("a NUL in the path".into()))?;
    let entry = matches!(spelled, Spelled::Function { function, .. } if !function.contains('+') && !function.starts_with("0x"));
    Ok(Probe::at(target, false, ret, entry, sites))
}

/// A kernel function's probe, the function checked against the kernel's symbols.
fn kernel_probe(ret: bool, spelled: &str) -> Result<Probe, ProbeError> {
    let (function, offset) = match spelled.split_once('+') {
        Some((function, offset)) => (
            function,
            parse_number(offset)
                .ok_or_else(|| ProbeError::Invalid(format!("`{offset}` is not an offset")))?,
        ),
        None => (spelled, 0),
    };
    if function.is_empty() {
        return Err(ProbeError::Invalid(
            "a kernel probe is kprobe:FUNCTION or kretprobe:FUNCTION".into(),
        ));
    }
    let functions = kernel_functions();
    if !functions.is_empty() && functions.binary_search_by(|f| f.as_str().cmp(function)).is_err() {
        return Err(ProbeError::Missing {
            what: format!("no kernel function `{function}`"),
            near: super::language::nearest(function, &functions),
        });
    }
    let target = CString::new(function).map_err(|_| ProbeError::Invalid("a NUL in the name".into()))?;
    let site = ProbeSite {
        offset,
        ..ProbeSite::default()
    };
    Ok(Probe::at(target, true, ret, offset == 0, vec![site]))
}

/// The kernel's functions by name (sorted), from `/proc/kallsyms`; none where it cannot be read
/// (the kernel then judges the name).
fn kernel_functions() -> Vec<String> {
    let text = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
    let mut names: Vec<String> = (text.lines())
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, kind, name) = (fields.next()?, fields.next()?, fields.next()?);
            matches!(kind, "t" | "T").then(|| name.to_string())
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Each site of a USDT probe: its offset, its semaphore's (in the file) and its arguments.
fn usdt_sites(
    object: &object::File<'_>,
    data: &[u8],
    path: &Path,
    provider: &str,
    name: &str,
) -> Result<Vec<ProbeSite>, ProbeError> {
    let all = usdt::sites(object, data);
    let offset = |address| file_offset_of(object, path, address);
    let sites = (all.iter())
        .filter(|s| s.provider == provider && s.name == name)
        .map(|site| {
            Ok(ProbeSite {
                offset: offset(site.address)?,
                semaphore: site.semaphore.map(offset).transpose()?,
                usdt_args: Some(site.args.clone()),
                ..ProbeSite::default()
            })
        })
        .collect::<Result<Vec<_>, ProbeError>>()?;
    if sites.is_empty() {
        return Err(ProbeError::Missing {
            what: format!("no USDT probe {provider}:{name} in {}", path.display()),
            near: super::language::nearest(
                &format!("{provider}:{name}"),
                &all.iter()
                    .map(|s| format!("{}:{}", s.provider, s.name))
                    .collect::<Vec<_>>(),
            ),
        });
    }
    Ok(sites)
}

/// Where in the file a source line starts: once per function its code is in (a line inlined
/// into several has a copy in each).
fn line_sites(
    object: &object::File<'_>,
    path: &Path,
    source: &str,
    line: u64,
) -> Result<Vec<u64>, ProbeError> {
    (super::lines::sites(object, path, source, line)?.iter())
        .map(|(address, _)| file_offset_of(object, path, *address))
        .collect()
}

/// Where the global `name` of a user probe's file is from the instruction probed at `site`
/// (both move together when the file is loaded), and its size.
pub fn global_from(probe: &Probe, site: &ProbeSite, name: &str) -> Result<(i64, u64), ProbeError> {
    let file = PathBuf::from(std::ffi::OsStr::from_bytes(probe.target.as_bytes()));
    with_object(&file, |object, _| {
        let probed = (object.segments())
            .find_map(|s| {
                let (start, size) = s.file_range();
                (start..start + size)
                    .contains(&site.offset)
                    .then(|| s.address() + site.offset - start)
            })
            .ok_or_else(|| {
                ProbeError::Invalid(format!(
                    "{}: the probe is in none of its segments",
                    file.display()
                ))
            })?;
        let globals = || {
            (object.symbols().chain(object.dynamic_symbols()))
                .filter(|s| s.kind() == SymbolKind::Data && !s.is_undefined() && s.address() != 0)
        };
        let mut named: Vec<(u64, u64)> = (globals().filter(|s| s.name() == Ok(name)))
            .map(|s| (s.address(), s.size()))
            .collect();
        named.sort();
        named.dedup_by_key(|g| g.0);
        match named.as_slice() {
            [(address, size)] => Ok((address.wrapping_sub(probed) as i64, *size)),
            [_, _, ..] => Err(ProbeError::Invalid(format!(
                "{} has {} globals named `{name}` (static ones of different source files): which one is meant cannot be told",
                file.display(),
                named.len()
            ))),
            [] => {
                let mut names: Vec<String> = globals()
                    .filter_map(|s| s.name().ok().map(str::to_string))
                    .collect();
                names.sort();
                names.dedup();
                Err(ProbeError::Missing {
                    what: format!("no global variable `{name}` in {}", file.display()),
                    near: super::language::nearest(name, &names),
                })
            }
        }
    })
}

/// The lines of `function` in the file `given` names, and the source file they are in.
pub fn function_lines(
    given: &str,
    function: &str,
) -> Result<(PathBuf, Vec<super::lines::SourceLine>), ProbeError> {
    let file = binary(given)?;
    with_object(&file, |object, _| {
        super::lines::function_lines(object, &file, given, function)
    })
}

/// The functions of the file `given` names (`binary`), by name: what a probe on it can name.
pub fn functions(given: &str) -> Result<(PathBuf, Vec<String>), ProbeError> {
    let file = binary(given)?;
    let names = with_object(&file, |object, _| Ok(function_names(object)))?;
    Ok((file, names))
}

/// The USDT probes of the file `given` names, as `PROVIDER:NAME`, each once, with what it
/// takes: its arguments as `record --fetch` names them and as its note places them.
pub fn usdt_probes(given: &str) -> Result<Vec<(String, String)>, ProbeError> {
    let file = binary(given)?;
    let mut sites = with_object(&file, |object, data| Ok(usdt::sites(object, data)))?;
    sites.sort_by(|a, b| (&a.provider, &a.name).cmp(&(&b.provider, &b.name)));
    let mut probes: Vec<(String, String)> = Vec::new();
    for (i, site) in sites.iter().enumerate() {
        let name = format!("{}:{}", site.provider, site.name);
        if probes.last().is_some_and(|(last, _)| *last == name) {
            continue;
        }
        let count = sites[i..]
            .iter()
            .take_while(|s| (&s.provider, &s.name) == (&site.provider, &site.name))
            .count();
        let args = usdt::split_args(&site.args).len();
        let mut what = match args {
            0 => "no arguments".to_string(),
            1 => format!("arg0: {}", site.args),
            n => format!("arg0..arg{}: {}", n - 1, site.args),
        };
        if count > 1 {
            what.push_str(&format!(" ({count} sites)"));
        }
        probes.push((name, what));
    }
    Ok(probes)
}

impl std::fmt::Display for ProbeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeError::Missing { what, near } if near.is_empty() => write!(f, "{what}"),
            ProbeError::Missing { what, near } => write!(f, "{what}: did you mean {}?", near.join(", ")),
            ProbeError::Invalid(reason) => write!(f, "{reason}"),
        }
    }
}

/// `read` on `file` parsed as an object file (mapped, not read whole).
fn with_object<T>(
    file: &Path,
    read: impl FnOnce(&object::File<'_>, &[u8]) -> Result<T, ProbeError>,
) -> Result<T, ProbeError> {
    let invalid = |reason: String| ProbeError::Invalid(format!("{}: {reason}", file.display()));
    let data = std::fs::File::open(file)
        // SAFETY: the file is mapped read-only and only read while mapped; a file truncated
        // under us would fault, as it would for any reader of a mapped binary.
        .and_then(|f| unsafe { memmap2::Mmap::map(&f) })
        .map_err(|e| invalid(e.to_string()))?;
    let object = object::File::parse(&*data).map_err(|e| invalid(format!("not an ELF file ({e})")))?;
    read(&object, &data)
}

/// The directories libraries are looked up in by name, for this machine's architecture.
fn library_dirs() -> Vec<PathBuf> {
    let triple = format!("{}-linux-gnu", std::env::consts::ARCH);
    ["/usr/lib", "/lib", "/usr/local/lib", "/usr/lib64", "/lib64"]
        .iter()
        .flat_map(|dir| [Path::new(dir).join(&triple), PathBuf::from(dir)])
        .collect()
}

/// The file a target process has mapped that `given` names (a library's name as `binary` takes
/// it, `libc`, or a program's file name, `redis-server`), as the process sees it: a process in
/// a container maps its own libc, which `/proc/PID/root` reaches. None when `given` is a path
/// or no target maps such a file.
fn in_targets(given: &str, targets: &[u32]) -> Option<PathBuf> {
    if given.contains('/') {
        return None;
    }
    targets.iter().find_map(|pid| {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
        let mut mapped: Vec<&str> = (maps.lines())
            // `start-end perms offset dev inode   /path/of/the/file`
            .filter_map(|line| line.splitn(6, char::is_whitespace).nth(5).map(str::trim))
            .filter(|path| path.starts_with('/'))
            .filter(|path| {
                let name = path.rsplit('/').next().unwrap_or_default();
                name == given || library_matches(name, given)
            })
            .collect();
        mapped.sort_by_key(|path| path.len());
        let inside = Path::new("/proc").join(pid.to_string()).join("root");
        let path = inside.join(mapped.first()?.trim_start_matches('/'));
        Some(std::fs::canonicalize(&path).unwrap_or(path)).filter(|path| is_elf(path))
    })
}

/// The file `given` names: a path, a program on `$PATH`, or a library (`libc`, `libc.so.6`).
fn binary(given: &str) -> Result<PathBuf, ProbeError> {
    let missing = |near| ProbeError::Missing {
        what: format!("no file `{given}` (a path, a program on $PATH or a library's name)"),
        near,
    };
    if given.contains('/') {
        return std::fs::canonicalize(given).map_err(|_| missing(Vec::new()));
    }
    if let Some(program) = crate::which::on_path(Path::new(given)) {
        return std::fs::canonicalize(program).map_err(|_| missing(Vec::new()));
    }
    let mut names = Vec::new();
    for dir in library_dirs() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut found: Vec<PathBuf> = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if library_matches(&name, given) && is_elf(&entry.path()) {
                found.push(entry.path());
            }
            if name.contains(".so") {
                names.push(name);
            }
        }
        // `libc.so.6` before `libc.so.6.debug`-like names: the shortest match.
        found.sort_by_key(|p| p.as_os_str().len());
        if let Some(library) = found.first() {
            return std::fs::canonicalize(library).map_err(|_| missing(Vec::new()));
        }
    }
    names.sort();
    names.dedup();
    Err(missing(super::language::nearest(given, &names)))
}

/// `libc` names `libc.so.6`, as do `c` and `libc.so.6` itself; `libc.so` alone is often a
/// linker script (not ELF: skipped by the caller).
fn library_matches(file: &str, given: &str) -> bool {
    let stem = given.strip_prefix("lib").unwrap_or(given);
    file == given
        || file.starts_with(&format!("lib{stem}.so"))
        || file.starts_with(&format!("lib{stem}-")) && file.contains(".so")
}

fn is_elf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok()
        && magic == *b"\x7fELF"
}

/// Where in `file` `function` (`NAME`, `NAME+OFFSET`, `0xADDRESS`) is: a file offset.
fn offset_in(object: &object::File<'_>, file: &Path, function: &str) -> Result<u64, ProbeError> {
    let invalid = |reason: String| ProbeError::Invalid(format!("{}: {reason}", file.display()));
    let (name, offset) = match function.split_once('+') {
        Some((name, offset)) => (
            name,
            parse_number(offset).ok_or_else(|| invalid(format!("`{offset}` is not an offset")))?,
        ),
        None => (function, 0),
    };
    let address = match parse_number(name).filter(|_| name.starts_with("0x")) {
        Some(address) => address,
        None => function_address(object, name).ok_or_else(|| ProbeError::Missing {
            what: format!("no function `{name}` in {}", file.display()),
            near: super::language::nearest(name, &function_names(object)),
        })?,
    } + offset;
    file_offset_of(object, file, address)
}

/// Where in the file an address of its segments lies.
fn file_offset_of(object: &object::File<'_>, file: &Path, address: u64) -> Result<u64, ProbeError> {
    object
        .segments()
        .find(|s| (s.address()..s.address().saturating_add(s.size())).contains(&address))
        .and_then(|s| (address - s.address()).checked_add(s.file_range().0))
        .ok_or_else(|| {
            ProbeError::Invalid(format!(
                "{}: address {address:#x} is in none of its segments",
                file.display()
            ))
        })
}

/// A defined function's address, from the symbol table or the dynamic one.
fn function_address(object: &object::File<'_>, name: &str) -> Option<u64> {
    object
        .symbols()
        .chain(object.dynamic_symbols())
        .find(|s| {
            s.kind() == SymbolKind::Text && !s.is_undefined() && s.name() == Ok(name) && s.address() != 0
        })
        .map(|s| s.address())
}

fn function_names(object: &object::File<'_>) -> Vec<String> {
    let mut names: Vec<String> = object
        .symbols()
        .chain(object.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && !s.is_undefined())
        .filter_map(|s| s.name().ok().map(str::to_string))
        .collect();
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_of_probes_and_of_other_events() {
        let function = |ret, file, function| Some(Spelled::Function { ret, file, function });
        assert_eq!(spelling("uprobe:libc:malloc"), function(false, "libc", "malloc"));
        assert_eq!(
            spelling("uretprobe:/usr/bin/x:f+4"),
            function(true, "/usr/bin/x", "f+4")
        );
        assert_eq!(spelling("uprobe:libc"), function(false, "libc", ""));
        assert_eq!(
            spelling("usdt:/usr/bin/python3.11:python:gc__start"),
            Some(Spelled::Usdt {
                file: "/usr/bin/python3.11",
                provider: "python",
                name: "gc__start"
            })
        );
        assert_eq!(
            spelling("kretprobe:do_nanosleep+4"),
            Some(Spelled::Kernel {
                ret: true,
                function: "do_nanosleep+4"
            })
        );
        assert_eq!(
            spelling("uprobe:./events:events.c:80"),
            Some(Spelled::Line {
                ret: false,
                file: "./events",
                source: "events.c",
                line: 80
            })
        );
        // An address is not a line, nor a line without a source file.
        assert_eq!(spelling("uprobe:x:0x80"), function(false, "x", "0x80"));
        assert_eq!(spelling("uprobe:x:80"), function(false, "x", "80"));
        assert!(matches!(
            spelling("uretprobe:x:a.c:3").map(|s| resolve(s, &[])),
            Some(Err(ProbeError::Invalid(_)))
        ));
        assert_eq!(spelling("syscalls:sys_enter_write"), None);
        assert_eq!(spelling("cycles:u"), None);
    }

    /// A kernel function is checked against the kernel's own symbols (`/proc/kallsyms`, whose
    /// names anyone may read).
    #[test]
    fn kernel_functions_are_checked_and_misspelt_ones_name_the_nearest() {
        let probe = resolve(
            Spelled::Kernel {
                ret: false,
                function: "do_nanosleep+8",
            },
            &[],
        )
        .unwrap();
        assert_eq!(
            (
                probe.target.to_str().unwrap(),
                probe.sites[0].offset,
                probe.kernel
            ),
            ("do_nanosleep", 8, true)
        );
        match resolve(
            Spelled::Kernel {
                ret: false,
                function: "do_nanoslep",
            },
            &[],
        ) {
            Err(ProbeError::Missing { near, .. }) => {
                assert!(near.contains(&"do_nanosleep".to_string()), "{near:?}")
            }
            other => panic!("{other:?}"),
        }
    }

    /// A library named without a path is the one the target maps, reached through its root:
    /// this process's own libc, as its maps name it.
    #[test]
    fn a_library_is_the_one_the_target_maps() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc = (maps.lines())
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.rsplit('/').next().is_some_and(|n| n.starts_with("libc.so")))
            .expect("this test's libc");
        let found = in_targets("libc", &[std::process::id()]).unwrap();
        assert_eq!(found, std::fs::canonicalize(libc).unwrap());
        assert_eq!(in_targets("/usr/lib/x", &[std::process::id()]), None);
        assert_eq!(in_targets("libnothing-here", &[std::process::id()]), None);
        assert_eq!(in_targets("libc", &[]), None);
    }

    #[test]
    fn libraries_by_name() {
        for (file, given) in [
            ("libc.so.6", "libc"),
            ("libc.so.6", "c"),
            ("libc.so.6", "libc.so.6"),
        ] {
            assert!(library_matches(file, given), "{file} {given}");
        }
        for (file, given) in [("libcrypt.so.1", "libc"), ("libc.so.6", "libm")] {
            assert!(!library_matches(file, given), "{file} {given}");
        }
    }

    /// The test binary itself: its own functions are found at the offsets its segments give,
    /// and a misspelt one names the nearest.
    #[test]
    fn functions_resolve_to_file_offsets_and_misspelt_ones_name_the_nearest() {
        let me = std::env::current_exe().unwrap();
        let me = me.to_str().unwrap();
        let at = |function| {
            spelling(&format!("uprobe:{me}:{function}"))
                .map(|s| resolve(s, &[]))
                .unwrap()
        };
        let main = at("main").unwrap();
        let plus = at("main+4").unwrap();
        assert_eq!(plus.sites[0].offset, main.sites[0].offset + 4);
        assert!(main.sites[0].offset > 0);
        match at("mian") {
            Err(ProbeError::Missing { near, .. }) => assert!(near.contains(&"main".to_string()), "{near:?}"),
            other => panic!("{other:?}"),
        }
        let missing = spelling("uprobe:/nonexistent/x:main")
            .map(|s| resolve(s, &[]))
            .unwrap();
        assert!(matches!(missing, Err(ProbeError::Missing { .. })));
        assert!(matches!(at(""), Err(ProbeError::Invalid(_))));
    }
}
