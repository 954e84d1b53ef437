//! Where the report goes. A file is written next to its destination and renamed into place, so a
//! failed write never leaves half a report; a broken pipe on stdout is not an error. The file
//! beside it is created new (`O_EXCL`) under a random name: bpfprof runs as root, and a
//! predictable name in a directory others can write (`/tmp`) would let them plant a symlink there
//! that root then writes through. A destination that is not a file (`/dev/null`, a FIFO, a
//! terminal) is written in place: renaming over it would replace the device with a file.
use std::{
    io::{self, BufWriter, Write},
    path::Path,
};

use crate::{cli::Format, error::UserError};

/// Before anything runs: the report's destination can take it. A file must be writable; a
/// terminal gets no pprof or SVG bytes (gzip is garbage on a screen; a flamegraph is pages of
/// XML), only a pipe or a file does.
pub fn check_destination(format: Format, path: Option<&Path>) -> Result<(), UserError> {
    use std::io::IsTerminal as _;
    let example = match format {
        Format::Pprof => "profile.pb.gz",
        Format::Svg => "flame.svg",
        Format::Heatmap => "waits.heatmap.svg",
        Format::Text | Format::Json | Format::Folded => "",
    };
    match path {
        Some(path) => check_writable(path),
        None if !example.is_empty() && io::stdout().is_terminal() => Err(UserError::Usage(format!(
            "{} output is not for a terminal: write it to a file with -o (e.g. -o {example}), or pipe it",
            format.name()
        ))),
        None => Ok(()),
    }
}

/// Fail before profiling, not after, when the report could not be written.
pub fn check_writable(path: &Path) -> Result<(), UserError> {
    let err = |reason: String| UserError::Output {
        path: path.to_path_buf(),
        reason,
    };
    if path.is_dir() {
        return Err(err("it is a directory".into()));
    }
    if is_special(path) {
        // Not opened: a FIFO's open would wait for its reader.
        return nix::unistd::access(path, nix::unistd::AccessFlags::W_OK)
            .map_err(|e| err(e.desc().to_string()));
    }
    // Removed as it is dropped.
    temp_beside(path).map(drop).map_err(|e| err(e.to_string()))
}

/// A destination that exists and is neither a file nor a directory: a device, a FIFO, a socket
/// (followed through symlinks: `/dev/stdout`).
fn is_special(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir())
}

/// A new file in `path`'s directory, named after it with a random part; removed unless persisted.
fn temp_beside(path: &Path) -> io::Result<tempfile::NamedTempFile> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".bpfprof")
        // What File::create would give the report (before the umask), not tempfile's 0600.
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
        .tempfile_in(dir)
        .map_err(|e| in_directory(dir, &e))
}

/// Why no file could be made in `dir`, naming the directory (tempfile's own error names the
/// temporary file, which the user never asked for).
fn in_directory(dir: &Path, e: &io::Error) -> io::Error {
    let dir = dir.display();
    let reason = match e.kind() {
        io::ErrorKind::NotFound => {
            format!("the directory {dir} does not exist: create it, or write elsewhere")
        }
        io::ErrorKind::NotADirectory => format!("{dir} is not a directory"),
        io::ErrorKind::PermissionDenied => format!("no permission to create files in {dir}"),
        kind => format!("cannot create a file in {dir}: {kind}"),
    };
    io::Error::new(e.kind(), reason)
}

/// Write the report with `render`. On a file error the report is saved in the temp directory
/// instead, and the error names that place.
pub fn write_report(
    path: Option<&Path>,
    render: &dyn Fn(&mut dyn Write) -> io::Result<()>,
) -> Result<(), UserError> {
    let Some(path) = path else {
        let stdout = io::stdout();
        let mut out = BufWriter::new(stdout.lock());
        return match render(&mut out).and_then(|()| out.flush()) {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
            Err(e) => Err(UserError::Output {
                path: "standard output".into(),
                reason: e.to_string(),
            }),
            Ok(()) => Ok(()),
        };
    };
    match write_atomically(path, render) {
        Ok(()) => Ok(()),
        Err(e) => {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let fallback = std::env::temp_dir().join(format!("bpfprof-{}-{name}", std::process::id()));
            let saved = match write_atomically(&fallback, render) {
                Ok(()) => format!("; the report was saved to {} instead", fallback.display()),
                Err(_) => String::new(),
            };
            Err(UserError::Output {
                path: path.to_path_buf(),
                reason: format!("{e}{saved}"),
            })
        }
    }
}

/// Write `path` whole or not at all: into a temporary file beside it, synced, then renamed.
pub fn write_atomically(path: &Path, render: &dyn Fn(&mut dyn Write) -> io::Result<()>) -> io::Result<()> {
    if is_special(path) {
        let mut out = BufWriter::new(std::fs::OpenOptions::new().write(true).open(path)?);
        render(&mut out)?;
        return out.flush();
    }
    let temp = temp_beside(path)?;
    let mut out = BufWriter::new(temp);
    render(&mut out)?;
    let temp = out.into_inner().map_err(|e| e.into_error())?;
    temp.as_file().sync_all()?;
    // A failure drops (removes) the temporary file.
    temp.persist(path).map(drop).map_err(|e| e.error)
}

