//! A sandbox exec's input and control while it runs: its standard input kept open (a
//! pipe) or a terminal it runs in (a pseudo-terminal this worker holds the master of),
//! and the registry the scheduler's calls reach through the probes listener (input,
//! resize, kill; with the listener's key).
//!
//! Every write is bounded in time: a command that reads nothing never holds a thread
//! of the worker. A terminal's output is relayed from its master into a pipe, which the
//! step's output machinery reads as the command's stdout.

use crate::preview::Previews;
use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The most input one call carries.
pub const MAX_INPUT: usize = 64 * 1024;
/// How long a write waits for the command to read.
const WRITE_WAIT: Duration = Duration::from_secs(5);
/// How many times (every 20 ms) a call waits for its exec to be registered.
const REGISTERING_TRIES: usize = 100;
/// The header that asks for the input to be closed after this call's bytes.
pub const EOF_HEADER: &str = "cairn-input-eof";

/// A command's input, made before it starts.
#[derive(Debug)]
pub struct Input {
    /// What the command gets as its standard input (the pipe's read end, or the
    /// terminal); dropped once it started, so that its end is seen.
    child_end: Mutex<Option<OwnedFd>>,
    /// Where input is written (the pipe's write end, or the terminal's master), non
    /// blocking; `None` once closed.
    writer: Mutex<Option<Arc<OwnedFd>>>,
    /// The terminal's master, for its size and its output.
    master: Option<Arc<OwnedFd>>,
    /// Held while the exec is this worker's: when it goes (the exec ended), the relay
    /// of the terminal's output stops, the master closes, and the terminal hangs up
    /// (`SIGHUP` to what still runs on it).
    hangup: Option<(OwnedFd, Mutex<Option<OwnedFd>>)>,
}

impl Input {
    /// A pipe: the command reads what is written until it is closed.
    pub fn pipe() -> io::Result<Input> {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        nonblocking(&write)?;
        Ok(Input {
            child_end: Mutex::new(Some(read)),
            writer: Mutex::new(Some(Arc::new(write))),
            master: None,
            hangup: None,
        })
    }

    /// A terminal of `rows` by `cols`: the command's input, output and errors.
    pub fn terminal(rows: u16, cols: u16) -> io::Result<Input> {
        use nix::fcntl::OFlag;
        use std::os::fd::{FromRawFd, IntoRawFd};
        // Both ends close-on-exec from their first instant: a process the worker starts
        // meanwhile (another sandbox's command) never inherits either.
        let master = nix::pty::posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)?;
        nix::pty::grantpt(&master)?;
        nix::pty::unlockpt(&master)?;
        // SAFETY: the master is a pseudo-terminal master this process owns;
        // TIOCGPTPEER opens its peer and returns a new descriptor (or -1), which is
        // owned from here on.
        #[allow(unsafe_code)]
        let (master, slave) = unsafe {
            let master = OwnedFd::from_raw_fd(master.into_raw_fd());
            let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
            let slave = libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, flags);
            if slave < 0 {
                return Err(io::Error::last_os_error());
            }
            (master, OwnedFd::from_raw_fd(slave))
        };
        set_size(&master, rows, cols)?;
        nonblocking(&master)?;
        let master = Arc::new(master);
        let (watch, held) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        Ok(Input {
            child_end: Mutex::new(Some(slave)),
            writer: Mutex::new(Some(master.clone())),
            master: Some(master),
            hangup: Some((held, Mutex::new(Some(watch)))),
        })
    }

    pub fn is_terminal(&self) -> bool {
        self.master.is_some()
    }

    /// A copy of the command's end, for one start.
    pub fn for_child(&self) -> io::Result<OwnedFd> {
        lock(&self.child_end)
            .as_ref()
            .ok_or_else(|| io::Error::other("the command has started"))?
            .try_clone()
    }

    /// The command started: this worker's copy of its end goes (a terminal's output
    /// then ends when the command's last copy closes), and a terminal's output is
    /// relayed into the pipe whose read end this returns.
    pub fn started(&self) -> io::Result<Option<OwnedFd>> {
        lock(&self.child_end).take();
        let (Some(master), Some((_, watch))) = (&self.master, &self.hangup) else {
            return Ok(None);
        };
        let watch = lock(watch)
            .take()
            .ok_or_else(|| io::Error::other("the terminal's output is relayed already"))?;
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let master = master.clone();
        std::thread::Builder::new()
            .name("terminal-output".into())
            .spawn(move || relay(master, &watch, write))?;
        Ok(Some(read))
    }

    /// Writes `data`, waiting at most [`WRITE_WAIT`] for the command to read; how much
    /// was taken. With `eof`, closes the input after (a terminal gets its end-of-file
    /// character instead: it stays open).
    async fn write(&self, data: &[u8], eof: bool) -> Result<usize, Refusal> {
        let Some(writer) = lock(&self.writer).clone() else {
            return Err(Refusal::Closed);
        };
        let written = write_within(&writer, data).await;
        if eof && written == data.len() {
            if self.is_terminal() {
                let end = [4u8];
                write_within(&writer, &end).await;
            } else {
                lock(&self.writer).take();
            }
        }
        Ok(written)
    }

    fn resize(&self, rows: u16, cols: u16) -> Result<(), Refusal> {
        let Some(master) = &self.master else {
            return Err(Refusal::NotATerminal);
        };
        set_size(master, rows, cols).map_err(|e| Refusal::Io(e.to_string()))
    }
}

