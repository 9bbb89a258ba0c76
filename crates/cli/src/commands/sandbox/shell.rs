//! `cairnctl sandbox shell`: an interactive terminal in a sandbox. The command (a shell
//! by default) runs in a terminal of this one's size; what is typed goes to it as it is
//! typed (this terminal in raw mode), its output is printed as it comes, a change of
//! this terminal's size follows, and `cairnctl` exits with its status. Also `sandbox
//! input` (bytes from stdin to a running exec) and `sandbox kill`.

use super::exec::{exec_status, until_ended};
use crate::client::{exit, CallError, Client};
use crate::commands::logs::{print_events, Stream};
use crate::{id, output};
use reqwest::Method;
use serde_json::json;
use std::io::Read;
use std::os::fd::AsFd;
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct ShellArgs {
    /// The sandbox's id (32 lowercase hex characters).
    pub sandbox: String,
    /// Seconds the session may last, 1 to 86400.
    #[arg(
        long = "timeout-seconds",
        alias = "timeout-sec",
        default_value_t = 3600
    )]
    pub timeout_sec: u32,
    /// The program and its arguments (after `--`); default `sh -i`.
    #[arg(last = true)]
    pub argv: Vec<String>,
}

/// This terminal in raw mode until dropped (where stdin is a terminal).
struct Raw(Option<nix::sys::termios::Termios>);

impl Raw {
    fn enter() -> Raw {
        use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};
        let stdin = std::io::stdin();
        let Ok(saved) = tcgetattr(stdin.as_fd()) else {
            return Raw(None);
        };
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        if tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw).is_err() {
            return Raw(None);
        }
        Raw(Some(saved))
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let stdin = std::io::stdin();
            let _ = nix::sys::termios::tcsetattr(
                stdin.as_fd(),
                nix::sys::termios::SetArg::TCSANOW,
                saved,
            );
        }
    }
}

/// This terminal's size (rows, cols), else 24 by 80.
fn size() -> (u16, u16) {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize to the pointer, which outlives the call.
    #[allow(unsafe_code)]
    let done = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) };
    if done == 0 && size.ws_row > 0 && size.ws_col > 0 {
        (size.ws_row.min(1000), size.ws_col.min(1000))
    } else {
        (24, 80)
    }
}

