//! A small key-value store over TCP: how the ranks of a group started as separate processes
//! (by `torchrun`, `mpirun`, Slurm) find each other. Rank 0 serves it on `MASTER_ADDR:
//! MASTER_PORT`; every rank (rank 0 too) is a client. The ranks pass NCCL's unique id through
//! it and meet on it the way the threads of one process meet on a mutex
//! ([`super::rendezvous`]).
//!
//! The protocol is three requests on one connection per client, each answered at once (a
//! client that waits for a key polls; nothing blocks the server):
//!
//! * `S <key-len> <value-len>\n<key><value>`: set, answered `+\n`;
//! * `N <key-len> <value-len>\n<key><value>`: set unless present (the first failure of a
//!   channel is kept), answered `+\n`;
//! * `G <key-len>\n<key>`: get, answered `= <len>\n<value>` or `-\n`.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The largest key or value the store takes (a guard against a stray connection).
const MAX_LEN: usize = 16 << 20;

/// The store's contents, shared by the server's connection threads.
type Map = Arc<Mutex<HashMap<Vec<u8>, Vec<u8>>>>;

/// The server, on rank 0: accepts connections on its own thread, one thread per connection.
/// It lives as long as the process (ranks may still meet while rank 0 shuts down).
pub(crate) struct StoreServer {
    addr: SocketAddr,
}

impl StoreServer {
    /// Listens on `addr` (port 0: any free port) and serves on background threads.
    pub(crate) fn start(addr: impl ToSocketAddrs) -> io::Result<StoreServer> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let map: Map = Arc::default();
        std::thread::Builder::new()
            .name("graph-runtime-store".into())
            .spawn(move || {
                for stream in listener.incoming().flatten() {
                    let map = map.clone();
                    let _ = std::thread::Builder::new()
                        .name("graph-runtime-store-conn".into())
                        .spawn(move || serve(stream, &map));
                }
            })?;
        Ok(StoreServer { addr })
    }

    /// Where it listens.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Answers one client's requests until it disconnects or sends something malformed.
fn serve(stream: TcpStream, map: &Map) {
    let _ = stream.set_nodelay(true);
    let Ok(write_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut writer = write_half;
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let mut parts = line.split_whitespace();
        let kind = parts.next().unwrap_or("");
        let lens: Vec<usize> = parts.filter_map(|p| p.parse().ok()).collect();
        if lens.iter().any(|&l| l > MAX_LEN) {
            return;
        }
        let answer = match (kind, lens.as_slice()) {
            ("S" | "N", &[k, v]) => {
                let (Ok(key), Ok(value)) = (read_n(&mut reader, k), read_n(&mut reader, v)) else {
                    return;
                };
                let mut m = map.lock().unwrap_or_else(|p| p.into_inner());
                if kind == "S" || !m.contains_key(&key) {
                    m.insert(key, value);
                }
                b"+\n".to_vec()
            }
            ("G", &[k]) => {
                let Ok(key) = read_n(&mut reader, k) else {
                    return;
                };
                let m = map.lock().unwrap_or_else(|p| p.into_inner());
                match m.get(&key) {
                    Some(v) => {
                        let mut a = format!("= {}\n", v.len()).into_bytes();
                        a.extend_from_slice(v);
                        a
                    }
                    None => b"-\n".to_vec(),
                }
            }
            _ => return,
        };
        if writer.write_all(&answer).is_err() {
            return;
        }
    }
}

fn read_n(r: &mut impl Read, n: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0; n];
    r.read_exact(&mut buf)?;
    Ok(buf)
}

/// One process's connection to the store.
pub(crate) struct StoreClient {
    conn: Mutex<BufReader<TcpStream>>,
    addr: SocketAddr,
}

