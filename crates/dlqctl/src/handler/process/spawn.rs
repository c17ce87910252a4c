//! Starting a handler program per message at the cost of a `posix_spawn`,
//! with the guarantees dlqctl gives on its handlers: a process group of its
//! own, death with dlqctl (`PR_SET_PDEATHSIG`, even on a `kill -9` of
//! dlqctl), default signal dispositions and an empty signal mask, dlqctl's
//! environment without the variables that hold its secrets
//! ([`crate::secrets::withheld_vars`]), stdin and
//! stderr as pipes, stdout on `/dev/null` ([`spawn`], the per-message
//! handler) or a pipe too ([`spawn_piped`], the `--jsonl` processes).
//!
//! # Why a hand-made `clone(CLONE_VM | CLONE_VFORK)`
//!
//! The standard library (and so `tokio::process`) uses `posix_spawn` (a
//! `clone(CLONE_VM|CLONE_VFORK)` inside glibc) only when nothing must run in
//! the child; a `pre_exec` hook, which `PR_SET_PDEATHSIG` needs, makes it
//! `fork` the whole worker instead, copying the page tables of a
//! multi-threaded process (`strace -f -T -e trace=clone,clone3` of
//! `BENCH_ONLY=3 cargo bench --bench worker` showed 400 plain `clone`s for
//! the worker's 400 runs, against `clone3(CLONE_VM|CLONE_VFORK)` for the
//! hand-written loop's; see docs/benchmarks.md). The ways out that issue 26
//! lists:
//!
//! - a spawner process started once, single-threaded, that forks cheaply:
//!   one more process to start, supervise and restart, and a round trip
//!   over a socket per message for the request, the pipes (fd passing) and
//!   the exit status;
//! - a subreaper plus a pidfd, with `posix_spawn`: a subreaper only adopts
//!   orphans while dlqctl lives; with no hook in the child there is no
//!   death signal, so a handler that ignores EOF outlives a `kill -9`;
//! - `clone(CLONE_VM|CLONE_VFORK|CLONE_PIDFD)` with a child that only makes
//!   raw, async-signal-safe system calls before `execve`: what glibc's
//!   `posix_spawn` does, plus the `prctl`, in one process and with no
//!   round trip.
//!
//! Chosen: the third, the only one that keeps every guarantee with no
//! extra process. It was the only one built and measured (the other two
//! were judged on the points above, not timed): 1.34–2.69× the
//! hand-written consume-spawn-ack loop at concurrency 8 where the fork was
//! at 0.33–0.63×, 0.83–1.26× at concurrency 1 where it was 0.33–0.40×.
//!
//! Everything the child needs (paths, argv, envp, the `PATH` candidates of
//! `execvp`) is built before the `clone`, so the child allocates nothing and
//! takes no lock; the parent thread is suspended until the child calls
//! `execve` or exits. The parent learns that the process ended through a
//! pidfd watched by tokio, not through `SIGCHLD`; on a kernel without
//! pidfds (before Linux 5.3) it polls `waitpid` instead.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use libc::{c_char, c_int, c_void, pid_t};
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

/// The child's stack: it runs a few system calls (and, with lazy binding,
/// the dynamic linker's resolver once), far below this.
const CHILD_STACK_BYTES: usize = 64 * 1024;

/// `execvp`'s fallback for a file the kernel cannot execute (`ENOEXEC`, a
/// script without `#!`): the shell runs it.
const SHELL: &CStr = c"/bin/sh";