/// A file written as it comes (`record`'s records) that appears whole at `finish` or not at all;
/// a device or FIFO is written in place. Dropped unfinished, the temporary file is removed.
pub struct Streamed {
    out: BufWriter<std::fs::File>,
    temp: Option<(tempfile::TempPath, std::path::PathBuf)>,
}

impl Streamed {
    pub fn create(path: &Path) -> io::Result<Streamed> {
        if is_special(path) {
            let file = std::fs::OpenOptions::new().write(true).open(path)?;
            return Ok(Streamed {
                out: BufWriter::new(file),
                temp: None,
            });
        }
        let (file, temp) = temp_beside(path)?.into_parts();
        Ok(Streamed {
            out: BufWriter::new(file),
            temp: Some((temp, path.to_path_buf())),
        })
    }

    /// Flushed, synced and renamed into place.
    pub fn finish(self) -> io::Result<()> {
        let file = self.out.into_inner().map_err(|e| e.into_error())?;
        if let Some((temp, path)) = self.temp {
            file.sync_all()?;
            temp.persist(path).map_err(|e| e.error)?;
        }
        Ok(())
    }
}

impl Write for Streamed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.out.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `-o /dev/null` (as root): written to, never renamed over (that replaced the device with a
    /// file once, and broke every program that opened /dev/null afterwards). A FIFO likewise.
    #[test]
    fn a_device_or_a_fifo_is_written_in_place_not_replaced() {
        use std::os::unix::fs::FileTypeExt as _;
        let null = Path::new("/dev/null");
        assert!(check_writable(null).is_ok());
        write_report(Some(null), &|w| w.write_all(b"gone")).unwrap();
        assert!(
            std::fs::metadata(null).unwrap().file_type().is_char_device(),
            "/dev/null is still the device"
        );
        let dir = std::env::temp_dir().join(format!("bpfprof-output-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("report.fifo");
        let _ = std::fs::remove_file(&fifo);
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
        };
        write_report(Some(&fifo), &|w| w.write_all(b"through the fifo")).unwrap();
        assert_eq!(reader.join().unwrap(), "through the fifo");
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    }

    #[test]
    fn writes_whole_file_or_says_why() {
        let dir = std::env::temp_dir().join(format!("bpfprof-output-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let target = dir.join("r.txt");
        assert!(check_writable(&target).is_ok());
        write_report(Some(&target), &|w| w.write_all(b"hello")).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "hello");
        assert!(matches!(check_writable(&dir), Err(UserError::Output { .. })));
        let missing = dir.join("no/such/dir/r.txt");
        let err = check_writable(&missing).unwrap_err().to_string();
        assert!(err.contains("cannot write the report"), "{err}");
        // The directory that is missing is named, not the temporary file that failed in it.
        let named = format!(
            "the directory {} does not exist",
            dir.join("no/such/dir").display()
        );
        assert!(err.contains(&named), "{err}");
        assert!(!err.contains(".bpfprof"), "{err}");
        std::fs::write(dir.join("file"), "").unwrap();
        let under_file = check_writable(&dir.join("file/r.txt")).unwrap_err().to_string();
        assert!(
            under_file.contains(&format!("{} is not a directory", dir.join("file").display())),
            "{under_file}"
        );
        let failed = write_report(Some(&missing), &|w| w.write_all(b"kept"))
            .unwrap_err()
            .to_string();
        assert!(failed.contains("saved to"), "{failed}");
        let fallback = std::env::temp_dir().join(format!("bpfprof-{}-r.txt", std::process::id()));
        assert_eq!(std::fs::read_to_string(&fallback).unwrap(), "kept");
        std::fs::remove_file(&fallback).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Someone who can write the report's directory plants symlinks at every name the temporary
    /// file could have had when it was named after bpfprof's pid: nothing is written through
    /// them, the report lands whole, and nothing is left beside it.
    #[test]
    fn a_planted_symlink_is_never_written_through() {
        let dir = std::env::temp_dir().join(format!("bpfprof-symlink-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let victim = dir.join("victim");
        std::fs::write(&victim, "untouched").unwrap();
        let target = dir.join("report.txt");
        let planted = dir.join(format!(".report.txt.bpfprof-{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        check_writable(&target).unwrap();
        write_report(Some(&target), &|w| w.write_all(b"the report")).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "the report");
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                planted.file_name().unwrap().to_string_lossy().as_ref(),
                "report.txt",
                "victim"
            ]
        );
        // The report keeps the permissions a new file gets.
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&target).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o666 & !umask(), "{mode:o}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn umask() -> u32 {
        // SAFETY: umask only swaps the process's mask; it is set straight back.
        unsafe {
            let mask = libc::umask(0o022);
            libc::umask(mask);
            mask as u32
        }
    }
}
