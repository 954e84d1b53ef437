//! glibc's condition variable, seen through its futexes. A waiter sleeps on one of the two words
//! of `__g_signals` (one per group of waiters, the groups taking turns), so the futex source sees
//! one `pthread_cond_t` as two futexes four bytes apart; a signaller may also sleep on another of
//! its words (glibc up to 2.40 waits in `__condvar_quiesce_and_switch_g1` for the old group's
//! waiters to leave, on `__g_refs`; any version on its internal lock, or in
//! `pthread_cond_destroy`). All are one condition variable: one entry, its whole wait, at the
//! condition variable's own address.
//!
//! Where `__g_signals` lies in the 48-byte, 8-aligned `pthread_cond_t`: at offset 40 from glibc
//! 2.25 (the current algorithm) to 2.40; glibc 2.41 dropped `__g_refs` and moved it to 32. Either
//! way its two words fill one aligned 8-byte slot, so a waiter's word gives the condition
//! variable's address; the other words' waits join the condition variable they lie in.
use std::collections::HashMap;

use super::{HolderStat, LockContext, LockStat, WaiterStat};
use crate::process::FileId;

/// `__g_signals`' offset in glibc up to 2.40, and from 2.41 on.
const SIGNALS_UP_TO_2_40: u64 = 40;
const SIGNALS_FROM_2_41: u64 = 32;
/// `sizeof(pthread_cond_t)`.
const CONDVAR_SIZE: u64 = 48;

/// Which word of a glibc condition variable an entry's waits were on, from its waiting stacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Word {
    /// `__g_signals`: a thread in `pthread_cond_wait` (or its timed forms) waiting to be signalled.
    Signals,
    /// Another word: a signaller, `pthread_cond_destroy`, or the condition variable's own lock.
    Internal,
    /// Not glibc's (Rust's std, parking_lot: the futex word is the condition variable itself).
    NotGlibc,
}

/// The innermost glibc condition-variable function its waiting stacks were in says which word
/// (the first stack that names one: a stack cut short names none).
fn word_of(lock: &LockStat) -> Word {
    let innermost = lock.waiters.iter().find_map(|w| {
        w.frames.iter().rev().find_map(|f| {
            let name = f.function.trim_start_matches('_');
            (name.starts_with("pthread_cond") || name.starts_with("condvar_")).then_some(name)
        })
    });
    match innermost {
        None => Word::NotGlibc,
        Some(name) if name.starts_with("condvar_") => Word::Internal,
        Some(name)
            if ["wait", "timedwait", "clockwait"]
                .iter()
                .any(|w| name.contains(w)) =>
        {
            Word::Signals
        }
        Some(_) => Word::Internal,
    }
}

/// One entry per condition variable: the entries of one `pthread_cond_t`'s words (kind
/// "condvar", same process image) merged at the condition variable's address. An internal word
/// with no waiter's word beside it stays as it was (its condition variable's address unknown),
/// and so does every other entry.
pub(super) fn one_entry_per_condvar(locks: Vec<LockStat>, context: &dyn LockContext) -> Vec<LockStat> {
    let mut layouts = Layouts::default();
    let mut merged: Vec<LockStat> = Vec::with_capacity(locks.len());
    let mut at: HashMap<(u32, u32, u64), usize> = HashMap::new();
    let mut internal = Vec::new();
    for mut lock in locks {
        let word = match lock.kind == "condvar" && lock.address % 4 == 0 && lock.instance == 0 {
            true => word_of(&lock),
            false => Word::NotGlibc,
        };
        match word {
            Word::NotGlibc => merged.push(lock),
            Word::Internal => internal.push(lock),
            Word::Signals => {
                let signals = layouts.signals_offset(context, lock.pid, lock.exec_generation);
                lock.address = (lock.address & !7).wrapping_sub(signals);
                let key = (lock.pid, lock.exec_generation, lock.address);
                match at.get(&key) {
                    Some(&i) => absorb(&mut merged[i], lock),
                    None => {
                        at.insert(key, merged.len());
                        merged.push(lock);
                    }
                }
            }
        }
    }
    for lock in internal {
        let within = at.iter().find(|((pid, generation, base), _)| {
            (*pid, *generation) == (lock.pid, lock.exec_generation)
                && (*base..base.saturating_add(CONDVAR_SIZE)).contains(&lock.address)
        });
        match within {
            Some((_, &i)) => absorb(&mut merged[i], lock),
            None => merged.push(lock),
        }
    }
    merged
}