/// Sets a terminal's size (its foreground job gets `SIGWINCH`).
fn set_size(master: &OwnedFd, rows: u16, cols: u16) -> io::Result<()> {
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from the pointer, which outlives the call.
    #[allow(unsafe_code)]
    let done = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &size) };
    if done < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn nonblocking(fd: &OwnedFd) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

/// Writes what the command takes within [`WRITE_WAIT`].
async fn write_within(fd: &OwnedFd, data: &[u8]) -> usize {
    let deadline = tokio::time::Instant::now() + WRITE_WAIT;
    let mut written = 0;
    while written < data.len() {
        match nix::unistd::write(fd.as_fd(), &data[written..]) {
            Ok(n) => written += n,
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {
                if tokio::time::Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // Nobody reads any more (the command ended): nothing more is taken.
            Err(_) => break,
        }
    }
    written
}

/// Copies the terminal's output into `out` until the terminal's last user closes it
/// (the master then reads EIO), nobody reads `out`, or the exec is over (`watch` hangs
/// up): this copy of the master then goes with it.
fn relay(master: Arc<OwnedFd>, watch: &OwnedFd, out: OwnedFd) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let out = std::fs::File::from(out);
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let mut ready = [
            PollFd::new(master.as_fd(), PollFlags::POLLIN),
            PollFd::new(watch.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut ready, PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return,
        }
        if ready[1].any().unwrap_or(true) {
            return;
        }
        match nix::unistd::read(&*master, &mut buffer) {
            Ok(0) => return,
            Ok(n) => {
                if io::Write::write_all(&mut &out, &buffer[..n]).is_err() {
                    return;
                }
            }
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
            // EIO: no process has the terminal open any more.
            Err(_) => return,
        }
    }
}

/// What a running exec can be asked: its input (if it has one), and to end.
struct Control {
    input: Option<Arc<Input>>,
    kill: CancellationToken,
}

/// The running execs of this worker's sandboxes, by operation id.
#[derive(Default)]
pub struct Controls(Mutex<HashMap<Uuid, Control>>);

impl Controls {
    /// Registers a running exec until the guard drops.
    pub fn enter(
        self: &Arc<Self>,
        operation: Uuid,
        input: Option<Arc<Input>>,
        kill: CancellationToken,
    ) -> Registered {
        lock(&self.0).insert(operation, Control { input, kill });
        Registered {
            controls: self.clone(),
            operation,
        }
    }

