//! JIT code named by the runtime that made it: a perf map (`/tmp/perf-PID.map`, one `START SIZE
//! NAME` line per function in hex, appended as code is compiled) as `node --perf-basic-prof`,
//! `python3.12 -X perf` and the JVM's perf-map agents write it. Read from the process's own mount
//! namespace (`/proc/PID/root/tmp/perf-NSPID.map`, NSPID its pid there), through a handle kept
//! open (the file may be deleted, the process gone); only what was appended since the last read,
//! whole lines, within bounds (a hostile process writes what it likes there).
use std::{
    collections::{BTreeMap, HashMap},
    fs::File,
    io::{Read as _, Seek as _, SeekFrom},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// Bytes read from one map over a run, at most (its rewrites included), and at one look.
const MAX_BYTES: u64 = 64 << 20;
const MAX_READ: u64 = 4 << 20;
/// Functions kept per map, at most.
const MAX_ENTRIES: usize = 1 << 20;
/// A line longer than this is skipped (counted as bad); a name is cut to `MAX_NAME` characters.
const MAX_LINE: usize = 4096;
const MAX_NAME: usize = 512;

/// One function of a perf map, or a Python function at one of its lines (`source`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct JitSymbol {
    pub start: u64,
    pub size: u64,
    pub name: Arc<str>,
    /// The function's file: a Python function's, or a JavaScript function's as V8 names it in
    /// its perf map.
    pub file: Option<Arc<str>>,
    /// The line running: a Python frame's (read from the interpreter's memory, not from a perf
    /// map).
    pub line: Option<u32>,
}

/// One process's perf map, as read so far.
#[derive(Debug)]
pub struct PerfMap {
    file: File,
    /// Where the next read starts: past the last whole line.
    read_to: u64,
    /// That line, as read: if the bytes before `read_to` are no longer these, the runtime
    /// rewrote the file (the JVM's `jcmd Compiler.perfmap` does), which is read anew.
    last_line: Vec<u8>,
    /// Bytes read over the run (`MAX_BYTES`).
    consumed: u64,
    /// By start: (end, name, file). A later line replaces the ranges it overlaps (code space
    /// reused).
    entries: BTreeMap<u64, Entry>,
    /// Lines that were not `START SIZE NAME`.
    pub bad_lines: u64,
}

/// A function of a perf map past its start: (end, name, file).
type Entry = (u64, Arc<str>, Option<Arc<str>>);

impl PerfMap {
    /// The perf map of `pid`, if it has one now: a regular file (never a FIFO, nor a symbolic
    /// link at its name) owned by the process's user or by root, as perf asks of one.
    pub fn open(pid: u32) -> Option<PerfMap> {
        use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
        let ns_pid = namespace_pid(pid).unwrap_or(pid);
        let owner = std::fs::metadata(format!("/proc/{pid}")).ok()?.uid();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(format!("/proc/{pid}/root/tmp/perf-{ns_pid}.map"))
            .ok()?;
        let meta = file.metadata().ok()?;
        (meta.is_file() && (meta.uid() == owner || meta.uid() == 0)).then(|| PerfMap::from_file(file))
    }

    pub fn from_file(file: File) -> PerfMap {
        PerfMap {
            file,
            read_to: 0,
            last_line: Vec::new(),
            consumed: 0,
            entries: BTreeMap::new(),
            bad_lines: 0,
        }
    }