/// A variable set (a value) or removed (`None`) in the program's
/// environment, on top of ours.
pub(crate) type EnvChange = (&'static str, Option<OsString>);

/// A started program: its stdin and stderr pipes (and stdout's, from
/// [`spawn_piped`]), and its process, which is killed with its group and
/// reaped if this is dropped before it ended.
pub(crate) struct Spawned {
    /// The write end of the program's stdin.
    pub(crate) stdin: Option<pipe::Sender>,
    /// The read end of the program's stdout (`None` from [`spawn`]: its
    /// stdout is `/dev/null`).
    pub(crate) stdout: Option<pipe::Receiver>,
    /// The read end of the program's stderr.
    pub(crate) stderr: Option<pipe::Receiver>,
    proc: Proc,
}

impl Spawned {
    /// The program's process id (and its process group's).
    pub(crate) fn pid(&self) -> pid_t {
        self.proc.pid
    }

    /// Waits for the program to end and reaps it. Cancel-safe: a dropped
    /// wait leaves the process to the next one (or to the drop).
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        self.proc.wait().await
    }

    /// Kills the process group while its leader is not reaped (its pid,
    /// the group's id, is still reserved, so this cannot hit another
    /// process).
    pub(crate) fn kill_group(&self) {
        if self.proc.status.is_none() {
            self.proc.kill_group();
        }
    }

    /// Once the leader was reaped: kills what it left behind in its group.
    /// POSIX reuses no pid as a process id while a process group of that
    /// id exists, so this reaches the leftovers or, when there are none, a
    /// group that no longer exists. Does nothing while the leader runs.
    pub(crate) fn kill_leftovers(&self) {
        if self.proc.status.is_some() {
            self.proc.kill_group();
        }
    }
}

/// How the parent learns that the process ended.
enum ExitWatch {
    /// Readable once the process ended (Linux 5.3 and later).
    Pidfd(AsyncFd<OwnedFd>),
    /// `waitpid(WNOHANG)` at growing intervals.
    Poll,
}

struct Proc {
    pid: pid_t,
    exit: ExitWatch,
    /// Set once reaped.
    status: Option<ExitStatus>,
    /// This is the reaping task's copy: its drop waits, blocking.
    in_reaper: bool,
}

