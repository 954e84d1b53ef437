//! Which rows of the shared array each file holds, and which processes use each file: the
//! bookkeeping that gives a file's rows back once no process can use them any more.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fs::File,
    time::{Duration, Instant},
};

use super::Segment;
use crate::{process::FileIdentity, python::Interpreter};
/// What the walker needs of one file, read and parsed once.
pub(super) struct FileTable {
    /// The path it was first mapped from (what `/debug/unwind` shows).
    pub(super) path: String,
    /// Its rows' place in the row array, or why it has none.
    pub(super) rows: Result<(u32, u32), String>,
    pub(super) segments: Vec<Segment>,
    /// The Python interpreter the file is, if the walker reads its frames.
    pub(super) python: Option<Interpreter>,
    /// Which file was read: a file kept idle is used again only while its (device, inode)
    /// still names that file, unchanged (a build writing over it in place).
    pub(super) identity: Option<FileIdentity>,
    /// Held open, so its inode is not another file's while it is kept, and a file deleted (a
    /// deploy replacing it) is seen as such and let go at once.
    pub(super) handle: Option<File>,
    /// Processes given this file's rows.
    pub(super) users: usize,
    /// Since when no process has been given it: its rows stay a while (`IDLE_KEPT`), for the
    /// next run of the same program, unless the array needs the room first.
    pub(super) idle_since: Option<Instant>,
}

/// How long a file no process maps keeps its rows: a program run again and again (a build's
/// compiler, a cron job, a shell's commands) is not read and parsed again for each run.
const IDLE_KEPT: Duration = Duration::from_secs(60);
/// At most this many such files are kept (each holds a descriptor), the latest idle.
const IDLE_FILES: usize = 256;

impl FileTable {
    /// Whether the file is gone from the file system (no name left): nothing can map it again.
    fn deleted(&self) -> bool {
        use std::os::unix::fs::MetadataExt as _;
        (self.handle.as_ref()).is_some_and(|file| file.metadata().is_ok_and(|m| m.nlink() == 0))
    }
}

/// A file by its device (as `stat` encodes it) and inode.
pub(super) type FileKey = (u64, u64);

/// One file's share of the row array.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileWithRows {
    /// As `stat` encodes it (0 for the vDSO).
    pub device: u64,
    pub inode: u64,
    pub path: String,
    pub rows: u32,
    /// Processes its rows were given to.
    pub processes: usize,
}

/// Which rows of the shared array are in use. A file's rows are one run; they are taken
/// first-fit from runs freed by files no process maps any more, else from the untouched tail.
/// Freed neighbours merge (and a free run that reaches the tail shrinks it), so a long run's
/// churn of binaries does not leave the array in slivers too small for the next file.
#[derive(Debug)]
pub(super) struct RowSpace {
    /// Free runs below `tail`: start -> length.
    free: BTreeMap<u32, u32>,
    tail: u32,
    capacity: u32,
}

impl RowSpace {
    fn new(capacity: u32) -> Self {
        Self {
            free: BTreeMap::new(),
            tail: 0,
            capacity,
        }
    }

    fn take(&mut self, len: u32) -> Option<u32> {
        if len == 0 {
            return Some(0);
        }
        let fit = self
            .free
            .iter()
            .find(|&(_, &free)| free >= len)
            .map(|(&at, &free)| (at, free));
        if let Some((at, free)) = fit {
            self.free.remove(&at);
            if free > len {
                self.free.insert(at + len, free - len);
            }
            return Some(at);
        }
        let end = self.tail.checked_add(len).filter(|&end| end <= self.capacity)?;
        let at = self.tail;
        self.tail = end;
        Some(at)
    }

    fn give_back(&mut self, mut at: u32, mut len: u32) {
        if len == 0 {
            return;
        }
        if let Some((&before, &before_len)) = self.free.range(..at).next_back() {
            if before + before_len == at {
                self.free.remove(&before);
                at = before;
                len += before_len;
            }
        }
        if let Some(after_len) = self.free.remove(&(at + len)) {
            len += after_len;
        }
        if at + len == self.tail {
            self.tail = at;
        } else {
            self.free.insert(at, len);
        }
    }

    pub(super) fn used(&self) -> u32 {
        self.tail - self.free.values().sum::<u32>()
    }
}

/// Which files have rows, where, and which processes use them: the bookkeeping that lets rows
/// of files no process maps any more go back to `RowSpace` (after `IDLE_KEPT`, or sooner when
/// the array is full).
pub(super) struct FileRows {
    pub(super) space: RowSpace,
    pub(super) files: HashMap<FileKey, FileTable>,
    /// Per process, the files it was given (counted in their `users`).
    pub(super) uses: HashMap<u32, HashSet<FileKey>>,
}

