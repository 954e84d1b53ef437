//! `-- COMMAND`: the command is forked first but held before `exec` until the BPF programs are
//! attached and its pid is a target, so its first instruction is already profiled.
use std::{
    ffi::{CString, OsString},
    os::{fd::OwnedFd, unix::ffi::OsStrExt},
    path::{Path, PathBuf},
};

use nix::{
    sys::wait::{waitpid, WaitPidFlag, WaitStatus},
    unistd::{fork, pipe2, read, write, ForkResult, Pid},
};

use crate::error::UserError;

/// Exit code of the held child when bpfprof gave up before releasing it.
const ABANDONED: i32 = 126;

pub struct PausedCommand {
    pid: Pid,
    gate: Option<OwnedFd>,
    exec_errors: OwnedFd,
    display: String,
    /// The program it will exec, as resolved on PATH.
    program: PathBuf,
    released: bool,
}

pub struct RunningCommand {
    pid: Pid,
    status: Option<i32>,
}

/// Find the program like a shell would, before anything is loaded.
pub fn resolve(program: &OsString) -> Result<PathBuf, UserError> {
    let path = Path::new(program);
    let display = program.to_string_lossy().into_owned();
    if program.as_bytes().contains(&b'/') {
        return if path.is_file() {
            Ok(path.to_path_buf())
        } else {
            Err(UserError::CommandNotFound(display))
        };
    }
    crate::which::on_path(path).ok_or(UserError::CommandNotFound(display))
}

pub fn display(argv: &[OsString]) -> String {
    argv.iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn spawn_paused(argv: &[OsString]) -> Result<PausedCommand, UserError> {
    let display = display(argv);
    let program = resolve(&argv[0])?;
    let failed = |reason: String| UserError::CommandFailed {
        command: display.clone(),
        reason,
    };
    let c_program = CString::new(program.as_os_str().as_bytes()).map_err(|e| failed(e.to_string()))?;
    let c_args: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|e| failed(e.to_string()))?;
    let (gate_read, gate_write) = pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| failed(e.to_string()))?;
    let (err_read, err_write) = pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| failed(e.to_string()))?;
    // SAFETY: the child only calls async-signal-safe functions (close, read, execv, write, _exit)
    // on data prepared before the fork.
    match unsafe { fork() }.map_err(|e| failed(e.to_string()))? {
        ForkResult::Child => {
            drop(gate_write);
            drop(err_read);
            let mut byte = [0u8; 1];
            if !matches!(read(&gate_read, &mut byte), Ok(1)) {
                unsafe { libc::_exit(ABANDONED) };
            }
            let errno = nix::unistd::execv(&c_program, &c_args).unwrap_err();
            let _ = write(&err_write, &(errno as i32).to_ne_bytes());
            unsafe { libc::_exit(127) };
        }
        ForkResult::Parent { child } => Ok(PausedCommand {
            pid: child,
            gate: Some(gate_write),
            exec_errors: err_read,
            display,
            program,
            released: false,
        }),
    }
}

impl PausedCommand {
    pub fn pid(&self) -> u32 {
        self.pid.as_raw() as u32
    }

    pub fn display(&self) -> &str {
        &self.display
    }

    pub fn program(&self) -> &Path {
        &self.program
    }

    /// Let the command exec. Fails if the exec did.
    pub fn release(mut self) -> Result<RunningCommand, UserError> {
        let gate = self.gate.take().expect("released once");
        let _ = write(&gate, b"g");
        drop(gate);
        let mut errno = [0u8; 4];
        let n = read(&self.exec_errors, &mut errno).unwrap_or(0);
        self.released = true;
        if n == 4 {
            let _ = waitpid(self.pid, None);
            let reason = std::io::Error::from_raw_os_error(i32::from_ne_bytes(errno)).to_string();
            return Err(UserError::CommandFailed {
                command: std::mem::take(&mut self.display),
                reason,
            });
        }
        Ok(RunningCommand {
            pid: self.pid,
            status: None,
        })
    }
}

impl Drop for PausedCommand {
    /// Never released (bpfprof failed first): the child sees the gate close, exits, is reaped.
    fn drop(&mut self) {
        if !self.released {
            self.gate.take();
            let _ = waitpid(self.pid, None);
        }
    }
}

impl RunningCommand {
    pub fn pid(&self) -> u32 {
        self.pid.as_raw() as u32
    }

    /// The exit code (shell convention: 128 + signal) once it has exited.
    pub fn try_wait(&mut self) -> Option<i32> {
        if self.status.is_none() {
            self.status = match waitpid(self.pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(_, code)) => Some(code),
                Ok(WaitStatus::Signaled(_, signal, _)) => Some(128 + signal as i32),
                Err(_) => Some(1),
                Ok(_) => None,
            };
        }
        self.status
    }

    /// The exit code, once the command has exited, waiting at most `limit`.
    pub fn wait_for(&mut self, limit: std::time::Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(code) = self.try_wait() {
                return Some(code);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_like_a_shell() {
        assert!(resolve(&"sh".into()).unwrap().is_absolute());
        assert!(matches!(
            resolve(&"no-such-command-xyz".into()),
            Err(UserError::CommandNotFound(_))
        ));
        assert!(matches!(
            resolve(&"./no/such".into()),
            Err(UserError::CommandNotFound(_))
        ));
    }

    #[test]
    fn held_command_runs_only_when_released_and_reports_its_status() {
        let argv: Vec<OsString> = ["sh", "-c", "exit 7"].iter().map(Into::into).collect();
        let paused = spawn_paused(&argv).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut running = paused.release().unwrap();
        assert_eq!(running.wait_for(std::time::Duration::from_secs(10)), Some(7));

        let paused = spawn_paused(&argv).unwrap();
        drop(paused); // abandoned: reaped, no zombie, never ran
    }
}
