//! A process's executable mappings: asked of the kernel one mapping at a time (`PROCMAP_QUERY`,
//! Linux 6.11+), else read out of the `/proc/<pid>/maps` text; with text a program copied to
//! anonymous memory in place taken as its file's.
use std::{
    fs::File,
    io,
    os::fd::AsRawFd as _,
    sync::atomic::{AtomicBool, Ordering},
};

/// One executable mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapsLine {
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    /// The file's device, as `stat` encodes it (`makedev(major, minor)`); 0 for none.
    pub dev: u64,
    pub inode: u64,
    pub path: String,
    /// The range whose `/proc/<pid>/map_files` entry opens the file: the line's own, or for
    /// text copied to anonymous memory (`adopted`) the file's mapping beside it.
    pub opened_through: (u64, u64),
}

impl MapsLine {
    /// `/proc/<pid>/map_files/…` of the file this line maps.
    pub fn map_files_path(&self, pid: u32) -> String {
        let (start, end) = self.opened_through;
        format!("/proc/{pid}/map_files/{start:x}-{end:x}")
    }
}

/// The executable mappings of the process whose `/proc/<pid>/maps` is `maps` (none once it has
/// exited). Asked of the kernel where it answers (only executable mappings are looked at, where
/// the text lists every one, a process mapping several times more data than code, and writes
/// each path), else read from the text. (The text's `[vsyscall]` page, outside the process's own
/// mappings, is not among the kernel's answers: nothing is unwound there.)
pub fn exec_mappings(maps: File) -> io::Result<Vec<MapsLine>> {
    static QUERY_UNKNOWN: AtomicBool = AtomicBool::new(false);
    if !QUERY_UNKNOWN.load(Ordering::Relaxed) {
        match query::exec_mappings(&maps) {
            Ok(lines) => return Ok(lines),
            // (An older kernel: `maps` has no ioctl.)
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTTY | libc::EINVAL)) => {
                QUERY_UNKNOWN.store(true, Ordering::Relaxed)
            }
            // (A path too long for the buffer, or any other refusal: the text says it all.)
            Err(e) => said_once(&e),
        }
    }
    Ok(parse_maps(&super::proc_dir::read_text(maps)?))
}

/// A refusal of the kernel's answers, said once (the text is read instead).
fn said_once(error: &io::Error) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        log::info!("asking the kernel for a process's mappings (PROCMAP_QUERY) failed: {error}; its /proc map text is read");
    }
}

/// Parse the executable mappings out of a `/proc/<pid>/maps` text. Every line is split in place,
/// three at a time (a mapping and its two neighbours); only the executable ones are copied out.
pub fn parse_maps(text: &str) -> Vec<MapsLine> {
    let mut lines = Vec::new();
    let mut window: [Option<Line<'_>>; 3] = [None; 3];
    for line in text.lines().filter_map(Line::parse).map(Some).chain([None]) {
        window = [window[1], window[2], line];
        if let [before, Some(this), after] = window {
            if this.exec {
                let adopted = before.zip(after).and_then(|(b, a)| adopted(&b, &this, &a));
                lines.push(adopted.unwrap_or(this).owned());
            }
        }
    }
    lines
}

/// One mapping, its path borrowed.
#[derive(Clone, Copy, Debug)]
struct Line<'a> {
    start: u64,
    end: u64,
    file_offset: u64,
    dev: u64,
    inode: u64,
    path: &'a str,
    exec: bool,
    opened_through: (u64, u64),
}

impl<'a> Line<'a> {
    /// A line of the text.
    fn parse(line: &'a str) -> Option<Line<'a>> {
        let mut fields = line.splitn(6, ' ');
        let (start, end) = fields.next()?.split_once('-')?;
        let exec = fields.next()?.contains('x');
        let file_offset = u64::from_str_radix(fields.next()?, 16).ok()?;
        let (major, minor) = fields.next()?.split_once(':')?;
        let dev = libc::makedev(
            u32::from_str_radix(major, 16).ok()?,
            u32::from_str_radix(minor, 16).ok()?,
        );
        let inode = fields.next()?.parse().ok()?;
        let path = fields.next().unwrap_or("").trim_start();
        let (start, end) = (
            u64::from_str_radix(start, 16).ok()?,
            u64::from_str_radix(end, 16).ok()?,
        );
        Some(Line {
            start,
            end,
            file_offset,
            dev,
            inode,
            path,
            exec,
            opened_through: (start, end),
        })
    }

    fn of(line: &'a MapsLine, exec: bool) -> Line<'a> {
        Line {
            start: line.start,
            end: line.end,
            file_offset: line.file_offset,
            dev: line.dev,
            inode: line.inode,
            path: &line.path,
            exec,
            opened_through: line.opened_through,
        }
    }

    fn owned(&self) -> MapsLine {
        MapsLine {
            start: self.start,
            end: self.end,
            file_offset: self.file_offset,
            dev: self.dev,
            inode: self.inode,
            path: self.path.to_string(),
            opened_through: self.opened_through,
        }
    }
}

/// Text a program copied to anonymous memory in place (remapped onto huge pages, as HHVM,
/// folly's and MySQL's large-page options do; or any program that remaps its own code) is still
/// its file's code: an executable anonymous mapping with the same file mapped right before and
/// right after it, both at the same load bias, is read as that file at the offsets it covers.
/// Anywhere else (JIT code beside a library, which mmap often places there) stays anonymous.
fn adopted<'a>(before: &Line<'a>, text: &Line<'a>, after: &Line<'a>) -> Option<Line<'a>> {
    let bias = |l: &Line| l.start.wrapping_sub(l.file_offset);
    let adopted = text.exec
        && text.inode == 0
        && text.path.is_empty()
        && before.inode != 0
        && (before.dev, before.inode, before.path) == (after.dev, after.inode, after.path)
        && (before.end, text.end) == (text.start, after.start)
        && bias(before) == bias(after)
        && text.start >= bias(before);
    adopted.then(|| Line {
        start: text.start,
        end: text.end,
        file_offset: text.start - bias(before),
        exec: true,
        opened_through: (before.start, before.end),
        ..*before
    })
}