impl FileRows {
    pub(super) fn new(capacity: u32) -> Self {
        Self {
            space: RowSpace::new(capacity),
            files: HashMap::new(),
            uses: HashMap::new(),
        }
    }

    /// Count `pid` as a user of the files it maps now (and no longer of those it mapped before
    /// an exec). Only files already in `files` are counted, so counts and `uses` agree.
    pub(super) fn set_uses(&mut self, pid: u32, keys: HashSet<FileKey>) {
        let keys: HashSet<FileKey> = keys.into_iter().filter(|k| self.files.contains_key(k)).collect();
        let before = self.uses.insert(pid, keys.clone()).unwrap_or_default();
        for key in keys.difference(&before) {
            if let Some(file) = self.files.get_mut(key) {
                file.users += 1;
                file.idle_since = None;
            }
        }
        let now = Instant::now();
        for key in before.difference(&keys) {
            self.unuse(key, now);
        }
    }

    /// Processes gone: the files they mapped lose a user. Idle files give their rows back
    /// once idle for `IDLE_KEPT` at `now`, deleted, or beyond the latest `IDLE_FILES`.
    pub(super) fn forget(&mut self, pids: &HashSet<u32>, now: Instant) {
        for pid in pids {
            for key in self.uses.remove(pid).unwrap_or_default() {
                self.unuse(&key, now);
            }
        }
        let mut idle: Vec<(Instant, FileKey, bool)> = (self.files.iter())
            .filter_map(|(key, f)| Some((f.idle_since?, *key, f.deleted())))
            .collect();
        idle.sort_by_key(|&(since, ..)| std::cmp::Reverse(since));
        for (n, (since, key, deleted)) in idle.into_iter().enumerate() {
            if deleted || n >= IDLE_FILES || now.saturating_duration_since(since) >= IDLE_KEPT {
                self.remove(&key);
            }
        }
    }

    /// `len` rows of the array, from the files kept idle if there is no room otherwise (the
    /// longest idle first), but for those in `pinned` (a load in progress has given them).
    pub(super) fn take(&mut self, len: u32, pinned: &HashSet<FileKey>) -> Option<u32> {
        loop {
            if let Some(at) = self.space.take(len) {
                return Some(at);
            }
            let oldest = (self.files.iter())
                .filter(|(key, _)| !pinned.contains(*key))
                .filter_map(|(key, f)| Some((f.idle_since?, key)))
                .min()
                .map(|(_, key)| *key)?;
            self.remove(&oldest);
        }
    }

    /// A file kept idle whose (device, inode) names another file now (deleted, and the inode
    /// used again), or one whose identity is unknown: its rows may not be that file's.
    pub(super) fn drop_if_replaced(&mut self, key: &FileKey, now: impl FnOnce() -> Option<FileIdentity>) {
        let kept = self.files.get(key).filter(|f| f.idle_since.is_some());
        if kept.is_some_and(|f| f.identity.is_none() || f.identity != now()) {
            self.remove(key);
        }
    }

    fn remove(&mut self, key: &FileKey) {
        if let Some(FileTable {
            rows: Ok((at, len)), ..
        }) = self.files.remove(key)
        {
            self.space.give_back(at, len);
        }
    }

    /// The files whose rows are in the array, most rows first: which binaries hold it.
    pub(super) fn files_with_rows(&self) -> Vec<FileWithRows> {
        let mut files: Vec<FileWithRows> = self
            .files
            .iter()
            .filter_map(|((device, inode), file)| {
                let &(_, rows) = file.rows.as_ref().ok()?;
                Some(FileWithRows {
                    device: *device,
                    inode: *inode,
                    path: file.path.clone(),
                    rows,
                    processes: file.users,
                })
            })
            .collect();
        files.sort_by(|a, b| b.rows.cmp(&a.rows).then_with(|| a.path.cmp(&b.path)));
        files
    }