    /// Read the lines appended since the last read: from the start again if the file shrank
    /// or was rewritten; at most `MAX_READ` bytes now and `MAX_BYTES` over the run.
    pub fn refresh(&mut self) {
        let size = self.file.metadata().map(|m| m.len()).unwrap_or(0);
        if size < self.read_to || !self.still_written_as_read() {
            self.read_to = 0;
            self.last_line.clear();
            self.entries.clear();
        }
        let want = (size.saturating_sub(self.read_to))
            .min(MAX_READ)
            .min(MAX_BYTES.saturating_sub(self.consumed));
        let mut bytes = Vec::new();
        if want == 0 || self.read_at(self.read_to, want, &mut bytes).is_err() {
            return;
        }
        // Whole lines only: a line being written is read next time. A line longer than any
        // kept is passed over.
        let whole = match bytes.iter().rposition(|&b| b == b'\n') {
            Some(end) => end + 1,
            None if bytes.len() > MAX_LINE => {
                self.bad_lines += 1;
                bytes.len()
            }
            None => 0,
        };
        self.read_to += whole as u64;
        self.consumed += whole as u64;
        // The end of the last line read (at most `KEPT` bytes of it), to tell a rewrite by.
        const KEPT: usize = 256;
        let last = bytes[..whole.saturating_sub(1)]
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |at| at + 1);
        if whole > 0 {
            self.last_line = bytes[last.max(whole.saturating_sub(KEPT))..whole].to_vec();
        }
        for line in bytes[..whole].split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            match parse_line(line) {
                Some((start, entry)) => self.insert(start, entry),
                None => self.bad_lines += 1,
            }
        }
    }

    /// `len` bytes from `offset` into `bytes`.
    fn read_at(&self, offset: u64, len: u64, bytes: &mut Vec<u8>) -> std::io::Result<()> {
        let mut file = &self.file;
        file.seek(SeekFrom::Start(offset))?;
        file.take(len).read_to_end(bytes).map(|_| ())
    }

    /// The last line read is still where it was: the file was appended to, not rewritten.
    fn still_written_as_read(&self) -> bool {
        let len = self.last_line.len() as u64;
        let mut bytes = Vec::new();
        len == 0 || (self.read_at(self.read_to - len, len, &mut bytes).is_ok() && bytes == self.last_line)
    }

    fn insert(&mut self, start: u64, entry: Entry) {
        let end = entry.0;
        // Drop what the new function overlaps: the entry before it that reaches into it, and
        // those that start inside it.
        if let Some((&before, &(before_end, ..))) = self.entries.range(..start).next_back() {
            if before_end > start {
                self.entries.remove(&before);
            }
        }
        let inside: Vec<u64> = self.entries.range(start..end).map(|(&s, _)| s).collect();
        for s in inside {
            self.entries.remove(&s);
        }
        if self.entries.len() < MAX_ENTRIES {
            self.entries.insert(start, entry);
        }
    }

    /// The function `addr` is in, if the map names one.
    pub fn find(&self, addr: u64) -> Option<JitSymbol> {
        let (&start, (end, name, file)) = self.entries.range(..=addr).next_back()?;
        (addr < *end).then(|| JitSymbol {
            start,
            size: end - start,
            name: name.clone(),
            file: file.clone(),
            line: None,
        })
    }

    /// How many functions it names now.
    pub fn functions(&self) -> usize {
        self.entries.len()
    }
}

/// Every target's perf map, and the functions of them samples fell in, each numbered once
/// (`JitNames`): what a `UserAddr::Jit` names.
#[derive(Debug, Default)]
pub struct JitMaps {
    maps: HashMap<u32, PerfMap>,
    /// When each process's map was last looked for or read.
    looked_at: HashMap<u32, Instant>,
    names: JitNames,
}

/// A process's perf map is looked for, or read again, at most this often.
const LOOK_EVERY: Duration = Duration::from_millis(250);

impl JitMaps {
    /// Look for `pid`'s perf map, or read what was appended to it, unless that was just done.
    pub fn refresh(&mut self, pid: u32) {
        if self
            .looked_at
            .get(&pid)
            .is_some_and(|at| at.elapsed() < LOOK_EVERY)
        {
            return;
        }
        self.looked_at.insert(pid, Instant::now());
        match self.maps.get_mut(&pid) {
            Some(map) => map.refresh(),
            None => {
                if let Some(mut map) = PerfMap::open(pid) {
                    map.refresh();
                    self.maps.insert(pid, map);
                }
            }
        }
    }

    /// The number of the function at `addr` of `pid`, if its perf map names one.
    pub fn symbol(&self, pid: u32, addr: u64) -> Option<u32> {
        self.names.intern(self.maps.get(&pid)?.find(addr)?)
    }

    pub fn forget(&mut self, pids: &std::collections::HashSet<u32>) {
        self.maps.retain(|pid, _| !pids.contains(pid));
        self.looked_at.retain(|pid, _| !pids.contains(pid));
    }

    pub fn names(&self) -> JitNames {
        self.names.clone()
    }
}

/// The JIT functions samples fell in, by number; shared with the snapshots symbolized elsewhere.
/// At most `MAX_NAMED` over a run: past that, a function is left unnamed (`[anon]`).
#[derive(Clone, Debug, Default)]
pub struct JitNames(Arc<Mutex<Interned>>);

#[derive(Debug, Default)]
struct Interned {
    symbols: Vec<JitSymbol>,
    ids: HashMap<JitSymbol, u32>,
}

const MAX_NAMED: usize = 1 << 18;

impl JitNames {
    pub fn intern(&self, symbol: JitSymbol) -> Option<u32> {
        let mut interned = self.0.lock().ok()?;
        if let Some(&id) = interned.ids.get(&symbol) {
            return Some(id);
        }
        if interned.symbols.len() >= MAX_NAMED {
            return None;
        }
        let id = interned.symbols.len() as u32;
        interned.symbols.push(symbol.clone());
        interned.ids.insert(symbol, id);
        Some(id)
    }

    pub fn get(&self, id: u32) -> Option<JitSymbol> {
        self.0.lock().ok()?.symbols.get(id as usize).cloned()
    }
}

