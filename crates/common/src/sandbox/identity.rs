//! A sandbox's own identity: its machine id, host name and SSH host key. Made by the
//! first worker that runs it and kept in its row for its life, so a stop and a resume
//! on another worker keep it; a fork, a restore or a template's sandbox is a new row and
//! gets its own. The API never shows it (the private key is a secret of the sandbox's).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// 32 lowercase hex digits, as `/etc/machine-id` holds it.
    pub machine_id: String,
    pub hostname: String,
    /// The OpenSSH private key (`/etc/ssh/ssh_host_ed25519_key`).
    pub ssh_host_ed25519_key: String,
    /// Its public half (`/etc/ssh/ssh_host_ed25519_key.pub`).
    pub ssh_host_ed25519_key_pub: String,
}
