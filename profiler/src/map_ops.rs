//! Map commands aya offers no call for: an entry taken out (looked up and deleted in one step),
//! and a whole hash map read, or taken out, a batch of entries per system call (the kernel's
//! `BPF_MAP_LOOKUP_BATCH` and `BPF_MAP_LOOKUP_AND_DELETE_BATCH`, Linux 5.6). A drain that went
//! key by key made three calls per entry (next key, lookup, delete): under process churn, two
//! thousand a second. Where the kernel has no batches, key by key.
use std::{
    borrow::Borrow,
    io,
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd},
};

use aya::{
    maps::{HashMap as BpfHashMap, IterableMap as _, MapData},
    Pod,
};

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_LOOKUP_AND_DELETE_BATCH: libc::c_long = 25;
/// Entries asked for per call; grown for a hash bucket that holds more (the kernel never splits
/// one), up to `MOST`.
const FIRST: usize = 128;
const MOST: usize = 1 << 20;
/// A bucket index no hash map has (`out_batch` before a call).
const NOT_WRITTEN: u32 = u32::MAX;

/// `union bpf_attr` as the batch commands read it.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// `bpf(2)` on one element of a map, for the commands aya offers no call for on a map's type.
pub(crate) fn map_elem_call(
    cmd: libc::c_long,
    map_fd: BorrowedFd<'_>,
    key: *const u8,
    value: *mut u8,
) -> io::Result<()> {
    #[repr(C)]
    struct ElemAttr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        value: u64,
        flags: u64,
    }
    let attr = ElemAttr {
        map_fd: map_fd.as_raw_fd() as u32,
        _pad: 0,
        key: key as u64,
        value: value as u64,
        flags: 0,
    };
    // SAFETY: the attribute points at a live key and value of the map's sizes (the callers'
    // types are the map's) for the duration of the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            &attr as *const ElemAttr,
            std::mem::size_of::<ElemAttr>(),
        )
    };
    match ret {
        r if r < 0 => Err(io::Error::last_os_error()),
        _ => Ok(()),
    }
}