/// `START SIZE NAME`: hex numbers (an optional `0x`), then the rest of the line (spaces and all).
/// Its start and entry: the name read as its runtime writes it (`runtime_name`).
fn parse_line(line: &[u8]) -> Option<(u64, Entry)> {
    if line.len() > MAX_LINE {
        return None;
    }
    let text = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
    let mut parts = text.splitn(3, ' ');
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let start = hex(parts.next()?)?;
    let size = hex(parts.next()?)?;
    let name = parts.next()?.trim();
    let end = start.checked_add(size).filter(|_| size > 0 && !name.is_empty())?;
    let name = match name.char_indices().nth(MAX_NAME) {
        Some((cut, _)) => &name[..cut],
        None => name,
    };
    let (name, file) = runtime_name(name);
    Some((start, (end, name, file)))
}

/// A function as its runtime names it in a perf map, and its file when the name says:
/// - V8 (Node.js): `JS:*alphaWork /app/split.js:11:19` is `alphaWork` in `/app/split.js`. The
///   mark of the tier that compiled it (`~` interpreted, `^` baseline, `+` Maglev, `*` TurboFan)
///   is dropped, so a function is one row whichever tier ran it. The line is where the function
///   starts, not the line running (which a frame's line means): it stays in the name only of a
///   function without one, `(anonymous /app/split.js:11)` (a script's own code `(top level
///   /app/split.js)`), so that those of different places stay apart. Older V8's `LazyCompile:`
///   and `Function:` are read alike.
/// - The JVM (`jcmd PID Compiler.perfmap`): `long Split.alphaWork(int)` is
///   `Split.alphaWork(int)`, its return type dropped.
///
/// Any other name is kept whole.
fn runtime_name(name: &str) -> (Arc<str>, Option<Arc<str>>) {
    v8_name(name)
        .or_else(|| jvm_name(name).map(|method| (Arc::from(method), None)))
        .unwrap_or_else(|| (Arc::from(name), None))
}

fn v8_name(name: &str) -> Option<(Arc<str>, Option<Arc<str>>)> {
    let (kind, rest) = name.split_once(':')?;
    let script = match kind {
        "JS" | "LazyCompile" | "Function" => false,
        "Eval" | "Script" => true,
        _ => return None,
    };
    let rest = rest.strip_prefix(['~', '^', '+', '*']).unwrap_or(rest);
    // The location is the last word, or all from the first ` /` (a path with spaces: a name
    // with ` /` in it is rarer).
    let (function, location) = match rest.find(" /") {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => rest.rsplit_once(' ')?,
    };
    let mut parts = location.rsplitn(3, ':');
    let (column, line, file) = (parts.next()?, parts.next()?, parts.next()?);
    let (_, line): (u32, u32) = (column.parse().ok()?, line.parse().ok()?);
    let function = match (function.is_empty(), file.is_empty()) {
        (false, _) => function.to_string(),
        (true, true) => "(anonymous)".to_string(),
        (true, false) if script => format!("(top level {file})"),
        (true, false) => format!("(anonymous {file}:{line})"),
    };
    Some((Arc::from(function), (!file.is_empty()).then(|| Arc::from(file))))
}

/// `RET Class.method(ARGS)`: the method and its arguments.
fn jvm_name(name: &str) -> Option<&str> {
    let (returns, method) = name.split_once(' ')?;
    let java_type = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_alphanumeric() || matches!(c, '.' | '$' | '_' | '[' | ']' | '/'))
    };
    // A constructor is `<init>`, a class's initializer `<clinit>`.
    let (class_method, _) = method.split_once('(')?;
    let plain = class_method
        .replace("<init>", "init")
        .replace("<clinit>", "clinit");
    (java_type(returns) && java_type(&plain) && plain.contains('.') && method.ends_with(')'))
        .then_some(method)
}