/// `other`'s waits and wakes added to `into` (the same condition variable); stacks seen on both
/// words become one.
fn absorb(into: &mut LockStat, other: LockStat) {
    into.flags |= other.flags;
    into.contentions += other.contentions;
    into.waiting_at_stop += other.waiting_at_stop;
    into.total_wait_ns += other.total_wait_ns;
    into.max_wait_ns = into.max_wait_ns.max(other.max_wait_ns);
    for waiter in other.waiters {
        match into.waiters.iter_mut().find(|w| w.frames == waiter.frames) {
            Some(same) => add_waiter(same, &waiter),
            None => into.waiters.push(waiter),
        }
    }
    for holder in other.holders {
        match into.holders.iter_mut().find(|h| h.frames == holder.frames) {
            Some(same) => add_holder(same, &holder),
            None => into.holders.push(holder),
        }
    }
}

fn add_waiter(into: &mut WaiterStat, other: &WaiterStat) {
    into.contentions += other.contentions;
    into.total_wait_ns += other.total_wait_ns;
    into.max_wait_ns = into.max_wait_ns.max(other.max_wait_ns);
}

fn add_holder(into: &mut HolderStat, other: &HolderStat) {
    into.wakes += other.wakes;
    into.total_wait_ns += other.total_wait_ns;
}

/// The glibc version of each C library a process maps, read once per file.
#[derive(Default)]
struct Layouts {
    minor_of: HashMap<FileId, Option<u32>>,
}

impl Layouts {
    /// Where `__g_signals` lies for this process's C library (glibc up to 2.40 where it cannot
    /// be told: a static binary, an unreadable file).
    fn signals_offset(&mut self, context: &dyn LockContext, pid: u32, generation: u32) -> u64 {
        let files = context.files();
        let libc = context
            .mapped_files(pid, generation)
            .into_iter()
            .map(|(id, _, _)| id)
            .find(|&id| files.file(id).is_some_and(|f| is_libc(&f.path)));
        let minor = libc.and_then(|id| {
            *self
                .minor_of
                .entry(id)
                .or_insert_with(|| files.file(id).and_then(|f| glibc_minor(&f.read_path())))
        });
        match minor {
            Some(minor) if minor >= 41 => SIGNALS_FROM_2_41,
            _ => SIGNALS_UP_TO_2_40,
        }
    }
}

fn is_libc(path: &str) -> bool {
    let name = crate::report::short_module(path);
    name.starts_with("libc.so") || (name.starts_with("libc-2.") && name.ends_with(".so"))
}

/// The newest `GLIBC_2.N` symbol version a C library defines: its own version (every release
/// that adds a symbol adds its version; a release that added none is one whose layout is that of
/// the release before it, which is all this is asked for).
fn glibc_minor(path: &std::path::Path) -> Option<u32> {
    use object::{Object as _, ObjectSection as _};
    let bytes = crate::process::map_file(path).ok()?;
    let file = object::File::parse(&*bytes).ok()?;
    let dynstr = file.section_by_name(".dynstr")?.data().ok()?;
    newest_glibc_version(dynstr)
}

