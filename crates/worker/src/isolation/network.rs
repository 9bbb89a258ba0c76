//! A step's network (invariant 10): every sandboxed process has a network namespace of
//! its own, never the host's. One that asks for the network gets a user-mode NAT to the
//! outside (slirp4netns) and an egress filter (nftables) in that namespace, installed
//! before the step's first instruction; without the network it has only its own
//! loopback.
//!
//! The filter refuses, unless the operator allows a destination by name: every
//! loopback, link-local (the cloud metadata address with it), private (RFC 1918,
//! RFC 4193) and CGNAT range, and the worker's own addresses. So a step reaches neither
//! PostgreSQL, Redis, RabbitMQ nor the API on the worker's loopback or pod network. The
//! rules live in the step's network namespace, which belongs to the step's user
//! namespace: the step has no capability there, so it cannot change them.
//!
//! bubblewrap reports the sandbox's init (`--info-fd`) and holds it (`--block-fd`)
//! until the worker has attached the NAT and the filter (once bubblewrap's own
//! loopback is up); a worker that dies meanwhile
//! closes the hold and the step, killed with it, never ran connected to anything.

use super::spawn::{Launch, Started};
use cairn_common::egress::Layer;
use prometheus_client::metrics::counter::Counter;
use std::io::{self, Read, Write};
use std::net::{IpAddr, ToSocketAddrs};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where slirp4netns answers DNS inside the namespace (it forwards to the host's
/// resolver): the only resolver a step's `/etc/resolv.conf` names.
pub const DNS: &str = "10.0.2.3";

/// Destinations no step reaches unless the operator allows them.
const DENIED_V4: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
];
const DENIED_V6: &[&str] = &[
    "::1/128",
    "::ffff:0:0/96",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
];

/// How long the NAT may take to come up.
const ATTACH: Duration = Duration::from_secs(10);

/// One destination the operator allows: an address or range, and a port or all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    pub net: String,
    pub port: Option<u16>,
}

impl Allowed {
    /// `HOST[:PORT]`, `CIDR[:PORT]` or `[IPV6/PREFIX]:PORT`; a host name is resolved
    /// once, now, to each of its addresses.
    pub fn parse(text: &str) -> Result<Vec<Allowed>, String> {
        let bad = |why: &str| format!("egress allow entry {text:?}: {why}");
        let (host, port) = cairn_common::egress::split_port(text).ok_or_else(|| bad("bad port"))?;
        if host.is_empty() {
            return Err(bad("no destination"));
        }
        let (addr, prefix) = match host.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (host, None),
        };
        if let Ok(ip) = addr.parse::<IpAddr>() {
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let bits: u8 = match prefix {
                Some(p) => p
                    .parse()
                    .ok()
                    .filter(|b| *b <= max)
                    .ok_or_else(|| bad("bad prefix"))?,
                None => max,
            };
            return Ok(vec![Allowed {
                net: format!("{ip}/{bits}"),
                port,
            }]);
        }
        if prefix.is_some() {
            return Err(bad("a prefix needs an address"));
        }
        let addrs: Vec<IpAddr> = (host, port.unwrap_or(0))
            .to_socket_addrs()
            .map_err(|e| bad(&format!("cannot resolve: {e}")))?
            .map(|a| a.ip())
            .collect();
        let mut seen = Vec::new();
        for ip in addrs {
            let bits = if ip.is_ipv4() { 32 } else { 128 };
            let one = Allowed {
                net: format!("{ip}/{bits}"),
                port,
            };
            if !seen.contains(&one) {
                seen.push(one);
            }
        }
        Ok(seen)
    }

    fn family(&self) -> &'static str {
        if self.net.contains(':') {
            "ip6"
        } else {
            "ip"
        }
    }
}

/// The egress of this worker's steps: its helpers and its filter.
#[derive(Debug)]
pub struct Egress {
    slirp: PathBuf,
    nft: PathBuf,
    nsenter: PathBuf,
    allowed: Vec<Allowed>,
    own: Vec<IpAddr>,
    /// The filter of a step that does not narrow it.
    rules: String,
}

