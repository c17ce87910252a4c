//! The spawner against real programs: exit statuses, pipes, the `execvp`
//! rules and errors, the child's signal state, and reaping (no zombie).

use super::*;
use crate::core::wire::TEMP_PREFIX;
use crate::handler::process::watch::{eventually, listed};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

fn temp_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("{TEMP_PREFIX}spawn-{tag}-{}", uuid::Uuid::new_v4()))
}

/// Runs `sh -c script` with `body` on stdin; its status and stderr.
async fn sh(script: &str, body: &[u8], env: &[EnvChange]) -> (ExitStatus, String) {
    let mut child = spawn(OsStr::new("sh"), &os(&["-c", script]), env).expect("spawn sh");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(body).await.unwrap();
    drop(stdin);
    status_and_stderr(child).await
}

/// Reads the child's stderr to its end, then waits for it: its status and
/// what it wrote.
async fn status_and_stderr(mut child: Spawned) -> (ExitStatus, String) {
    let mut err = String::new();
    let mut stderr = child.stderr.take().unwrap();
    stderr.read_to_string(&mut err).await.unwrap();
    (child.wait().await.unwrap(), err)
}

async fn wait_unlisted(pid: pid_t) -> bool {
    eventually(250, || !listed(pid)).await
}

#[tokio::test]
async fn exit_status_stdin_and_stderr_round_trip() {
    let (status, err) = sh("cat >&2; exit 3", b"hello\0world", &[]).await;
    assert_eq!(status.code(), Some(3));
    assert_eq!(err, "hello\0world");
    let (status, _) = sh("kill -TERM $$", b"", &[]).await;
    assert_eq!(status.signal(), Some(libc::SIGTERM));
}

/// The program as it is once started (`execve` done when spawn returns):
/// a line of its /proc status and where its fd points.
struct Running {
    child: Spawned,
}

impl Running {
    fn sleeping() -> Running {
        Running {
            child: spawn(OsStr::new("sleep"), &os(&["100"]), &[]).expect("spawn sleep"),
        }
    }

    fn status_line(&self, key: &str) -> String {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.pid())).unwrap();
        status
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_default()
            .to_string()
    }

    fn fd(&self, fd: u32) -> String {
        std::fs::read_link(format!("/proc/{}/fd/{fd}", self.child.pid()))
            .unwrap()
            .to_string_lossy()
            .into_owned()
    }
}

#[tokio::test]
async fn stdio_is_two_pipes_and_dev_null_and_env_is_ours_plus_changes() {
    let running = Running::sleeping();
    assert!(running.fd(0).starts_with("pipe:"), "{}", running.fd(0));
    assert_eq!(running.fd(1), "/dev/null");
    assert!(running.fd(2).starts_with("pipe:"), "{}", running.fd(2));
    assert_ne!(running.fd(0), running.fd(2));
    // Our ends of its pipes are not inherited (close-on-exec): the child
    // holds one fd per pipe.
    let fds: Vec<String> = std::fs::read_dir(format!("/proc/{}/fd", running.child.pid()))
        .unwrap()
        .map(|e| {
            std::fs::read_link(e.unwrap().path())
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    for fd in [0, 2] {
        let n = fds.iter().filter(|f| **f == running.fd(fd)).count();
        assert_eq!(n, 1, "{fds:?}");
    }
    drop(running);

    std::env::set_var("DLQCTL_SPAWN_TEST_KEPT", "kept");
    std::env::set_var("DLQCTL_SPAWN_TEST_REMOVED", "there");
    let env = [
        ("DLQCTL_SPAWN_TEST_SET", Some(OsString::from("a b=c"))),
        ("DLQCTL_SPAWN_TEST_REMOVED", None),
    ];
    let (status, err) = sh(
        "echo \"$DLQCTL_SPAWN_TEST_KEPT|$DLQCTL_SPAWN_TEST_SET|${DLQCTL_SPAWN_TEST_REMOVED-unset}\" >&2",
        b"",
        &env,
    )
    .await;
    assert!(status.success());
    assert_eq!(err, "kept|a b=c|unset\n");
}

/// The program starts with every signal at its default disposition and
/// none blocked, whatever dlqctl had: Rust ignores SIGPIPE, tokio catches
/// the signals it listens to, and the spawning thread may block some.
#[tokio::test]
async fn the_program_gets_default_signal_dispositions_and_an_empty_mask() {
    let _catch = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
        .expect("a SIGUSR1 handler");
    // SAFETY: ignoring SIGUSR2 in this test binary; nothing else uses it.
    unsafe { libc::signal(libc::SIGUSR2, libc::SIG_IGN) };
    let ours = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    // The test can fail: our own state is not the default.
    assert!(!ours.contains("SigIgn:\t0000000000000000"), "{ours}");
    assert!(!ours.contains("SigCgt:\t0000000000000000"), "{ours}");
    // SAFETY: sigset operations on a local set; blocks SIGUSR2 in this
    // thread (current-thread runtime: the spawn runs here) for the spawn.
    let mut blocked: libc::sigset_t = unsafe { std::mem::zeroed() };
    let mut saved: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigemptyset(&mut blocked);
        libc::sigaddset(&mut blocked, libc::SIGUSR2);
        libc::pthread_sigmask(libc::SIG_BLOCK, &blocked, &mut saved);
    }
    let running = Running::sleeping();
    let mine = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &saved, std::ptr::null_mut()) };
    assert!(!mine.contains("SigBlk:\t0000000000000000"), "{mine}");
    for key in ["SigBlk", "SigIgn", "SigCgt"] {
        assert_eq!(
            running.status_line(key),
            format!("{key}:\t0000000000000000")
        );
    }
}

