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

/// Parse the executable mappings out of a `/proc/<pid>/maps` text.
pub fn parse_maps(text: &str) -> Vec<MapsLine> {
    let mut lines: Vec<(MapsLine, bool)> = text.lines().filter_map(parse_maps_line).collect();
    adopt_remapped_text(&mut lines);
    lines
        .into_iter()
        .filter(|(_, exec)| *exec)
        .map(|(line, _)| line)
        .collect()
}

/// A line and whether it is executable.
fn parse_maps_line(line: &str) -> Option<(MapsLine, bool)> {
    let mut fields = line.splitn(6, ' ');
    let range = fields.next()?;
    let perms = fields.next()?;
    let offset = fields.next()?;
    let dev = fields.next()?;
    let inode = fields.next()?;
    let path = fields.next().unwrap_or("").trim_start().to_string();
    let (start, end) = range.split_once('-')?;
    let (start, end) = (
        u64::from_str_radix(start, 16).ok()?,
        u64::from_str_radix(end, 16).ok()?,
    );
    let line = MapsLine {
        start,
        end,
        file_offset: u64::from_str_radix(offset, 16).ok()?,
        dev: dev.to_string(),
        inode: inode.parse().ok()?,
        path,
        opened_through: (start, end),
    };
    Some((line, perms.contains('x')))
}

/// Text a program copied to anonymous memory in place (remapped onto huge pages, as HHVM,
/// folly's and MySQL's large-page options do; or any program that remaps its own code) is still
/// its file's code: an executable anonymous mapping with the same file mapped right before and
/// right after it, both at the same load bias, is read as that file at the offsets it covers.
/// Anywhere else (JIT code beside a library, which mmap often places there) stays anonymous.
fn adopt_remapped_text(lines: &mut [(MapsLine, bool)]) {
    let bias = |l: &MapsLine| l.start.wrapping_sub(l.file_offset);
    for i in 1..lines.len().saturating_sub(1) {
        let [(before, _), (text, true), (after, _)] = &lines[i - 1..=i + 1] else {
            continue;
        };
        let adopted = text.inode == 0
            && text.path.is_empty()
            && before.inode != 0
            && (&before.dev, before.inode, &before.path) == (&after.dev, after.inode, &after.path)
            && (before.end, text.end) == (text.start, after.start)
            && bias(before) == bias(after)
            && text.start >= bias(before);
        if adopted {
            let line = MapsLine {
                file_offset: text.start - bias(before),
                opened_through: (before.start, before.end),
                start: text.start,
                end: text.end,
                ..before.clone()
            };
            lines[i].0 = line;
        }
    }
}
