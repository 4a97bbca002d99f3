//! MySQL and MariaDB binlog positions: MySQL GTID sets, MariaDB GTID lists, and `file:pos`.
//!
//! These are the values of [`Position::MySqlGtid`](super::Position::MySqlGtid),
//! [`Position::MariaDbGtid`](super::Position::MariaDbGtid) and
//! [`Position::MySqlFile`](super::Position::MySqlFile). Their text is exactly what the
//! `cdcd.position` checkpoint key stores (`docs/exactly-once.md`, section 1): `uuid:1-42,…`
//! (MySQL's own `gtid_executed` syntax, tags included), `0-1-42,1-2-7` (MariaDB's
//! `gtid_binlog_pos` syntax) and `binlog.000003:4711`.
//!
//! Ordering is partial: a GTID set is at or past another when it contains it; a MariaDB list is
//! at or past another when every replication domain's sequence number is; a file position by
//! file then offset.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;

use super::position::ParsePositionError;

/// A MySQL GTID set: per source UUID (and optional tag, MySQL 8.3+), sorted disjoint intervals of
/// transaction numbers, each `[start, end]` inclusive.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct GtidSet {
    /// Key: `uuid` or `uuid:tag`, lower case.
    pub sids: BTreeMap<String, Vec<(u64, u64)>>,
}

impl GtidSet {
    pub fn is_empty(&self) -> bool {
        self.sids.values().all(Vec::is_empty)
    }

    /// Adds transaction `gno` of `sid` (`uuid` or `uuid:tag`).
    pub fn add(&mut self, sid: &str, gno: u64) {
        let ivs = self.sids.entry(sid.to_ascii_lowercase()).or_default();
        add_interval(ivs, gno, gno);
    }

    /// The transactions in both (the newest set both are at or past).
    pub fn intersection(&self, other: &GtidSet) -> GtidSet {
        let mut out = GtidSet::default();
        for (sid, mine) in &self.sids {
            let Some(theirs) = other.sids.get(sid) else {
                continue;
            };
            let mut ivs = Vec::new();
            for &(s, e) in mine {
                for &(ts, te) in theirs {
                    let (lo, hi) = (s.max(ts), e.min(te));
                    if lo <= hi {
                        ivs.push((lo, hi));
                    }
                }
            }
            if !ivs.is_empty() {
                ivs.sort_unstable();
                out.sids.insert(sid.clone(), ivs);
            }
        }
        out
    }

    /// The transactions in either.
    pub fn union(&self, other: &GtidSet) -> GtidSet {
        let mut out = self.clone();
        for (sid, ivs) in &other.sids {
            let mine = out.sids.entry(sid.clone()).or_default();
            for &(s, e) in ivs {
                add_interval(mine, s, e);
            }
        }
        out.sids.retain(|_, ivs| !ivs.is_empty());
        out
    }

    /// Whether every transaction of `other` is in `self`.
    pub fn contains(&self, other: &GtidSet) -> bool {
        other.sids.iter().all(|(sid, ivs)| {
            let mine = self.sids.get(sid).map(Vec::as_slice).unwrap_or(&[]);
            ivs.iter()
                .all(|&(s, e)| mine.iter().any(|&(ms, me)| ms <= s && e <= me))
        })
    }
}

fn add_interval(ivs: &mut Vec<(u64, u64)>, start: u64, end: u64) {
    ivs.push((start, end));
    ivs.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ivs.len());
    for &(s, e) in ivs.iter() {
        match merged.last_mut() {
            Some(last) if s <= last.1.saturating_add(1) => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    *ivs = merged;
}

impl PartialOrd for GtidSet {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        match (self.contains(other), other.contains(self)) {
            (true, true) => Some(Ordering::Equal),
            (true, false) => Some(Ordering::Greater),
            (false, true) => Some(Ordering::Less),
            (false, false) => None,
        }
    }
}

impl fmt::Display for GtidSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (sid, ivs) in &self.sids {
            if ivs.is_empty() {
                continue;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            f.write_str(sid)?;
            for &(s, e) in ivs {
                if s == e {
                    write!(f, ":{s}")?;
                } else {
                    write!(f, ":{s}-{e}")?;
                }
            }
        }
        Ok(())
    }
}

/// Whether `s` is a UUID in its 36-character text form.
pub(crate) fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

