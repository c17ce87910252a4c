//! A TCP relay in front of the broker, for faults a test must cause on
//! one connection path only: `close` drops every connection and stops
//! listening (a node that died), `blackhole` keeps the sockets open but
//! stops forwarding in both directions (a silent network: no RST, no FIN).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// A relay from a local port to `target`.
pub struct Relay {
    /// Where clients connect.
    pub addr: SocketAddr,
    closed: CancellationToken,
    silent: Arc<AtomicBool>,
}

impl Relay {
    /// Listens on a free local port and forwards each connection to `target`.
    pub async fn start(target: SocketAddr) -> Relay {
        Relay::start_on("127.0.0.1:0".parse().expect("an address"), target).await
    }

    /// Listens on `listen` (a port a client already tries: a broker that
    /// comes up late) and forwards each connection to `target`.
    pub async fn start_on(listen: SocketAddr, target: SocketAddr) -> Relay {
        let listener = TcpListener::bind(listen).await.expect("bind a relay");
        let addr = listener.local_addr().expect("relay address");
        let closed = CancellationToken::new();
        let silent = Arc::new(AtomicBool::new(false));
        let (c, s) = (closed.clone(), silent.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = c.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok((client, _)) = accepted else { continue };
                let (c, s) = (c.clone(), s.clone());
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::select! {
                        () = c.cancelled() => {}
                        () = pump(cr, sw, s.clone()) => {}
                        () = pump(sr, cw, s) => {}
                    }
                    // Dropping both halves closes the sockets.
                });
            }
        });
        Relay {
            addr,
            closed,
            silent,
        }
    }

    /// An AMQP URL (guest/guest, vhost `/`) through the relay.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@{}/%2f", self.addr)
    }

    /// Drops every connection and stops listening.
    pub fn close(&self) {
        self.closed.cancel();
    }

    /// Stops forwarding, keeping every socket open.
    pub fn blackhole(&self) {
        self.silent.store(true, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    silent: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if silent.load(Ordering::SeqCst) {
            // Swallow everything from now on, and never close.
            loop {
                if matches!(from.read(&mut buf).await, Ok(0) | Err(_)) {
                    std::future::pending::<()>().await;
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
