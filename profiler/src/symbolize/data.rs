//! Names for data addresses (a lock's): the data symbols of the files a process maps (global and
//! static objects, `.bss` included, with the offset of a member), and the kernel's from
//! `/proc/kallsyms`.
use std::collections::HashMap;

use object::{Object as _, ObjectSymbol as _, SymbolKind};

use crate::{
    process::{FileId, FileTable},
    unwind::{bias_of, segments_of, Segment},
};

/// Names kernel data addresses (a static kernel lock) from `/proc/kallsyms`: the nearest data
/// symbol at or below, with the offset into it (sizes are not listed: an offset past the next
/// symbol cannot happen, one into a large object may name a member).
pub struct KernelData {
    /// (address, name), sorted.
    symbols: Vec<(u64, String)>,
    /// kallsyms lists code but no data objects: the kernel was built without
    /// `CONFIG_KALLSYMS_ALL` (what data symbols it has then are section bounds, not objects).
    no_data_symbols: bool,
}

/// A data object every kernel has (`init_task`, the first task): listed in kallsyms, as data,
/// exactly when the kernel keeps its data symbols there.
const KNOWN_DATA_SYMBOL: &str = "init_task";

impl KernelData {
    pub fn read() -> KernelData {
        let text = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
        KernelData::parse(&text)
    }

    pub fn parse(text: &str) -> KernelData {
        let (mut symbols, mut known, mut code) = (Vec::new(), false, false);
        for line in text.lines() {
            let mut fields = line.split_whitespace();
            let (Some(address), Some(kind), Some(name)) = (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let Ok(address) = u64::from_str_radix(address, 16) else {
                continue;
            };
            let data = matches!(kind, "d" | "D" | "b" | "B");
            code |= address != 0 && matches!(kind, "t" | "T");
            known |= data && name == KNOWN_DATA_SYMBOL;
            if address != 0 && data {
                symbols.push((address, name.to_string()));
            }
        }
        // Without data symbols, the few left are section bounds: a lock named after one would be
        // named wrongly.
        if !known {
            symbols.clear();
        }
        symbols.sort();
        KernelData {
            symbols,
            no_data_symbols: code && !known,
        }
    }

    /// What the report says once when static kernel locks cannot be named.
    pub fn note(&self) -> Option<String> {
        self.no_data_symbols.then(|| {
            "static kernel locks shown as addresses: this kernel's kallsyms has no data symbols (CONFIG_KALLSYMS_ALL off)"
                .to_string()
        })
    }

    pub fn name(&self, address: u64) -> Option<String> {
        let i = self.symbols.partition_point(|s| s.0 <= address).checked_sub(1)?;
        let (start, name) = &self.symbols[i];
        // Past the last data symbol (heap, per-CPU areas): no name.
        self.symbols.get(i + 1)?;
        match address - start {
            0 => Some(name.clone()),
            offset if offset < 4096 => Some(format!("{name}+{offset:#x}")),
            _ => None,
        }
    }
}

/// Names data addresses (a global or static lock, including zero-initialised ones in `.bss`)
/// from the symbol tables of the files a process maps. Each file is read once.
#[derive(Default)]
pub struct DataSymbols {
    files: HashMap<FileId, Option<FileData>>,
}

struct FileData {
    segments: Vec<Segment>,
    /// (address, size, name), sorted by address.
    objects: Vec<(u64, u64, String)>,
}

impl DataSymbols {
    /// The data object at `address` of one image of a process, given the files it maps
    /// (`Processes::mapped_files`) and where to read them.
    pub fn name(
        &mut self,
        files: &dyn FileTable,
        mapped: &[(FileId, u64, u64)],
        address: u64,
    ) -> Option<String> {
        for &(file, start, file_offset) in mapped {
            let data = self
                .files
                .entry(file)
                .or_insert_with(|| FileData::read(&files.file(file)?.read_path()));
            let Some(data) = data else {
                continue;
            };
            let Some(bias) = bias_of(&data.segments, start, file_offset) else {
                continue;
            };
            let vaddr = address.wrapping_sub(bias);
            if !data.segments.iter().any(|s| s.holds(vaddr)) {
                continue;
            }
            return data.object_at(vaddr);
        }
        None
    }
}

impl FileData {
    fn read(path: &std::path::Path) -> Option<FileData> {
        let bytes = crate::process::map_file(path).ok()?;
        let file = object::File::parse(&*bytes).ok()?;
        let mut objects: Vec<(u64, u64, String)> = file
            .symbols()
            .chain(file.dynamic_symbols())
            .filter(|s| s.kind() == SymbolKind::Data && s.size() > 0)
            .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_string())))
            .collect();
        objects.sort();
        objects.dedup_by_key(|o| o.0);
        Some(FileData {
            segments: segments_of(&file),
            objects,
        })
    }

    /// The object covering `vaddr`, with the offset into it when the lock is a member.
    fn object_at(&self, vaddr: u64) -> Option<String> {
        let i = self.objects.partition_point(|o| o.0 <= vaddr).checked_sub(1)?;
        let (address, size, name) = &self.objects[i];
        match vaddr - address {
            offset if offset >= *size => None,
            0 => Some(name.clone()),
            offset => Some(format!("{name}+{offset:#x}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_locks_are_named_from_kallsyms_data_symbols() {
        let kallsyms = "ffffffff81000000 T _text\nffffffff82a00000 D rtnl_mutex\nffffffff82a00040 d other\nffffffff82e00000 D init_task\nffffffff83000000 B __bss_stop\n";
        let data = KernelData::parse(kallsyms);
        assert_eq!(data.note(), None);
        assert_eq!(data.name(0xffffffff82a00000).as_deref(), Some("rtnl_mutex"));
        assert_eq!(data.name(0xffffffff82a00010).as_deref(), Some("rtnl_mutex+0x10"));
        assert_eq!(data.name(0xffffffff82a10000), None);
        assert_eq!(data.name(0xffff888000001000), None);
        assert_eq!(data.name(0xffffffff81000000), None);
    }

    #[test]
    fn a_kernel_without_data_symbols_is_said_once_and_its_section_bounds_name_nothing() {
        // CONFIG_KALLSYMS_ALL off (as on this project's 6.18 VM): code, and section bounds as 'D'.
        let kallsyms = "ffffffff81000000 T _text\nffffffff81000100 t helper\nffffffff82400000 D __start_rodata\nffffffff83783000 B __init_begin\n";
        let data = KernelData::parse(kallsyms);
        assert_eq!(
            data.name(0xffffffff82400010),
            None,
            "not a lock in __start_rodata"
        );
        let note = data.note().expect("a note");
        assert!(note.contains("CONFIG_KALLSYMS_ALL off"), "{note}");
        // kallsyms unreadable, or its addresses hidden (kptr_restrict): not this cause.
        assert_eq!(KernelData::parse("").note(), None);
        assert_eq!(KernelData::parse("0000000000000000 T _text\n").note(), None);
    }

    #[test]
    fn data_objects_are_named_with_member_offsets() {
        let data = FileData {
            segments: Vec::new(),
            objects: vec![(0x1000, 40, "table_lock".into()), (0x2000, 8, "flag".into())],
        };
        assert_eq!(data.object_at(0x1000).as_deref(), Some("table_lock"));
        assert_eq!(data.object_at(0x1010).as_deref(), Some("table_lock+0x10"));
        assert_eq!(data.object_at(0x1028), None);
        assert_eq!(data.object_at(0xfff), None);
        assert_eq!(data.object_at(0x2004).as_deref(), Some("flag+0x4"));
    }
}
