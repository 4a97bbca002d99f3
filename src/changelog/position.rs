//! Source positions: where in the source's log a change or a checkpoint sits.
//!
//! A position is a type, never a bare string or integer (STYLE rule 7). Its `Display` and
//! `FromStr` are exactly the `cdcd.position` checkpoint value, so what a snapshot stores is what a
//! restart parses.
//!
//! An empty GTID state (a fresh binlog after `RESET MASTER`, or GTIDs just enabled) has no text of
//! its own in MySQL or MariaDB (both print `""`), and an empty string could be either kind. So
//! `cdcd.position` writes [`EMPTY_GTID_SET`] and [`EMPTY_GTID_LIST`] instead, and still reads `""`
//! (what versions before this wrote) as an empty GTID state. Either empty state is before every
//! GTID position of both kinds, so it compares below them whatever kind `""` was read as, and the
//! MySQL source turns it into its server's kind before streaming.

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
#[error("invalid position {text:?}: expected a Postgres LSN such as 0/16B3748, a MySQL GTID set (uuid:1-42, or empty-gtid-set), a MariaDB GTID list (0-1-42, or empty-gtid-list) or binlog.000003:4711")]
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

/// `cdcd.position` of an empty MySQL GTID set.
pub const EMPTY_GTID_SET: &str = "empty-gtid-set";
/// `cdcd.position` of an empty MariaDB GTID list.
pub const EMPTY_GTID_LIST: &str = "empty-gtid-list";