impl std::fmt::Debug for StoreClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreClient")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl StoreClient {
    /// Connects to the store at `addr`, retrying until `timeout` (rank 0 may not be
    /// listening yet when the others start).
    pub(crate) fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<StoreClient> {
        let started = Instant::now();
        loop {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                Ok(stream) => {
                    stream.set_nodelay(true)?;
                    return Ok(StoreClient {
                        conn: Mutex::new(BufReader::new(stream)),
                        addr,
                    });
                }
                Err(e) if started.elapsed() >= timeout => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn request(&self, head: String, body: &[&[u8]]) -> io::Result<Option<Vec<u8>>> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let mut msg = head.into_bytes();
        for part in body {
            msg.extend_from_slice(part);
        }
        conn.get_mut().write_all(&msg)?;
        let mut line = String::new();
        if conn.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let line = line.trim_end();
        match line.split_once(' ') {
            Some(("=", len)) => {
                let len: usize = len.parse().map_err(|_| io::ErrorKind::InvalidData)?;
                Ok(Some(read_n(&mut *conn, len)?))
            }
            _ if line == "+" || line == "-" => Ok(None),
            _ => Err(io::ErrorKind::InvalidData.into()),
        }
    }

    /// Sets `key` to `value`.
    pub(crate) fn set(&self, key: &str, value: &[u8]) -> io::Result<()> {
        let head = format!("S {} {}\n", key.len(), value.len());
        self.request(head, &[key.as_bytes(), value]).map(drop)
    }

    /// Sets `key` to `value` unless it has a value already.
    pub(crate) fn set_if_absent(&self, key: &str, value: &[u8]) -> io::Result<()> {
        let head = format!("N {} {}\n", key.len(), value.len());
        self.request(head, &[key.as_bytes(), value]).map(drop)
    }

    /// The value of `key`, if set.
    pub(crate) fn get(&self, key: &str) -> io::Result<Option<Vec<u8>>> {
        self.request(format!("G {}\n", key.len()), &[key.as_bytes()])
    }

    /// Waits until `key` is set (polling), up to `timeout`.
    pub(crate) fn wait(&self, key: &str, timeout: Duration) -> io::Result<Option<Vec<u8>>> {
        let started = Instant::now();
        loop {
            if let Some(v) = self.get(key)? {
                return Ok(Some(v));
            }
            if started.elapsed() >= timeout {
                return Ok(None);
            }
            std::thread::sleep(poll_interval(started.elapsed()));
        }
    }
}

/// How long a waiting client sleeps between polls: short at first (ranks usually arrive
/// within microseconds of each other), longer when a rank is late.
pub(crate) fn poll_interval(waited: Duration) -> Duration {
    if waited < Duration::from_millis(2) {
        Duration::from_micros(20)
    } else if waited < Duration::from_millis(100) {
        Duration::from_micros(200)
    } else {
        Duration::from_millis(2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_and_set_if_absent_over_loopback() {
        let server = StoreServer::start("127.0.0.1:0").unwrap();
        let a = StoreClient::connect(server.addr(), Duration::from_secs(5)).unwrap();
        let b = StoreClient::connect(server.addr(), Duration::from_secs(5)).unwrap();
        assert_eq!(a.get("k").unwrap(), None);
        a.set("k", b"one").unwrap();
        assert_eq!(b.get("k").unwrap().as_deref(), Some(&b"one"[..]));
        b.set_if_absent("k", b"two").unwrap();
        assert_eq!(a.get("k").unwrap().as_deref(), Some(&b"one"[..]));
        // Binary values with newlines and spaces, and an empty one.
        let blob: Vec<u8> = (0..=255u8).collect();
        a.set("blob key", &blob).unwrap();
        assert_eq!(b.get("blob key").unwrap(), Some(blob));
        a.set("empty", b"").unwrap();
        assert_eq!(b.get("empty").unwrap(), Some(Vec::new()));
    }

    #[test]
    fn a_waiting_client_sees_a_later_set_and_gives_up_on_a_missing_key() {
        let server = StoreServer::start("127.0.0.1:0").unwrap();
        let addr = server.addr();
        let setter = std::thread::spawn(move || {
            let c = StoreClient::connect(addr, Duration::from_secs(5)).unwrap();
            std::thread::sleep(Duration::from_millis(30));
            c.set("late", b"here").unwrap();
        });
        let c = StoreClient::connect(addr, Duration::from_secs(5)).unwrap();
        let got = c.wait("late", Duration::from_secs(5)).unwrap();
        assert_eq!(got.as_deref(), Some(&b"here"[..]));
        setter.join().unwrap();
        let started = Instant::now();
        assert_eq!(c.wait("never", Duration::from_millis(50)).unwrap(), None);
        assert!(started.elapsed() >= Duration::from_millis(50));
    }

    #[test]
    fn a_stray_connection_is_dropped_and_the_store_serves_on() {
        let server = StoreServer::start("127.0.0.1:0").unwrap();
        // Garbage, and a length beyond the limit: the server closes those connections.
        for junk in [&b"HELLO\n"[..], format!("S {} 1\n", MAX_LEN + 1).as_bytes()] {
            let mut stray = TcpStream::connect(server.addr()).unwrap();
            stray.write_all(junk).unwrap();
            let mut buf = [0u8; 8];
            stray
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            assert_eq!(
                stray.read(&mut buf).unwrap_or(0),
                0,
                "the server answered {junk:?}"
            );
        }
        let c = StoreClient::connect(server.addr(), Duration::from_secs(5)).unwrap();
        c.set("still", b"here").unwrap();
        assert_eq!(c.get("still").unwrap().as_deref(), Some(&b"here"[..]));
    }

    #[test]
    fn a_client_retries_until_the_server_listens() {
        // Find a free port, then start the server on it a little after the client tries.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let server = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            StoreServer::start(addr).unwrap()
        });
        let c = StoreClient::connect(addr, Duration::from_secs(10)).unwrap();
        let _server = server.join().unwrap();
        c.set("x", b"1").unwrap();
        assert_eq!(c.get("x").unwrap().as_deref(), Some(&b"1"[..]));
    }
}