impl Proc {
    async fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let status = match &self.exit {
            ExitWatch::Pidfd(fd) => loop {
                let mut ready = fd.readable().await?;
                if let Some(status) = try_reap(self.pid)? {
                    break status;
                }
                ready.clear_ready();
            },
            ExitWatch::Poll => {
                let mut pause = Duration::from_millis(1);
                loop {
                    if let Some(status) = try_reap(self.pid)? {
                        break status;
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
            }
        };
        self.status = Some(status);
        Ok(status)
    }

    fn kill_group(&self) {
        // SAFETY: kill(2) has no memory-safety preconditions; the group id
        // is our unreaped child's pid.
        unsafe {
            libc::kill(-self.pid, libc::SIGKILL);
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        self.kill_group();
        if let Ok(Some(_)) = try_reap(self.pid) {
            return;
        }
        // The SIGKILL is on its way: reap on the runtime when there is
        // one, so that no zombie is left and no thread blocks. The task's
        // own Proc, if the task is dropped unrun (the runtime is shutting
        // down), waits here instead.
        if !self.in_reaper {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let mut proc = Proc {
                    pid: self.pid,
                    exit: std::mem::replace(&mut self.exit, ExitWatch::Poll),
                    status: None,
                    in_reaper: true,
                };
                runtime.spawn(async move {
                    let _ = proc.wait().await;
                });
                return;
            }
        }
        let _ = wait_blocking(self.pid);
    }
}

/// Reaps `pid` if it ended.
fn try_reap(pid: pid_t) -> io::Result<Option<ExitStatus>> {
    let mut status: c_int = 0;
    loop {
        // SAFETY: status is a valid out pointer for the call's duration.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Ok(Some(ExitStatus::from_raw(status)));
        }
        if r == 0 {
            return Ok(None);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Waits for `pid` to end, blocking the thread; only for a process that
/// ends at once (killed, or failed before `execve`).
fn wait_blocking(pid: pid_t) -> io::Result<ExitStatus> {
    let mut status: c_int = 0;
    loop {
        // SAFETY: status is a valid out pointer for the call's duration.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return Ok(ExitStatus::from_raw(status));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Starts `program` with `args`, our environment changed by `env` (a value
/// sets the variable, `None` removes it), resolving the program like
/// `execvp`. Must be called within a tokio runtime.
///
/// Errors as `std::process::Command::spawn` gives them: `InvalidInput` for
/// a NUL byte in an argument or a variable, the `execve` error (`ENOENT`,
/// `EACCES`, `E2BIG`, ...) when the program could not be started.
pub(crate) fn spawn(program: &OsStr, args: &[OsString], env: &[EnvChange]) -> io::Result<Spawned> {
    spawn_with(program, args, env, Stdout::Null, pidfd_supported())
}

/// [`spawn`], with the program's stdout a pipe too ([`Spawned::stdout`]).
pub(crate) fn spawn_piped(
    program: &OsStr,
    args: &[OsString],
    env: &[EnvChange],
) -> io::Result<Spawned> {
    spawn_with(program, args, env, Stdout::Pipe, pidfd_supported())
}

/// Where the program's stdout goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stdout {
    Null,
    Pipe,
}

/// Whether this kernel gives pidfds (`pidfd_open`, Linux 5.3, which also
/// brought `CLONE_PIDFD` and poll support); asked once.
fn pidfd_supported() -> bool {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        // SAFETY: pidfd_open of our own pid; the fd is closed at once.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
        if fd >= 0 {
            // SAFETY: fd was just opened and is owned by nobody else.
            unsafe { libc::close(fd as c_int) };
            true
        } else {
            false
        }
    })
}

fn spawn_with(
    program: &OsStr,
    args: &[OsString],
    env: &[EnvChange],
    stdout: Stdout,
    use_pidfd: bool,
) -> io::Result<Spawned> {
    let mut image = ExecImage::new(program, args, env)?;
    let (stdin_read, stdin_write) = pipe_pair()?;
    let (stderr_read, stderr_write) = pipe_pair()?;
    set_nonblocking(&stdin_write)?;
    set_nonblocking(&stderr_read)?;
    let stdin_read = above_stdio(stdin_read)?;
    let stderr_write = above_stdio(stderr_write)?;
    let stdout_pipe = match stdout {
        Stdout::Null => None,
        Stdout::Pipe => {
            let (read, write) = pipe_pair()?;
            set_nonblocking(&read)?;
            Some((read, above_stdio(write)?))
        }
    };
    let stdout_fd = match &stdout_pipe {
        Some((_, write)) => write.as_raw_fd(),
        None => dev_null()?,
    };
    let ctx = ChildContext {
        candidates: image.candidates.as_ptr(),
        candidate_count: image.candidates.len(),
        argv: image.argv.as_ptr(),
        shell_argv: image.shell_argv.as_mut_ptr(),
        envp: image.envp.as_ptr(),
        fds: [stdin_read.as_raw_fd(), stdout_fd, stderr_write.as_raw_fd()],
        // SAFETY: getpid has no preconditions.
        parent: unsafe { libc::getpid() },
        error: AtomicI32::new(0),
    };
    let (pid, pidfd) = clone_vfork(&ctx, use_pidfd)?;
    drop(stdin_read);
    drop(stderr_write);
    let stdout_read = stdout_pipe.map(|(read, _write)| read);
    drop(image);
    let failed = ctx.error.load(Ordering::SeqCst);
    if failed != 0 {
        // The child wrote why and exited before execve; it is gone or
        // about to be.
        let _ = wait_blocking(pid);
        return Err(io::Error::from_raw_os_error(failed));
    }
    let exit = match pidfd {
        // SAFETY: the OwnedFd is a valid open pidfd, moved into the
        // AsyncFd, which alone closes it (when dropped).
        Some(fd) => {
            match unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) } {
                Ok(fd) => ExitWatch::Pidfd(fd),
                Err(_) => ExitWatch::Poll,
            }
        }
        None => ExitWatch::Poll,
    };
    let proc = Proc {
        pid,
        exit,
        status: None,
        in_reaper: false,
    };
    // From here the Proc kills and reaps the child if anything fails.
    Ok(Spawned {
        stdin: Some(pipe::Sender::from_owned_fd_unchecked(stdin_write)?),
        stdout: stdout_read
            .map(pipe::Receiver::from_owned_fd_unchecked)
            .transpose()?,
        stderr: Some(pipe::Receiver::from_owned_fd_unchecked(stderr_read)?),
        proc,
    })
}