    /// The exec's input (if it has one) and its kill. An exec is `running` a moment
    /// before it is registered here: one not registered yet is waited for, briefly.
    async fn control(
        &self,
        operation: Uuid,
    ) -> Result<(Option<Arc<Input>>, CancellationToken), Refusal> {
        for _ in 0..REGISTERING_TRIES {
            if let Some(control) = lock(&self.0).get(&operation) {
                return Ok((control.input.clone(), control.kill.clone()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(Refusal::NotRunning)
    }

    async fn input(&self, operation: Uuid) -> Result<Arc<Input>, Refusal> {
        self.control(operation).await?.0.ok_or(Refusal::NoInput)
    }
}

/// Removes its exec from the registry when dropped.
pub struct Registered {
    controls: Arc<Controls>,
    operation: Uuid,
}

impl Drop for Registered {
    fn drop(&mut self) {
        lock(&self.controls.0).remove(&self.operation);
    }
}

/// Why a call was refused, as the scheduler reads it.
#[derive(Debug)]
enum Refusal {
    Unauthorized,
    NotRunning,
    NoInput,
    Closed,
    NotATerminal,
    Io(String),
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (status, code, message) = match self {
            Refusal::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "not this worker's key".to_string(),
            ),
            Refusal::NotRunning => (
                StatusCode::CONFLICT,
                "not_running",
                "the exec is not running on this worker".into(),
            ),
            Refusal::NoInput => (
                StatusCode::CONFLICT,
                "no_input",
                "the exec was started without `stdin` or `pty`: its input is /dev/null".into(),
            ),
            Refusal::Closed => (
                StatusCode::CONFLICT,
                "no_input",
                "the exec's input was closed".into(),
            ),
            Refusal::NotATerminal => (
                StatusCode::CONFLICT,
                "not_a_terminal",
                "the exec was started without `pty`".into(),
            ),
            Refusal::Io(e) => (StatusCode::INTERNAL_SERVER_ERROR, "internal", e),
        };
        let body = serde_json::json!({"error": code, "message": message});
        (status, Json(body)).into_response()
    }
}

type Shared = (Arc<Previews>, Arc<Controls>);

/// The routes the scheduler calls for a running exec, behind the listener's key.
pub fn router(previews: Arc<Previews>, controls: Arc<Controls>) -> Router {
    Router::new()
        .route("/operations/{operation}/input", post(input))
        .route("/operations/{operation}/resize", post(resize))
        .route("/operations/{operation}/kill", post(kill))
        .with_state((previews, controls))
}

fn authorized(previews: &Previews, headers: &HeaderMap) -> Result<(), Refusal> {
    previews
        .authorized(headers)
        .then_some(())
        .ok_or(Refusal::Unauthorized)
}

async fn input(
    State((previews, controls)): State<Shared>,
    Path(operation): Path<Uuid>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<serde_json::Value>, Refusal> {
    authorized(&previews, &headers)?;
    let input = controls.input(operation).await?;
    let eof = headers.get(EOF_HEADER).is_some_and(|v| v == "true");
    let data = &body[..body.len().min(MAX_INPUT)];
    let written = input.write(data, eof).await?;
    Ok(Json(serde_json::json!({"written": written})))
}

#[derive(serde::Deserialize)]
struct Size {
    rows: u16,
    cols: u16,
}

async fn resize(
    State((previews, controls)): State<Shared>,
    Path(operation): Path<Uuid>,
    headers: HeaderMap,
    Json(size): Json<Size>,
) -> Result<StatusCode, Refusal> {
    authorized(&previews, &headers)?;
    let input = match controls.input(operation).await {
        Err(Refusal::NoInput) => Err(Refusal::NotATerminal),
        found => found,
    }?;
    input.resize(size.rows, size.cols)?;
    Ok(StatusCode::NO_CONTENT)
}

async fn kill(
    State((previews, controls)): State<Shared>,
    Path(operation): Path<Uuid>,
    request: Request,
) -> Result<StatusCode, Refusal> {
    authorized(&previews, request.headers())?;
    controls.control(operation).await?.1.cancel();
    Ok(StatusCode::ACCEPTED)
}
