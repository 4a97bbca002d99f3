//! What both sinks' resyncs share (`cdcd resync --table T`, [`crate::sinks::Sink::resync`]):
//! where a table's new lineage lives, the rule that says which of its commits replaces the live
//! table, and the property that marks a table as a resync's lineage.
//!
//! Each sink swaps in its own way (`iceberg/resync/`: one metadata commit; `lsm/resync.rs`: one
//! `OVERWRITE` snapshot); the rule below is why readers never see either go back.

use crate::changelog::Position;
use crate::sinks::ResyncMode;

/// The property the swap sets (Iceberg: a table property; Paimon: a snapshot property every
/// later snapshot keeps): the id of the resync whose lineage the table now is.
pub const RESYNC_ID_PROPERTY: &str = "cdcd.resync-id";

/// The location of resync `id`'s lineage of the table at `table_location`.
pub fn lineage_location(table_location: &str, id: &str) -> String {
    format!("{}/resync-{id}", table_location.trim_end_matches('/'))
}

/// A resync under way in a sink: its id, and which commit of the lineage swaps.
#[derive(Debug, Clone)]
pub(crate) struct Lineage {
    pub id: String,
    mode: ResyncMode,
    /// The live table's checkpoint when the resync was marked (`None`: no live table).
    live: Option<Position>,
}

impl Lineage {
    pub fn new(id: &str, mode: ResyncMode, live: Option<Position>) -> Lineage {
        Lineage {
            id: id.to_owned(),
            mode,
            live,
        }
    }

    /// Whether the lineage's commit at `position` replaces the live table.
    pub fn swaps_at(&self, position: &Position) -> bool {
        if position.is_snapshot_incomplete() {
            return false;
        }
        match self.mode {
            ResyncMode::SwapAtCopyEnd => true,
            ResyncMode::CopyOnly => false,
            ResyncMode::SwapWhenCaughtUp => self
                .live
                .as_ref()
                .is_none_or(|live| live.is_snapshot_incomplete() || position.covers(live)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_lineage_swaps_at_the_commit_its_mode_names() {
        use crate::changelog::Lsn;
        let pos = |n| Position::Postgres(Lsn(n));
        let incomplete = Position::snapshot_incomplete(&pos(1));
        for mode in [
            ResyncMode::SwapAtCopyEnd,
            ResyncMode::CopyOnly,
            ResyncMode::SwapWhenCaughtUp,
        ] {
            assert!(
                !Lineage::new("x", mode, Some(pos(10))).swaps_at(&incomplete),
                "{mode:?}"
            );
        }
        assert!(Lineage::new("x", ResyncMode::SwapAtCopyEnd, Some(pos(10))).swaps_at(&pos(5)));
        assert!(!Lineage::new("x", ResyncMode::CopyOnly, Some(pos(10))).swaps_at(&pos(50)));
        let caught_up = Lineage::new("x", ResyncMode::SwapWhenCaughtUp, Some(pos(10)));
        assert!(!caught_up.swaps_at(&pos(9)), "behind the live table");
        assert!(caught_up.swaps_at(&pos(10)) && caught_up.swaps_at(&pos(11)));
        assert!(Lineage::new("x", ResyncMode::SwapWhenCaughtUp, None).swaps_at(&pos(1)));
    }
}
