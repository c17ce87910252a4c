//! A `redis-server` of a test's own: on a free loopback port, keeping
//! nothing on disk (`--save ""`, no append-only file), killed when
//! dropped. Optionally with a password, or TLS only (`rediss://`, a CA
//! and a server certificate made with the `openssl` command). A test
//! stops it and starts it again, empty, on the same port, to see what an
//! outage does.
//!
//! It never touches the Redis other people run on port 6379. Without
//! `redis-server` (or, for TLS, `openssl`) the test fails, saying what
//! to install: it never skips.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::Scratch;

/// A running (or stopped) redis-server.
pub struct RedisServer {
    port: u16,
    password: Option<String>,
    /// The CA's certificate (PEM), when TLS only.
    ca: Option<PathBuf>,
    dir: Scratch,
    child: Option<Child>,
}

impl RedisServer {
    /// A server without a password.
    pub fn start() -> RedisServer {
        RedisServer::launch(None, false)
    }

    /// A server that wants `password` (`--requirepass`).
    pub fn with_password(password: &str) -> RedisServer {
        RedisServer::launch(Some(password.to_string()), false)
    }

    /// A server that speaks TLS only, with a certificate for `localhost`
    /// and 127.0.0.1 signed by a CA of its own ([`RedisServer::ca_pem`]).
    pub fn tls() -> RedisServer {
        RedisServer::launch(None, true)
    }

    fn launch(password: Option<String>, tls: bool) -> RedisServer {
        let dir = Scratch::new();
        let ca = tls.then(|| make_certificates(dir.path()));
        let mut server = RedisServer {
            port: 0,
            password,
            ca,
            dir,
            child: None,
        };
        // A free port can be taken between the look and the bind: a few tries.
        for _ in 0..5 {
            server.port = free_port();
            if server.spawn() {
                return server;
            }
        }
        panic!("redis-server found no free port: {}", server.log());
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its URL, with its password if it has one: `redis://:PASSWORD@127.0.0.1:PORT/0`,
    /// or `rediss://localhost:PORT/0` for TLS.
    pub fn url(&self) -> String {
        match &self.password {
            Some(p) => self.url_with_password(p),
            None if self.ca.is_some() => format!("rediss://localhost:{}/0", self.port),
            None => format!("redis://127.0.0.1:{}/0", self.port),
        }
    }

    /// Its URL with `password`, right or wrong.
    pub fn url_with_password(&self, password: &str) -> String {
        format!("redis://:{password}@127.0.0.1:{}/0", self.port)
    }

    /// The CA its TLS certificate chains to (PEM).
    pub fn ca_pem(&self) -> Vec<u8> {
        let ca = self.ca.as_ref().expect("a TLS server");
        std::fs::read(ca).expect("read the CA certificate")
    }

    /// Kills it (SIGKILL: an outage, not a shutdown); the port stays its own.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.spawn() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not start again on port {}: {}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// What the server logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    /// Spawns redis-server and waits until it listens; `false` when it
    /// exited (the port taken).
    fn spawn(&mut self) -> bool {
        let port = self.port.to_string();
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(self.dir.path());
        match &self.ca {
            Some(ca) => {
                let d = self.dir.path();
                cmd.args(["--port", "0", "--tls-port", &port])
                    .arg("--tls-cert-file")
                    .arg(d.join("server.crt"))
                    .arg("--tls-key-file")
                    .arg(d.join("server.key"))
                    .arg("--tls-ca-cert-file")
                    .arg(ca)
                    .args(["--tls-auth-clients", "no"]);
            }
            None => {
                cmd.args(["--port", &port]);
            }
        }
        if let Some(p) = &self.password {
            cmd.args(["--requirepass", p]);
        }
        let log = std::fs::File::create(self.dir.path().join("redis.log")).expect("a log file");
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().expect("a log file"))
            .stderr(log);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                "redis-server is not installed (the idempotency store tests run their own): \
                 apt-get install redis-server"
            ),
            Err(e) => panic!("cannot run redis-server: {e}"),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                if self.log().contains("Address already in use") {
                    return false;
                }
                panic!("redis-server exited ({status}): {}", self.log());
            }
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
            if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                self.child = Some(child);
                return true;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not listen: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A loopback port nothing listens on (as the system hands them out).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("its address").port()
}

/// Makes `ca.crt`, `server.crt` and `server.key` in `dir` with the
/// `openssl` command; returns the CA's path.
fn make_certificates(dir: &Path) -> PathBuf {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        dir,
        &[
            &["req", "-x509"],
            &ec[..],
            &["-keyout", "ca.key", "-out", "ca.crt", "-days", "2"],
        ],
        &[
            "-subj",
            "/CN=dlqctl test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
    openssl(
        dir,
        &[
            &["req"],
            &ec[..],
            &["-keyout", "server.key", "-out", "server.csr"],
        ],
        &["-subj", "/CN=localhost"],
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write the extensions");
    openssl(
        dir,
        &[&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
        ]],
        &[
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ],
    );
    dir.join("ca.crt")
}

fn openssl(dir: &Path, parts: &[&[&str]], more: &[&str]) {
    let args: Vec<&str> = parts
        .iter()
        .flat_map(|p| p.iter().copied())
        .chain(more.iter().copied())
        .collect();
    let out = match Command::new("openssl")
        .args(&args)
        .current_dir(dir)
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            panic!("openssl is not installed (the rediss:// test makes its certificates): apt-get install openssl")
        }
        Err(e) => panic!("cannot run openssl: {e}"),
    };
    assert!(
        out.status.success(),
        "openssl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}
