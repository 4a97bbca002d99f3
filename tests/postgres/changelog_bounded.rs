//! Issue 38's goal "the changelog's files bounded by maintenance over the long run", Iceberg: a
//! table with the changelog on streams one commit per transaction for many commits while the
//! daemon maintains every 300 ms (compaction from 3 small files, snapshots expired at once but
//! the newest 3, a short metadata log). The changelog table's files, live and on disk, data and
//! metadata, stop growing after a warm-up while its rows keep growing, and the changelog still
//! replays exactly to the source (DuckDB and pyiceberg through `REPLAY`).

use std::time::Duration;

use crate::postgres::changelog::replayed;
use crate::postgres::resync::files_under;
use crate::support::{connect, current_metadata, exec, test_env, unique, Pipeline, Settings};

/// Rounds streamed, each its own transaction and commit; the warm-up is the first [`WARM_UP`].
const ROUNDS: i64 = 80;
const WARM_UP: i64 = 20;

/// The changelog table's files: live data files (its current snapshot's), files on disk under
/// `data/` and under `metadata/`.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Files {
    live: usize,
    data: usize,
    metadata: usize,
}

impl Files {
    fn of(dir: &std::path::Path) -> Files {
        let live = if dir.join("metadata").exists() {
            let meta = current_metadata(dir);
            let current = meta["current-snapshot-id"].as_i64();
            meta["snapshots"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|s| s["snapshot-id"].as_i64() == current)
                .and_then(|s| s["summary"]["total-data-files"].as_str())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        } else {
            0
        };
        Files {
            live,
            data: files_under(&dir.join("data")),
            metadata: files_under(&dir.join("metadata")),
        }
    }

    fn max(self, other: Files) -> Files {
        Files {
            live: self.live.max(other.live),
            data: self.data.max(other.data),
            metadata: self.metadata.max(other.metadata),
        }
    }
}

/// Round `k`: two inserts, updates of a seventh of the rows, a delete.
fn round(t: &str, k: i64) -> String {
    format!(
        "BEGIN;
         INSERT INTO {t} VALUES ({k}, {k}, 'r{k}'), ({far}, {k}, NULL);
         UPDATE {t} SET v = v + 1, s = 'u{k}' WHERE id % 7 = {m};
         DELETE FROM {t} WHERE id = {gone};
         COMMIT;",
        far = 100_000 + k,
        m = k % 7,
        gone = k - 3,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_bounds_the_changelog_tables_files() {
    let env = ground_or_skip!(test_env("maintenance_bounds_the_changelog_tables_files"));
    let t = unique("chlb");
    let settings = Settings {
        commit_interval_ms: 100,
        sink_extra: format!(
            "maintenance_interval_ms = 300\n\
             [sink.tables.\"public.{t}\"]\nchangelog = true\n\
             [sink.table_properties]\n\
             \"cdcd.compaction.min-input-files\" = \"3\"\n\
             \"history.expire.max-snapshot-age-ms\" = \"1\"\n\
             \"cdcd.expiry.delete-delay-ms\" = \"0\"\n\
             \"history.expire.min-snapshots-to-keep\" = \"3\"\n\
             \"write.metadata.previous-versions-max\" = \"5\"\n"
        ),
        ..Settings::default()
    };
    let mut p = Pipeline::new(&env, &t, &[&t], &settings);
    let client = connect(&env.pg_url).await;
    // Copied empty: the changelog replays onto no rows (the copy's snapshot expires).
    exec(
        &client,
        &format!(
            "DROP TABLE IF EXISTS {t};
             CREATE TABLE {t} (id int PRIMARY KEY, v int, s text);"
        ),
    )
    .await;
    p.on_cleanup(format!("DROP TABLE IF EXISTS {t}"));
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    let changelog = p.table_dir(&format!("{t}_changelog"));
    let (mut warm, mut late) = (Files::default(), Files::default());
    for k in 1..=ROUNDS {
        exec(&client, &round(&t, k)).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = Files::of(&changelog);
        if k <= WARM_UP {
            warm = warm.max(now);
        } else if k > ROUNDS - WARM_UP {
            late = late.max(now);
        }
    }
    p.assert_equal(&t, 60).await;
    eprintln!("changelog files: warm-up {warm:?}, last rounds {late:?}");
    // Without maintenance each round adds a data file, a manifest, a manifest list and a
    // metadata file: four times the warm-up's by the end.
    assert!(
        late.live <= 2 * warm.live.max(3)
            && late.data <= 2 * warm.data.max(3)
            && late.metadata <= 2 * warm.metadata.max(10),
        "the changelog's files grow with its commits: warm-up {warm:?}, last rounds {late:?}"
    );
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    let out = replayed(
        &env.python,
        &env.pg_url,
        &format!("public.{t}"),
        &p.table_dir(&t),
        &changelog,
        "empty",
    );
    let mut lines = out.lines();
    let counts = lines.next().unwrap_or_default();
    let rows: Option<&str> = counts.split(' ').next();
    let seqs = counts.split(' ').nth(1).map(|s| s.replace("seqs", "rows"));
    assert!(
        rows.is_some() && rows == seqs.as_deref() && lines.next().is_none(),
        "the changelog replays to the source, each change once:\n{out}"
    );
}