/// `PROCMAP_QUERY`: the kernel's answer for one address at a time.
pub(super) mod query {
    use super::*;

    /// `struct procmap_query` (include/uapi/linux/fs.h).
    #[repr(C)]
    #[derive(Default)]
    struct ProcmapQuery {
        size: u64,
        query_flags: u64,
        query_addr: u64,
        vma_start: u64,
        vma_end: u64,
        vma_flags: u64,
        vma_page_size: u64,
        vma_offset: u64,
        inode: u64,
        dev_major: u32,
        dev_minor: u32,
        vma_name_size: u32,
        build_id_size: u32,
        vma_name_addr: u64,
        build_id_addr: u64,
    }
    const _: () = assert!(std::mem::size_of::<ProcmapQuery>() == 104);

    nix::ioctl_readwrite!(procmap_query, b'f', 17, ProcmapQuery);

    /// `PROCMAP_QUERY_VMA_EXECUTABLE`, `PROCMAP_QUERY_COVERING_OR_NEXT_VMA`.
    const EXECUTABLE: u64 = 0x04;
    const COVERING_OR_NEXT: u64 = 0x10;

    /// The executable mappings, in address order; each anonymous one with its neighbours asked
    /// for too, to see whether it is a file's text copied there.
    pub(in crate::process) fn exec_mappings(maps: &File) -> io::Result<Vec<MapsLine>> {
        let mut name = vec![0u8; libc::PATH_MAX as usize];
        let mut lines = Vec::new();
        let mut at = 0;
        while let Some(line) = ask(maps, at, EXECUTABLE | COVERING_OR_NEXT, &mut name)? {
            at = line.end;
            lines.push(line);
        }
        for text in lines.iter_mut().filter(|l| l.inode == 0 && l.path.is_empty()) {
            let before = text
                .start
                .checked_sub(1)
                .map(|at| ask(maps, at, 0, &mut name))
                .transpose()?
                .flatten();
            let after = ask(maps, text.end, 0, &mut name)?;
            if let Some((before, after)) = before.zip(after) {
                let (before, after) = (Line::of(&before, false), Line::of(&after, false));
                if let Some(line) = adopted(&before, &Line::of(text, true), &after) {
                    *text = line.owned();
                }
            }
        }
        Ok(lines)
    }

    /// The mapping covering `at` (or with `COVERING_OR_NEXT` the next one), as `flags` ask;
    /// None where there is none (or the process has exited: its map is empty).
    fn ask(maps: &File, at: u64, flags: u64, name: &mut [u8]) -> io::Result<Option<MapsLine>> {
        let mut query = ProcmapQuery {
            size: std::mem::size_of::<ProcmapQuery>() as u64,
            query_flags: flags,
            query_addr: at,
            vma_name_size: name.len() as u32,
            vma_name_addr: name.as_mut_ptr() as u64,
            ..Default::default()
        };
        // SAFETY: `query` is the kernel's struct, of its size; the kernel writes at most
        // `vma_name_size` bytes at `vma_name_addr`, which `name` holds for the call.
        match unsafe { procmap_query(maps.as_raw_fd(), &mut query) } {
            Ok(_) => {}
            Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ESRCH) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        // (The size the kernel says includes the name's terminating NUL; 0 for none.)
        let len = (query.vma_name_size as usize).saturating_sub(1).min(name.len());
        let path = String::from_utf8_lossy(&name[..len]).into_owned();
        let (start, end) = (query.vma_start, query.vma_end);
        Ok(Some(MapsLine {
            start,
            end,
            file_offset: query.vma_offset,
            dev: libc::makedev(query.dev_major, query.dev_minor),
            inode: query.inode,
            path,
            opened_through: (start, end),
        }))
    }
}
