//! Just enough of the kernel's BTF to find where `task_struct` keeps the fields the sched
//! programs read. Their BTF and raw tracepoints hand them `task_struct` pointers, not the
//! pre-formatted record of the classic tracepoints, which saves the record's construction on
//! every context switch; the price is that the field offsets differ per kernel build and must
//! come from its BTF (aya's BTF type accessors are not public).
//!
//! Format: <https://docs.kernel.org/bpf/btf.html> — a header, a type section of variable-length
//! records (type ids count from 1 in order), and a string section.
use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, ensure, Context};

pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

/// The running kernel's BTF: `$BPFPROF_BTF` where set (a kernel without `/sys/kernel/btf/vmlinux`
/// can use a BTF file generated for it, e.g. from BTFHub), else the kernel's own.
pub fn kernel_btf_path() -> std::path::PathBuf {
    std::env::var_os("BPFPROF_BTF")
        .map(Into::into)
        .unwrap_or_else(|| VMLINUX.into())
}

/// The kernel's own BTF as aya reads it, to load BTF tracepoints against: a program names its
/// tracepoint by a type id of the kernel's own BTF, which a file given in `BPFPROF_BTF` (read for
/// offsets) need not number alike.
pub fn kernel_btf() -> Result<aya::Btf, crate::error::UserError> {
    aya::Btf::from_sys_fs().map_err(|e| {
        crate::error::UserError::NoBtf(format!("{VMLINUX}, which its BTF tracepoints need: {e}"))
    })
}

const MAGIC: u16 = 0xeb9f;
/// How deep a type is followed (typedefs and qualifiers, anonymous structs within structs): the
/// kernel's own go a few levels; a crafted BTF's may loop.
const MAX_NESTING: u32 = 32;
/// Structs examined looking for one member (the kernel's task_struct: a few dozen).
const MAX_STRUCTS_SEARCHED: u32 = 4096;
const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;
const KIND_PTR: u32 = 2;

#[derive(Debug, Clone, Copy)]
struct Member {
    name_off: u32,
    type_id: u32,
    /// Bit offset within the enclosing struct.
    bit_offset: u32,
}

#[derive(Debug, Clone)]
struct Type {
    name_off: u32,
    kind: u32,
    /// Size in bytes for structs, unions and ints; the referenced type id for pointers,
    /// typedefs and modifiers.
    size_or_type: u32,
    /// Struct/union members; for a function prototype, one entry per parameter.
    members: Vec<Member>,
}

/// The types of one BTF blob, with struct and typedef names indexed.
#[derive(Debug)]
pub struct Btf {
    types: Vec<Type>,
    strings: Vec<u8>,
    by_name: HashMap<String, Vec<u32>>,
}

fn u32_at(data: &[u8], at: usize) -> anyhow::Result<u32> {
    let bytes = data
        .get(at..at + 4)
        .with_context(|| format!("truncated at byte {at}"))?;
    Ok(u32::from_le_bytes(bytes.try_into().unwrap()))
}

impl Btf {
    pub fn from_file(path: &Path) -> anyhow::Result<Btf> {
        let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        Btf::parse(&data).with_context(|| format!("parsing the BTF in {}", path.display()))
    }

