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
    #[arg(long, default_value_t = 3600)]
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
    let typing = tokio::spawn(send_typing(client.clone(), base.clone()));
    let sizing = tokio::spawn(follow_size(client.clone(), base.clone()));
    let printed = print_events(output, Stream::Stdout).await;
    typing.abort();
    sizing.abort();
    drop(raw);
    let limit = Duration::from_secs(60 + u64::from(args.timeout_sec) + 60);
    let receipt = until_ended(client, &base, limit).await?;
    if let Err(e) = printed {
        eprintln!("({e})");
    }
    exec_status(&receipt)
}

/// Sends what is typed, as it is typed, in order; at the end of this stdin (not a
/// terminal), closes the command's.
async fn send_typing(client: Client, base: String) {
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
        let path = format!("{base}/input{}", if eof { "?eof=true" } else { "" });
        if client
            .call_bytes(Method::POST, &path, Some(bytes))
            .await
            .is_err()
            || eof
        {
            return;
        }
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
    let base = format!("/api/v1/sandboxes/{sandbox}/operations/{operation}/input");
    let chunks: Vec<&[u8]> = data.chunks(64 * 1024).collect();
    let last = chunks.len().saturating_sub(1);
    if chunks.is_empty() && eof {
        client
            .call_bytes(Method::POST, &format!("{base}?eof=true"), Some(Vec::new()))
            .await?;
    }
    for (index, chunk) in chunks.into_iter().enumerate() {
        let path = if eof && index == last {
            format!("{base}?eof=true")
        } else {
            base.clone()
        };
        client
            .call_bytes(Method::POST, &path, Some(chunk.to_vec()))
            .await?;
    }
    Ok(exit::OK)
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
