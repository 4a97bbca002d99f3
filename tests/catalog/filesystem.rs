//! The filesystem catalog (the default) shared with another engine that commits to the same
//! table directory the way Iceberg-Java's `HadoopTableOperations` does, and deletes the metadata
//! files that leave its metadata log (`tests/support/hadoop_table.rs`). Needs the test bed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cdcd::storage::Warehouse;

use super::create_table;
use crate::support::hadoop_table::HadoopTable;
use crate::support::s3::{moto_test_env, s3_config, S3Pipeline};
use crate::support::{connect, exec, parse_lsn, test_env_and_name, Pipeline, Settings, LAKECHECK};

/// Rounds of (a source transaction, cdcd's commit of it, three commits by the other writer).
const ROUNDS: u64 = 8;

/// Issue 34 part 3. With `write.metadata.previous-versions-max = 1` and delete-after-commit on,
/// the other writer's three commits on top of cdcd's version N delete N+1, so cdcd's next
/// commit, built on its cached N, finds `v<N+1>` free. Before the fix it created it in the gap,
/// moved the hint back below the other writer's newest version and acknowledged the source:
/// then either the next commit found the other writer's next version, conflicted and stopped,
/// and the restart resumed past the acknowledged rows (lost), or, as here once the other
/// writer ran ahead, the two went on as two histories, cdcd's in the gaps (where the hint
/// pointed) and the other writer's above it (what a reader that lists, and the other engine,
/// saw: without cdcd's rows). Now every such commit is a conflict and is planned again on the
/// newest version: the newest version holds every row, the versions left form one chain, the
/// hint names the newest, and no hint is ever left below an existing version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_writers_deleted_versions_never_fork_the_table() {
    let (env, name) = ground_or_skip!(test_env_and_name("catfs"));
    let t = format!("{name}_orders");
    let mut p = Pipeline::new(&env, &name, &[&t], &settings());
    let lake = Lake {
        endpoint: None,
        table: format!("file://{}", p.table_dir(&t).display()),
        warehouse: Warehouse::from_url(&format!("file://{}", p.warehouse.display())).unwrap(),
    };
    shared_with_another_writer(&mut p, &t, lake).await;
}

/// The same on S3 (the serial moto, whose create-if-absent is atomic): the listings go through
/// S3's `ListObjectsV2` with `start-after`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_writers_deleted_versions_never_fork_the_table_on_s3() {
    let (env, endpoint, name) = ground_or_skip!(moto_test_env(true, "catfs3"));
    let t = format!("{name}_orders");
    let mut s = S3Pipeline::new(&env, &name, &[&t], &endpoint);
    s.write_config(&settings(), &endpoint);
    let lake = Lake {
        endpoint: Some(endpoint.clone()),
        table: s.table_url(&t),
        warehouse: Warehouse::open(&s.warehouse_url, &s3_config(&endpoint)).unwrap(),
    };
    shared_with_another_writer(&mut s.p, &t, lake).await;
}

/// `write.metadata.previous-versions-max = 1`; no maintenance cycle: its load would refresh
/// cdcd's cached base before the next commit.
fn settings() -> Settings {
    Settings {
        sink_extra: "maintenance_interval_ms = 0\n\n[sink.table_properties]\n\
                     \"write.metadata.previous-versions-max\" = \"1\"\n"
            .into(),
        ..Settings::default()
    }
}

/// Where the test's table is, for the other writer and the oracle.
struct Lake {
    /// moto's endpoint; `None`: local disk.
    endpoint: Option<String>,
    /// The table's location (`file:///…/shop/<t>` or `s3://…/shop/<t>`).
    table: String,
    warehouse: Warehouse,
}

impl Lake {
    /// lakecheck of `public.<table>` against `iceberg` (the table, or one metadata file),
    /// polling up to `wait_secs`; panics with its output unless equal.
    async fn assert_equal(&self, p: &Pipeline, table: &str, iceberg: &str, wait_secs: u32) {
        let mut cmd = tokio::process::Command::new(&p.env.python);
        cmd.arg(LAKECHECK)
            .args(["--source", &p.env.pg_url])
            .args(["--source-table", &format!("public.{table}")])
            .args(["--iceberg", iceberg])
            .args(["--wait", &wait_secs.to_string()]);
        if let Some(endpoint) = &self.endpoint {
            cmd.env("AWS_ENDPOINT_URL", endpoint)
                .env("AWS_ACCESS_KEY_ID", "test")
                .env("AWS_SECRET_ACCESS_KEY", "test")
                .env("AWS_REGION", "us-east-1");
        }
        let out = cmd.kill_on_drop(true).output().await.unwrap();
        let text = crate::support::stderr_then_stdout(&out);
        assert_eq!(
            out.status.code(),
            Some(0),
            "lakecheck {iceberg}: differs from the source:\n{text}"
        );
        eprintln!("lakecheck {iceberg}: {}", text.lines().last().unwrap_or(""));
    }
}

