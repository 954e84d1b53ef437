//! Code nothing names, placed: in the function its file's unwind table bounds (one `.eh_frame`
//! FDE per function, as compilers emit them; else `.debug_frame`'s), else by its address.
use super::{Frame, NameKind, ObjectRef};
use crate::{process::map_file, unwind::fde_ranges};

/// Function bounds of one file, `(start, end)` in its virtual addresses, sorted by start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FunctionBounds(Vec<(u64, u64)>);

impl FunctionBounds {
    /// From the file's own frame information; none where it has none (or it is corrupt).
    pub fn of_file(file: &object::File<'_>) -> FunctionBounds {
        match fde_ranges(file) {
            Ok(ranges) => FunctionBounds::new(ranges),
            Err(e) => {
                log::debug!("no function bounds: {e}");
                FunctionBounds::default()
            }
        }
    }

    /// The file's, read from it (mapped and parsed once, not kept mapped).
    pub fn read(path: &std::path::Path) -> FunctionBounds {
        let data = match map_file(path) {
            Ok(data) => data,
            Err(e) => {
                log::debug!("{}: {e}", path.display());
                return FunctionBounds::default();
            }
        };
        match object::File::parse(&*data) {
            Ok(file) => FunctionBounds::of_file(&file),
            Err(_) => FunctionBounds::default(),
        }
    }

    /// Empty and reversed ranges are no function; overlapping ones are kept as they are (the
    /// one that starts last, before the address, is the one it is in).
    pub fn new(mut ranges: Vec<(u64, u64)>) -> FunctionBounds {
        ranges.retain(|(start, end)| start < end);
        ranges.sort_unstable();
        ranges.dedup();
        FunctionBounds(ranges)
    }

    /// The function the address is in: the last that starts at or before it, if it ends after.
    pub fn containing(&self, vaddr: u64) -> Option<(u64, u64)> {
        let after = self.0.partition_point(|&(start, _)| start <= vaddr);
        let &(start, end) = self.0.get(after.checked_sub(1)?)?;
        (vaddr < end).then_some((start, end))
    }

    /// The function that starts exactly there (what `--annotate module+0x…` names).
    pub fn starting_at(&self, vaddr: u64) -> Option<(u64, u64)> {
        let at = self.0.partition_point(|&(start, _)| start < vaddr);
        self.0.get(at).copied().filter(|&(start, _)| start == vaddr)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The frame of an address nothing named, at `object` in `module`'s file (mapped at
/// `address`): placed in the function `bounds` holds it in (`module+0x<function start>`, kind
/// `Fde`), else by its own virtual address (`module+0x<vaddr>`, kind `Address`); `[unknown]`
/// where no segment holds its file offset.
pub(super) fn placed_frame(module: &str, address: u64, object: ObjectRef, bounds: &FunctionBounds) -> Frame {
    let unknown = Frame::unknown(module, address, false);
    let Some(vaddr) = object.vaddr else {
        return Frame {
            object: Some(object),
            ..unknown
        };
    };
    match bounds.containing(vaddr) {
        Some((start, _)) => Frame {
            function: Frame::placed_name(module, start),
            start: Some(start),
            offset: Some(vaddr - start),
            kind: NameKind::Fde,
            object: Some(object),
            ..unknown
        },
        None => Frame {
            function: Frame::placed_name(module, vaddr),
            kind: NameKind::Address,
            object: Some(object),
            ..unknown
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_in_the_function_that_starts_before_it_and_ends_after() {
        // As a compiler emits them: out of order, one gap (0x1040..0x1100), a `.cold` part far
        // away, an empty entry and one duplicate.
        let bounds = FunctionBounds::new(vec![
            (0x1100, 0x1180),
            (0x1000, 0x1040),
            (0x2000, 0x2010),
            (0x1500, 0x1500),
            (0x1000, 0x1040),
        ]);
        assert_eq!(bounds.len(), 3);
        let cases = [
            (0x1000, Some((0x1000, 0x1040))), // start
            (0x1023, Some((0x1000, 0x1040))), // middle
            (0x103f, Some((0x1000, 0x1040))), // last byte
            (0x1040, None),                   // end: the gap begins
            (0x10ff, None),                   // gap
            (0x1100, Some((0x1100, 0x1180))),
            (0x1500, None), // the empty entry is no function
            (0x0fff, None), // before the first
            (0x2010, None), // after the last
            (u64::MAX, None),
        ];
        for (vaddr, want) in cases {
            assert_eq!(bounds.containing(vaddr), want, "{vaddr:#x}");
        }
        assert_eq!(bounds.starting_at(0x1100), Some((0x1100, 0x1180)));
        assert_eq!(bounds.starting_at(0x1101), None);
        assert!(FunctionBounds::default().containing(0).is_none());
    }

    #[inline(never)]
    fn placed_function_for_bounds_test(x: u64) -> u64 {
        std::hint::black_box(x).wrapping_mul(3)
    }

    #[test]
    fn this_binarys_functions_are_bounded_by_their_symbols() {
        // Ground truth: the symbol table of the test binary itself. Every sized function symbol
        // that an FDE covers starts one (compilers emit one FDE per function).
        placed_function_for_bounds_test(1);
        let data = std::fs::read("/proc/self/exe").unwrap();
        let file = object::File::parse(&*data).unwrap();
        let bounds = FunctionBounds::of_file(&file);
        assert!(bounds.len() > 1000, "{} FDEs", bounds.len());
        use object::{Object as _, ObjectSymbol as _};
        let symbol = file
            .symbols()
            .find(|s| {
                s.name()
                    .is_ok_and(|n| n.contains("placed_function_for_bounds_test"))
            })
            .expect("the test function's symbol");
        let (start, end) = (symbol.address(), symbol.address() + symbol.size());
        println!("symbol {start:#x}..{end:#x}");
        assert_eq!(bounds.containing(start), Some((start, end)));
        assert_eq!(bounds.containing(end - 1), Some((start, end)));
        assert_eq!(bounds.starting_at(start), Some((start, end)));
    }
}