    pub fn parse(data: &[u8]) -> anyhow::Result<Btf> {
        ensure!(data.len() >= 24, "shorter than a BTF header");
        let magic = u16::from_le_bytes([data[0], data[1]]);
        ensure!(
            magic == MAGIC,
            "bad magic {magic:#x} (big-endian BTF is not supported)"
        );
        let hdr_len = u32_at(data, 4)? as usize;
        let (type_off, type_len) = (u32_at(data, 8)? as usize, u32_at(data, 12)? as usize);
        let (str_off, str_len) = (u32_at(data, 16)? as usize, u32_at(data, 20)? as usize);
        let section = |off: usize, len: usize| {
            data.get(hdr_len + off..hdr_len + off + len)
                .context("section beyond the end of the data")
        };
        let type_data = section(type_off, type_len)?;
        let strings = section(str_off, str_len)?.to_vec();

        // Type id 0 is `void`.
        let mut types = vec![Type {
            name_off: 0,
            kind: 0,
            size_or_type: 0,
            members: Vec::new(),
        }];
        let mut at = 0;
        while at < type_data.len() {
            let name_off = u32_at(type_data, at)?;
            let info = u32_at(type_data, at + 4)?;
            let size_or_type = u32_at(type_data, at + 8)?;
            at += 12;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let kind_flag = info >> 31 == 1;
            let mut members = Vec::new();
            match kind {
                KIND_STRUCT | KIND_UNION => {
                    for _ in 0..vlen {
                        let offset = u32_at(type_data, at + 8)?;
                        members.push(Member {
                            name_off: u32_at(type_data, at)?,
                            type_id: u32_at(type_data, at + 4)?,
                            // With kind_flag the top 8 bits are a bitfield's size.
                            bit_offset: if kind_flag { offset & 0xff_ffff } else { offset },
                        });
                        at += 12;
                    }
                }
                KIND_FUNC_PROTO => {
                    for _ in 0..vlen {
                        members.push(Member {
                            name_off: u32_at(type_data, at)?,
                            type_id: u32_at(type_data, at + 4)?,
                            bit_offset: 0,
                        });
                        at += 8;
                    }
                }
                KIND_INT | KIND_VAR | KIND_DECL_TAG => at += 4,
                KIND_ARRAY => at += 12,
                KIND_ENUM => at += 8 * vlen,
                KIND_DATASEC | KIND_ENUM64 => at += 12 * vlen,
                0 | 20.. => bail!("unknown BTF kind {kind} for type id {}", types.len()),
                _ => {}
            }
            types.push(Type {
                name_off,
                kind,
                size_or_type,
                members,
            });
        }
        let mut btf = Btf {
            types,
            strings,
            by_name: HashMap::new(),
        };
        for id in 1..btf.types.len() as u32 {
            let t = &btf.types[id as usize];
            if matches!(t.kind, KIND_STRUCT | KIND_UNION | KIND_TYPEDEF) && t.name_off != 0 {
                let name = btf.name(t.name_off).to_string();
                btf.by_name.entry(name).or_default().push(id);
            }
        }
        Ok(btf)
    }

    fn name(&self, off: u32) -> &str {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or("")
    }

    fn named(&self, name: &str, kind: u32) -> Option<&Type> {
        self.by_name
            .get(name)?
            .iter()
            .map(|&id| &self.types[id as usize])
            .find(|t| t.kind == kind)
    }

