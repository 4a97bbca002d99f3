//! Source positions: where in the source's log a change or a checkpoint sits.
//!
//! A position is a type, never a bare string or integer (STYLE rule 7). Its `Display` and
//! `FromStr` are exactly the `cdcd.position` checkpoint value, so what a snapshot stores is what a
//! restart parses.

use std::fmt;
use std::str::FromStr;

use super::gtid::{BinlogFile, GtidList, GtidSet};

/// A Postgres WAL location (`XLogRecPtr`), written `hi/lo` in hex as Postgres does (`0/16B3748`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl Lsn {
    pub const ZERO: Lsn = Lsn(0);

    pub fn is_zero(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// The text could not be read as a position.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid position {text:?}: expected a Postgres LSN such as 0/16B3748, a MySQL GTID set (uuid:1-42), a MariaDB GTID list (0-1-42) or binlog.000003:4711")]
pub struct ParsePositionError {
    pub text: String,
}

impl FromStr for Lsn {
    type Err = ParsePositionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParsePositionError { text: s.to_owned() };
        let (hi, lo) = s.split_once('/').ok_or_else(err)?;
        let hi = u32::from_str_radix(hi, 16).map_err(|_| err())?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| err())?;
        Ok(Lsn((u64::from(hi) << 32) | u64::from(lo)))
    }
}

/// Where a source is, in the source's own terms.
///
/// Positions of one pipeline are all of one kind (one source); comparing positions of different
/// kinds is meaningless and `partial_cmp` says so with `None`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Position {
    /// Postgres: the end LSN of a committed transaction (everything before it is applied).
    Postgres(Lsn),
    /// MySQL with GTIDs: every transaction applied (`gtid_executed` syntax).
    MySqlGtid(GtidSet),
    /// MariaDB with GTIDs: the last transaction applied per replication domain.
    MariaDbGtid(GtidList),
    /// MySQL or MariaDB by binlog file and offset (GTIDs off). `pos` 0 (binlog offsets start at 4)
    /// with an empty file marks an incomplete initial copy.
    MySqlFile(BinlogFile),
}

impl PartialOrd for Position {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        match (self, other) {
            (Position::Postgres(a), Position::Postgres(b)) => Some(a.cmp(b)),
            (Position::MySqlGtid(a), Position::MySqlGtid(b)) => a.partial_cmp(b),
            (Position::MariaDbGtid(a), Position::MariaDbGtid(b)) => a.partial_cmp(b),
            (Position::MySqlFile(a), Position::MySqlFile(b)) => a.partial_cmp(b),
            _ => None,
        }
    }
}

impl Position {
    /// The checkpoint of a table whose initial copy is under way: not a place to resume from.
    pub fn snapshot_incomplete(like: &Position) -> Position {
        match like {
            Position::Postgres(_) => Position::Postgres(Lsn::ZERO),
            Position::MySqlGtid(_) | Position::MariaDbGtid(_) | Position::MySqlFile(_) => {
                Position::MySqlFile(BinlogFile::default())
            }
        }
    }

    /// Whether this is [`Position::snapshot_incomplete`].
    pub fn is_snapshot_incomplete(&self) -> bool {
        match self {
            Position::Postgres(lsn) => lsn.is_zero(),
            Position::MySqlFile(f) => f.pos == 0 && f.file.is_empty(),
            Position::MySqlGtid(_) | Position::MariaDbGtid(_) => false,
        }
    }

    /// True when this position is at or past `other` (same kind).
    pub fn covers(&self, other: &Position) -> bool {
        matches!(
            self.partial_cmp(other),
            Some(std::cmp::Ordering::Greater | std::cmp::Ordering::Equal)
        )
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Position::Postgres(lsn) => lsn.fmt(f),
            Position::MySqlGtid(set) => set.fmt(f),
            Position::MariaDbGtid(list) => list.fmt(f),
            Position::MySqlFile(file) => file.fmt(f),
        }
    }
}

impl FromStr for Position {
    type Err = ParsePositionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // The kinds' texts do not overlap: an LSN has a '/', a MariaDB list only digits, '-' and
        // ',', a GTID set starts with a UUID, and anything else with a ':' is `file:pos`.
        if s.contains('/') {
            return s.parse::<Lsn>().map(Position::Postgres);
        }
        if !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_digit() || c == '-' || c == ',')
        {
            return s.parse::<GtidList>().map(Position::MariaDbGtid);
        }
        if s.split(':').next().is_some_and(super::gtid::is_uuid) {
            return s.parse::<GtidSet>().map(Position::MySqlGtid);
        }
        s.parse::<BinlogFile>().map(Position::MySqlFile)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsn_round_trips_through_text() {
        for text in ["0/0", "0/16B3748", "1/0", "FFFFFFFF/FFFFFFFF"] {
            let lsn: Lsn = text.parse().unwrap();
            assert_eq!(lsn.to_string(), text);
        }
        assert_eq!("0/16B3748".parse::<Lsn>().unwrap(), Lsn(0x16B3748));
        assert_eq!("1/2".parse::<Lsn>().unwrap(), Lsn((1 << 32) | 2));
    }

    #[test]
    fn bad_lsn_is_an_error() {
        for text in ["", "16B3748", "0/xyz", "0/1/2", "100000000/0"] {
            assert!(text.parse::<Lsn>().is_err(), "{text}");
        }
    }

    #[test]
    fn mysql_positions_round_trip_by_kind() {
        for text in [
            "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-42,4e11fa47-71ca-11e1-9e33-c80aa9429562:7",
            "0-1-42,1-2-7",
            "binlog.000003:4711",
            "mariadb-bin.000001:4",
        ] {
            let p: Position = text.parse().unwrap();
            assert_eq!(p.to_string(), text);
        }
        assert!(matches!(
            "0-1-42".parse().unwrap(),
            Position::MariaDbGtid(_)
        ));
        assert!(matches!(
            "binlog.000003:4711".parse().unwrap(),
            Position::MySqlFile(_)
        ));
        let like: Position = "0-1-1".parse().unwrap();
        let incomplete = Position::snapshot_incomplete(&like);
        assert!(incomplete.is_snapshot_incomplete());
        let back: Position = incomplete.to_string().parse().unwrap();
        assert!(back.is_snapshot_incomplete());
        assert_eq!(like.partial_cmp(&incomplete), None);
    }

    #[test]
    fn positions_order_by_lsn() {
        let a = Position::Postgres(Lsn(10));
        let b = Position::Postgres(Lsn(20));
        assert!(b.covers(&a));
        assert!(a.covers(&a));
        assert!(!a.covers(&b));
    }
}