/// The pid `pid` has in its own pid namespace (the last of `/proc/PID/status`'s `NSpid`).
fn namespace_pid(pid: u32) -> Option<u32> {
    let status = super::read_proc(&format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    fn map_of(text: &[u8]) -> (PerfMap, tempfile::NamedTempFile) {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(text).unwrap();
        let mut map = PerfMap::from_file(File::open(file.path()).unwrap());
        map.refresh();
        (map, file)
    }

    /// Lines as node and the JVM write them; a later function replaces the ones it overlaps; a
    /// line being written is read once whole; garbage is counted, never fatal.
    #[test]
    fn functions_are_read_as_appended_and_bad_lines_are_counted() {
        let (mut map, mut file) = map_of(
            b"3a0e8a9c0 6c LazyCompile:~hot /app/x.js:1\n0x3a0e8aa40 20 Builtin:Call\nzz 10 x\n10 0 empty\n",
        );
        assert_eq!(map.functions(), 2);
        assert_eq!(map.bad_lines, 2);
        let hot = map.find(0x3a0e8a9c0 + 0x10).unwrap();
        assert_eq!(
            (hot.start, hot.size, &*hot.name),
            (0x3a0e8a9c0, 0x6c, "LazyCompile:~hot /app/x.js:1")
        );
        assert_eq!(hot.file, None, "no column: not V8's form, kept whole");
        assert!(map.find(0x3a0e8a9c0 + 0x6c).is_none());
        file.write_all(b"3a0e8a9e0 40 LazyCompile:*hot /app/x.js:1\n3a0e8ab00 1")
            .unwrap();
        map.refresh();
        assert_eq!(&*map.find(0x3a0e8a9c0).map_or("gone".into(), |s| s.name), "gone");
        assert_eq!(
            &*map.find(0x3a0e8a9f0).unwrap().name,
            "LazyCompile:*hot /app/x.js:1"
        );
        assert!(map.find(0x3a0e8ab00).is_none(), "the line is not whole yet");
        file.write_all(b"0 opt\n").unwrap();
        map.refresh();
        assert_eq!(&*map.find(0x3a0e8ab05).unwrap().name, "opt");
        assert_eq!(map.bad_lines, 2);
        // Rewritten whole, longer than before (`jcmd Compiler.perfmap` again): read anew.
        let rewritten = "5000 10 first\n".repeat(8) + "6000 10 second\n";
        std::fs::write(file.path(), rewritten).unwrap();
        map.refresh();
        assert!(map.find(0x3a0e8a9f0).is_none(), "the old functions are gone");
        assert_eq!(&*map.find(0x5000).unwrap().name, "first");
        assert_eq!(&*map.find(0x6000).unwrap().name, "second");
        assert_eq!(map.bad_lines, 2);
        let (long, _) = map_of(format!("1000 10 {}\n", "n".repeat(5000)).as_bytes());
        assert_eq!((long.functions(), long.bad_lines), (0, 1));
        let (cut, _) = map_of(format!("1000 10 {}\n", "n".repeat(600)).as_bytes());
        assert_eq!(cut.find(0x1000).unwrap().name.len(), MAX_NAME);
    }

    /// V8's and the JVM's names are read into a function and its place; anything else is kept.
    #[test]
    fn runtimes_names_are_read_into_function_and_place() {
        let read = |name: &str| {
            let (function, file) = runtime_name(name);
            (function.to_string(), file.map(|f| f.to_string()))
        };
        let named = |function: &str, file: &str| (function.to_string(), Some(file.to_string()));
        assert_eq!(
            read("JS:*alphaWork /app/split.js:11:19"),
            named("alphaWork", "/app/split.js")
        );
        assert_eq!(
            read("JS:~alphaWork /app/split.js:1:19"),
            read("JS:^alphaWork /app/split.js:1:19")
        );
        assert_eq!(
            read("JS:+get size /app/a b.js:7:3"),
            named("get size", "/app/a b.js")
        );
        assert_eq!(
            read("JS:~ node:internal/main/run_main_module:1:1"),
            named(
                "(anonymous node:internal/main/run_main_module:1)",
                "node:internal/main/run_main_module"
            )
        );
        assert_eq!(
            read("JS:~ /app/x.js:3:1"),
            named("(anonymous /app/x.js:3)", "/app/x.js")
        );
        assert_ne!(
            read("JS:~ /app/x.js:3:1"),
            read("JS:~ /app/x.js:9:1"),
            "anonymous functions stay apart"
        );
        assert_eq!(
            read("Eval:~ /app/split.js:1:1"),
            named("(top level /app/split.js)", "/app/split.js")
        );
        assert_eq!(read("LazyCompile:*hot /app/x.js:4:2"), named("hot", "/app/x.js"));
        assert_eq!(read("JS:~f :1:1"), ("f".to_string(), None), "no script: no file");
        assert_eq!(
            read("long Split.alphaWork(int)"),
            ("Split.alphaWork(int)".into(), None)
        );
        assert_eq!(
            read("void java.lang.String.<init>(byte[], byte)").0,
            "java.lang.String.<init>(byte[], byte)"
        );
        assert_eq!(read("java.lang.String[] a.B$C.d()"), ("a.B$C.d()".into(), None));
        assert_eq!(
            read("void X$$Lambda$14/0x0000000800c03000.run()").0,
            "X$$Lambda$14/0x0000000800c03000.run()"
        );
        for kept in [
            "Builtin:ArrayPrototypePush",
            "StubRoutines (1)",
            "Interpreter",
            "JS:~x /app/x.js:one:2",
            "JS:~x /app/x.js:1:abc",
            "JS:",
            "py::f:/x.py",
            "unwind_exception Runtime1 stub",
        ] {
            assert_eq!(read(kept), (kept.to_string(), None));
        }
    }
}