impl Egress {
    /// The helpers found on the worker's PATH, or what is missing, in words.
    pub fn find(
        path: &std::ffi::OsStr,
        nsenter: PathBuf,
        allowed: &[Allowed],
    ) -> Result<Egress, String> {
        let find = |name: &str, package: &str| {
            super::program::find(name.as_ref(), path).ok_or_else(|| {
                format!("{name} is not installed (Debian: apt-get install {package})")
            })
        };
        let slirp = find("slirp4netns", "slirp4netns");
        let nft = find("nft", "nftables");
        match (slirp, nft) {
            (Ok(slirp), Ok(nft)) => {
                let own = own_addresses();
                Ok(Egress {
                    slirp,
                    nft,
                    nsenter,
                    rules: rules(allowed, &own, &[]),
                    allowed: allowed.to_vec(),
                    own,
                })
            }
            (slirp, nft) => Err([slirp.err(), nft.err()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join("; ")),
        }
    }

    /// The filter's rules, as nft reads them.
    pub fn rules(&self) -> &str {
        &self.rules
    }

    /// The filter of a step whose layers narrow this worker's policy, in order.
    pub fn narrowed_rules(&self, layers: &[(Layer, Vec<Allowed>)]) -> String {
        rules(&self.allowed, &self.own, layers)
    }

    /// Attaches the NAT and the filter to the sandbox bubblewrap reports on `hold`, then
    /// lets its command start. The returned link keeps the NAT up while it lives.
    pub async fn connect(&self, hold: Hold) -> Result<Link, String> {
        let info = hold.info;
        let pid = tokio::task::spawn_blocking(move || read_child_pid(info))
            .await
            .map_err(|e| e.to_string())??;
        let rules = hold.rules.as_deref().unwrap_or(&self.rules);
        let link = tokio::time::timeout(ATTACH, self.attach(pid, rules))
            .await
            .map_err(|_| "the step's network did not come up in time".to_string())??;
        let mut release = std::fs::File::from(hold.release);
        release
            .write_all(b"1")
            .map_err(|e| format!("cannot start the step: {e}"))?;
        Ok(link)
    }

    /// Adds to `refused` the packets the filter of `link`'s namespace refused (its
    /// `counter reject` rules), read after the step in a task of its own so that the
    /// step's end waits for nothing; the NAT goes with `link` once they are read.
    pub fn tally(&self, link: Link, refused: Counter) {
        let (nsenter, nft) = (self.nsenter.clone(), self.nft.clone());
        tokio::spawn(async move {
            match read_refused(&nsenter, &nft, &link).await {
                Some(packets) => {
                    refused.inc_by(packets);
                }
                None => tracing::debug!("the step's egress counters could not be read"),
            }
        });
    }

    async fn attach(&self, pid: i32, rules: &str) -> Result<Link, String> {
        // bubblewrap brings the namespace's loopback up after it reports the child;
        // the NAT configured meanwhile makes that fail ("loopback: Failed
        // RTM_NEWADDR"). The loopback's local route shows once it is up.
        loop {
            match std::fs::read_to_string(format!("/proc/{pid}/net/fib_trie")) {
                Ok(routes) if routes.contains("127.0.0.1") => break,
                Ok(_) => tokio::time::sleep(Duration::from_millis(1)).await,
                Err(_) => return Err("the sandbox ended before its network was attached".into()),
            }
        }
        let (ready_read, ready_write) =
            super::descriptors::pipe_pair().map_err(|e| e.to_string())?;
        let (exit_read, exit_write) = super::descriptors::pipe_pair().map_err(|e| e.to_string())?;
        let mut slirp = Launch::new(&self.slirp);
        slirp
            .args(["--configure", "--mtu=65520", "--disable-host-loopback"])
            .arg(format!("--ready-fd={}", super::spawn::FILE_FD + 1))
            .arg(format!("--exit-fd={}", super::spawn::FILE_FD + 2))
            .arg(pid.to_string())
            .arg("tap0");
        slirp.quiet = true;
        slirp.extra_files = vec![ready_write, exit_read];
        let slirp = slirp
            .spawn()
            .map_err(|e| format!("cannot start slirp4netns: {e}"))?;
        // Held so that the namespace, and its filter's counters, outlive the step's
        // processes until the worker has read them.
        let netns = std::fs::File::open(format!("/proc/{pid}/ns/net"))
            .map_err(|e| format!("cannot hold the step's network namespace: {e}"))?;
        let link = Link {
            _slirp: slirp,
            _exit: exit_write,
            netns: OwnedFd::from(netns),
        };
        let ready = tokio::task::spawn_blocking(move || {
            let mut byte = [0u8; 1];
            std::fs::File::from(ready_read)
                .read(&mut byte)
                .map(|n| n == 1)
        })
        .await
        .map_err(|e| e.to_string())?;
        if !matches!(ready, Ok(true)) {
            return Err("slirp4netns could not attach to the step's network namespace".into());
        }
        let mut filter = Launch::new(&self.nsenter);
        filter
            .arg(format!("--target={pid}"))
            .args(["--net", "--"])
            .arg(&self.nft)
            .args(["-f", &format!("/dev/fd/{}", super::spawn::FILE_FD)]);
        filter.file =
            Some(super::descriptors::memory_file(rules.as_bytes()).map_err(|e| e.to_string())?);
        let mut nft = filter
            .spawn()
            .map_err(|e| format!("cannot start nft: {e}"))?;
        drop(nft.stdout.take());
        let said = nft.stderr.take().map(|err| {
            tokio::task::spawn_blocking(move || {
                let mut text = String::new();
                let _ = std::fs::File::from(err)
                    .take(4096)
                    .read_to_string(&mut text);
                text
            })
        });
        let status = nft.wait().await.map_err(|e| e.to_string())?;
        let said = match said {
            Some(task) => task.await.unwrap_or_default(),
            None => String::new(),
        };
        if !status.success() {
            return Err(format!(
                "nft could not install the step's egress filter ({status}): {}",
                said.trim()
            ));
        }
        Ok(link)
    }
}

/// The worker's ends of bubblewrap's report and hold, and the filter to install (the
/// worker's own unless the step narrowed it).
#[derive(Debug)]
pub struct Hold {
    info: OwnedFd,
    release: OwnedFd,
    rules: Option<String>,
}

impl Hold {
    /// The same hold, installing `rules` instead of the worker's filter.
    pub fn with_rules(self, rules: String) -> Hold {
        Hold {
            rules: Some(rules),
            ..self
        }
    }
}

/// A sandbox's NAT: it ends when this is dropped.
#[derive(Debug)]
pub struct Link {
    _slirp: Started,
    _exit: OwnedFd,
    netns: OwnedFd,
}

/// A hold, and bubblewrap's ends of it: where it writes its report and the descriptor
/// it blocks on, placed after its argument file.
pub fn hold() -> io::Result<(Hold, Vec<OwnedFd>)> {
    let (info_read, info_write) = super::descriptors::pipe_pair()?;
    let (block_read, block_write) = super::descriptors::pipe_pair()?;
    Ok((
        Hold {
            info: info_read,
            release: block_write,
            rules: None,
        },
        vec![info_write, block_read],
    ))
}

/// bubblewrap's arguments for a [`hold`] placed at the descriptors after the file.
pub fn hold_args() -> [String; 4] {
    let fd = super::spawn::FILE_FD;
    [
        "--info-fd".into(),
        (fd + 1).to_string(),
        "--block-fd".into(),
        (fd + 2).to_string(),
    ]
}

fn read_child_pid(info: OwnedFd) -> Result<i32, String> {
    let mut text = String::new();
    std::fs::File::from(info)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|_| "the sandbox ended before its network was attached".to_string())?;
    value["child-pid"]
        .as_i64()
        .and_then(|p| i32::try_from(p).ok())
        .ok_or_else(|| "bubblewrap reported no child".to_string())
}

