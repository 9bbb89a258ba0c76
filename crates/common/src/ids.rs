//! Run, request and action ids: exactly 32 lowercase hexadecimal characters on the wire,
//! UUIDs in the database. Tenant ids are names ([`valid_tenant_id`]).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;
use uuid::Uuid;

/// Whether `id` is a tenant id the database accepts: 1 to 63 lowercase letters, digits
/// and `-`, not starting with `-`.
pub fn valid_tenant_id(id: &str) -> bool {
    let bytes = id.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0] != b'-'
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

/// A 32-lowercase-hex identifier.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id(pub Uuid);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("an id is exactly 32 lowercase hexadecimal characters")]
pub struct InvalidId;

impl Id {
    pub fn new() -> Self {
        Id(Uuid::new_v4())
    }

    pub fn uuid(self) -> Uuid {
        self.0
    }
}

impl Default for Id {
    fn default() -> Self {
        Self::new()
    }
}

impl FromStr for Id {
    type Err = InvalidId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let well_formed = s.len() == 32
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !well_formed {
            return Err(InvalidId);
        }
        Uuid::parse_str(s).map(Id).map_err(|_| InvalidId)
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.simple())
    }
}

impl fmt::Debug for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Id({})", self.0.simple())
    }
}

impl From<Uuid> for Id {
    fn from(value: Uuid) -> Self {
        Id(value)
    }
}

/// Read from the database as the UUID it is (so `Option<Id>` columns decode too).
impl sqlx::Type<sqlx::Postgres> for Id {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <Uuid as sqlx::Type<sqlx::Postgres>>::type_info()
    }

    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <Uuid as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, sqlx::Postgres> for Id {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        <Uuid as sqlx::Decode<sqlx::Postgres>>::decode(value).map(Id)
    }
}

impl Serialize for Id {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_only_32_lowercase_hex() {
        let id = Id::new();
        assert_eq!(id.to_string().parse::<Id>(), Ok(id));
        assert!("0123456789abcdef0123456789abcdef".parse::<Id>().is_ok());
        for bad in [
            "",
            "0123456789ABCDEF0123456789abcdef",
            "0123456789abcdef0123456789abcde",
            "0123456789abcdef0123456789abcdef0",
            "01234567-89ab-cdef-0123-456789abcdef",
            "0123456789abcdef0123456789abcdeg",
        ] {
            assert_eq!(bad.parse::<Id>(), Err(InvalidId), "{bad}");
        }
    }
}