    fn unuse(&mut self, key: &FileKey, now: Instant) {
        let Some(file) = self.files.get_mut(key) else {
            return;
        };
        file.users = file.users.saturating_sub(1);
        match (file.users, &file.rows) {
            // Kept: its rows are what a next run would need.
            (0, Ok(_)) => file.idle_since = Some(now),
            // Without rows (none usable, or no room then): read again when next mapped.
            (0, Err(_)) => self.remove(key),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_rows_are_taken_again_and_neighbours_merge() {
        let mut space = RowSpace::new(100);
        let a = space.take(30).unwrap();
        let b = space.take(30).unwrap();
        let c = space.take(30).unwrap();
        assert_eq!((a, b, c), (0, 30, 60));
        assert_eq!(space.take(11), None, "10 rows left at the tail");
        space.give_back(a, 30);
        assert_eq!(space.take(20), Some(0), "first fit, in the freed run");
        assert_eq!(space.used(), 80);
        space.give_back(b, 30);
        // The rest of the first run (20..30) and b's run (30..60) are one run now.
        assert_eq!(space.take(40), Some(20));
        space.give_back(c, 30);
        space.give_back(20, 40);
        space.give_back(0, 20);
        assert_eq!(space.used(), 0);
        assert_eq!(space.tail, 0, "everything freed: the tail went back to the start");
        assert!(space.free.is_empty());
        assert_eq!(space.take(100), Some(0), "the whole array in one run again");
    }

    /// Against a model that knows every row: runs never overlap, and a request fails only when
    /// no free stretch of that length exists anywhere (merging keeps free runs whole).
    #[test]
    fn row_space_agrees_with_a_row_by_row_model() {
        const CAPACITY: u32 = 64;
        let mut space = RowSpace::new(CAPACITY);
        let mut model = [false; CAPACITY as usize];
        let mut held: Vec<(u32, u32)> = Vec::new();
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..20_000 {
            if held.is_empty() || next(2) == 0 {
                let len = 1 + next(16) as u32;
                let fits = model.windows(len as usize).any(|w| w.iter().all(|used| !used));
                match space.take(len) {
                    Some(at) => {
                        for used in &mut model[at as usize..(at + len) as usize] {
                            assert!(!*used, "row {at}+{len} handed out twice");
                            *used = true;
                        }
                        held.push((at, len));
                    }
                    None => assert!(!fits, "{len} free rows in a row exist, yet refused"),
                }
            } else {
                let (at, len) = held.swap_remove(next(held.len() as u64) as usize);
                space.give_back(at, len);
                model[at as usize..(at + len) as usize].fill(false);
            }
            assert_eq!(space.used() as usize, model.iter().filter(|&&u| u).count());
        }
    }

    fn file_with_rows(placed: &mut FileRows, name: &str, len: u32) -> FileKey {
        let at = placed.space.take(len).unwrap();
        let key = key_of(name);
        placed.files.insert(
            key,
            FileTable {
                path: name.to_string(),
                rows: Ok((at, len)),
                segments: Vec::new(),
                python: None,
                identity: Some(identity(name.len() as u64)),
                handle: None,
                users: 0,
                idle_since: None,
            },
        );
        key
    }

    /// A key for a file of the tests, by its name.
    fn key_of(name: &str) -> FileKey {
        (name.bytes().fold(0, |key, b| key * 256 + u64::from(b)), 1)
    }

    fn identity(size: u64) -> FileIdentity {
        FileIdentity {
            dev: 1,
            inode: 1,
            size,
            mtime_ns: 0,
        }
    }

    #[test]
    fn a_files_rows_are_freed_once_idle_after_its_last_process_is_forgotten_or_execs() {
        let start = Instant::now();
        let mut placed = FileRows::new(1000);
        let libc = file_with_rows(&mut placed, "libc", 100);
        let app = file_with_rows(&mut placed, "app", 200);
        placed.set_uses(10, HashSet::from([libc, app]));
        placed.set_uses(11, HashSet::from([libc, app]));
        assert_eq!(placed.space.used(), 300);

        placed.forget(&HashSet::from([10]), start);
        assert_eq!(placed.space.used(), 300, "pid 11 still maps both");

        // pid 11 execs something that maps libc only: app has no user left, and is kept idle
        // until IDLE_KEPT has passed.
        let other = file_with_rows(&mut placed, "other", 50);
        placed.set_uses(11, HashSet::from([libc, other]));
        assert!(placed.files[&app].idle_since.is_some());
        placed.forget(&HashSet::new(), Instant::now() + IDLE_KEPT / 2);
        assert_eq!(placed.space.used(), 350, "app is kept idle");
        placed.forget(&HashSet::new(), Instant::now() + IDLE_KEPT);
        assert!(!placed.files.contains_key(&app));
        assert_eq!(placed.space.used(), 150);
        // The same pid loaded again (a map change) counts each file once.
        placed.set_uses(11, HashSet::from([libc, other]));
        assert_eq!(placed.files[&libc].users, 1);

        // A file without rows, or one never read, is not counted and frees nothing.
        placed.set_uses(12, HashSet::from([libc, key_of("unread")]));
        assert_eq!(placed.uses[&12].len(), 1);

        let listed: Vec<(String, u32, usize)> = placed
            .files_with_rows()
            .into_iter()
            .map(|f| (f.path, f.rows, f.processes))
            .collect();
        assert_eq!(
            listed,
            [("libc".to_string(), 100, 2), ("other".to_string(), 50, 1)],
            "most rows first, with their users"
        );

        placed.forget(&HashSet::from([11, 12, 99]), Instant::now());
        assert_eq!(placed.space.used(), 150, "both idle, kept");
        placed.forget(&HashSet::new(), Instant::now() + IDLE_KEPT);
        assert!(placed.files.is_empty());
        assert!(placed.files_with_rows().is_empty());
        assert_eq!(placed.space.used(), 0);
    }

    #[test]
    fn a_file_kept_idle_is_given_again_while_it_is_the_same_file_and_yields_its_rows_when_full() {
        let start = Instant::now();
        let mut placed = FileRows::new(300);
        let c = file_with_rows(&mut placed, "c", 100);
        let (a, b) = (
            file_with_rows(&mut placed, "a", 100),
            file_with_rows(&mut placed, "bb", 100),
        );
        placed.set_uses(1, HashSet::from([a]));
        placed.set_uses(2, HashSet::from([b]));
        placed.forget(&HashSet::from([1]), start);
        placed.forget(&HashSet::from([2]), start + Duration::from_secs(1));

        // Mapped again, the same file: its rows are given again, and it is in use.
        placed.drop_if_replaced(&a, || Some(identity(1)));
        placed.set_uses(3, HashSet::from([a]));
        assert_eq!((placed.files[&a].users, placed.files[&a].idle_since), (1, None));
        placed.forget(&HashSet::from([3]), start + Duration::from_secs(2));

        // Another file under b's (device, inode): b's rows are dropped, not given.
        placed.drop_if_replaced(&b, || Some(identity(9)));
        assert!(!placed.files.contains_key(&b));
        // A file in use is never dropped, whatever is asked.
        placed.set_uses(4, HashSet::from([c]));
        placed.drop_if_replaced(&c, || None);
        assert!(placed.files.contains_key(&c));

        // The array full: the idle file gives its rows to a new one, the one in use keeps its;
        // and one a load in progress has given already keeps them too.
        assert_eq!(placed.space.used(), 200);
        assert_eq!(placed.take(150, &HashSet::from([a])), None);
        assert!(placed.files.contains_key(&a), "pinned by the load");
        let none = HashSet::new();
        assert_eq!(
            placed.take(150, &none),
            Some(100),
            "a's rows (100..200) and b's freed ones"
        );
        assert!(!placed.files.contains_key(&a));
        assert!(placed.files.contains_key(&c));
        assert_eq!(placed.take(100, &none), None, "nothing idle left to take from");
    }

    #[test]
    fn an_idle_file_deleted_or_beyond_the_latest_kept_is_let_go_at_once() {
        let start = Instant::now();
        let mut placed = FileRows::new(100_000);
        let path = std::env::temp_dir().join(format!("bpfprof-idle-{}", std::process::id()));
        std::fs::write(&path, b"x").unwrap();
        let deleted = file_with_rows(&mut placed, "deleted", 10);
        placed.files.get_mut(&deleted).unwrap().handle = Some(File::open(&path).unwrap());
        placed.set_uses(1, HashSet::from([deleted]));
        placed.forget(&HashSet::from([1]), start);
        assert!(placed.files.contains_key(&deleted), "kept idle while it exists");
        std::fs::remove_file(&path).unwrap();
        placed.forget(&HashSet::new(), start);
        assert!(
            !placed.files.contains_key(&deleted),
            "deleted: nothing can map it again"
        );

        // A file without rows is read again when next mapped (there may be room by then).
        let rowless = file_with_rows(&mut placed, "rowless", 0);
        placed.files.get_mut(&rowless).unwrap().rows = Err("the unwind row array is full".into());
        placed.set_uses(2, HashSet::from([rowless]));
        placed.forget(&HashSet::from([2]), start);
        assert!(!placed.files.contains_key(&rowless));

        // One more than IDLE_FILES go idle, one at a time: the first is let go.
        for n in 0..=IDLE_FILES as u32 {
            let key = file_with_rows(&mut placed, &format!("f{n}"), 1);
            placed.set_uses(n, HashSet::from([key]));
            placed.forget(&HashSet::from([n]), start + Duration::from_millis(n.into()));
        }
        assert_eq!(placed.files.len(), IDLE_FILES);
        assert!(!placed.files.contains_key(&key_of("f0")));
    }
}