/// The nft ruleset of a step's namespace. The `platform` chain is the worker's policy:
/// what the operator allows returns from it, then the platform's ranges and the worker's
/// own addresses are refused. Each narrowing layer (the tenant's, then the run's or
/// sandbox's) is a chain of its own, jumped to after it in that order: what it names
/// returns, everything else is refused. So a packet leaves only if every layer lets it
/// through: a lower layer narrows the policy, never widens it.
fn rules(allowed: &[Allowed], own: &[IpAddr], layers: &[(Layer, Vec<Allowed>)]) -> String {
    let accept = |out: &mut String, list: &[Allowed], verdict: &str| {
        for allow in list {
            match allow.port {
                Some(port) => {
                    for proto in ["tcp", "udp"] {
                        out.push_str(&format!(
                            "    {} daddr {} {proto} dport {port} {verdict}\n",
                            allow.family(),
                            allow.net
                        ));
                    }
                }
                None => out.push_str(&format!(
                    "    {} daddr {} {verdict}\n",
                    allow.family(),
                    allow.net
                )),
            }
        }
    };
    let mut out = String::from("table inet cairn {\n  chain platform {\n");
    accept(&mut out, allowed, "return");
    let mut v4: Vec<String> = DENIED_V4.iter().map(|s| s.to_string()).collect();
    let mut v6: Vec<String> = DENIED_V6.iter().map(|s| s.to_string()).collect();
    for ip in own {
        match ip {
            IpAddr::V4(a) => v4.push(format!("{a}/32")),
            IpAddr::V6(a) => v6.push(format!("{a}/128")),
        }
    }
    out.push_str(&format!(
        "    ip daddr {{ {} }} counter reject\n    ip6 daddr {{ {} }} counter reject\n  }}\n",
        v4.join(", "),
        v6.join(", ")
    ));
    for (layer, list) in layers {
        out.push_str(&format!("  chain {} {{\n", chain(*layer)));
        accept(&mut out, list, "return");
        out.push_str("    counter reject\n  }\n");
    }
    out.push_str(
        "  chain egress {\n    type filter hook output priority 0; policy accept;\n    oifname \"lo\" accept\n",
    );
    for proto in ["udp", "tcp"] {
        out.push_str(&format!("    ip daddr {DNS} {proto} dport 53 accept\n"));
    }
    out.push_str("    jump platform\n");
    for (layer, _) in layers {
        out.push_str(&format!("    jump {}\n", chain(*layer)));
    }
    out.push_str("  }\n}\n");
    out
}

