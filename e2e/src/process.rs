//! Child processes that die with the test: each is killed on drop, and Linux's parent-death
//! signal kills it even if the test process itself is killed.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::Error;

/// A running component whose output goes to `<logs>/<name>.log`.
pub struct Component {
    pub name: String,
    child: Child,
}

impl Component {
    pub fn spawn(name: &str, program: &Path, args: &[String], logs: &Path) -> Result<Self, Error> {
        Self::spawn_with_env(name, program, args, &[], logs)
    }

    pub fn spawn_with_env(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, String)],
        logs: &Path,
    ) -> Result<Self, Error> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(logs.join(format!("{name}.log")))
            .map_err(|e| Error::io(name, e))?;
        let err = log.try_clone().map_err(|e| Error::io(name, e))?;
        let mut cmd = Command::new(program);
        cmd.args(args).envs(env.iter().map(|(k, v)| (k, v))).stdin(Stdio::null()).stdout(log).stderr(err);
        // SAFETY: the closure runs in the forked child before exec and calls only prctl(2), which
        // is async-signal-safe; it allocates nothing and touches no locks.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| Error::io(&format!("{name} ({})", program.display()), e))?;
        Ok(Self { name: name.to_string(), child })
    }

    /// `Some(status)` if the process has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then SIGKILL after a grace period, then reap.
    pub fn stop(&mut self) {
        if self.exited().is_some() {
            return;
        }
        // SAFETY: kill(2) on our own child's pid, which has not been reaped yet (checked above).
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        for _ in 0..50 {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Component {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Component {
    /// SIGKILL, as a crash would: no cleanup runs in the process.
    pub fn stop_now(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the process to exit on its own (e.g. an injected crash), up to `timeout`.
    pub fn wait_exit(&mut self, timeout: std::time::Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if let Some(s) = self.exited() {
                return Some(s);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        None
    }
}
