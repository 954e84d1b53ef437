//! Reading `/proc`: a process's directory held open while one capture reads its files, and the
//! read of a `/proc` text file every capture makes.
use std::{fs::File, io, os::fd::OwnedFd};

use nix::{fcntl::OFlag, sys::stat::Mode};

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
        let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC;
        read_text(File::from(nix::fcntl::openat(
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
}

/// A `/proc` text file. `fs::read_to_string` asks the file's size first (a `statx`, and 0 for
/// these files) and then grows its buffer from 32 bytes, each size a `read` (a process's map
/// took 7 reads); here one buffer of 16 kB, two reads (the text, then its end).
pub fn read_proc(path: &str) -> io::Result<String> {
    read_text(File::open(path)?)
}

fn read_text(mut file: File) -> io::Result<String> {
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
    String::from_utf8(text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
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
    }
}
