//! Frames in the vDSO, named from the kernel's image as this process maps it.
use blazesym::{
    symbolize::{source::Process, source::Source, Input, Symbolized},
    Pid,
};

use super::{bounds, frames_of, Frame, ObjectRef, Symbolizer};
use crate::process::UserAddr;

impl Symbolizer {
    /// Frames in the vDSO, named by its own symbols (`__vdso_clock_gettime`): every 64-bit
    /// process maps the kernel's one image, so an offset into a target's vDSO is named at the
    /// same offset into this process's (what blazesym reads), whether or not the target still
    /// runs. (A 32-bit process's vDSO, another image, is not taken for one: `process`.)
    pub(super) fn vdso_frames(&self, addrs: &[UserAddr]) -> Vec<Vec<Frame>> {
        let unknown = |a: &UserAddr| vec![Frame::unknown("[vdso]", a.addr(), false)];
        let own = match crate::process::own_vdso() {
            Some(own) if !addrs.is_empty() => own,
            _ => return addrs.iter().map(unknown).collect(),
        };
        let own_addrs: Vec<u64> = addrs
            .iter()
            .map(|a| match *a {
                UserAddr::Vdso { offset, .. } if offset < own.range.end - own.range.start => {
                    own.range.start + offset
                }
                _ => 0,
            })
            .collect();
        let source = Source::Process(Process {
            debug_syms: false,
            perf_map: false,
            map_files: false,
            vdso: true,
            ..Process::new(Pid::Slf)
        });
        let symbolizer = self.kernel.borrow();
        let Ok(results) = symbolizer.symbolize(&source, Input::AbsAddr(&own_addrs)) else {
            return addrs.iter().map(unknown).collect();
        };
        let mut placed = None;
        addrs
            .iter()
            .zip(&results)
            .map(|(a, result)| match (result, a) {
                (Symbolized::Unknown(_), UserAddr::Vdso { offset, addr }) => {
                    let placed = placed.get_or_insert_with(VdsoPlaces::read);
                    vec![placed.frame(*offset, *addr)]
                }
                _ => frames_of(result, "[vdso]", a.addr(), false, None),
            })
            .collect()
    }
}

/// Where the vDSO's code that its symbols leave out is (arm64's static helpers): placed in the
/// function its `.eh_frame` bounds, `[vdso]+0x<start>`, as a stripped file's code is.
struct VdsoPlaces {
    bounds: bounds::FunctionBounds,
    /// (file offset, virtual address) of the image's first loadable segment.
    base: Option<(u64, u64)>,
}

impl VdsoPlaces {
    fn read() -> Self {
        use object::{Object as _, ObjectSegment as _};
        let image = crate::process::own_vdso().map_or(&[][..], |own| &own.image);
        let Ok(file) = object::File::parse(image) else {
            return Self {
                bounds: bounds::FunctionBounds::default(),
                base: None,
            };
        };
        let base = file.segments().next().map(|s| (s.file_range().0, s.address()));
        Self {
            bounds: bounds::FunctionBounds::of_file(&file),
            base,
        }
    }

    fn frame(&self, offset: u64, address: u64) -> Frame {
        let object = ObjectRef {
            build_id: None,
            file_offset: Some(offset),
            vaddr: self
                .base
                .and_then(|(file, vaddr)| (offset + vaddr).checked_sub(file)),
        };
        bounds::placed_frame("[vdso]", address, object, &self.bounds)
    }
}