/// Runs `clone(CLONE_VM|CLONE_VFORK[|CLONE_PIDFD])` with [`child_main`]
/// and returns once the child called `execve` or exited.
fn clone_vfork(ctx: &ChildContext, use_pidfd: bool) -> io::Result<(pid_t, Option<OwnedFd>)> {
    let words = CHILD_STACK_BYTES / std::mem::size_of::<u128>();
    let mut stack: Vec<u128> = Vec::with_capacity(words);
    // The stack grows down from the end of the buffer, 16-byte aligned.
    let top = (stack.as_mut_ptr().wrapping_add(words) as usize & !15) as *mut c_void;
    let mut flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD;
    if use_pidfd {
        flags |= libc::CLONE_PIDFD;
    }
    let mut pidfd: c_int = -1;
    let all: u64 = !0;
    let mut saved: u64 = 0;
    // Block every signal around the clone: a handler of ours must not run
    // in the child, which shares our memory, before it reset them.
    // SAFETY: rt_sigprocmask with valid 8-byte masks for the call's duration.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &all as *const u64,
            &mut saved as *mut u64,
            8,
        );
    }
    // SAFETY: the child runs child_main on `stack`, which outlives it (the
    // parent thread is suspended until the child calls execve or exits:
    // CLONE_VFORK); `ctx` and everything it points to stay alive and
    // unchanged meanwhile; child_main only makes async-signal-safe calls.
    let pid = unsafe {
        libc::clone(
            child_main,
            top,
            flags,
            ctx as *const ChildContext as *mut c_void,
            &mut pidfd as *mut c_int,
        )
    };
    let clone_error = io::Error::last_os_error();
    // SAFETY: as above, restoring the mask saved there.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &saved as *const u64,
            std::ptr::null_mut::<u64>(),
            8,
        );
    }
    drop(stack);
    if pid < 0 {
        return Err(clone_error);
    }
    // SAFETY: the kernel wrote a new pidfd that nothing else owns.
    let pidfd = (use_pidfd && pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) });
    Ok((pid, pidfd))
}

/// What the child reads: raw pointers into the parent's [`ExecImage`] and
/// fds, valid while the parent is suspended.
struct ChildContext {
    candidates: *const *const c_char,
    candidate_count: usize,
    argv: *const *const c_char,
    /// `["/bin/sh", <the candidate>, args..., NULL]`: the child writes the
    /// candidate in slot 1 for the `ENOEXEC` fallback.
    shell_argv: *mut *const c_char,
    envp: *const *const c_char,
    /// The fds to make 0, 1 and 2, all above 2.
    fds: [c_int; 3],
    parent: pid_t,
    /// The errno of the step that failed, 0 when execve succeeded.
    error: AtomicI32,
}

/// The child: runs on its own stack in the parent's memory until execve.
extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the ChildContext the parent passed, alive while the
    // parent is suspended.
    let ctx = unsafe { &*(arg as *const ChildContext) };
    // SAFETY: child_exec only dereferences ctx's pointers as documented.
    let error = unsafe { child_exec(ctx) };
    ctx.error.store(error, Ordering::SeqCst);
    // SAFETY: exit_group ends this process, never returns.
    unsafe {
        libc::syscall(libc::SYS_exit_group, 127);
    }
    127
}

