//! PostgreSQL, Redis and RabbitMQ of the chaos run's own, on free ports under its
//! scratch directory: the faults restart them, and the shared services are never
//! touched. PostgreSQL runs as the `postgres` user and RabbitMQ as `rabbitmq` (neither
//! runs as root), both from the machine's packages.

use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A port nobody listens on now.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn wait_port(port: u16, limit: Duration, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("{what} did not listen on {port} within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

fn run(command: &mut Command, what: &str) -> anyhow::Result<()> {
    let output = command
        .output()
        .with_context(|| format!("running {what}"))?;
    if !output.status.success() {
        bail!(
            "{what} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

fn chown(path: &Path, user: &str) -> anyhow::Result<()> {
    run(Command::new("chown").arg("-R").arg(user).arg(path), "chown")
}

/// A PostgreSQL cluster of its own (`initdb`, `pg_ctl`).
pub struct Postgres {
    pub port: u16,
    data: PathBuf,
    socket: PathBuf,
    pg_ctl: PathBuf,
}

impl Postgres {
    pub fn start(dir: &Path) -> anyhow::Result<Postgres> {
        let root = dir.join("postgres");
        std::fs::create_dir_all(&root)?;
        chown(&root, "postgres")?;
        let bin = pg_bin()?;
        let pg = Postgres {
            port: free_port()?,
            data: root.join("data"),
            socket: root.clone(),
            pg_ctl: bin.join("pg_ctl"),
        };
        run(
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(bin.join("initdb"))
                .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
                .arg(&pg.data),
            "initdb",
        )?;
        pg.ctl("start")?;
        Ok(pg)
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/cairn_chaos", self.port)
    }

    fn ctl(&self, action: &str) -> anyhow::Result<()> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=400",
            self.port,
            self.socket.display()
        );
        run(
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(&self.pg_ctl)
                .args(["-D"])
                .arg(&self.data)
                .args(["-m", "fast", "-w", "-l"])
                .arg(self.socket.join("log"))
                .args(["-o", &options, action]),
            &format!("pg_ctl {action}"),
        )
    }

    /// A fast restart: every connection is cut.
    pub fn restart(&self) -> anyhow::Result<()> {
        self.ctl("restart")
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = self.ctl("stop");
    }
}

/// The directory of `initdb` and `pg_ctl`: on `PATH`, else Debian's newest.
fn pg_bin() -> anyhow::Result<PathBuf> {
    if let Ok(output) = Command::new("sh")
        .args(["-c", "command -v initdb"])
        .output()
    {
        let path = String::from_utf8_lossy(&output.stdout).trim().to_string();
        if !path.is_empty() {
            let resolved = std::fs::canonicalize(&path)?;
            return Ok(resolved
                .parent()
                .context("initdb's directory")?
                .to_path_buf());
        }
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .context("no initdb on PATH and no /usr/lib/postgresql")?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").exists())
        .collect();
    versions.sort();
    versions.pop().context("no PostgreSQL server binaries")
}

/// A `redis-server` of its own, keeping nothing on disk.
pub struct Redis {
    pub port: u16,
    child: Option<Child>,
}

impl Redis {
    pub fn start() -> anyhow::Result<Redis> {
        let mut redis = Redis {
            port: free_port()?,
            child: None,
        };
        redis.spawn()?;
        Ok(redis)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting redis-server")?;
        self.child = Some(child);
        wait_port(self.port, Duration::from_secs(10), "redis-server")
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn flushall(&self) -> anyhow::Result<()> {
        run(
            Command::new("redis-cli")
                .args(["-p", &self.port.to_string(), "FLUSHALL"])
                .stdout(Stdio::null()),
            "redis-cli FLUSHALL",
        )
    }

    /// SIGKILL, then a new server on the same port (it starts empty).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.spawn()
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A second RabbitMQ node, on its own AMQP and distribution ports.
pub struct Rabbit {
    pub port: u16,
    node: String,
    child: Option<Child>,
}

impl Rabbit {
    pub fn start(dir: &Path) -> anyhow::Result<Rabbit> {
        let root = dir.join("rabbitmq");
        std::fs::create_dir_all(&root)?;
        let port = free_port()?;
        let dist = free_port()?;
        let config = root.join("rabbitmq.conf");
        std::fs::write(
            &config,
            format!("listeners.tcp.local = 127.0.0.1:{port}\nloopback_users = none\n"),
        )?;
        std::fs::write(root.join("enabled_plugins"), "[].\n")?;
        chown(&root, "rabbitmq")?;
        let node = format!("cairn-chaos-{port}@localhost");
        let child = Command::new("rabbitmq-server")
            .env("RABBITMQ_NODENAME", &node)
            .env("RABBITMQ_DIST_PORT", dist.to_string())
            .env("RABBITMQ_CONFIG_FILE", &config)
            .env("RABBITMQ_MNESIA_BASE", root.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", root.join("log"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                root.join("enabled_plugins"),
            )
            .env("RABBITMQ_PID_FILE", root.join("pid"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting rabbitmq-server")?;
        let rabbit = Rabbit {
            port,
            node,
            child: Some(child),
        };
        wait_port(port, Duration::from_secs(90), "rabbitmq-server")?;
        Ok(rabbit)
    }

    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// `rabbitmqctl stop_app` / `start_app`: the broker goes away, the node stays.
    pub fn app(&self, action: &str) -> anyhow::Result<()> {
        run(
            Command::new("rabbitmqctl")
                .env("HOME", "/var/lib/rabbitmq")
                .args(["-q", "-n", &self.node, action]),
            &format!("rabbitmqctl {action}"),
        )?;
        if action == "start_app" {
            wait_port(self.port, Duration::from_secs(60), "rabbitmq start_app")?;
        }
        Ok(())
    }
}

impl Drop for Rabbit {
    fn drop(&mut self) {
        let _ = Command::new("rabbitmqctl")
            .env("HOME", "/var/lib/rabbitmq")
            .args(["-q", "-n", &self.node, "shutdown"])
            .output();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
