//! Harness for end-to-end tests: starts Cairn's real binaries against the real services,
//! each test with its own database, queue prefix and Redis key prefix.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub mod browser;
pub mod cluster;
pub mod handoff;
pub mod interrupted;
pub mod sandboxes;

pub use cairn_common::testing::{self, ServiceLock};

/// The directory holding the built binaries (`target/debug`), or `CAIRN_BIN_DIR`.
pub fn bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("CAIRN_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/debug/deps/<test> -> target/debug
    exe.parent()
        .and_then(|deps| deps.parent())
        .expect("target directory")
        .to_path_buf()
}

pub fn binary(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: build the binaries first (cargo build --workspace --bins)",
        path.display()
    );
    path
}

/// A free TCP port on loopback, never one handed out to a test that is still running: a
/// binary binds its port only after it reached the database, and until then the kernel
/// would hand the same free port to a test running beside it, whose process would then
/// answer for ours. Tests run in processes of their own (cargo-nextest) or as threads of
/// one (`cargo test`), so the reservation is a lock on a file named after the port,
/// held until this process ends.
pub fn free_addr() -> SocketAddr {
    use std::fs::{File, TryLockError};
    use std::sync::{Mutex, PoisonError};
    static HELD: Mutex<Vec<(u16, File)>> = Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("cairn-test-ports");
    std::fs::create_dir_all(&dir).expect("the port reservations' directory");
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        let addr = listener.local_addr().expect("local address");
        let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
        if held.iter().any(|(port, _)| *port == addr.port()) {
            continue;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(addr.port().to_string()))
            .expect("a port reservation file");
        match file.try_lock() {
            Ok(()) => {
                held.push((addr.port(), file));
                return addr;
            }
            Err(TryLockError::WouldBlock) => continue,
            Err(TryLockError::Error(e)) => panic!("reserve port {}: {e}", addr.port()),
        }
    }
}

/// Settings that isolate one test: database, queue prefix and Redis key prefix.
#[derive(Debug)]
pub struct Isolation {
    pub database_name: String,
    pub database_url: String,
    pub prefix: String,
}

impl Isolation {
    /// A test's own database, already migrated (a copy of the migrated template), its
    /// queue prefix and key prefix.
    pub fn new(label: &str) -> Isolation {
        let isolation = Isolation::unmade(label);
        testing::create_migrated_blocking(&isolation.database_name);
        isolation
    }

    /// The same, with a database that does not exist yet: the first binary makes it.
    pub fn unmade(label: &str) -> Isolation {
        let prefix = testing::unique_prefix(label);
        let database_name = testing::database_name();
        Isolation {
            database_url: format!("{}/{database_name}", server_url()),
            database_name,
            prefix,
        }
    }

    /// The environment every binary of this test gets.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("CAIRN_DATABASE_URL".into(), self.database_url.clone()),
            ("CAIRN_REDIS_URL".into(), testing::redis_url()),
            ("CAIRN_REDIS_PREFIX".into(), self.prefix.clone()),
            ("CAIRN_AMQP_URL".into(), testing::amqp_url()),
            ("CAIRN_QUEUE_PREFIX".into(), self.prefix.clone()),
            ("CAIRN_LOG_FORMAT".into(), "json".into()),
            // Four tests at a time, each with a scheduler and workers, share one server's
            // 100 connections: each process keeps two open, not eight.
            ("CAIRN_DATABASE_WARM_CONNECTIONS".into(), "2".into()),
            // A worker refuses a workspaces directory another worker holds: each test's
            // workers get their own (a cluster names one per worker after this).
            (
                "CAIRN_WORKSPACES_DIR".into(),
                self.scratch()
                    .join("workspaces")
                    .to_string_lossy()
                    .into_owned(),
            ),
        ]
    }

    /// A directory of this test's own, removed with it.
    fn scratch(&self) -> PathBuf {
        std::env::temp_dir().join(format!("cairn-e2e-{}", self.prefix.trim_end_matches('.')))
    }
}

/// The test's database is dropped with it, even when the test panics.
impl Drop for Isolation {
    fn drop(&mut self) {
        testing::drop_database_blocking(&self.database_name);
        testing::delete_topology_blocking(&self.prefix);
        let _ = std::fs::remove_dir_all(self.scratch());
    }
}

fn server_url() -> String {
    testing::postgres_server_url()
}

/// A running binary; killed with SIGKILL if the test drops it while it still runs.
pub struct Process {
    pub name: String,
    child: Child,
    log: PathBuf,
}

impl Process {
    pub fn start(name: &str, env: &[(String, String)]) -> Process {
        Self::start_with_args(name, env, &[])
    }