fn errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot (in the
    // child, the suspended parent thread's, which nothing else reads
    // meanwhile).
    unsafe { *libc::__errno_location() }
}

/// Sets the child up and calls execve; returns the errno of what failed.
/// Only async-signal-safe calls, no allocation, no panic path.
///
/// # Safety
///
/// Only in the child of [`clone_vfork`], with `ctx` as built by
/// [`spawn_with`].
unsafe fn child_exec(ctx: &ChildContext) -> c_int {
    // Default dispositions: our handlers (tokio's) point into memory the
    // program will not have, and the program expects a clean state. The
    // raw call, not glibc's sigaction, which refuses the signals glibc
    // reserves (32, 33). The kernel's struct is the handler, the flags,
    // (the restorer,) the mask: all zero is SIG_DFL, no flag, on every
    // architecture; 32 bytes cover the largest of those layouts.
    let default = [0u64; 4];
    for signal in 1..65 {
        if signal != libc::SIGKILL && signal != libc::SIGSTOP {
            libc::syscall(
                libc::SYS_rt_sigaction,
                signal,
                default.as_ptr(),
                std::ptr::null_mut::<u64>(),
                8,
            );
        }
    }
    if libc::syscall(libc::SYS_setpgid, 0, 0) != 0 {
        return errno();
    }
    if libc::syscall(
        libc::SYS_prctl,
        libc::PR_SET_PDEATHSIG,
        libc::SIGKILL,
        0,
        0,
        0,
    ) != 0
    {
        return errno();
    }
    // dlqctl may have died before the prctl: then nobody kills this child.
    if libc::syscall(libc::SYS_getppid) as pid_t != ctx.parent {
        return libc::ESRCH;
    }
    for (target, fd) in (0..).zip(ctx.fds) {
        // fd > 2 >= target: dup3 never sees equal fds, and clears
        // close-on-exec on the target.
        if libc::syscall(libc::SYS_dup3, fd, target as c_int, 0) < 0 {
            return errno();
        }
    }
    let empty: u64 = 0;
    if libc::syscall(
        libc::SYS_rt_sigprocmask,
        libc::SIG_SETMASK,
        &empty as *const u64,
        std::ptr::null_mut::<u64>(),
        8,
    ) != 0
    {
        return errno();
    }
    // execvp's rules (glibc): try each candidate; a file the kernel cannot
    // execute goes to the shell; EACCES is remembered and the search goes
    // on; "not there" errors go on; any other error stops it.
    let mut saw_eacces = false;
    let mut last = libc::ENOENT;
    for i in 0..ctx.candidate_count {
        let path = *ctx.candidates.add(i);
        libc::syscall(libc::SYS_execve, path, ctx.argv, ctx.envp);
        let mut e = errno();
        if e == libc::ENOEXEC {
            *ctx.shell_argv.add(1) = path;
            libc::syscall(libc::SYS_execve, SHELL.as_ptr(), ctx.shell_argv, ctx.envp);
            e = errno();
        }
        match e {
            libc::EACCES => saw_eacces = true,
            libc::ENOENT | libc::ESTALE | libc::ENOTDIR | libc::ENODEV | libc::ETIMEDOUT => {}
            _ => return e,
        }
        last = e;
    }
    if saw_eacces {
        libc::EACCES
    } else {
        last
    }
}

/// The strings and pointer arrays `execve` takes, built in the parent.
struct ExecImage {
    /// Owns every string the arrays point into.
    _strings: Vec<CString>,
    candidates: Vec<*const c_char>,
    argv: Vec<*const c_char>,
    shell_argv: Vec<*const c_char>,
    envp: Vec<*const c_char>,
}

fn c_string(bytes: Vec<u8>) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "nul byte found in provided data",
        )
    })
}