/// The test of both: cdcd streams `public.<t>` while the other writer commits on top of it
/// after each of cdcd's commits.
async fn shared_with_another_writer(p: &mut Pipeline, t: &str, lake: Lake) {
    let client = connect(&p.env.pg_url).await;
    exec(&client, &create_table(t)).await;
    p.on_cleanup(format!("DROP TABLE IF EXISTS {t}"));
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    lake.assert_equal(p, t, &lake.table, 60).await;

    let other = HadoopTable::new(lake.warehouse.clone(), &lake.table);
    let stop = Arc::new(AtomicBool::new(false));
    // moto serves one request at a time: sampled less often there, and its slower commits
    // leave a hint behind its create for longer.
    let (every, persisting) = match lake.endpoint {
        None => (Duration::from_millis(25), Duration::from_millis(300)),
        Some(_) => (Duration::from_millis(200), Duration::from_secs(2)),
    };
    let watcher = tokio::spawn(watch_hint(
        other.clone(),
        Arc::clone(&stop),
        every,
        persisting,
    ));
    let mut restarts = 0;
    for round in 1..=ROUNDS {
        let before = current_lsn(&client).await;
        exec(
            &client,
            &format!(
                "INSERT INTO {t} SELECT {base} + g, 'round {round}', g FROM generate_series(1, 20) g",
                base = 10_000 * round
            ),
        )
        .await;
        restarts += wait_acked(p, &client, before).await;
        // Readers (and the watcher) see the state cdcd's commit left.
        tokio::time::sleep(Duration::from_millis(500)).await;
        for i in 1..=3 {
            other
                .set_property("other.engine", &format!("round {round} commit {i}"))
                .await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let low_hints = watcher.await.unwrap();

    if p.try_exit().is_some() {
        restarts += 1;
        p.start();
    }
    exec(
        &client,
        &format!("UPDATE {t} SET v = 'last' WHERE id % 5 = 0"),
    )
    .await;
    lake.assert_equal(p, t, &lake.table, 60).await;
    p.sigterm_and_wait(Duration::from_secs(60)).await;
    eprintln!("cdcd restarts: {restarts}");

    // The table as every reader finds it: the newest listed version is the hinted one, the
    // versions left are one history, and that newest version holds every row.
    let versions = other.versions().await;
    let newest = *versions.last().unwrap();
    assert_eq!(
        other.hint().await,
        Some(newest),
        "the hint does not name the newest version (versions {versions:?})"
    );
    assert_one_chain(&other, &versions).await;
    let newest_file = format!("{}/metadata/v{newest}.metadata.json", lake.table);
    lake.assert_equal(p, t, &newest_file, 0).await;
    assert!(
        low_hints.is_empty(),
        "version-hint.text was left below an existing version: {low_hints:?}"
    );
    let out = p.output();
    assert!(
        out.contains("a newer metadata version exists than the commit's base"),
        "no commit met the other writer's versions: the test did not exercise the gap\n{out}"
    );
    assert!(
        out.contains("planning the commit again on top of it"),
        "{out}"
    );
}

async fn current_lsn(client: &tokio_postgres::Client) -> u64 {
    let row = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap();
    parse_lsn(row.get(0))
}

/// Waits until cdcd acknowledged a position past `before` (its commit of the transaction that
/// followed), restarting it when it stopped; returns the number of restarts.
async fn wait_acked(p: &mut Pipeline, client: &tokio_postgres::Client, before: u64) -> u32 {
    let mut restarts = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if p.confirmed_flush_lsn(client)
            .await
            .is_some_and(|a| a > before)
        {
            return restarts;
        }
        if p.try_exit().is_some() {
            restarts += 1;
            p.start();
            p.wait_slot_active(client, Duration::from_secs(60)).await;
        }
        assert!(
            Instant::now() < deadline,
            "cdcd acknowledged nothing past {before:X} in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Samples the hint and the newest listed version every `every` until `stop`: a hint two or
/// more versions below the newest, unchanged for `persisting`, was written below an existing
/// version (a writer's own hint lags its create by a version for a moment only). Returns what
/// it saw.
async fn watch_hint(
    table: HadoopTable,
    stop: Arc<AtomicBool>,
    every: Duration,
    persisting: Duration,
) -> Vec<String> {
    let mut low = Vec::new();
    let mut since: Option<(u64, u64, Instant)> = None;
    while !stop.load(Ordering::Relaxed) {
        let hint = table.hint().await;
        let newest = table.versions().await.last().copied();
        since = match (hint, newest, since) {
            (Some(h), Some(n), Some((sh, sn, at))) if h + 1 < n && (sh, sn) == (h, n) => {
                if at.elapsed() >= persisting {
                    low.push(format!("hint {h} with v{n} listed"));
                    None
                } else {
                    Some((sh, sn, at))
                }
            }
            (Some(h), Some(n), _) if h + 1 < n => Some((h, n, Instant::now())),
            _ => None,
        };
        tokio::time::sleep(every).await;
    }
    low
}

/// The versions left (`versions`, ascending) are one history: no gap among them, and each
/// names the one before it in its metadata log with that file's own timestamp. A version
/// created beside another writer's history breaks either.
async fn assert_one_chain(table: &HadoopTable, versions: &[u64]) {
    assert!(!versions.is_empty());
    for pair in versions.windows(2) {
        let (older, newer) = (pair[0], pair[1]);
        assert_eq!(
            newer,
            older + 1,
            "a gap among the versions left: {versions:?}"
        );
        let (o, n) = (
            table.read(older).await.unwrap(),
            table.read(newer).await.unwrap(),
        );
        let file = format!("{}/metadata/v{older}.metadata.json", table.location);
        let logged = n["metadata-log"].as_array().unwrap().iter().any(|e| {
            e["metadata-file"].as_str() == Some(file.as_str())
                && e["timestamp-ms"] == o["last-updated-ms"]
        });
        assert!(
            logged,
            "v{newer} does not descend from v{older} (versions {versions:?})"
        );
    }
}