fn newest_glibc_version(strings: &[u8]) -> Option<u32> {
    strings
        .split(|&b| b == 0)
        .filter_map(|s| s.strip_prefix(b"GLIBC_2."))
        .filter_map(|rest| {
            let digits: Vec<u8> = rest.iter().copied().take_while(u8::is_ascii_digit).collect();
            std::str::from_utf8(&digits).ok()?.parse().ok()
        })
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::{FileSnapshot, FileTable};

    /// A process without a readable C library (as a static binary): glibc up to 2.40.
    struct NoLibc(FileSnapshot);

    impl LockContext for NoLibc {
        fn comm(&self, _pid: u32) -> String {
            "w".into()
        }
        fn mapped_files(&self, _pid: u32, _generation: u32) -> Vec<(FileId, u64, u64)> {
            Vec::new()
        }
        fn files(&self) -> &dyn FileTable {
            &self.0
        }
    }

    fn entry(address: u64, kind: &'static str, waits: &[(&str, u64)]) -> LockStat {
        let waiters: Vec<WaiterStat> = waits
            .iter()
            .map(|&(function, ns)| WaiterStat {
                frames: function.split(' ').map(crate::model::tests::frame).collect(),
                contentions: 1,
                total_wait_ns: ns,
                max_wait_ns: ns,
            })
            .collect();
        LockStat {
            pid: 7,
            comm: "w".into(),
            address,
            kind,
            contentions: waiters.len() as u64,
            total_wait_ns: waiters.iter().map(|w| w.total_wait_ns).sum(),
            max_wait_ns: waiters.iter().map(|w| w.max_wait_ns).max().unwrap_or(0),
            waiters,
            ..LockStat::default()
        }
    }

    #[test]
    fn both_signal_words_are_one_condvar_at_its_own_address() {
        // As measured on Debian 12's glibc 2.36: `pthread_cond_t` at 0x40a0, waits on 0x40c8 and 0x40cc.
        let context = NoLibc(FileSnapshot::default());
        const WAIT: &str = "consumer ___pthread_cond_wait __futex_abstimed_wait_common";
        let locks = vec![
            entry(
                0x40c8,
                "condvar",
                &[(WAIT, 300), ("other pthread_cond_timedwait", 5)],
            ),
            entry(0x40cc, "condvar", &[(WAIT, 200)]),
            entry(0x40e0, "mutex", &[("consumer", 50)]),
            // The signaller waiting for the old group's waiters to leave (`__g_refs[1]`).
            entry(
                0x40b4,
                "condvar",
                &[(
                    "producer ___pthread_cond_signal __condvar_quiesce_and_switch_g1",
                    7,
                )],
            ),
            // Another condition variable, one slot further on.
            entry(0x40f8 + 40, "condvar", &[(WAIT, 1)]),
            // Rust's condition variable waits on its own word.
            entry(
                0x5004,
                "condvar",
                &[("std::sys::sync::condvar::futex::Condvar::wait", 9)],
            ),
        ];
        let mut merged = one_entry_per_condvar(locks, &context);
        merged.sort_by_key(|l| l.address);
        let addresses: Vec<u64> = merged.iter().map(|l| l.address).collect();
        assert_eq!(addresses, [0x40a0, 0x40e0, 0x40f8, 0x5004]);
        let cond = &merged[0];
        assert_eq!(
            (cond.contentions, cond.total_wait_ns, cond.max_wait_ns),
            (4, 512, 300)
        );
        // The stack seen on both words is one waiting stack; the signaller's is another.
        assert_eq!(cond.waiters.len(), 3);
        let consumer = cond
            .waiters
            .iter()
            .find(|w| w.frames[0].function == "consumer")
            .unwrap();
        assert_eq!((consumer.contentions, consumer.total_wait_ns), (2, 500));
        assert_eq!(merged[1].total_wait_ns, 50, "a mutex is left as it is");
        assert_eq!(
            merged[3].total_wait_ns, 9,
            "Rust's condition variable is its own word"
        );
    }

    #[test]
    fn the_c_library_says_its_version() {
        assert_eq!(
            newest_glibc_version(b"\0GLIBC_2.2.5\0GLIBC_2.36\0GLIBC_PRIVATE\0GLIBC_2.4\0"),
            Some(36)
        );
        assert_eq!(newest_glibc_version(b"GLIBC_2.41\0GLIBC_2.3.4\0"), Some(41));
        assert_eq!(newest_glibc_version(b"libm.so.6\0"), None);
        assert!(is_libc("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(is_libc("/lib64/libc-2.17.so"));
        assert!(!is_libc("/usr/lib/libcap.so.2"));
        // This machine's own C library is read (Debian 12: 2.36).
        let libc = match cfg!(target_arch = "aarch64") {
            true => "/lib/aarch64-linux-gnu/libc.so.6",
            false => "/lib/x86_64-linux-gnu/libc.so.6",
        };
        assert!(glibc_minor(std::path::Path::new(libc)).is_some_and(|m| m >= 17));
    }
}