impl ExecImage {
    fn new(program: &OsStr, args: &[OsString], env: &[EnvChange]) -> io::Result<Self> {
        let mut strings = Vec::with_capacity(args.len() + 64);
        // A CString's bytes stay where they are when it moves: the
        // pointers taken here stay valid while `strings` lives.
        let mut keep = |s: CString| {
            let p = s.as_ptr();
            strings.push(s);
            p
        };
        if program.is_empty() {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        let mut argv = Vec::with_capacity(args.len() + 2);
        argv.push(keep(c_string(program.as_bytes().to_vec())?));
        for arg in args {
            argv.push(keep(c_string(arg.as_bytes().to_vec())?));
        }
        argv.push(std::ptr::null());
        let mut shell_argv = Vec::with_capacity(argv.len() + 1);
        shell_argv.push(SHELL.as_ptr());
        shell_argv.extend_from_slice(&argv);

        let mut envp = Vec::with_capacity(64);
        let mut path_var = None;
        // dlqctl's secrets stay with dlqctl (crate::secrets): the broker
        // and management URLs, the web token, a store's `env:NAME`,
        // unless the operator passes them (`--pass-env`).
        let withheld = crate::secrets::withheld_vars();
        for (name, value) in std::env::vars_os() {
            if env.iter().any(|(n, _)| OsStr::new(n) == name)
                || withheld.iter().any(|w| OsStr::new(w) == name)
            {
                continue;
            }
            if name == "PATH" {
                path_var = Some(value.clone());
            }
            envp.push(keep(c_string(env_entry(&name, &value))?));
        }
        for (name, value) in env.iter().filter_map(|(n, v)| v.as_deref().map(|v| (n, v))) {
            envp.push(keep(c_string(env_entry(OsStr::new(name), value))?));
        }
        envp.push(std::ptr::null());

        let mut candidates = Vec::new();
        if program.as_bytes().contains(&b'/') {
            candidates.push(argv[0]);
        } else {
            let path_var = path_var.unwrap_or_else(|| OsString::from("/bin:/usr/bin"));
            for dir in path_var.as_bytes().split(|b| *b == b':') {
                let mut full = Vec::with_capacity(dir.len() + 1 + program.len());
                if !dir.is_empty() {
                    full.extend_from_slice(dir);
                    full.push(b'/');
                }
                full.extend_from_slice(program.as_bytes());
                // A PATH entry with a NUL byte cannot be tried.
                if let Ok(c) = CString::new(full) {
                    candidates.push(keep(c));
                }
            }
        }
        Ok(ExecImage {
            _strings: strings,
            candidates,
            argv,
            shell_argv,
            envp,
        })
    }
}

fn env_entry(name: &OsStr, value: &OsStr) -> Vec<u8> {
    let mut entry = Vec::with_capacity(name.len() + 1 + value.len());
    entry.extend_from_slice(name.as_bytes());
    entry.push(b'=');
    entry.extend_from_slice(value.as_bytes());
    entry
}

/// A pipe, both ends close-on-exec: (read, write).
fn pipe_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds: [c_int; 2] = [-1; 2];
    // SAFETY: fds is a valid out array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 just opened both fds; nothing else owns them.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl on an fd we own; a pipe end has no other status flag.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `fd`, moved above 2 if it is 0, 1 or 2 (dlqctl started with a standard
/// stream closed), so that placing the child's 0, 1 and 2 never closes
/// another of its fds.
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC on an fd we own returns a new fd or -1.
    let new = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if new < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the fd was just created and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// `/dev/null`, opened once (above 2, close-on-exec) for every child's
/// stdout.
fn dev_null() -> io::Result<RawFd> {
    static DEV_NULL: OnceLock<OwnedFd> = OnceLock::new();
    if let Some(fd) = DEV_NULL.get() {
        return Ok(fd.as_raw_fd());
    }
    let file = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
    let fd = above_stdio(OwnedFd::from(file))?;
    Ok(DEV_NULL.get_or_init(|| fd).as_raw_fd())
}

#[cfg(test)]
mod tests;
