//! Reading `/proc`: a process's directory held open while one capture reads its files, and the
//! read of a `/proc` text file every capture makes.
use std::{
    fs::File,
    io,
    os::fd::{AsRawFd as _, OwnedFd},
};

use nix::{fcntl::OFlag, sys::stat::Mode};
use profiler_common::FileId;

/// A process's `/proc/PID` directory, opened once for a capture. Its files are read relative to
/// it: each is found without looking the pid up again (the costly part of opening one, for a
/// process `/proc` has not shown before), and all are that one process's: should it exit and
/// its pid be reused meanwhile, they fail rather than read another process's.
pub struct ProcDir(OwnedFd);

impl ProcDir {
    pub fn open(pid: u32) -> io::Result<ProcDir> {
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        Ok(ProcDir(nix::fcntl::open(
            format!("/proc/{pid}").as_str(),
            flags,
            Mode::empty(),
        )?))
    }

    /// A text file of the directory (`maps`, `comm`, `cgroup`).
    pub fn read(&self, name: &str) -> io::Result<String> {
        read_text(self.open_file(name)?)
    }

    /// A file of the directory, opened to read.
    pub fn open_file(&self, name: &str) -> io::Result<File> {
        let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC;
        Ok(File::from(nix::fcntl::openat(
            &self.0,
            name,
            flags,
            Mode::empty(),
        )?))
    }

    /// Where a link of the directory points (`exe`).
    pub fn read_link(&self, name: &str) -> io::Result<String> {
        let target = nix::fcntl::readlinkat(&self.0, name)?;
        Ok(target.to_string_lossy().into_owned())
    }

    /// The process's executable: its path, and whether it is the file the kernel names `id`
    /// (read through one handle on the file, so both are of the same file even if the process
    /// execs meanwhile). By its inode number: the device `stat` gives is the filesystem's own
    /// on most, another on some (a btrfs subvolume's, an overlay's).
    pub fn executable(&self, id: FileId) -> io::Result<(String, bool)> {
        let flags = OFlag::O_PATH | OFlag::O_CLOEXEC;
        let file = nix::fcntl::openat(&self.0, "exe", flags, Mode::empty())?;
        let stat = nix::sys::stat::fstat(&file)?;
        let path = nix::fcntl::readlink(format!("/proc/self/fd/{}", file.as_raw_fd()).as_str())?;
        let same = stat.st_ino == id.inode;
        Ok((path.to_string_lossy().into_owned(), same))
    }
}

impl From<ProcDir> for LazyDir {
    /// A directory opened already.
    fn from(dir: ProcDir) -> LazyDir {
        LazyDir {
            pid: 0,
            dir: std::cell::OnceCell::from(Some(dir)),
        }
    }
}

/// A process's directory opened when first needed, if at all: what the kernel said of a process
/// may leave nothing to read.
pub struct LazyDir {
    pid: u32,
    dir: std::cell::OnceCell<Option<ProcDir>>,
}

impl LazyDir {
    pub fn new(pid: u32) -> LazyDir {
        LazyDir {
            pid,
            dir: Default::default(),
        }
    }

    /// The directory; None if the process is gone.
    pub fn get(&self) -> Option<&ProcDir> {
        self.dir.get_or_init(|| ProcDir::open(self.pid).ok()).as_ref()
    }
}

/// A `/proc` text file. `fs::read_to_string` asks the file's size first (a `statx`, and 0 for
/// these files) and then grows its buffer from 32 bytes, each size a `read` (a process's map
/// took 7 reads); here one buffer of 16 kB, two reads (the text, then its end).
pub fn read_proc(path: &str) -> io::Result<String> {
    read_text(File::open(path)?)
}

pub(super) fn read_text(mut file: File) -> io::Result<String> {
    use std::io::Read as _;
    // (Not `File::read_to_end`: it asks the size and the position first.)
    let (mut text, mut len) = (vec![0; 16 << 10], 0);
    loop {
        if len == text.len() {
            text.resize(2 * len, 0);
        }
        match file.read(&mut text[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    text.truncate(len);
    // (A path in a map, a name, need not be UTF-8: never the whole file's failure.)
    Ok(String::from_utf8(text).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_process_through_its_directory_as_by_path() {
        let me = std::process::id();
        let dir = ProcDir::open(me).unwrap();
        assert_eq!(
            dir.read("comm").unwrap(),
            std::fs::read_to_string("/proc/self/comm").unwrap()
        );
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        assert_eq!(dir.read_link("exe").unwrap(), exe.to_string_lossy());
        // Longer than the first buffer: a map of many lines is read whole.
        let long = (0..2000).map(|i| format!("line {i}\n")).collect::<String>();
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), &long).unwrap();
        assert_eq!(read_proc(file.path().to_str().unwrap()).unwrap(), long);
        // A path in a map need not be UTF-8: the text is still read, that path lossily.
        std::fs::write(file.path(), b"7f00-7f01 r-xp 0 fe:01 9 /opt/caf\xe9.so\n").unwrap();
        assert_eq!(
            read_proc(file.path().to_str().unwrap()).unwrap(),
            "7f00-7f01 r-xp 0 fe:01 9 /opt/caf\u{fffd}.so\n"
        );
    }

    #[test]
    fn a_process_gone_is_not_read_through_its_old_directory() {
        let mut child = std::process::Command::new("sleep").arg("10").spawn().unwrap();
        let dir = ProcDir::open(child.id()).unwrap();
        assert!(dir.read("maps").is_ok());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(dir.read("maps").is_err());
        assert!(dir.read_link("exe").is_err());
        assert!(dir.executable(FileId::default()).is_err());
        assert!(LazyDir::new(child.id()).get().is_none());
    }

    #[test]
    fn an_executable_is_known_by_the_kernels_identity_of_its_file() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = LazyDir::new(std::process::id());
        let dir = dir.get().unwrap();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let id = FileId {
            inode: std::fs::metadata(&exe).unwrap().ino(),
            dev: 1,
            generation: 7,
        };
        assert_eq!(
            dir.executable(id).unwrap(),
            (exe.to_string_lossy().into_owned(), true)
        );
        let other = FileId {
            inode: id.inode + 1,
            ..id
        };
        assert!(!dir.executable(other).unwrap().1);
    }
}