/// The filter chain of a narrowing layer.
fn chain(layer: Layer) -> &'static str {
    match layer {
        Layer::Tenant => "tenant",
        Layer::Run => "run",
        Layer::Sandbox => "sandbox",
    }
}

/// The packets the filter in `link`'s namespace refused, as `nft` lists them.
async fn read_refused(nsenter: &Path, nft: &Path, link: &Link) -> Option<u64> {
    let netns = link.netns.try_clone().ok()?;
    let mut list = Launch::new(nsenter);
    list.arg(format!("--net=/proc/self/fd/{}", super::spawn::FILE_FD))
        .arg("--")
        .arg(nft)
        .args(["list", "table", "inet", "cairn"]);
    list.file = Some(netns);
    let mut child = list.spawn().ok()?;
    drop(child.stderr.take());
    let out = child.stdout.take()?;
    let text = tokio::task::spawn_blocking(move || {
        let mut text = String::new();
        std::fs::File::from(out)
            .take(1 << 20)
            .read_to_string(&mut text)
            .map(|_| text)
    })
    .await
    .ok()?
    .ok()?;
    child
        .wait()
        .await
        .ok()?
        .success()
        .then(|| refused_packets(&text))
}

/// The packets of every `counter ... reject` rule in `nft list` output.
fn refused_packets(listing: &str) -> u64 {
    listing
        .lines()
        .filter(|l| l.trim_end().ends_with("reject"))
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "packets")?;
            words.next()?.parse::<u64>().ok()
        })
        .sum()
}

