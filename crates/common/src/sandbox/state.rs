//! Sandbox states and the transition table: exactly the seed's diagram.
//!
//! ```text
//! creating --ready--> running --stop/timeout--> stopped --resume--> running
//! running --pause--> paused --resume--> running;  paused --stop (pause limit)--> stopped
//! creating --boot failure--> error;  running --runtime failure--> error
//! running|stopped|paused --destroy--> destroyed;  error --delete--> destroyed
//! ```
//!
//! A paused sandbox's stop is the seed's "then it behaves like a stop" (the pause limit,
//! or its worker lost).

use crate::request::table::Machine;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

crate::text_enum! {
    /// The public states of a sandbox.
    #[derive(Serialize, Deserialize, ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum SandboxState {
        /// Being placed on a worker and prepared; not ready for work.
        Creating => "creating",
        /// A worker holds it and it is ready for exec and files.
        Running => "running",
        /// Its worker slot is released and its disk saved: files survive, processes do not.
        Stopped => "stopped",
        /// Its processes are frozen in place, for at most the pause limit.
        Paused => "paused",
        /// Creation or runtime recovery failed; `error_reason` says why.
        Error => "error",
        /// Permanently released.
        Destroyed => "destroyed",
    }
}

crate::text_enum! {
    /// What happens to a sandbox.
    pub enum SandboxEvent {
        /// Its worker prepared the tree: it is ready.
        Ready => "ready",
        /// Its preparation failed for good.
        BootFailure => "boot_failure",
        /// Stopped by a person, a timeout, the pause limit or a lost worker.
        Stop => "stop",
        Pause => "pause",
        Resume => "resume",
        RuntimeFailure => "runtime_failure",
        Destroy => "destroy",
        /// A failed record deleted.
        Delete => "delete",
    }
}

crate::text_enum! {
    /// What the API asked of the sandbox's owner; the owner carries it out and moves
    /// the state.
    pub enum Desired {
        Running => "running",
        Stopped => "stopped",
        Paused => "paused",
        Destroyed => "destroyed",
    }
}

impl Machine for SandboxState {
    type Event = SandboxEvent;
    const NAME: &'static str = "sandbox";
    const TABLE: &'static str = "sandboxes";
    const COLUMN: &'static str = "state";
    const EVENTS: &'static [SandboxEvent] = SandboxEvent::ALL;

    fn rule(event: SandboxEvent) -> (&'static [Self], Self) {
        use SandboxState::*;
        match event {
            SandboxEvent::Ready => (&[Creating], Running),
            SandboxEvent::BootFailure => (&[Creating], Error),
            SandboxEvent::Stop => (&[Running, Paused], Stopped),
            SandboxEvent::Pause => (&[Running], Paused),
            SandboxEvent::Resume => (&[Stopped, Paused], Running),
            SandboxEvent::RuntimeFailure => (&[Running], Error),
            SandboxEvent::Destroy => (&[Running, Stopped, Paused], Destroyed),
            SandboxEvent::Delete => (&[Error], Destroyed),
        }
    }

    fn parse_state(text: &str) -> Option<Self> {
        SandboxState::parse(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use SandboxEvent as E;
    use SandboxState as S;

    #[test]
    fn the_table_is_the_seeds_diagram() {
        let mut edges = Vec::new();
        for from in S::ALL {
            for event in E::ALL {
                if let Some(to) = from.next(*event) {
                    edges.push((from.as_str(), event.as_str(), to.as_str()));
                }
            }
        }
        edges.sort();
        let mut expected = vec![
            ("creating", "ready", "running"),
            ("creating", "boot_failure", "error"),
            ("running", "stop", "stopped"),
            ("paused", "stop", "stopped"),
            ("running", "pause", "paused"),
            ("stopped", "resume", "running"),
            ("paused", "resume", "running"),
            ("running", "runtime_failure", "error"),
            ("running", "destroy", "destroyed"),
            ("stopped", "destroy", "destroyed"),
            ("paused", "destroy", "destroyed"),
            ("error", "delete", "destroyed"),
        ];
        expected.sort();
        assert_eq!(edges, expected);
        assert!(S::Destroyed.accepts_nothing());
    }
}