impl std::str::FromStr for GtidSet {
    type Err = ParsePositionError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = || ParsePositionError {
            text: text.to_owned(),
        };
        let mut set = GtidSet::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let mut fields = part.split(':');
            let uuid = fields.next().filter(|u| is_uuid(u)).ok_or_else(err)?;
            let mut sid = uuid.to_ascii_lowercase();
            let mut any = false;
            for field in fields {
                let (s, e) = match field.split_once('-') {
                    Some((s, e)) => (s.parse::<u64>(), e.parse::<u64>()),
                    None => (field.parse::<u64>(), field.parse::<u64>()),
                };
                match (s, e) {
                    (Ok(s), Ok(e)) if s >= 1 && s <= e => {
                        add_interval(set.sids.entry(sid.clone()).or_default(), s, e);
                        any = true;
                    }
                    // A tag (MySQL 8.3+): letters, digits and '_', starting with a letter or '_';
                    // the intervals after it belong to `uuid:tag`.
                    _ if !field.is_empty()
                        && field.len() <= 32
                        && field.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                        && !field.starts_with(|c: char| c.is_ascii_digit()) =>
                    {
                        sid = format!(
                            "{}:{}",
                            uuid.to_ascii_lowercase(),
                            field.to_ascii_lowercase()
                        );
                    }
                    _ => return Err(err()),
                }
            }
            if !any {
                return Err(err());
            }
        }
        Ok(set)
    }
}

/// One MariaDB GTID: `domain-server-seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MariaGtid {
    pub domain: u32,
    pub server: u32,
    pub seq: u64,
}

/// A MariaDB GTID list: the last GTID applied per replication domain (what `gtid_binlog_pos` and
/// `@slave_connect_state` hold), sorted by domain, one entry per domain.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct GtidList {
    pub gtids: Vec<MariaGtid>,
}

impl GtidList {
    /// Records `gtid` as its domain's latest.
    pub fn apply(&mut self, gtid: MariaGtid) {
        match self.gtids.binary_search_by_key(&gtid.domain, |g| g.domain) {
            Ok(i) => {
                if let Some(slot) = self.gtids.get_mut(i) {
                    *slot = gtid;
                }
            }
            Err(i) => self.gtids.insert(i, gtid),
        }
    }

    /// No domain has a transaction (`gtid_binlog_pos` after `RESET MASTER`).
    pub fn is_empty(&self) -> bool {
        self.gtids.iter().all(|g| g.seq == 0)
    }

    /// Per domain, the older of the two (a domain missing from either is left out).
    pub fn meet(&self, other: &GtidList) -> GtidList {
        let mut out = GtidList::default();
        for g in &self.gtids {
            if let Some(o) = other.gtids.iter().find(|o| o.domain == g.domain) {
                out.apply(if o.seq < g.seq { *o } else { *g });
            }
        }
        out
    }

    /// Per domain, the newer of the two.
    pub fn join(&self, other: &GtidList) -> GtidList {
        let mut out = self.clone();
        for o in &other.gtids {
            if out.seq(o.domain) < o.seq {
                out.apply(*o);
            }
        }
        out
    }

    /// The sequence number of `domain` (0: nothing from it).
    pub fn seq(&self, domain: u32) -> u64 {
        self.gtids
            .iter()
            .find(|g| g.domain == domain)
            .map_or(0, |g| g.seq)
    }
}

impl PartialOrd for GtidList {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        let mut ord = Ordering::Equal;
        let domains = self.gtids.iter().chain(&other.gtids).map(|g| g.domain);
        for d in domains {
            match (ord, self.seq(d).cmp(&other.seq(d))) {
                (_, Ordering::Equal) => {}
                (Ordering::Equal, o) => ord = o,
                (a, b) if a != b => return None,
                _ => {}
            }
        }
        Some(ord)
    }
}

impl fmt::Display for GtidList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, g) in self.gtids.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}-{}-{}", g.domain, g.server, g.seq)?;
        }
        Ok(())
    }
}

impl std::str::FromStr for GtidList {
    type Err = ParsePositionError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = || ParsePositionError {
            text: text.to_owned(),
        };
        let mut list = GtidList::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let mut it = part.split('-');
            let (Some(d), Some(s), Some(q), None) = (it.next(), it.next(), it.next(), it.next())
            else {
                return Err(err());
            };
            let gtid = MariaGtid {
                domain: d.parse().map_err(|_| err())?,
                server: s.parse().map_err(|_| err())?,
                seq: q.parse().map_err(|_| err())?,
            };
            if list.seq(gtid.domain) != 0 {
                return Err(err());
            }
            list.apply(gtid);
        }
        Ok(list)
    }
}