/// Where a source is, in the source's own terms.
///
/// Positions of one pipeline are all of one kind (one source); comparing positions of different
/// kinds is meaningless and `partial_cmp` says so with `None`, except that an empty GTID state of
/// either kind is below every GTID position of both (see the module doc).
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
            (Position::MySqlGtid(_), Position::MariaDbGtid(_))
            | (Position::MariaDbGtid(_), Position::MySqlGtid(_)) => {
                match (self.is_empty_gtid(), other.is_empty_gtid()) {
                    (true, true) => Some(std::cmp::Ordering::Equal),
                    (true, false) => Some(std::cmp::Ordering::Less),
                    (false, true) => Some(std::cmp::Ordering::Greater),
                    (false, false) => None,
                }
            }
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

    /// A GTID position holding no transaction (either kind).
    pub fn is_empty_gtid(&self) -> bool {
        match self {
            Position::MySqlGtid(set) => set.is_empty(),
            Position::MariaDbGtid(list) => list.is_empty(),
            Position::Postgres(_) | Position::MySqlFile(_) => false,
        }
    }

    /// The newest position that both `self` and `other` are at or past: where a stream must
    /// start so that neither misses a change. GTID sets and lists are only partially ordered, so
    /// this is their intersection (per-domain minimum), not one of the two. `None` for positions
    /// of different kinds (an empty GTID state of either kind is the meet of itself and any GTID
    /// position).
    pub fn meet(&self, other: &Position) -> Option<Position> {
        match (self, other) {
            (Position::Postgres(a), Position::Postgres(b)) => Some(Position::Postgres(*a.min(b))),
            (Position::MySqlGtid(a), Position::MySqlGtid(b)) => {
                Some(Position::MySqlGtid(a.intersection(b)))
            }
            (Position::MariaDbGtid(a), Position::MariaDbGtid(b)) => {
                Some(Position::MariaDbGtid(a.meet(b)))
            }
            (Position::MySqlFile(a), Position::MySqlFile(b)) => {
                Some(Position::MySqlFile(if b < a {
                    b.clone()
                } else {
                    a.clone()
                }))
            }
            _ if self.is_empty_gtid() && other.partial_cmp(self).is_some() => Some(self.clone()),
            _ if other.is_empty_gtid() && self.partial_cmp(other).is_some() => Some(other.clone()),
            _ => None,
        }
    }

    /// The oldest position at or past both `self` and `other` (union of GTID sets, per-domain
    /// maximum of GTID lists). A table complete through two positions is complete through this
    /// one. `None` for positions of different kinds.
    pub fn join(&self, other: &Position) -> Option<Position> {
        match (self, other) {
            (Position::Postgres(a), Position::Postgres(b)) => Some(Position::Postgres(*a.max(b))),
            (Position::MySqlGtid(a), Position::MySqlGtid(b)) => {
                Some(Position::MySqlGtid(a.union(b)))
            }
            (Position::MariaDbGtid(a), Position::MariaDbGtid(b)) => {
                Some(Position::MariaDbGtid(a.join(b)))
            }
            (Position::MySqlFile(a), Position::MySqlFile(b)) => {
                Some(Position::MySqlFile(if b > a {
                    b.clone()
                } else {
                    a.clone()
                }))
            }
            _ if self.is_empty_gtid() && other.partial_cmp(self).is_some() => Some(other.clone()),
            _ if other.is_empty_gtid() && self.partial_cmp(other).is_some() => Some(self.clone()),
            _ => None,
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
            Position::MySqlGtid(set) if set.is_empty() => f.write_str(EMPTY_GTID_SET),
            Position::MariaDbGtid(list) if list.is_empty() => f.write_str(EMPTY_GTID_LIST),
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
        // ',', a GTID set starts with a UUID, and anything else with a ':' is `file:pos`. The
        // empty texts have no ':'; `""` is what earlier versions wrote for an empty state of
        // either kind (read as a MariaDB list: it compares like an empty set, see the module doc).
        match s {
            EMPTY_GTID_SET => return Ok(Position::MySqlGtid(GtidSet::default())),
            EMPTY_GTID_LIST | "" => return Ok(Position::MariaDbGtid(GtidList::default())),
            _ => {}
        }
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

    /// Issue 17 part 4: a checkpoint taken on a fresh binlog (`RESET MASTER`) must parse back.
    #[test]
    fn empty_gtid_states_round_trip_and_precede_every_gtid_position() {
        let set = Position::MySqlGtid(GtidSet::default());
        let list = Position::MariaDbGtid(GtidList::default());
        assert_eq!(set.to_string(), EMPTY_GTID_SET);
        assert_eq!(list.to_string(), EMPTY_GTID_LIST);
        assert_eq!(set.to_string().parse::<Position>().unwrap(), set);
        assert_eq!(list.to_string().parse::<Position>().unwrap(), list);
        // What earlier versions wrote.
        let legacy: Position = "".parse().unwrap();
        assert!(legacy.is_empty_gtid());
        assert!(!legacy.is_snapshot_incomplete());
        let some_set: Position = "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-3".parse().unwrap();
        let some_list: Position = "0-1-3".parse().unwrap();
        for empty in [&set, &list, &legacy] {
            for other in [&some_set, &some_list] {
                assert!(
                    other.covers(empty) && !empty.covers(other),
                    "{other} over {empty}"
                );
                assert_eq!(empty.meet(other).as_ref(), Some(empty));
                assert_eq!(empty.join(other).as_ref(), Some(other));
            }
            assert!(empty.covers(&set) && empty.covers(&list));
        }
        assert_eq!(some_set.partial_cmp(&some_list), None);
        assert_eq!(some_set.meet(&some_list), None);
        // A non-empty MySQL set never reads as the empty text's kind, nor the reverse.
        assert!(
            matches!(some_set.to_string().parse().unwrap(), Position::MySqlGtid(s) if !s.is_empty())
        );
    }

    #[test]
    fn meet_and_join_bound_both_positions() {
        let a: Position = "0-1-10,1-1-5".parse().unwrap();
        let b: Position = "0-1-5,1-1-8".parse().unwrap();
        assert_eq!(a.partial_cmp(&b), None);
        let meet = a.meet(&b).unwrap();
        assert_eq!(meet.to_string(), "0-1-5,1-1-5");
        assert!(a.covers(&meet) && b.covers(&meet));
        let join = a.join(&b).unwrap();
        assert!(join.covers(&a) && join.covers(&b));
        let f1: Position = "binlog.000003:4711".parse().unwrap();
        let f2: Position = "binlog.000004:4".parse().unwrap();
        assert_eq!(f1.meet(&f2), Some(f1.clone()));
        assert_eq!(f1.join(&f2), Some(f2.clone()));
        assert_eq!(
            Position::Postgres(Lsn(5)).meet(&Position::Postgres(Lsn(3))),
            Some(Position::Postgres(Lsn(3)))
        );
        assert_eq!(f1.meet(&a), None);
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
