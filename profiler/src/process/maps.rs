//! `/proc/<pid>/maps` read: the executable mappings, with text a program copied to anonymous
//! memory in place taken as its file's.

/// One line of `/proc/<pid>/maps`, executable mappings only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapsLine {
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    pub dev: String,
    pub inode: u64,
    pub path: String,
    /// The range whose `/proc/<pid>/map_files` entry opens the file: the line's own, or for
    /// text copied to anonymous memory (`adopt_remapped_text`) the file's mapping beside it.
    pub opened_through: (u64, u64),
}

impl MapsLine {
    /// `/proc/<pid>/map_files/…` of the file this line maps.
    pub fn map_files_path(&self, pid: u32) -> String {
        let (start, end) = self.opened_through;
        format!("/proc/{pid}/map_files/{start:x}-{end:x}")
    }
}

/// Parse the executable mappings out of a `/proc/<pid>/maps` text. Every line is split in place;
/// only the executable ones are copied out (a process maps several times more data than code).
pub fn parse_maps(text: &str) -> Vec<MapsLine> {
    let mut lines: Vec<Line<'_>> = text.lines().filter_map(Line::parse).collect();
    adopt_remapped_text(&mut lines);
    lines.iter().filter(|l| l.exec).map(Line::owned).collect()
}

/// One line of the text, borrowed from it.
#[derive(Clone, Copy, Debug)]
struct Line<'a> {
    start: u64,
    end: u64,
    file_offset: u64,
    dev: &'a str,
    inode: u64,
    path: &'a str,
    exec: bool,
    opened_through: (u64, u64),
}

impl<'a> Line<'a> {
    fn parse(line: &'a str) -> Option<Line<'a>> {
        let mut fields = line.splitn(6, ' ');
        let (start, end) = fields.next()?.split_once('-')?;
        let exec = fields.next()?.contains('x');
        let file_offset = u64::from_str_radix(fields.next()?, 16).ok()?;
        let dev = fields.next()?;
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

    fn owned(&self) -> MapsLine {
        MapsLine {
            start: self.start,
            end: self.end,
            file_offset: self.file_offset,
            dev: self.dev.to_string(),
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
fn adopt_remapped_text(lines: &mut [Line<'_>]) {
    let bias = |l: &Line| l.start.wrapping_sub(l.file_offset);
    for i in 1..lines.len().saturating_sub(1) {
        let (before, text, after) = (lines[i - 1], lines[i], lines[i + 1]);
        let adopted = text.exec
            && text.inode == 0
            && text.path.is_empty()
            && before.inode != 0
            && (before.dev, before.inode, before.path) == (after.dev, after.inode, after.path)
            && (before.end, text.end) == (text.start, after.start)
            && bias(&before) == bias(&after)
            && text.start >= bias(&before);
        if adopted {
            lines[i] = Line {
                start: text.start,
                end: text.end,
                file_offset: text.start - bias(&before),
                exec: true,
                opened_through: (before.start, before.end),
                ..before
            };
        }
    }
}
