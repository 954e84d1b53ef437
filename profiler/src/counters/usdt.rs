//! USDT probes (`usdt:FILE:PROVIDER:NAME`): the static probe sites a program was built with,
//! described in its `.note.stapsdt` notes (SystemTap's format, as DTRACE_PROBE and sys/sdt.h
//! write them). Each note gives the probe's address (moved by the difference between its
//! `.stapsdt.base` section's address and the base recorded in the note, should the file have
//! been prelinked) and its semaphore's, a counter the program tests before preparing the probe's
//! arguments: the kernel raises it in every process while a probe on the site is attached
//! (`ref_ctr_offset`), and lowers it after.
use object::{
    read::elf::{ElfFile64, SectionHeader as _},
    Endianness, Object as _, ObjectSection as _,
};

/// One USDT probe site, as the kernel's uprobe PMU takes it: file offsets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    pub provider: String,
    pub name: String,
    /// The site's instruction, as an address of the file's and (`crate::counters::probe`
    /// converts) its offset.
    pub address: u64,
    /// Its semaphore's address, if it has one.
    pub semaphore: Option<u64>,
    /// Its arguments as the note spells them (`8@%rbp -4@112(%rsp)`; see `parse_arg_at`).
    pub args: String,
}

const NT_STAPSDT: u32 = 3;

/// Every USDT site of an ELF file (none when it has no `.note.stapsdt`, or is not 64-bit ELF).
pub fn sites(object: &object::File<'_>, data: &[u8]) -> Vec<Site> {
    let Ok(elf) = ElfFile64::<Endianness>::parse(data) else {
        return Vec::new();
    };
    let base = object.section_by_name(".stapsdt.base").map(|s| s.address());
    let endian = elf.endian();
    let mut found = Vec::new();
    for section in elf.elf_section_table().iter() {
        let Ok(Some(mut notes)) = section.notes(endian, data) else {
            continue;
        };
        while let Ok(Some(note)) = notes.next() {
            if note.name() != b"stapsdt" || note.n_type(endian) != NT_STAPSDT {
                continue;
            }
            if let Some(site) = parse(note.desc(), endian, base) {
                found.push(site);
            }
        }
    }
    found
}

/// A note's description: three addresses (the site, the base it was linked at, the
/// semaphore), then the provider, the name and the arguments, each NUL-terminated.
fn parse(desc: &[u8], endian: Endianness, base: Option<u64>) -> Option<Site> {
    let word = |i: usize| -> Option<u64> {
        let bytes: [u8; 8] = desc.get(i * 8..i * 8 + 8)?.try_into().ok()?;
        Some(match endian {
            Endianness::Little => u64::from_le_bytes(bytes),
            Endianness::Big => u64::from_be_bytes(bytes),
        })
    };
    let (pc, linked_base, semaphore) = (word(0)?, word(1)?, word(2)?);
    let mut strings = desc.get(24..)?.split(|b| *b == 0);
    let provider = String::from_utf8_lossy(strings.next()?).into_owned();
    let name = String::from_utf8_lossy(strings.next()?).into_owned();
    let args = String::from_utf8_lossy(strings.next().unwrap_or_default()).into_owned();
    let address = match base {
        Some(base) if linked_base != 0 => pc.wrapping_add(base).wrapping_sub(linked_base),
        _ => pc,
    };
    Some(Site {
        provider,
        name,
        address,
        semaphore: (semaphore != 0).then_some(semaphore),
        args,
    })
}

/// Arguments of one probe at most (sys/sdt.h's own limit).
pub const MAX_ARGS: usize = 12;

/// One argument of a USDT probe: where its value is when the probe fires, and its size in bytes
/// (1, 2, 4 or 8), signed or not (`-4@` is a signed `int`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arg {
    pub size: u8,
    pub signed: bool,
    pub at: Location,
}

