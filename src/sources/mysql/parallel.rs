//! Tables of one initial copy copied on several connections at once (MariaDB), all reading the
//! same consistent snapshot.
//!
//! Where it sits: `copy_job.rs` begins the copy's snapshot on its connection and plans the
//! tables; [`open_at`] then begins a consistent snapshot on up to `source.snapshot_parallelism`
//! − 1 more connections and keeps those whose snapshot is at the same binlog position, and
//! [`copy_tables`] copies the tables on all of them (each table whole on one connection, so its
//! events stay in order), the largest first.
//!
//! Why the same position means the same snapshot: MariaDB's `START TRANSACTION WITH CONSISTENT
//! SNAPSHOT` takes the InnoDB read view and `binlog_snapshot_file/position` together, under the
//! commit-order lock: the view holds exactly the transactions binlogged before that position.
//! Two snapshots at one position therefore see the same rows, and everything `copy.rs` argues
//! for one snapshot holds for the tables copied on either. A connection whose snapshot landed at
//! another position (a transaction committed between the two begins) is closed; when writes never
//! pause long enough, the copy runs on the one connection, as before. MySQL gives no position
//! taken with the snapshot (it needs `FLUSH TABLES WITH READ LOCK` around the begin), so a MySQL
//! copy stays on one connection.
//!
//! Memory: each connection holds one batch at a time (cut at `BATCH_ROWS` / `BATCH_BYTES`), and
//! the pipeline's bounded channel stops them all when the sink is slower; the copy's buffered rows
//! are committed within the budget's share whatever the number of tables (`pipeline/copy.rs`).

use std::time::Instant;

use futures::future::join_all;
use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::copy::{self, Copied, Finish, TablePlan};
use super::setup::{self, Flavor};
use super::snapshot;
use crate::changelog::Position;
use crate::config::MySqlConfig;
use crate::sources::{SourceError, SourceEvent};

/// Begins of one extra connection's snapshot before it is given up.
const BEGIN_ATTEMPTS: u32 = 3;

/// Up to `wanted` more connections, each inside a consistent snapshot at `at` (the copy's). Fewer,
/// or none, when snapshots land elsewhere (the source is being written) or the flavor gives no
/// position with its snapshot (MySQL); a connection that fails is left out, never an error.
pub(super) async fn open_at(
    cfg: &MySqlConfig,
    flavor: Flavor,
    at: &Position,
    wanted: usize,
) -> Vec<Conn> {
    let mut conns = Vec::new();
    if flavor != Flavor::MariaDb {
        return conns;
    }
    while conns.len() < wanted {
        match at_snapshot(cfg, flavor, at).await {
            Ok(Some(conn)) => conns.push(conn),
            Ok(None) => {
                info!(snapshot = %at, connections = conns.len() + 1, "the source moved on since the copy's snapshot began: copying on fewer connections");
                break;
            }
            Err(e) => {
                info!(error = %e, connections = conns.len() + 1, "cannot open another copy connection: copying on fewer");
                break;
            }
        }
    }
    conns
}

/// A new connection inside a consistent snapshot at `at`, or `None` when its snapshots kept
/// landing elsewhere.
async fn at_snapshot(
    cfg: &MySqlConfig,
    flavor: Flavor,
    at: &Position,
) -> Result<Option<Conn>, SourceError> {
    let mut conn = setup::connect(cfg).await?;
    for _ in 0..BEGIN_ATTEMPTS {
        if snapshot::begin(&mut conn, flavor).await? == *at {
            return Ok(Some(conn));
        }
        conn.query_drop("ROLLBACK")
            .await
            .map_err(setup::server_err(
                "ending a copy snapshot at another position",
            ))?;
    }
    Ok(None)
}

/// Copies `plans` on `main` and `more` (every one inside a snapshot at the same position): each
/// table whole on one connection, the largest tables first, each to the connection with the
/// fewest estimated rows so far. What [`copy::copy_tables`] does on one connection, merged, and
/// the copy's one "initial copy finished" line once every connection is done.
#[allow(clippy::too_many_arguments)]
pub(super) async fn copy_tables(
    main: &mut Conn,
    more: &mut [Conn],
    cfg: &MySqlConfig,
    plans: Vec<TablePlan<'_>>,
    finish: &Finish,
    events: &mpsc::Sender<SourceEvent>,
    shutdown: &CancellationToken,
) -> Result<Copied, SourceError> {
    let mut conns: Vec<&mut Conn> = std::iter::once(main).chain(more.iter_mut()).collect();
    if conns.len() > 1 {
        info!(
            connections = conns.len(),
            tables = plans.len(),
            "copying tables on several connections at one snapshot"
        );
    }
    let started = Instant::now();
    let groups = spread(plans, conns.len());
    let copies = conns
        .iter_mut()
        .zip(&groups)
        .map(|(conn, plans)| copy::copy_tables(conn, cfg, plans, finish, events, shutdown));
    let mut altered = Vec::new();
    let mut rows = 0;
    let mut shut_down = false;
    for copied in join_all(copies).await {
        match copied? {
            Copied::All {
                altered: a,
                rows: r,
            } => {
                altered.extend(a);
                rows += r;
            }
            Copied::ShutDown => shut_down = true,
        }
    }
    if shut_down {
        return Ok(Copied::ShutDown);
    }
    let seconds = started.elapsed().as_secs_f64();
    info!(
        rows,
        seconds,
        rows_per_s = (rows as f64 / seconds.max(1e-9)) as u64,
        "initial copy finished"
    );
    Ok(Copied::All { altered, rows })
}

/// `plans` in `n` groups of about equal estimated rows: largest first, each to the lightest group.
fn spread<T: Estimated>(mut plans: Vec<T>, n: usize) -> Vec<Vec<T>> {
    let n = n.max(1);
    plans.sort_by_key(|p| std::cmp::Reverse(p.estimated_rows()));
    let mut groups: Vec<(u64, Vec<T>)> = (0..n).map(|_| (0, Vec::new())).collect();
    for plan in plans {
        if let Some(lightest) = groups.iter_mut().min_by_key(|g| g.0) {
            lightest.0 += plan.estimated_rows();
            lightest.1.push(plan);
        }
    }
    groups.into_iter().map(|g| g.1).collect()
}

trait Estimated {
    fn estimated_rows(&self) -> u64;
}

impl Estimated for TablePlan<'_> {
    fn estimated_rows(&self) -> u64 {
        self.estimated_rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Estimated for u64 {
        fn estimated_rows(&self) -> u64 {
            *self
        }
    }

    #[test]
    fn spreads_the_largest_first_to_the_lightest() {
        let groups = spread(vec![10u64, 500, 40, 300, 200, 5], 3);
        assert_eq!(groups, vec![vec![500], vec![300], vec![200, 40, 10, 5]]);
        assert_eq!(spread(vec![1u64, 2], 1), vec![vec![2, 1]]);
        // More connections than tables: the rest get nothing.
        assert_eq!(spread(vec![7u64], 3), vec![vec![7], vec![], vec![]]);
    }
}