    pub fn start_with_args(name: &str, env: &[(String, String)], args: &[&str]) -> Process {
        Self::spawn(name, env, args, false)
    }

    /// Starts a binary whose stderr is a pipe nobody reads: its read end is closed at
    /// once, as `cairn-worker 2>&1 | head -2` leaves it.
    pub fn start_with_closed_stderr(name: &str, env: &[(String, String)]) -> Process {
        Self::spawn(name, env, &[], true)
    }

    fn spawn(name: &str, env: &[(String, String)], args: &[&str], closed_stderr: bool) -> Process {
        let log = std::env::temp_dir().join(format!(
            "cairn-e2e-{name}-{}.log",
            uuid::Uuid::new_v4().simple()
        ));
        let out = std::fs::File::create(&log).expect("create log file");
        let err = if closed_stderr {
            Stdio::piped()
        } else {
            Stdio::from(out.try_clone().expect("clone log file"))
        };
        let mut child = Command::new(binary(name))
            .args(args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn binary");
        drop(child.stderr.take());
        Process {
            name: name.to_string(),
            child,
            log,
        }
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid fits i32")
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), signal)
            .expect("send signal");
    }

    /// Waits for the process to exit, up to `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The first UUID in its hyphenated form in `text`: logs print ids as the 32 hex
/// characters of the API and the CLI, never this way.
pub fn hyphenated_uuid(text: &str) -> Option<&str> {
    const GROUPS: [usize; 5] = [8, 4, 4, 4, 12];
    let bytes = text.as_bytes();
    let is_hex = |b: u8| b.is_ascii_hexdigit();
    (0..bytes.len()).find_map(|start| {
        let mut at = start;
        for (i, len) in GROUPS.iter().enumerate() {
            if i > 0 {
                if bytes.get(at) != Some(&b'-') {
                    return None;
                }
                at += 1;
            }
            let group = bytes.get(at..at + len)?;
            if !group.iter().all(|&b| is_hex(b)) {
                return None;
            }
            at += len;
        }
        let bounded = start == 0 || !is_hex(bytes[start - 1]);
        (bounded && bytes.get(at).is_none_or(|&b| !is_hex(b))).then(|| &text[start..at])
    })
}

/// A minimal HTTP/1.1 response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: String,
}

impl Response {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// One HTTP request on a fresh connection (tests only need plain loopback HTTP).
pub fn http(addr: SocketAddr, method: &str, path: &str) -> std::io::Result<Response> {
    request(addr, method, path, None, None)
}

/// An HTTP request with an optional bearer token and JSON body.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&serde_json::Value>,
) -> std::io::Result<Response> {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let content_type = (!body.is_empty()).then_some("application/json");
    let headers = token
        .map(|t| vec![format!("Authorization: Bearer {t}")])
        .unwrap_or_default();
    let raw = exchange(addr, method, path, &headers, content_type, body.as_bytes())?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok(Response { status, body })
}

/// One HTTP/1.1 exchange with raw bytes: the whole response, head and body.
pub fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[String],
    content_type: Option<&str>,
    body: &[u8],
) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(90)))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for header in headers {
        head.push_str(header);
        head.push_str("\r\n");
    }
    if let Some(content_type) = content_type {
        head.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    Ok(raw)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// Polls `GET path` until it answers `status`, or panics with the process log.
pub fn wait_for_status(
    process: &mut Process,
    addr: SocketAddr,
    path: &str,
    status: u16,
    timeout: Duration,
) -> Response {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(response) = http(addr, "GET", path) {
            if response.status == status {
                return response;
            }
        }
        if let Some(exit) = process.wait_exit(Duration::ZERO) {
            panic!(
                "{} exited ({exit}) before {path} answered {status}:\n{}",
                process.name,
                process.log()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{} did not answer {status} on {path} within {timeout:?}:\n{}",
            process.name,
            process.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Command lines of host processes that hold `marker` (a step's own processes are
/// found this way: their process ids are of their sandbox's PID namespace).
pub fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(marker) {
            found.push(cmdline);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::hyphenated_uuid;

    #[test]
    fn finds_a_hyphenated_uuid_and_nothing_else() {
        let id = "0b7e9a52-3c1d-4f6e-8a90-1b2c3d4e5f60";
        assert_eq!(hyphenated_uuid(&format!("request_id={id} done")), Some(id));
        assert_eq!(hyphenated_uuid(id), Some(id));
        assert_eq!(hyphenated_uuid("0b7e9a523c1d4f6e8a901b2c3d4e5f60"), None);
        assert_eq!(hyphenated_uuid(&format!("{id}a")), None);
        assert_eq!(hyphenated_uuid("2026-12-01T22:05:54Z"), None);
    }
}