/// A binlog file and the offset of the next event in it (`binlog.000003:4711`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct BinlogFile {
    pub file: String,
    pub pos: u64,
}

impl PartialOrd for BinlogFile {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        // Binlog names share a base and grow a zero-padded counter that may gain digits.
        let key = |b: &BinlogFile| (b.file.len(), b.file.clone(), b.pos);
        Some(key(self).cmp(&key(other)))
    }
}

impl fmt::Display for BinlogFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.pos)
    }
}

impl std::str::FromStr for BinlogFile {
    type Err = ParsePositionError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = || ParsePositionError {
            text: text.to_owned(),
        };
        let (file, pos) = text.rsplit_once(':').ok_or_else(err)?;
        if file.contains([',', ':', '/']) {
            return Err(err());
        }
        Ok(BinlogFile {
            file: file.to_owned(),
            pos: pos.parse().map_err(|_| err())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const U1: &str = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
    const U2: &str = "4e11fa47-71ca-11e1-9e33-c80aa9429562";

    #[test]
    fn gtid_set_round_trips_and_orders_by_containment() {
        let text = format!("{U1}:1-42:50,{U2}:7");
        let set: GtidSet = text.parse().unwrap();
        assert_eq!(set.to_string(), text);
        let mut more = set.clone();
        more.add(U2, 8);
        assert_eq!(more.to_string(), format!("{U1}:1-42:50,{U2}:7-8"));
        assert!(more > set);
        let other: GtidSet = format!("{U1}:1-43").parse().unwrap();
        assert_eq!(other.partial_cmp(&set), None);
        let tagged: GtidSet = format!("{U1}:1-5,{U1}:mytag:1-3").parse().unwrap();
        assert_eq!(tagged.to_string(), format!("{U1}:1-5,{U1}:mytag:1-3"));
        assert!(U1.parse::<GtidSet>().is_err());
        assert!("nope:1-2".parse::<GtidSet>().is_err());
    }

    #[test]
    fn gtid_list_round_trips_and_orders_per_domain() {
        let a: GtidList = "0-1-42,1-2-7".parse().unwrap();
        assert_eq!(a.to_string(), "0-1-42,1-2-7");
        let mut b = a.clone();
        b.apply(MariaGtid {
            domain: 1,
            server: 2,
            seq: 8,
        });
        assert!(b > a);
        let c: GtidList = "0-1-43,1-2-6".parse().unwrap();
        assert_eq!(c.partial_cmp(&a), None);
        assert!("0-1".parse::<GtidList>().is_err());
        assert!("0-1-2,0-1-3".parse::<GtidList>().is_err());
    }

    #[test]
    fn gtid_set_intersection_and_union_bound_both() {
        let a: GtidSet = format!("{U1}:1-10:20-30,{U2}:1-5").parse().unwrap();
        let b: GtidSet = format!("{U1}:5-25").parse().unwrap();
        let meet = a.intersection(&b);
        assert_eq!(meet.to_string(), format!("{U1}:5-10:20-25"));
        assert!(a.contains(&meet) && b.contains(&meet));
        let join = a.union(&b);
        assert_eq!(join.to_string(), format!("{U1}:1-30,{U2}:1-5"));
        assert!(join.contains(&a) && join.contains(&b));
        assert!(a.intersection(&GtidSet::default()).is_empty());
    }

    #[test]
    fn gtid_list_meet_and_join_per_domain() {
        let a: GtidList = "0-1-10,1-1-5".parse().unwrap();
        let b: GtidList = "0-1-5,1-1-8,2-3-1".parse().unwrap();
        assert_eq!(a.meet(&b).to_string(), "0-1-5,1-1-5");
        assert_eq!(a.join(&b).to_string(), "0-1-10,1-1-8,2-3-1");
        assert!(a.meet(&b) <= a && a.meet(&b) <= b);
        assert!(a.join(&b) >= a && a.join(&b) >= b);
        assert!(GtidList::default().is_empty());
        assert!(!a.is_empty());
    }

    #[test]
    fn binlog_file_orders_by_file_then_offset() {
        let a: BinlogFile = "mariadb-bin.000003:4711".parse().unwrap();
        assert_eq!(a.to_string(), "mariadb-bin.000003:4711");
        let b: BinlogFile = "mariadb-bin.000004:4".parse().unwrap();
        assert!(b > a);
        let c: BinlogFile = "mariadb-bin.1000000:4".parse().unwrap();
        assert!(c > b);
    }
}