pub async fn shell(client: &Client, args: ShellArgs) -> Result<u8, CallError> {
    let sandbox = id(&args.sandbox, "the sandbox id")?;
    let argv = if args.argv.is_empty() {
        vec!["sh".to_string(), "-i".to_string()]
    } else {
        args.argv
    };
    let (rows, cols) = size();
    let body = json!({"argv": argv, "timeout_sec": args.timeout_sec,
                      "pty": {"rows": rows, "cols": cols}, "env": {"TERM": "xterm-256color"}});
    let path = format!("/api/v1/sandboxes/{sandbox}/exec?wait=false");
    let answer = client.call(Method::POST, &path, Some(&body), &[]).await?;
    let operation = output::text(&answer.body["operation_id"]);
    let base = format!("/api/v1/sandboxes/{sandbox}/operations/{operation}");
    // What is typed is only taken once the command runs.
    let waited = std::time::Instant::now();
    while client.get(&base).await?["state"] == "pending" {
        if waited.elapsed() > Duration::from_secs(60) {
            return Err(CallError::new(
                exit::NOT_COMPLETED,
                "the shell did not start within 60 s",
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let output = client
        .open_stream(&format!("{base}/output?stream=stdout&follow=true"))
        .await?;
    let raw = Raw::enter();
    let mut typing = tokio::spawn(send_typing(client.clone(), base.clone()));
    let sizing = tokio::spawn(follow_size(client.clone(), base.clone()));
    let stopped = tokio::select! {
        printed = print_events(output, Stream::Stdout) => Ok(printed),
        refused = &mut typing => Err(refused.ok().flatten().map_or_else(
            || "typing stopped".to_string(),
            |e| format!("the shell stopped taking what is typed ({})", e.message),
        )),
        signal = stopped_by_signal() => Err(format!("cairnctl got {signal}")),
    };
    typing.abort();
    sizing.abort();
    // This terminal as it was, however the session ended here.
    drop(raw);
    let printed = match stopped {
        Ok(printed) => printed,
        Err(why) => {
            let hint = format!("cairnctl sandbox kill {sandbox} {operation}");
            return Err(CallError::new(
                exit::ERROR,
                format!("{why}; the shell may still run: {hint}"),
            ));
        }
    };
    let limit = Duration::from_secs(60 + u64::from(args.timeout_sec) + 60);
    let receipt = until_ended(client, &base, limit).await?;
    if let Err(e) = printed {
        eprintln!("({e})");
    }
    exec_status(&receipt)
}

/// Sends what is typed, as it is typed, in order; at the end of this stdin (not a
/// terminal), closes the command's. Why it stopped, if the command would not take it.
async fn send_typing(client: Client, base: String) -> Option<CallError> {
    let (sender, mut typed) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buffer = [0u8; 4096];
        loop {
            match stdin.read(&mut buffer) {
                Ok(0) | Err(_) => {
                    let _ = sender.blocking_send(Vec::new());
                    return;
                }
                Ok(n) => {
                    if sender.blocking_send(buffer[..n].to_vec()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    while let Some(bytes) = typed.recv().await {
        let eof = bytes.is_empty();
        match send_all(&client, &base, &bytes, eof).await {
            // The shell ended on its own (its end reaches the output just after): what
            // is left to type has nowhere to go.
            Err(e) if e.message.starts_with("409 not_running") => break,
            Err(e) => return Some(e),
            Ok(()) if eof => break,
            Ok(()) => {}
        }
    }
    // Nothing more to type: the session goes on until the shell ends.
    std::future::pending().await
}

/// The signal that stops this process (a `kill`, or its terminal closed): the session
/// ends here with this terminal restored.
async fn stopped_by_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut hangup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = hangup.recv() => "SIGHUP",
    }
}

/// Sends this terminal's size each time it changes.
async fn follow_size(client: Client, base: String) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut changes) = signal(SignalKind::window_change()) else {
        return;
    };
    while changes.recv().await.is_some() {
        let (rows, cols) = size();
        let body = json!({"rows": rows, "cols": cols});
        let _ = client
            .call(Method::POST, &format!("{base}/resize"), Some(&body), &[])
            .await;
    }
}

/// Sends this process's stdin to a running exec's input, closing it at the end with
/// `--eof`.
pub async fn input(
    client: &Client,
    sandbox: &str,
    operation: &str,
    eof: bool,
) -> Result<u8, CallError> {
    let sandbox = id(sandbox, "the sandbox id")?;
    let operation = id(operation, "the operation id")?;
    let mut data = Vec::new();
    std::io::stdin()
        .read_to_end(&mut data)
        .map_err(|e| CallError::new(exit::ERROR, format!("reading stdin: {e}")))?;
    let base = format!("/api/v1/sandboxes/{sandbox}/operations/{operation}");
    send_all(client, &base, &data, eof).await?;
    Ok(exit::OK)
}

/// Sends `data` to the exec's input, in calls of at most 64 KiB, again from where the
/// command stopped taking it; `eof` with the last.
async fn send_all(client: &Client, base: &str, data: &[u8], eof: bool) -> Result<(), CallError> {
    let mut sent = 0;
    let mut stalled = 0;
    loop {
        let piece = &data[sent..data.len().min(sent + 64 * 1024)];
        let last = sent + piece.len() == data.len();
        let query = if eof && last { "?eof=true" } else { "" };
        let answer = send_once(client, &format!("{base}/input{query}"), piece).await?;
        let taken: serde_json::Value = serde_json::from_slice(&answer).unwrap_or_default();
        let taken = taken["written"]
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0);
        sent += taken.min(piece.len());
        if sent == data.len() && (last || piece.is_empty()) {
            return Ok(());
        }
        stalled = if taken == 0 { stalled + 1 } else { 0 };
        if stalled == 3 {
            return Err(CallError::new(
                exit::ERROR,
                format!(
                    "the command took {sent} of {} bytes and reads no more",
                    data.len()
                ),
            ));
        }
    }
}

/// One input call. A scheduler that could not be reached took nothing: that is tried
/// again, a few times; an answer lost on the way (the bytes may have been taken) is
/// not, so that nothing is typed twice.
async fn send_once(client: &Client, path: &str, piece: &[u8]) -> Result<Vec<u8>, CallError> {
    let mut tries = 0;
    loop {
        match client
            .call_bytes(Method::POST, path, Some(piece.to_vec()))
            .await
        {
            Ok((_, answer)) => return Ok(answer),
            Err(e) if e.transient && e.code != exit::UNCERTAIN && tries < 5 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Ends a running exec; its receipt will say `killed`.
pub async fn kill(
    client: &Client,
    sandbox: &str,
    operation: &str,
    json: bool,
) -> Result<u8, CallError> {
    let sandbox = id(sandbox, "the sandbox id")?;
    let operation = id(operation, "the operation id")?;
    let path = format!("/api/v1/sandboxes/{sandbox}/operations/{operation}/kill");
    let answer = client.call(Method::POST, &path, None, &[]).await?;
    if json {
        output::json(&answer.body);
    } else {
        println!("ending: its receipt will say `killed`");
    }
    Ok(exit::OK)
}
