//! Where a run change feed stands, as the `id` of its events: the PostgreSQL snapshot
//! whose visible run rows have all been sent, and, part way through a batch, the
//! snapshot being caught up to and the last row sent of it. Parsed strictly, so that a
//! position the API did not write is a 400 and never reaches the database.

use cairn_common::ids::Id;
use uuid::Uuid;

/// The most transactions a snapshot may list as running (`xip`).
const MAX_RUNNING: usize = 1000;

/// A PostgreSQL snapshot (`pg_snapshot`, text `xmin:xmax:xip,…`): the transactions below
/// `xmin` have ended, those from `xmax` on had not begun, and `running` were in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub xmin: u64,
    pub xmax: u64,
    pub running: Vec<u64>,
}

impl Snapshot {
    /// The snapshot in PostgreSQL's text form, or `None` when it is not one.
    pub fn parse(text: &str) -> Option<Snapshot> {
        let mut parts = text.split(':');
        let xmin: u64 = parts.next()?.parse().ok()?;
        let xmax: u64 = parts.next()?.parse().ok()?;
        let list = parts.next()?;
        if parts.next().is_some() || xmin > xmax {
            return None;
        }
        let running: Vec<u64> = if list.is_empty() {
            Vec::new()
        } else {
            list.split(',')
                .map(|x| x.parse().ok())
                .collect::<Option<_>>()?
        };
        let ordered = running.windows(2).all(|w| w[0] < w[1]);
        let within = running.iter().all(|x| (xmin..xmax).contains(x));
        (ordered && within && running.len() <= MAX_RUNNING).then_some(Snapshot {
            xmin,
            xmax,
            running,
        })
    }

    pub fn text(&self) -> String {
        let running: Vec<String> = self.running.iter().map(u64::to_string).collect();
        format!("{}:{}:{}", self.xmin, self.xmax, running.join(","))
    }
}

/// A feed's position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Position {
    /// Every run row visible in `seen` has been sent.
    Caught { seen: Snapshot },
    /// On the way from `seen` to `target`: of the rows visible in `target` and not in
    /// `seen`, those up to `(xid, run)` in `(change_xid, id)` order have been sent.
    Within {
        seen: Snapshot,
        target: Snapshot,
        xid: u64,
        run: Uuid,
    },
}

impl Position {
    pub fn text(&self) -> String {
        match self {
            Position::Caught { seen } => seen.text(),
            Position::Within {
                seen,
                target,
                xid,
                run,
            } => format!("{};{};{xid};{}", seen.text(), target.text(), Id::from(*run)),
        }
    }

    pub fn parse(text: &str) -> Option<Position> {
        let parts: Vec<&str> = text.split(';').collect();
        match parts.as_slice() {
            [seen] => Some(Position::Caught {
                seen: Snapshot::parse(seen)?,
            }),
            [seen, target, xid, run] => {
                let seen = Snapshot::parse(seen)?;
                let target = Snapshot::parse(target)?;
                // The target is caught up to from `seen`: never behind it.
                if target.xmax < seen.xmax {
                    return None;
                }
                Some(Position::Within {
                    seen,
                    target,
                    xid: xid.parse().ok()?,
                    run: run.parse::<Id>().ok()?.uuid(),
                })
            }
            _ => None,
        }
    }

    /// The newest snapshot the position names: where the stream stands once the batch
    /// it is in is sent.
    pub fn reach(&self) -> &Snapshot {
        match self {
            Position::Caught { seen } => seen,
            Position::Within { target, .. } => target,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_reads_back_as_it_was_written() {
        let seen = Snapshot::parse("100:105:101,103").expect("a snapshot");
        assert_eq!(seen.running, vec![101, 103]);
        let target = Snapshot::parse("104:110:").expect("a snapshot");
        for at in [
            Position::Caught { seen: seen.clone() },
            Position::Within {
                seen,
                target,
                xid: 106,
                run: Uuid::new_v4(),
            },
        ] {
            assert_eq!(Position::parse(&at.text()), Some(at));
        }
    }

    #[test]
    fn what_the_api_did_not_write_is_refused() {
        let run = Uuid::nil().simple();
        for bad in [
            "",
            "x",
            "7",
            "7:6:",
            "5:9:9",
            "5:9:7,6",
            "5:9:4",
            "5:9:,",
            "5:9::",
            "-1:2:",
            "5:9:;5:9:;6",
            &format!("5:9:;4:8:;6;{run}"),
            &format!("5:9:;5:9:;x;{run}"),
            "5:9:;5:9:;6;1234",
        ] {
            assert_eq!(Position::parse(bad), None, "{bad:?}");
        }
        let many: Vec<String> = (1..=1001).map(|x| x.to_string()).collect();
        assert_eq!(Snapshot::parse(&format!("1:2000:{}", many.join(","))), None);
    }
}
