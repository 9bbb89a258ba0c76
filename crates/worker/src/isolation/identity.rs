//! A sandbox resource's identity in its view: `/etc/machine-id`, `/etc/hostname` (and
//! the UTS name) and `/etc/ssh`'s host key, from files this worker writes in a directory
//! of its own, never in the tree or the home the sandbox can change (a link placed
//! there would be followed by bubblewrap, as root, on the host).

use cairn_common::sandbox::identity::Identity;
use ssh_key::{rand_core::OsRng, Algorithm, LineEnding, PrivateKey};
use std::io;
use std::path::{Path, PathBuf};

/// A new identity for sandbox `id`: a random machine id and SSH host key.
pub fn make(id: uuid::Uuid) -> Result<Identity, String> {
    let key = PrivateKey::random(&mut OsRng, Algorithm::Ed25519)
        .map_err(|e| format!("cannot make an SSH host key: {e}"))?;
    let private = key
        .to_openssh(LineEnding::LF)
        .map_err(|e| format!("cannot encode the SSH host key: {e}"))?;
    let public = key
        .public_key()
        .to_openssh()
        .map_err(|e| format!("cannot encode the SSH host key: {e}"))?;
    let hostname = format!("sbx-{}", &id.simple().to_string()[..12]);
    Ok(Identity {
        machine_id: uuid::Uuid::new_v4().simple().to_string(),
        ssh_host_ed25519_key: private.to_string(),
        ssh_host_ed25519_key_pub: format!("{public} root@{hostname}\n"),
        hostname,
    })
}

/// The directory of one sandbox's identity files; removed when dropped.
#[derive(Debug)]
pub struct IdentityDir {
    pub path: PathBuf,
}

impl IdentityDir {
    /// Writes `identity`'s files in a new directory under `base`, each made with its
    /// mode (never readable by another host user, not even for a moment): the sandbox's
    /// user is this worker's uid inside its namespace, so owner-only suffices, and the
    /// private key stays its alone, as sshd requires.
    pub fn write(base: &Path, identity: &Identity) -> io::Result<IdentityDir> {
        use std::io::Write;
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let private = |path: &Path| {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(path)
        };
        private(base)?;
        let dir = IdentityDir {
            path: base.join(uuid::Uuid::new_v4().simple().to_string()),
        };
        let ssh = dir.path.join("ssh");
        private(&ssh)?;
        let files = [
            (
                dir.path.join("machine-id"),
                format!("{}\n", identity.machine_id),
                0o444,
            ),
            (
                dir.path.join("hostname"),
                format!("{}\n", identity.hostname),
                0o444,
            ),
            (
                ssh.join("ssh_host_ed25519_key"),
                identity.ssh_host_ed25519_key.clone(),
                0o600,
            ),
            (
                ssh.join("ssh_host_ed25519_key.pub"),
                identity.ssh_host_ed25519_key_pub.clone(),
                0o444,
            ),
        ];
        for (path, content, mode) in files {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(&path)?
                .write_all(content.as_bytes())?;
        }
        Ok(dir)
    }
}

impl Drop for IdentityDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_identity_is_new_and_its_key_parses() {
        let id = uuid::Uuid::new_v4();
        let (a, b) = (make(id).expect("a"), make(id).expect("b"));
        assert_ne!(a.machine_id, b.machine_id);
        assert_ne!(a.ssh_host_ed25519_key_pub, b.ssh_host_ed25519_key_pub);
        assert_eq!(a.machine_id.len(), 32);
        assert!(a.ssh_host_ed25519_key_pub.starts_with("ssh-ed25519 "));
        let key = PrivateKey::from_openssh(&a.ssh_host_ed25519_key).expect("parses");
        assert_eq!(key.algorithm(), Algorithm::Ed25519);
        let base = std::env::temp_dir().join(format!("cairn-id-{}", uuid::Uuid::new_v4()));
        let dir = IdentityDir::write(&base, &a).expect("write");
        let written = std::fs::read_to_string(dir.path.join("machine-id")).expect("read");
        assert_eq!(written.trim(), a.machine_id);
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&dir.path.join("ssh/ssh_host_ed25519_key")), 0o600);
        assert_eq!(mode(&dir.path), 0o700, "no other host user looks in");
        let path = dir.path.clone();
        drop(dir);
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(base);
    }
}