/// Where an argument is: the compiler chose (sys/sdt.h's `nor` constraint) a register, memory
/// at a register plus an offset, or a constant; on x86-64 also a global, relative to the probed
/// instruction (`counter(%rip)`). Registers are byte offsets in the probe's `pt_regs`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    Register(u16),
    Memory { base: u16, offset: i64 },
    Constant(i64),
    Global { symbol: String, offset: i64 },
}

/// Argument `n` of a note's arguments (`8@%rbp 8@%r12 -4@%eax`, AArch64's `-4@x1 8@[sp, 16]`),
/// as an `Arg`; one this cannot place (an indexed address, a high-byte register) is refused with
/// its spelling. The others are left unread, so such an argument does not keep them from being
/// read.
pub fn parse_arg_at(text: &str, n: usize, aarch64: bool) -> Result<Arg, String> {
    let args = split_args(text);
    match args.get(n) {
        Some(arg) => parse_arg(arg, aarch64).ok_or_else(|| format!("argument `{arg}` is not read yet")),
        None if args.is_empty() => Err("this USDT probe has no arguments".into()),
        None => Err(format!(
            "this USDT probe has arg0..arg{} (counted from 0, as its note and bpftrace count them)",
            args.len() - 1
        )),
    }
}

/// The arguments, split at the spaces between them (not those inside AArch64's `[sp, 16]`).
pub fn split_args(text: &str) -> Vec<&str> {
    let (mut args, mut start, mut depth) = (Vec::new(), 0, 0);
    for (i, c) in text.char_indices() {
        match c {
            '[' | '(' => depth += 1,
            ']' | ')' => depth -= 1,
            ' ' if depth == 0 => {
                args.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    args.push(&text[start..]);
    args.retain(|a| !a.is_empty());
    args
}

fn parse_arg(text: &str, aarch64: bool) -> Option<Arg> {
    let (size, operand) = match text.split_once('@') {
        Some((size, operand)) => (size.parse::<i8>().ok()?, operand),
        // An old note without sizes: a word.
        None => (8, text),
    };
    let bytes = size.unsigned_abs();
    if ![1, 2, 4, 8].contains(&bytes) {
        return None;
    }
    let at = match aarch64 {
        false => x86_64_operand(operand)?,
        true => aarch64_operand(operand)?,
    };
    Some(Arg {
        size: bytes,
        signed: size < 0,
        at,
    })
}

/// `%reg`, `$NUMBER`, `OFFSET(%reg)`, `SYMBOL+OFFSET(%rip)` (AT&T syntax).
fn x86_64_operand(text: &str) -> Option<Location> {
    if let Some(register) = text.strip_prefix('%') {
        return x86_64_register(register).map(Location::Register);
    }
    if let Some(number) = text.strip_prefix('$') {
        return signed_number(number).map(Location::Constant);
    }
    let (displacement, base) = text.strip_suffix(')')?.split_once('(')?;
    let base = base.strip_prefix('%')?;
    if base == "rip" {
        let (symbol, offset) = match displacement.find(['+', '-']) {
            Some(at) => (&displacement[..at], signed_number(&displacement[at..])?),
            None => (displacement, 0),
        };
        return (!symbol.is_empty() && signed_number(symbol).is_none()).then(|| Location::Global {
            symbol: symbol.to_string(),
            offset,
        });
    }
    Some(Location::Memory {
        base: x86_64_register(base)?,
        offset: match displacement {
            "" => 0,
            d => signed_number(d)?,
        },
    })
}

/// Where x86-64's `struct pt_regs` keeps the instruction pointer.
pub const X86_64_IP: u16 = 128;

/// A general register by any of its names (`rax`, `eax`, `ax`, `al`; `r8`..`r8b`), as its
/// offset in x86-64's `struct pt_regs`; the high bytes (`ah`) are not one.
fn x86_64_register(name: &str) -> Option<u16> {
    const NAMES: [([&str; 4], u16); 9] = [
        (["rbp", "ebp", "bp", "bpl"], 32),
        (["rbx", "ebx", "bx", "bl"], 40),
        (["rax", "eax", "ax", "al"], 80),
        (["rcx", "ecx", "cx", "cl"], 88),
        (["rdx", "edx", "dx", "dl"], 96),
        (["rsi", "esi", "si", "sil"], 104),
        (["rdi", "edi", "di", "dil"], 112),
        (["rip", "eip", "ip", "ip"], X86_64_IP),
        (["rsp", "esp", "sp", "spl"], 152),
    ];
    if let Some(number) = name.strip_prefix('r') {
        let digits = number.trim_end_matches(['d', 'w', 'b']);
        if let Ok(n @ 8..=15) = digits.parse::<u16>() {
            // r15 is first in pt_regs, r8 tenth: r15 r14 r13 r12 rbp rbx r11 r10 r9 r8.
            let offsets = [72, 64, 56, 48, 24, 16, 8, 0];
            return (digits.len() + 1 >= number.len()).then(|| offsets[usize::from(n - 8)]);
        }
    }
    NAMES
        .iter()
        .find(|(names, _)| names.contains(&name))
        .map(|(_, offset)| *offset)
}

/// `xN`/`wN`, `sp`, `[REG]`, `[REG, OFFSET]`, `NUMBER` (GNU AArch64 syntax; `#` optional).
fn aarch64_operand(text: &str) -> Option<Location> {
    if let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        let (base, offset) = match inner.split_once(',') {
            Some((base, offset)) => (base.trim(), signed_number(offset.trim().trim_start_matches('#'))?),
            None => (inner.trim(), 0),
        };
        return Some(Location::Memory {
            base: aarch64_register(base)?,
            offset,
        });
    }
    match aarch64_register(text) {
        Some(register) => Some(Location::Register(register)),
        None => signed_number(text.trim_start_matches('#')).map(Location::Constant),
    }
}

/// `x0`..`x30` (or their `w` halves) and `sp`, as offsets in AArch64's `struct user_pt_regs`.
fn aarch64_register(name: &str) -> Option<u16> {
    if name == "sp" {
        return Some(31 * 8);
    }
    let number = name.strip_prefix('x').or_else(|| name.strip_prefix('w'))?;
    match number.parse::<u16>() {
        Ok(n @ 0..=30) if !number.starts_with('+') => Some(n * 8),
        _ => None,
    }
}

/// `-16`, `112`, `0x10`, `-0x10`, `+8`.
fn signed_number(text: &str) -> Option<i64> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    // Digits only: from_str_radix would take a second sign (`-0x-8000000000000000`).
    let (digits, radix) = match digits.strip_prefix("0x") {
        Some(hex) => (hex, 16),
        None => (digits, 10),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let magnitude = i64::from_str_radix(digits, radix).ok()?;
    match negative {
        true => magnitude.checked_neg(),
        false => Some(magnitude),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Numbers as the assembler writes them, and the ones a crafted note may hold instead: a
    /// second sign (which from_str_radix took), the negation of i64::MIN (an overflow).
    #[test]
    fn signed_numbers_take_one_sign_and_never_overflow() {
        assert_eq!(signed_number("-16"), Some(-16));
        assert_eq!(signed_number("+8"), Some(8));
        assert_eq!(signed_number("-0x10"), Some(-16));
        assert_eq!(signed_number("0x-8000000000000000"), None);
        assert_eq!(signed_number("-0x-8000000000000000"), None);
        assert_eq!(signed_number("-0x8000000000000000"), None);
        assert_eq!(signed_number("--1"), None);
        assert_eq!(signed_number("1f"), None);
    }

    fn desc(pc: u64, base: u64, semaphore: u64, strings: &[u8]) -> Vec<u8> {
        [
            &pc.to_le_bytes()[..],
            &base.to_le_bytes(),
            &semaphore.to_le_bytes(),
            strings,
        ]
        .concat()
    }

    #[test]
    fn notes_give_the_site_moved_with_its_base_and_the_semaphore() {
        let note = desc(0x4287f3, 0x8cc5a0, 0xa8426e, b"python\0gc__start\0-4@112(%rsp)\0");
        let site = parse(&note, Endianness::Little, Some(0x8cc5a0)).unwrap();
        assert_eq!(
            site,
            Site {
                provider: "python".into(),
                name: "gc__start".into(),
                address: 0x4287f3,
                semaphore: Some(0xa8426e),
                args: "-4@112(%rsp)".into(),
            }
        );
        // Prelinked 0x1000 lower than the file now says: the site moves up with it.
        let moved = parse(&note, Endianness::Little, Some(0x8cd5a0)).unwrap();
        assert_eq!(moved.address, 0x4297f3);
        // No semaphore; a truncated note is none.
        let bare = parse(&desc(0x10, 0, 0, b"p\0n\0\0"), Endianness::Little, None).unwrap();
        assert_eq!((bare.address, bare.semaphore), (0x10, None));
        assert!(parse(&note[..20], Endianness::Little, None).is_none());
    }

    /// Every argument of a note, each read as `parse_arg_at` reads it.
    fn parse_args(text: &str, aarch64: bool) -> Result<Vec<Arg>, String> {
        (0..split_args(text).len())
            .map(|n| parse_arg_at(text, n, aarch64))
            .collect()
    }

    #[test]
    fn arguments_are_registers_memory_constants_or_globals() {
        use Location::*;
        let python = parse_args("8@%rbp 8@%r12 -4@%eax", false).unwrap();
        let at: Vec<_> = python.iter().map(|a| (a.size, a.signed, a.at.clone())).collect();
        assert_eq!(
            at,
            [
                (8, false, Register(32)),
                (8, false, Register(24)),
                (4, true, Register(80))
            ]
        );
        let memory = parse_args(
            "-4@112(%rsp) 2@-0x10(%r8w) 1@(%rdi) 8@$-5 4@line_value+4(%rip)",
            false,
        );
        let at: Vec<_> = memory.unwrap().into_iter().map(|a| a.at).collect();
        assert_eq!(
            at,
            [
                Memory {
                    base: 152,
                    offset: 112
                },
                Memory {
                    base: 72,
                    offset: -16
                },
                Memory { base: 112, offset: 0 },
                Constant(-5),
                Global {
                    symbol: "line_value".into(),
                    offset: 4
                },
            ]
        );
        assert_eq!(
            parse_args("8@%r15 4@%r10d 1@%sil", false).unwrap()[1].at,
            Register(56)
        );
        assert_eq!(parse_args("8@%r15", false).unwrap()[0].at, Register(0));
        let arm = parse_args("-4@w1 8@[sp, 16] 8@[x29, #-8] 8@[x2] 4@7 8@x30", true).unwrap();
        let at: Vec<_> = arm.into_iter().map(|a| a.at).collect();
        assert_eq!(
            at,
            [
                Register(8),
                Memory {
                    base: 248,
                    offset: 16
                },
                Memory {
                    base: 232,
                    offset: -8
                },
                Memory { base: 16, offset: 0 },
                Constant(7),
                Register(240),
            ]
        );
        assert!(parse_args("", false).unwrap().is_empty());
        for bad in [
            "8@%ah",
            "8@(%rax,%rbx,8)",
            "3@%rax",
            "8@%r16",
            "8@%r8x",
            "8@x31",
            "8@foo(%rax)",
            "x@%rax",
        ] {
            assert!(
                parse_args(bad, false).is_err() || parse_args(bad, true).is_err(),
                "{bad}"
            );
        }
        assert!(parse_args("8@%ah", false).is_err());
        assert!(parse_args("8@(%rax,%rbx,8)", false).is_err());
        assert!(parse_args("8@x31", true).is_err());
    }
}
