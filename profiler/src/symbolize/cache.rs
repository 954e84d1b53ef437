//! The frames a long-lived symbolizer keeps across profiles, bounded in bytes.
use foldhash::{HashMap, HashMapExt as _};

use super::Frame;
use crate::process::FileIdentity;

/// Frames per (file, offset), bounded in bytes: two generations; a lookup in the old one moves
/// the entry to the new one, and when the new one is full the old one is dropped. Hot addresses
/// stay, addresses of executables that are gone age out within two generations. Bytes, not
/// entries: an entry of a deeply inlined C++ address weighs ten of a C one, and a cache that
/// runs for weeks must be bounded in what it costs.
pub struct FrameCache {
    new: HashMap<(FileIdentity, u64), Vec<Frame>>,
    old: HashMap<(FileIdentity, u64), Vec<Frame>>,
    new_bytes: usize,
    old_bytes: usize,
    /// Per generation.
    capacity: usize,
}

impl FrameCache {
    pub fn new(bytes: usize) -> Self {
        Self {
            new: HashMap::new(),
            old: HashMap::new(),
            new_bytes: 0,
            old_bytes: 0,
            capacity: bytes / 2,
        }
    }

    /// What an entry costs on the heap: its slot in the table and its frames' own allocations
    /// (allocator overhead aside).
    pub fn entry_bytes(frames: &[Frame]) -> usize {
        let slot = std::mem::size_of::<((FileIdentity, u64), Vec<Frame>)>() + 1;
        let strings: usize = frames
            .iter()
            .map(|f| {
                let build_id = f.object.as_ref().and_then(|o| o.build_id.as_ref());
                f.function.capacity()
                    + f.module.capacity()
                    + f.file.as_ref().map_or(0, String::capacity)
                    + build_id.map_or(0, String::capacity)
            })
            .sum();
        slot + std::mem::size_of_val(frames) + strings
    }

    pub fn get(&mut self, key: &(FileIdentity, u64)) -> Option<Vec<Frame>> {
        if let Some(frames) = self.new.get(key) {
            return Some(frames.clone());
        }
        let frames = self.old.remove(key)?;
        self.old_bytes -= Self::entry_bytes(&frames);
        self.insert(*key, frames.clone());
        Some(frames)
    }

    pub fn insert(&mut self, key: (FileIdentity, u64), frames: Vec<Frame>) {
        let bytes = Self::entry_bytes(&frames);
        let replacing = self.new.get(&key).map_or(0, |f| Self::entry_bytes(f));
        if self.new_bytes - replacing + bytes > self.capacity && !self.new.is_empty() {
            self.old = std::mem::take(&mut self.new);
            self.old_bytes = std::mem::take(&mut self.new_bytes);
        }
        if let Some(replaced) = self.new.insert(key, frames) {
            self.new_bytes -= Self::entry_bytes(&replaced);
        }
        self.new_bytes += bytes;
    }

    pub fn len(&self) -> usize {
        self.new.len() + self.old.len()
    }

    pub fn bytes(&self) -> usize {
        self.new_bytes + self.old_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_cache_is_bounded_and_keeps_what_is_used() {
        let id = FileIdentity {
            dev: 1,
            inode: 2,
            size: 3,
            mtime_ns: 4,
        };
        let frames = |n| vec![Frame::unknown("m", n, false)];
        // Room for two entries a generation.
        let mut cache = FrameCache::new(4 * FrameCache::entry_bytes(&frames(1)));
        cache.insert((id, 1), frames(1));
        cache.insert((id, 2), frames(2));
        cache.insert((id, 3), frames(3));
        assert!(cache.get(&(id, 2)).is_some(), "moved to the new generation");
        cache.insert((id, 4), frames(4));
        assert!(cache.get(&(id, 1)).is_none(), "never used again: aged out");
        assert_eq!(cache.get(&(id, 3)), Some(frames(3)));
        assert!(cache.len() <= 4);
        assert!(cache.bytes() <= 4 * FrameCache::entry_bytes(&frames(1)));
    }

    #[test]
    fn the_frame_cache_is_bounded_in_bytes_whatever_its_entries_weigh() {
        let id = FileIdentity {
            dev: 1,
            inode: 2,
            size: 3,
            mtime_ns: 4,
        };
        let light = vec![Frame::unknown("m", 1, false)];
        let mut heavy = vec![Frame::unknown("m", 1, false); 20];
        for frame in &mut heavy {
            frame.function = "ns::Template<Deep, Nested<Types>>::inlined_function_name".repeat(4);
        }
        let capacity = 64 * 1024;
        let mut cache = FrameCache::new(capacity);
        for offset in 0..10_000 {
            let frames = if offset % 2 == 0 {
                light.clone()
            } else {
                heavy.clone()
            };
            cache.insert((id, offset), frames);
            assert!(cache.bytes() <= capacity, "{} bytes held", cache.bytes());
        }
        let held: usize = cache
            .new
            .values()
            .chain(cache.old.values())
            .map(|f| FrameCache::entry_bytes(f))
            .sum();
        assert_eq!(held, cache.bytes(), "the count agrees with the entries held");
        assert!(
            cache.bytes() > capacity / 2,
            "the old generation is kept, not emptied"
        );
        // The same key again replaces, it does not count twice.
        let before = cache.bytes();
        cache.insert((id, 9_999), heavy.clone());
        assert_eq!(cache.bytes(), before);
    }
}
