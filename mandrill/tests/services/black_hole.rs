//! A TCP proxy that can turn into a network black hole: until then it
//! passes bytes both ways; from then on it passes nothing, either way, and
//! closes nothing, so that its clients wait as on a server stopped with
//! SIGSTOP or a route that drops every packet. Only the proxy's own
//! connections are affected: the server behind it stays up for everyone
//! else.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the proxy's threads look at their flags.
const TICK: Duration = Duration::from_millis(20);

#[derive(Default)]
struct Flags {
    /// Everything is swallowed, old connections and new.
    hung: AtomicBool,
    /// The proxy is being dropped.
    stopping: AtomicBool,
}

pub struct BlackHole {
    pub port: u16,
    flags: Arc<Flags>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
    acceptor: Option<JoinHandle<()>>,
}

impl BlackHole {
    /// A proxy to `upstream` on a free loopback port.
    pub fn to(upstream: SocketAddr) -> Self {
        Self::start(upstream, Vec::new())
    }

    /// A proxy to `upstream` that hangs each connection on which the client
    /// sends one of `markers` (bytes of a statement's text): that and the
    /// client's next write (a PostgreSQL client prepares a statement, then
    /// sends its execution) are passed on, so the server acts on them, but
    /// from then on nothing passes on that connection, its answers lost.
    /// Other connections go on.
    pub fn hanging_on(upstream: SocketAddr, markers: &[&str]) -> Self {
        Self::start(
            upstream,
            markers.iter().map(|m| m.as_bytes().to_vec()).collect(),
        )
    }

    fn start(upstream: SocketAddr, markers: Vec<Vec<u8>>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener.set_nonblocking(true).expect("non-blocking accept");
        let port = listener.local_addr().expect("proxy address").port();
        let flags = Arc::new(Flags::default());
        let threads = Arc::new(Mutex::new(Vec::new()));
        let markers = Arc::new(markers);
        let acceptor = std::thread::spawn({
            let (flags, threads) = (flags.clone(), threads.clone());
            move || {
                while !flags.stopping.load(Ordering::Acquire) {
                    let client = match listener.accept() {
                        Ok((client, _)) => client,
                        Err(error) if error.kind() == ErrorKind::WouldBlock => {
                            std::thread::sleep(TICK);
                            continue;
                        }
                        Err(_) => continue,
                    };
                    let _ = client.set_nonblocking(false);
                    let connection = Connection {
                        hung: Arc::new(AtomicBool::new(flags.hung.load(Ordering::Acquire))),
                        armed: Arc::new(AtomicBool::new(false)),
                        flags: flags.clone(),
                        markers: markers.clone(),
                    };
                    let server = if connection.is_hung() {
                        // As a stopped server: the connection is accepted,
                        // and nothing ever answers.
                        None
                    } else {
                        TcpStream::connect(upstream).ok()
                    };
                    let mut spawned = threads.lock().unwrap();
                    match server {
                        Some(server) => {
                            let up = (client.try_clone().unwrap(), server.try_clone().unwrap());
                            let c = connection.clone();
                            spawned.push(std::thread::spawn(move || c.pump(up.0, up.1, true)));
                            spawned.push(std::thread::spawn(move || {
                                connection.pump(server, client, false)
                            }));
                        }
                        None => {
                            spawned.push(std::thread::spawn(move || connection.swallow(client)))
                        }
                    }
                }
            }
        });
        Self {
            port,
            flags,
            threads,
            acceptor: Some(acceptor),
        }
    }

    /// From now on nothing passes, on any connection, old or new.
    pub fn hang(&self) {
        self.flags.hung.store(true, Ordering::Release);
    }

    /// The server `url` (`postgres://…@HOST:PORT/DB`) names.
    pub fn upstream_of(url: &str) -> SocketAddr {
        let (_, rest) = url.split_once("://").expect("a URL");
        let authority = rest.split('/').next().unwrap_or(rest);
        let host = authority
            .rsplit_once('@')
            .map_or(authority, |(_, host)| host);
        host.to_socket_addrs()
            .expect("a reachable host")
            .next()
            .expect("an address")
    }

    /// `url` (`postgres://…@HOST:PORT/DB`) through this proxy.
    pub fn url_for(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").expect("a URL");
        let (authority, path) = rest.split_once('/').expect("a database");
        let (user, _host) = match authority.rsplit_once('@') {
            Some((user, host)) => (format!("{user}@"), host),
            None => (String::new(), authority),
        };
        format!("{scheme}://{user}127.0.0.1:{}/{path}", self.port)
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.flags.stopping.store(true, Ordering::Release);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        for thread in self.threads.lock().unwrap().drain(..) {
            let _ = thread.join();
        }
    }
}

/// One proxied connection's state.
#[derive(Clone)]
struct Connection {
    /// This connection swallows everything.
    hung: Arc<AtomicBool>,
    /// A marker was sent: the client's next write is the last passed on.
    armed: Arc<AtomicBool>,
    flags: Arc<Flags>,
    markers: Arc<Vec<Vec<u8>>>,
}

impl Connection {
    fn is_hung(&self) -> bool {
        self.hung.load(Ordering::Acquire) || self.flags.hung.load(Ordering::Acquire)
    }

    fn stopping(&self) -> bool {
        self.flags.stopping.load(Ordering::Acquire)
    }

    /// Copies `from` to `to` until either ends, or, once hung, reads and
    /// drops what comes; a close seen then is not passed on either.
    fn pump(&self, mut from: TcpStream, mut to: TcpStream, from_client: bool) {
        let _ = from.set_read_timeout(Some(TICK));
        let mut buffer = vec![0u8; 64 * 1024];
        // The end of the last read, so that a marker split across two
        // reads is still seen.
        let mut tail: Vec<u8> = Vec::new();
        while !self.stopping() {
            let read = match from.read(&mut buffer) {
                Ok(0) => {
                    if !self.is_hung() {
                        let _ = to.shutdown(Shutdown::Write);
                    }
                    break;
                }
                Ok(read) => read,
                Err(error)
                    if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
                {
                    continue;
                }
                Err(_) => break,
            };
            if self.is_hung() {
                continue;
            }
            if from_client && self.armed.load(Ordering::Acquire) {
                // Hung before the server can answer this last write.
                self.hung.store(true, Ordering::Release);
                let _ = to.write_all(&buffer[..read]);
                continue;
            }
            if to.write_all(&buffer[..read]).is_err() {
                break;
            }
            if from_client && !self.markers.is_empty() {
                tail.extend_from_slice(&buffer[..read]);
                if self
                    .markers
                    .iter()
                    .any(|marker| tail.windows(marker.len()).any(|w| w == marker.as_slice()))
                {
                    self.armed.store(true, Ordering::Release);
                }
                let keep = self.markers.iter().map(Vec::len).max().unwrap_or(0);
                let cut = tail.len().saturating_sub(keep);
                tail.drain(..cut);
            }
        }
    }

    /// Holds a connection accepted while hung: reads and drops its bytes.
    fn swallow(&self, mut client: TcpStream) {
        let _ = client.set_read_timeout(Some(TICK));
        let mut buffer = vec![0u8; 16 * 1024];
        while !self.stopping() {
            match client.read(&mut buffer) {
                Ok(0) => break,
                Ok(_) => {}
                Err(error)
                    if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => break,
            }
        }
    }
}