#[tokio::test]
async fn the_program_leads_its_own_process_group_and_dies_with_us() {
    let (status, err) = sh("cut -d' ' -f1,5 /proc/$$/stat >&2", b"", &[]).await;
    assert!(status.success());
    let mut words = err.split_whitespace();
    assert_eq!(words.next(), words.next(), "pid and pgid: {err}");
    // The death signal is a property of the process, read from the
    // kernel: PR_GET_PDEATHSIG is not readable from outside, so the
    // program asks (the parent-death signal shows in no /proc file).
    let probe = temp_path("pdeath");
    std::fs::write(
        &probe,
        "import ctypes,sys\nlibc=ctypes.CDLL(None)\nv=ctypes.c_int()\n\
         libc.prctl(2, ctypes.byref(v))\nsys.stderr.write(str(v.value))\n",
    )
    .unwrap();
    // Debian's python3 itself, not a version manager's shim that may fork.
    let python = if std::path::Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    let child = spawn(OsStr::new(python), &[probe.clone().into()], &[]).expect("python3");
    let (status, err) = status_and_stderr(child).await;
    assert!(status.success(), "{err}");
    assert_eq!(err, libc::SIGKILL.to_string());
    std::fs::remove_file(&probe).unwrap();
}

#[tokio::test]
async fn spawn_failures_are_the_errors_execvp_gives() {
    let e = spawn(OsStr::new("no-such-program-of-dlqctl"), &[], &[])
        .err()
        .unwrap();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    let e = spawn(OsStr::new("/nonexistent/x"), &[], &[]).err().unwrap();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    let e = spawn(OsStr::new(""), &[], &[]).err().unwrap();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    let e = spawn(OsStr::new("/tmp"), &[], &[]).err().unwrap();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");

    let file = temp_path("noexec");
    std::fs::write(&file, "#!/bin/sh\nexit 0\n").unwrap();
    let e = spawn(file.as_os_str(), &[], &[]).err().unwrap();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
    std::fs::remove_file(&file).unwrap();

    let e = spawn(OsStr::new("/bin/true"), &os(&["a\0b"]), &[])
        .err()
        .unwrap();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    let env = [("DLQCTL_X", Some(OsString::from("a\0b")))];
    let e = spawn(OsStr::new("/bin/true"), &[], &env).err().unwrap();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    // One argument over Linux's 128 KiB per string.
    let big = OsString::from("x".repeat(200 * 1024));
    let e = spawn(OsStr::new("/bin/true"), &[big], &[]).err().unwrap();
    assert_eq!(e.raw_os_error(), Some(libc::E2BIG), "{e}");
}