    /// Through typedefs and qualifiers to the type they name.
    fn resolve(&self, mut id: u32) -> Option<&Type> {
        for _ in 0..MAX_NESTING {
            let t = self.types.get(id as usize)?;
            match t.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = t.size_or_type
                }
                _ => return Some(t),
            }
        }
        None
    }

    /// Byte offset of `member` in `struct name`, looking through anonymous structs and unions
    /// (where randomized or grouped fields live).
    pub fn member_offset(&self, name: &str, member: &str) -> Option<u32> {
        let t = self.named(name, KIND_STRUCT)?;
        let mut budget = MAX_STRUCTS_SEARCHED;
        let bits = self.find_member(t, member, 0, MAX_NESTING, &mut budget)?;
        (bits % 8 == 0).then_some(bits / 8)
    }

    /// At most `depth` anonymous structs deep, and `budget` structs in all: a crafted BTF's
    /// struct may contain itself, many times over.
    fn find_member(
        &self,
        t: &Type,
        member: &str,
        base_bits: u32,
        depth: u32,
        budget: &mut u32,
    ) -> Option<u32> {
        *budget = budget.checked_sub(1)?;
        for m in &t.members {
            if m.name_off != 0 && self.name(m.name_off) == member {
                return base_bits.checked_add(m.bit_offset);
            }
        }
        let depth = depth.checked_sub(1)?;
        t.members.iter().filter(|m| m.name_off == 0).find_map(|m| {
            let inner = self.resolve(m.type_id)?;
            let base = base_bits.checked_add(m.bit_offset)?;
            matches!(inner.kind, KIND_STRUCT | KIND_UNION)
                .then(|| self.find_member(inner, member, base, depth, budget))?
        })
    }

    /// Number of parameters of the function a `typedef ... (*name)(...)` points to: raw
    /// tracepoints are declared as `btf_trace_<event>` typedefs, whose first parameter is the
    /// probe's private data and the rest are the tracepoint's arguments.
    pub fn fn_pointer_params(&self, typedef: &str) -> Option<usize> {
        let t = self.named(typedef, KIND_TYPEDEF)?;
        let ptr = self.resolve(t.size_or_type)?;
        if ptr.kind != KIND_PTR {
            return None;
        }
        let proto = self.resolve(ptr.size_or_type)?;
        (proto.kind == KIND_FUNC_PROTO).then_some(proto.members.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A little BTF blob: `struct inner { int a; int b; }`,
    /// `struct outer { long x; struct { int y; int z; }; char name[16]; }` with `z` as a bitfield
    /// member, and `typedef void (*btf_trace_ev)(void *, int)`.
    fn blob() -> Vec<u8> {
        let mut strings = b"\0int\0outer\0x\0y\0z\0name\0btf_trace_ev\0long\0char\0".to_vec();
        strings.push(0);
        let off = |s: &str| {
            let needle = [s.as_bytes(), b"\0"].concat();
            strings.windows(needle.len()).position(|w| w == needle).unwrap() as u32
        };
        let mut types = Vec::new();
        let mut push = |words: &[u32]| types.extend(words.iter().flat_map(|w| w.to_le_bytes()));
        // 1: int
        push(&[off("int"), KIND_INT << 24, 4, 32]);
        // 2: long
        push(&[off("long"), KIND_INT << 24, 8, 64]);
        // 3: char
        push(&[off("char"), KIND_INT << 24, 1, 8]);
        // 4: char[16]
        push(&[0, KIND_ARRAY << 24, 0, 3, 1, 16]);
        // 5: anonymous struct { int y; int z:8 (kind_flag) }
        push(&[0, (1 << 31) | (KIND_STRUCT << 24) | 2, 8]);
        push(&[off("y"), 1, 0]);
        push(&[off("z"), 1, (8 << 24) | 32]);
        // 6: struct outer { long x; <anon 5>; char name[16]; }
        push(&[off("outer"), (KIND_STRUCT << 24) | 3, 32]);
        push(&[off("x"), 2, 0]);
        push(&[0, 5, 64]);
        push(&[off("name"), 4, 128]);
        // 7: void *, 8: func proto (void *, int), 9: pointer to 8, 10: typedef btf_trace_ev
        push(&[0, KIND_PTR << 24, 0]);
        push(&[0, (KIND_FUNC_PROTO << 24) | 2, 0, 0, 7, 0, 1]);
        push(&[0, KIND_PTR << 24, 8]);
        push(&[off("btf_trace_ev"), KIND_TYPEDEF << 24, 9]);

        let mut data = Vec::new();
        data.extend(MAGIC.to_le_bytes());
        data.extend([1u8, 0]);
        for word in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            data.extend(word.to_le_bytes());
        }
        data.extend(types);
        data.extend(strings);
        data
    }

    #[test]
    fn finds_members_through_anonymous_structs_and_bitfield_encodings() {
        let btf = Btf::parse(&blob()).unwrap();
        assert_eq!(btf.member_offset("outer", "x"), Some(0));
        assert_eq!(btf.member_offset("outer", "y"), Some(8));
        assert_eq!(btf.member_offset("outer", "z"), Some(12));
        assert_eq!(btf.member_offset("outer", "name"), Some(16));
        assert_eq!(btf.member_offset("outer", "missing"), None);
        assert_eq!(btf.member_offset("nothere", "x"), None);
        assert_eq!(btf.fn_pointer_params("btf_trace_ev"), Some(2));
    }

    #[test]
    fn rejects_what_is_not_btf() {
        assert!(Btf::parse(b"not btf at all, but long enough").is_err());
        let mut truncated = blob();
        truncated.truncate(40);
        assert!(Btf::parse(&truncated).is_err());
    }

    /// The running kernel's own BTF (the machines this project supports have it).
    #[test]
    fn reads_the_running_kernels_task_struct() {
        let btf = Btf::from_file(Path::new(VMLINUX)).unwrap();
        let pid = btf.member_offset("task_struct", "pid").unwrap();
        let tgid = btf.member_offset("task_struct", "tgid").unwrap();
        let comm = btf.member_offset("task_struct", "comm").unwrap();
        assert_eq!(tgid, pid + 4, "pid and tgid are adjacent in task_struct");
        assert!(comm > tgid);
        assert!(btf.fn_pointer_params("btf_trace_sched_switch").unwrap() >= 4);
    }
}