/// Every address of the worker's interfaces.
fn own_addresses() -> Vec<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut own = Vec::new();
    for addr in addrs {
        let Some(address) = addr.address else {
            continue;
        };
        let ip = if let Some(v4) = address.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else if let Some(v6) = address.as_sockaddr_in6() {
            IpAddr::V6(v6.ip())
        } else {
            continue;
        };
        if !own.contains(&ip) {
            own.push(ip);
        }
    }
    own
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_entries_parse_as_documented() {
        let one = |t: &str| Allowed::parse(t).expect(t);
        assert_eq!(
            one("10.2.0.0/16:5432"),
            [Allowed {
                net: "10.2.0.0/16".into(),
                port: Some(5432)
            }]
        );
        assert_eq!(
            one("203.0.113.7"),
            [Allowed {
                net: "203.0.113.7/32".into(),
                port: None
            }]
        );
        assert_eq!(
            one("[fd00::/8]:443"),
            [Allowed {
                net: "fd00::/8".into(),
                port: Some(443)
            }]
        );
        assert_eq!(one("localhost:80").first().map(|a| a.port), Some(Some(80)));
        for bad in [
            "",
            ":80",
            "10.0.0.0/33",
            "10.0.0.1:http",
            "10.0.0.1:99999",
            "[::1",
        ] {
            assert!(Allowed::parse(bad).is_err(), "{bad:?}");
        }
    }

    /// What is allowed comes before what is refused; the platform's ranges and the
    /// worker's own addresses are refused.
    #[test]
    fn the_rules_refuse_the_platform_and_allow_only_what_is_named() {
        let allowed = Allowed::parse("10.9.0.5:8080").expect("allow");
        let text = rules(&allowed, &["192.0.2.2".parse().expect("ip")], &[]);
        assert!(!text.contains("    counter reject\n  }\n}"), "{text}");
        let accept = text.find("10.9.0.5/32 tcp dport 8080 return").expect(&text);
        let reject = text.find("counter reject").expect(&text);
        assert!(accept < reject, "{text}");
        for denied in [
            "127.0.0.0/8",
            "169.254.0.0/16",
            "10.0.0.0/8",
            "192.0.2.2/32",
            "fc00::/7",
            "100.64.0.0/10",
        ] {
            let refused = text
                .lines()
                .any(|l| l.contains("counter reject") && l.contains(denied));
            assert!(refused, "{denied}: {text}");
        }
    }

    /// Each layer is a chain that returns only what it names and refuses the rest, and
    /// the egress chain jumps to the platform's, then the tenant's, then the step's: a
    /// packet leaves only if every one lets it through.
    #[test]
    fn each_layer_narrows_after_the_platform_is_refused() {
        let tenant = Allowed::parse("203.0.113.0/24").expect("tenant");
        let step = Allowed::parse("203.0.113.10:8080").expect("step");
        let text = rules(&[], &[], &[(Layer::Tenant, tenant), (Layer::Run, step)]);
        let chain_of = |name: &str| {
            let start = text.find(&format!("  chain {name} {{")).expect(&text);
            let end = start + text[start..].find("  }\n").expect(&text);
            text[start..end].to_string()
        };
        let tenant = chain_of("tenant");
        let run = chain_of("run");
        assert!(tenant.contains("ip daddr 203.0.113.0/24 return"), "{text}");
        assert!(
            run.contains("ip daddr 203.0.113.10/32 tcp dport 8080 return"),
            "{text}"
        );
        for chain in [&tenant, &run] {
            assert!(chain.trim_end().ends_with("counter reject"), "{text}");
            assert!(!chain.contains("accept"), "a layer never accepts: {text}");
        }
        let egress = chain_of("egress");
        let order: Vec<usize> = ["jump platform", "jump tenant", "jump run"]
            .iter()
            .map(|j| egress.find(j).expect(&text))
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{text}");
    }

    #[test]
    fn refused_packets_sum_the_reject_counters() {
        let listing = "table inet cairn {\n\tchain platform {\n\t\tip daddr { 10.0.0.0/8 } counter packets 3 bytes 180 reject\n\t\tip6 daddr { fc00::/7 } counter packets 0 bytes 0 reject\n\t}\n\tchain egress {\n\t\tip daddr 10.0.2.3 udp dport 53 accept\n\t\tcounter packets 2 bytes 120 reject\n\t}\n}\n";
        assert_eq!(refused_packets(listing), 5);
        assert_eq!(refused_packets(""), 0);
    }
}