#[tokio::test]
async fn a_script_without_a_shebang_runs_in_the_shell() {
    let file = temp_path("script");
    std::fs::write(&file, "echo \"ran $1\" >&2\nexit 7\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
    let child = spawn(file.as_os_str(), &os(&["arg"]), &[]).expect("spawn");
    let (status, err) = status_and_stderr(child).await;
    assert_eq!(status.code(), Some(7));
    assert_eq!(err, "ran arg\n");
    std::fs::remove_file(&file).unwrap();
}

#[test]
fn candidates_follow_path_like_execvp() {
    let image = ExecImage::new(OsStr::new("prog"), &[], &[]).unwrap();
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/bin:/usr/bin".into());
    let got: Vec<String> = image
        .candidates
        .iter()
        // SAFETY: the pointers are into image's live CStrings.
        .map(|p| unsafe { CStr::from_ptr(*p) }.to_string_lossy().into_owned())
        .collect();
    let want: Vec<String> = path
        .to_string_lossy()
        .split(':')
        .map(|d| {
            if d.is_empty() {
                "prog".to_string()
            } else {
                format!("{d}/prog")
            }
        })
        .collect();
    assert_eq!(got, want);
    let image = ExecImage::new(OsStr::new("./dir/prog"), &os(&["a"]), &[]).unwrap();
    assert_eq!(image.candidates.len(), 1);
    assert_eq!(image.argv.len(), 3);
    assert!(image.argv[2].is_null());
    assert_eq!(image.shell_argv.len(), 4);
    assert!(image.envp.last().unwrap().is_null());
}

/// The ways a child is watched: by its pidfd where the kernel has them,
/// and by polling.
fn watch_modes() -> Vec<bool> {
    [true, false]
        .into_iter()
        .filter(|&use_pidfd| !use_pidfd || pidfd_supported())
        .collect()
}

/// `sleep 100`, watched by its pidfd or by polling.
fn sleeper(use_pidfd: bool) -> Spawned {
    spawn_with(
        OsStr::new("sleep"),
        &os(&["100"]),
        &[],
        Stdout::Null,
        use_pidfd,
    )
    .unwrap()
}

/// Dropped while running (a cancelled or timed-out run): the group is
/// killed and the program reaped, in both ways of watching it.
#[tokio::test]
async fn a_dropped_child_is_killed_and_reaped_no_zombie() {
    for use_pidfd in watch_modes() {
        let child = sleeper(use_pidfd);
        let pid = child.pid();
        assert!(listed(pid));
        drop(child);
        assert!(
            wait_unlisted(pid).await,
            "pid {pid} left (pidfd {use_pidfd})"
        );
    }
}

#[tokio::test]
async fn kill_group_then_wait_reaps_with_the_signal() {
    for use_pidfd in watch_modes() {
        let mut child = sleeper(use_pidfd);
        let pid = child.pid();
        child.kill_group();
        let status = child.wait().await.unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert!(!listed(pid), "pid {pid} is a zombie (pidfd {use_pidfd})");
        // Waiting again answers the same; killing again is a no-op.
        child.kill_group();
        assert_eq!(child.wait().await.unwrap().signal(), Some(libc::SIGKILL));
    }
}

/// Outside a runtime (no task to reap on), the drop waits itself.
#[test]
fn a_child_dropped_outside_a_runtime_is_reaped() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let child = rt.block_on(async { sleeper(false) });
    let pid = child.pid();
    drop(child);
    assert!(!listed(pid), "pid {pid} left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_spawns_all_succeed() {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..64 {
        tasks.spawn(async move {
            let (status, err) = sh(&format!("echo {i} >&2"), b"", &[]).await;
            assert!(status.success());
            assert_eq!(err, format!("{i}\n"));
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
}

/// `spawn_piped` (the `--jsonl` processes): stdout is a third pipe of its
/// own, read back while the program runs, with the same stdin, stderr and
/// environment as `spawn`.
#[tokio::test]
async fn spawn_piped_gives_stdout_as_a_pipe_of_its_own() {
    let running = Running {
        child: spawn_piped(OsStr::new("sleep"), &os(&["100"]), &[]).expect("spawn sleep"),
    };
    let fds: Vec<String> = (0..3).map(|fd| running.fd(fd)).collect();
    assert!(fds.iter().all(|f| f.starts_with("pipe:")), "{fds:?}");
    assert!(
        fds[0] != fds[1] && fds[1] != fds[2] && fds[0] != fds[2],
        "{fds:?}"
    );
    drop(running);

    let env = [("DLQCTL_SPAWN_TEST_PIPED", Some(OsString::from("v")))];
    let mut child = spawn_piped(
        OsStr::new("sh"),
        &os(&[
            "-c",
            "read line; echo \"$line $DLQCTL_SPAWN_TEST_PIPED\"; echo err >&2",
        ]),
        &env,
    )
    .expect("spawn sh");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().expect("a stdout pipe");
    let mut stderr = child.stderr.take().unwrap();
    stdin.write_all(b"hello\n").await.unwrap();
    let mut out = String::new();
    stdout.read_to_string(&mut out).await.unwrap();
    let mut err = String::new();
    stderr.read_to_string(&mut err).await.unwrap();
    assert!(child.wait().await.unwrap().success(), "{err}");
    assert_eq!(out, "hello v\n");
    assert_eq!(err, "err\n");

    let plain = spawn(OsStr::new("true"), &[], &[]).unwrap();
    assert!(plain.stdout.is_none());
}

/// What the leader left in its group is killed once the leader is reaped,
/// and not before (`kill_leftovers` does nothing while it runs).
#[tokio::test]
async fn kill_leftovers_reaches_the_group_after_the_leader_ended() {
    let mut child = spawn_piped(
        OsStr::new("sh"),
        &os(&["-c", "sleep 100 & echo $!; read x; exit 0"]),
        &[],
    )
    .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut buf = [0u8; 32];
    let n = stdout.read(&mut buf).await.unwrap();
    let orphan: pid_t = std::str::from_utf8(&buf[..n])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    child.kill_leftovers();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(listed(orphan), "killed while the leader ran");
    drop(child.stdin.take());
    assert!(child.wait().await.unwrap().success());
    assert!(listed(orphan), "the leader's exit killed it");
    child.kill_leftovers();
    // Its parent is now init (or a subreaper), which may not reap it at
    // once: dead is gone or a zombie.
    let dead = eventually(250, || {
        let stat = std::fs::read_to_string(format!("/proc/{orphan}/stat")).unwrap_or_default();
        // The state follows the command's closing parenthesis.
        stat.rsplit_once(") ")
            .is_none_or(|(_, rest)| rest.starts_with('Z'))
    })
    .await;
    assert!(dead, "pid {orphan} still runs");
}

/// dlqctl's secret-bearing variables (and a store's `env:NAME`) do not
/// reach the program, unless passed on purpose (`--pass-env`).
#[tokio::test]
async fn secret_variables_are_withheld_unless_passed() {
    std::env::set_var("AMQP_URL", "amqp://u:pw@h");
    std::env::set_var("DLQCTL_MANAGEMENT_URL", "http://u:pw@h");
    std::env::set_var("DLQCTL_AUTH_TOKEN", "tok");
    std::env::set_var("DLQCTL_SPAWN_TEST_STORE", "redis://:pw@h");
    std::env::set_var("DLQCTL_SPAWN_TEST_PASSED", "redis://:pw@h2");
    crate::secrets::withhold_var("DLQCTL_SPAWN_TEST_STORE");
    crate::secrets::withhold_var("DLQCTL_SPAWN_TEST_PASSED");
    crate::secrets::pass_var("DLQCTL_SPAWN_TEST_PASSED");
    let script = "echo \"${AMQP_URL-unset}|${DLQCTL_MANAGEMENT_URL-unset}|${DLQCTL_AUTH_TOKEN-unset}|${DLQCTL_SPAWN_TEST_STORE-unset}|${DLQCTL_SPAWN_TEST_PASSED-unset}\" >&2";
    let (status, err) = sh(script, b"", &[]).await;
    assert!(status.success());
    assert_eq!(err, "unset|unset|unset|unset|redis://:pw@h2\n");
}