/// Take one entry out of a hash map: its value as it was when removed, in one step
/// (`BPF_MAP_LOOKUP_AND_DELETE_ELEM`, hash maps since Linux 5.14), so nothing the kernel adds
/// to it between a read and a delete is lost. None: no such key (any more).
fn take_entry<K: Pod, V: Pod>(map: &MapData, key: &K) -> io::Result<Option<V>> {
    const BPF_MAP_LOOKUP_AND_DELETE_ELEM: libc::c_long = 21;
    let mut value = std::mem::MaybeUninit::<V>::zeroed();
    match map_elem_call(
        BPF_MAP_LOOKUP_AND_DELETE_ELEM,
        map.fd().as_fd(),
        (key as *const K).cast(),
        value.as_mut_ptr().cast(),
    ) {
        // SAFETY: the kernel filled the value; V is plain data.
        Ok(()) => Ok(Some(unsafe { value.assume_init() })),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// What `take_all` took, and how many entries it failed to take (left in the map).
pub struct Taken<K, V> {
    pub entries: Vec<(K, V)>,
    pub failed: u64,
}

/// Every entry of `map`, which is left empty; each entry is taken whole, looked up and deleted
/// at once, so one the kernel writes meanwhile is either taken or left for the next drain.
pub fn take_all<T: Borrow<MapData>, K: Pod, V: Pod>(map: &BpfHashMap<T, K, V>) -> Taken<K, V> {
    let entries = match batches(map.map(), BPF_MAP_LOOKUP_AND_DELETE_BATCH) {
        Batched::Whole(entries) => return Taken { entries, failed: 0 },
        Batched::Partial(entries) => entries,
        Batched::Unsupported => Vec::new(),
    };
    // What is left, key by key. Keys first: a hash map's iteration restarts when the key it
    // stands on is deleted.
    let mut taken = Taken { entries, failed: 0 };
    let keys: Vec<K> = map.keys().filter_map(Result::ok).collect();
    for key in keys {
        match take_entry(map.map(), &key) {
            Ok(Some(value)) => taken.entries.push((key, value)),
            Ok(None) => {}
            Err(_) => taken.failed += 1,
        }
    }
    taken
}

/// Every entry of `map`, left in it.
pub fn read_all<T: Borrow<MapData>, K: Pod, V: Pod>(map: &BpfHashMap<T, K, V>) -> Vec<(K, V)> {
    match batches(map.map(), BPF_MAP_LOOKUP_BATCH) {
        Batched::Whole(entries) => entries,
        Batched::Partial(_) | Batched::Unsupported => map.iter().filter_map(Result::ok).collect(),
    }
}

/// How a batched read ended.
enum Batched<K, V> {
    Whole(Vec<(K, V)>),
    /// Stopped by an error partway: what was read (and, with a delete, taken) until then.
    Partial(Vec<(K, V)>),
    /// No batches here (an older kernel, a map type without them): nothing read.
    Unsupported,
}

/// The entries, a batch per call.
fn batches<K: Pod, V: Pod>(map: &MapData, command: libc::c_long) -> Batched<K, V> {
    let mut entries = Vec::new();
    let (mut token, mut started) = (0u32, false);
    let mut room = FIRST;
    let (mut keys, mut values) = (Vec::<K>::new(), Vec::<V>::new());
    loop {
        keys.reserve_exact(room);
        values.reserve_exact(room);
        // No bucket index: the kernel writes the real one together with the count.
        let mut next = NOT_WRITTEN;
        let mut attr = BatchAttr {
            in_batch: if started { &token as *const u32 as u64 } else { 0 },
            out_batch: &mut next as *mut u32 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: room as u32,
            map_fd: map.fd().as_fd().as_raw_fd() as u32,
            ..Default::default()
        };
        // SAFETY: the attribute names buffers of `room` keys and values that live across the
        // call, and a hash map's batch token (a u32 bucket index) on both sides.
        let result = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                command,
                &mut attr as *mut BatchAttr,
                std::mem::size_of::<BatchAttr>() as u32,
            )
        };
        let error = (result < 0).then(|| io::Error::last_os_error().raw_os_error().unwrap_or(0));
        // The count is the kernel's only where it wrote it, with the bucket it stopped at: on
        // success, and wherever its walk stopped at a bucket (the end, a bucket too big for the
        // room, one it could not lock, memory), whatever the error; not where it refused first.
        let filled = match next {
            NOT_WRITTEN => 0,
            _ => (attr.count as usize).min(room),
        };
        // SAFETY: the kernel wrote `filled` whole keys and values (their sizes are the map's,
        // checked when the map was typed), and `Pod` types are valid for any bits.
        unsafe {
            keys.set_len(filled);
            values.set_len(filled);
        }
        entries.extend(keys.drain(..).zip(values.drain(..)));
        match error {
            None => (token, started) = (next, true),
            Some(libc::ENOENT) if next != NOT_WRITTEN => return Batched::Whole(entries),
            Some(libc::ENOSPC) if filled == 0 && room < MOST => room *= 4,
            Some(_) if !started && entries.is_empty() => return Batched::Unsupported,
            Some(e) => {
                log::debug!(
                    "a batched map read stopped, the rest read key by key: {}",
                    io::Error::from_raw_os_error(e)
                );
                return Batched::Partial(entries);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a map of its own (needs BPF: root): every entry read, then taken, in batches (the
    /// batch commands used, not the key-by-key fallback), across many calls' worth.
    #[test]
    fn a_whole_map_is_read_then_taken_in_batches() {
        let mut map =
            BpfHashMap::<MapData, u32, [u64; 3]>::create(20_000, 0).expect("creating a BPF map (root?)");
        let written: Vec<(u32, [u64; 3])> = (0..5_000u32).map(|k| (k * 7, [k.into(), 1, 2])).collect();
        for (key, value) in &written {
            map.insert(key, value, 0).unwrap();
        }
        let sorted = |mut entries: Vec<(u32, [u64; 3])>| {
            entries.sort();
            entries
        };
        let Batched::Whole(read) = batches(map.map(), BPF_MAP_LOOKUP_BATCH) else {
            panic!("the kernel has batch lookups, for the whole map");
        };
        assert_eq!(sorted(read), written);
        assert_eq!(sorted(read_all(&map)), written, "reading leaves them");
        let taken = take_all(&map);
        assert_eq!((sorted(taken.entries), taken.failed), (written, 0));
        assert_eq!(map.keys().count(), 0, "taking empties it");
        assert!(take_all(&map).entries.is_empty());
    }

    #[test]
    fn the_attribute_is_laid_out_as_the_kernel_reads_it() {
        // `in_batch` .. `flags` of the kernel's batch member: 56 bytes, `count` at 32.
        assert_eq!(std::mem::size_of::<BatchAttr>(), 56);
        assert_eq!(std::mem::offset_of!(BatchAttr, count), 32);
        assert_eq!(std::mem::offset_of!(BatchAttr, flags), 48);
    }
}
