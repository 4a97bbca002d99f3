//! The Postgres source against a real server: set `CDCD_TEST_PG` (e.g.
//! `postgres://postgres@127.0.0.1:55432/cdc`, a superuser on a `wal_level = logical` server);
//! without it the test prints a note and passes. Everything it creates is named `tr_<m|s>_<pid>…` and
//! dropped at the end, also when the test fails (slot and publication names end in the pid, as
//! `scripts/test.sh` expects of leftovers).

use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::changelog::{Op, TableChanges, Transaction};
use crate::config::{Config, SourceConfig};

/// Drops the test's slot, publication and tables with psql, however the test ends.
struct Cleanup {
    url: String,
    /// Run one by one (`-c` each), so one failing statement does not undo the others.
    sql: Vec<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let mut cmd = std::process::Command::new("psql");
        cmd.args(["-X", "-q", &self.url]);
        for sql in &self.sql {
            cmd.args(["-c", sql]);
        }
        let _ = cmd.output();
    }
}

fn pg_url(test: &str) -> Option<String> {
    crate::test_ground::var(test, "CDCD_TEST_PG")
}

async fn client(url: &str) -> Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
}

/// Receives events until `done` says so, skipping heartbeats; panics after 60 s.
async fn collect(
    rx: &mut mpsc::Receiver<SourceEvent>,
    mut done: impl FnMut(&[SourceEvent]) -> bool,
) -> Vec<SourceEvent> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !done(&got) {
        let ev = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("timed out; so far: {:?}", summary(&got)))
            .expect("source ended");
        if !matches!(ev, SourceEvent::Heartbeat(_)) {
            got.push(ev);
        }
    }
    got
}

/// Position and per-run (table, ops) of each transaction, for failure messages.
fn summary(events: &[SourceEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| match e {
            SourceEvent::Transaction(t) => format!(
                "tx {} {:?}",
                t.position,
                t.changes
                    .iter()
                    .map(|c| (c.schema.id.name.clone(), c.len()))
                    .collect::<Vec<_>>()
            ),
            other => format!("{other:?}").chars().take(80).collect(),
        })
        .collect()
}

fn txs(events: &[SourceEvent]) -> Vec<&Transaction> {
    events
        .iter()
        .filter_map(|e| match e {
            SourceEvent::Transaction(t) => Some(t),
            _ => None,
        })
        .collect()
}

fn ids32(c: &TableChanges) -> Vec<i32> {
    c.rows
        .column(0)
        .as_primitive::<Int32Type>()
        .values()
        .to_vec()
}

/// The source config of a pipeline `tag` (its slot and publication too) capturing `tables` (a
/// name or glob) from the server at `url`.
fn source_config(url: &str, tag: &str, tables: &str) -> PostgresConfig {
    let toml = format!(
        "[pipeline]\nname = \"{tag}\"\n[source]\nkind = \"postgres\"\nurl = \"{url}\"\n\
         tables = [\"{tables}\"]\nslot = \"{tag}\"\npublication = \"{tag}\"\n\
         [sink]\nwarehouse = \"/tmp/{tag}\"\n"
    );
    let config = Config::from_toml(&toml, "test.toml").unwrap();
    let SourceConfig::Postgres(cfg) = config.source else {
        panic!("postgres source expected")
    };
    cfg
}

/// Cancels a source's `run` and waits (at most 20 s) for it to end without an error.
async fn stop<T, E: std::fmt::Debug>(
    shutdown: &CancellationToken,
    run: tokio::task::JoinHandle<Result<T, E>>,
) {
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn source_against_postgres() {
    let Some(url) = pg_url("source_against_postgres") else {
        return;
    };
    let tag = format!("tr_m_{}", std::process::id());
    let (a, b) = (format!("{tag}_a"), format!("{tag}_b"));
    let _cleanup = Cleanup {
        url: url.clone(),
        sql: vec![
            format!("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = '{tag}' AND active"),
            "SELECT pg_sleep(0.5)".to_owned(),
            format!("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '{tag}'"),
            format!("DROP PUBLICATION IF EXISTS {tag}"),
            format!("DROP TABLE IF EXISTS {a}, {b}"),
        ],
    };
    let pg = client(&url).await;
    pg.batch_execute(&format!(
        "CREATE TABLE {a} (id int4 PRIMARY KEY, body text, n int4);
         CREATE TABLE {b} (id int8 PRIMARY KEY, v text);
         INSERT INTO {a} VALUES (1, 'one', 1), (2, 'two', NULL), (3, 'three', 3);"
    ))
    .await
    .unwrap();

    let cfg = source_config(&url, &tag, &format!("public.{tag}_*"));

    let problems = PostgresSource::new(cfg.clone()).check().await;
    assert!(problems.is_empty(), "{problems:?}");

    let mut source = PostgresSource::new(cfg.clone())
        .with_replication_options("-c logical_decoding_work_mem=64kB");
    let prepared = source.prepare().await.unwrap();
    assert_eq!(
        prepared.tables,
        vec![TableId::new("public", &a), TableId::new("public", &b)]
    );
    assert!(!prepared.slot_exists);

    let (tx, mut rx) = mpsc::channel(16);
    let (ack_tx, ack_rx) = watch::channel(None);
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(Box::new(source).run(
        Resume {
            start: None,
            snapshot: true,
            copy: Vec::new(),
            copy_only: false,
        },
        tx,
        ack_rx,
        shutdown.clone(),
    ));

    // The initial copy: a truncate marker then the rows for `a`, only the marker for `b`.
    let copy = collect(&mut rx, |g| {
        g.iter()
            .filter(|e| matches!(e, SourceEvent::SnapshotDone { .. }))
            .count()
            == 2
    })
    .await;
    let mut copied_a = Vec::new();
    let mut consistent = None;
    for e in &copy {
        match e {
            SourceEvent::SnapshotRows(c) if c.schema.id.name == a => {
                for (i, op) in c.ops.iter().enumerate() {
                    if *op == Op::Insert {
                        copied_a.push(c.rows.column(0).as_primitive::<Int32Type>().value(i));
                    }
                }
            }
            SourceEvent::SnapshotDone { position, .. } => consistent = Some(position.clone()),
            _ => {}
        }
    }
    assert_eq!(copied_a, vec![1, 2, 3]);
    let consistent = consistent.unwrap();

    // Streaming: plain DML, a TOASTed value left unchanged, a key change, a truncate, and one
    // transaction big enough to be streamed, with a rolled-back savepoint inside.
    // One statement per call: a multi-statement simple query is one implicit transaction.
    for sql in [
        format!("INSERT INTO {a} VALUES (4, (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 3000) i), 4)"),
        format!("UPDATE {a} SET n = 40 WHERE id = 4"),
        format!("UPDATE {a} SET id = 5 WHERE id = 1"),
        format!("DELETE FROM {a} WHERE id = 2"),
        format!("TRUNCATE {b}"),
        format!(
            "BEGIN;
             INSERT INTO {b} SELECT i, repeat('v', 200) FROM generate_series(1, 3000) i;
             SAVEPOINT s;
             INSERT INTO {b} SELECT i, repeat('w', 200) FROM generate_series(100001, 103000) i;
             ROLLBACK TO SAVEPOINT s;
             UPDATE {b} SET v = 'last' WHERE id = 3000;
             COMMIT;"
        ),
    ] {
        pg.batch_execute(&sql).await.unwrap();
    }
    let streamed = collect(&mut rx, |g| txs(g).len() == 6).await;
    let t = txs(&streamed);
    for w in t.windows(2) {
        assert!(w[1].position > w[0].position, "commit order");
    }
    assert!(t[0].position > consistent);
    // Insert of a TOASTed body.
    assert_eq!(t[0].changes[0].ops, vec![Op::Insert]);
    // Update leaving the TOASTed body unchanged: absent, not NULL.
    let c = &t[1].changes[0];
    assert_eq!(c.ops, vec![Op::Update]);
    assert!(!c.is_present(1, 0) && c.is_present(2, 0));
    // Key change 1 → 5 carries the old key.
    let c = &t[2].changes[0];
    assert_eq!((ids32(c), c.key_changed.clone()), (vec![5], vec![true]));
    assert_eq!(c.old_keys.column(0).as_primitive::<Int32Type>().value(0), 1);
    // Delete: key present, the rest absent.
    let c = &t[3].changes[0];
    assert_eq!(c.ops, vec![Op::Delete]);
    assert!(c.is_present(0, 0) && !c.is_present(1, 0));
    // Truncate of b.
    assert_eq!(t[4].changes[0].ops, vec![Op::Truncate]);
    assert_eq!(t[4].changes[0].schema.id.name, b);
    // The big transaction: 3000 inserts (the rolled-back savepoint's rows gone) and one update.
    let big = t[5];
    assert_eq!(big.change_count(), 3001);
    let mut max_id = 0;
    for c in &big.changes {
        let ids = c.rows.column(0).as_primitive::<Int64Type>();
        max_id = max_id.max(ids.values().iter().copied().max().unwrap_or(0));
    }
    assert_eq!(
        max_id, 3000,
        "rolled-back subtransaction rows must not appear"
    );

    let row = pg
        .query_one(
            "SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = $1",
            &[&tag],
        )
        .await
        .unwrap();
    let stream_txns: i64 = row.get(0);
    assert!(stream_txns > 0, "the big transaction was streamed");

    // Acknowledge the last transaction: the slot's confirmed position follows.
    ack_tx.send(Some(big.position.clone())).unwrap();
    let Position::Postgres(acked) = big.position else {
        panic!("postgres position expected")
    };
    let mut confirmed = Lsn::ZERO;
    for _ in 0..50 {
        let row = pg
            .query_one(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&tag],
            )
            .await
            .unwrap();
        confirmed = row.get::<_, String>(0).parse().unwrap();
        if confirmed >= acked {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(confirmed, acked);

    stop(&shutdown, run).await;

    // A restart without snapshot resumes after the acknowledged position: only what came since.
    pg.batch_execute(&format!("INSERT INTO {a} VALUES (6, 'six', 6)"))
        .await
        .unwrap();
    let mut source = PostgresSource::new(cfg);
    assert!(source.prepare().await.unwrap().slot_exists);
    let (tx, mut rx) = mpsc::channel(16);
    let (_ack_tx, ack_rx) = watch::channel(None);
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(Box::new(source).run(
        Resume {
            start: Some(Position::Postgres(acked)),
            snapshot: false,
            copy: Vec::new(),
            copy_only: false,
        },
        tx,
        ack_rx,
        shutdown.clone(),
    ));
    let resumed = collect(&mut rx, |g| !g.is_empty()).await;
    let t = txs(&resumed);
    assert_eq!(t.len(), 1, "{:?}", summary(&resumed));
    assert!(t[0].position > Position::Postgres(acked));
    assert_eq!(ids32(&t[0].changes[0]), vec![6]);
    stop(&shutdown, run).await;
}

#[tokio::test]
async fn setup_checks_against_postgres() {
    let Some(url) = pg_url("setup_checks_against_postgres") else {
        return;
    };
    let tag = format!("tr_s_{}", std::process::id());
    let (k, nk, p) = (format!("{tag}_keyed"), format!("{tag}_nokey"), tag.clone());
    let (ix, ov, bad) = (
        format!("{tag}_ix"),
        format!("{tag}_ov"),
        format!("{tag}_ovbad"),
    );
    let _cleanup = Cleanup {
        url: url.clone(),
        sql: vec![
            format!("DROP PUBLICATION IF EXISTS {p}"),
            format!("DROP PUBLICATION IF EXISTS {p}_inserts"),
            format!("DROP TABLE IF EXISTS {k}, {nk}, {ix}, {ov}, {bad}"),
        ],
    };
    let pg = client(&url).await;
    pg.batch_execute(&format!(
        "CREATE TABLE {k} (b text, a int4, PRIMARY KEY (a, b));
         CREATE TABLE {nk} (x int4);
         CREATE TABLE {ix} (v text, u int4 NOT NULL, w int4 NOT NULL);
         CREATE UNIQUE INDEX {ix}_uq ON {ix} (w, u);
         ALTER TABLE {ix} REPLICA IDENTITY USING INDEX {ix}_uq;
         CREATE TABLE {ov} (t int4 NOT NULL, e int4 NOT NULL, note text);
         ALTER TABLE {ov} REPLICA IDENTITY FULL;
         CREATE TABLE {bad} (t int4 NOT NULL, note text);
         CREATE PUBLICATION {p} FOR TABLE {nk} WITH (publish = 'insert, update, delete, truncate');"
    ))
    .await
    .unwrap();

    // Issue 23: keys from the primary key, a replica identity index, and source.key_columns;
    // an override needs REPLICA IDENTITY FULL and NOT NULL columns.
    let toml = format!(
        "[pipeline]\nname = \"{tag}\"\n[source]\nkind = \"postgres\"\nurl = \"{url}\"\n\
         tables = [\"public.{tag}_*\", \"public.{tag}_none\"]\npublication = \"{p}\"\n\
         key_columns = {{ \"public.{ov}\" = [\"t\", \"e\"], \"public.{bad}\" = [\"note\"] }}\n\
         [sink]\nwarehouse = \"/tmp/{tag}\"\n"
    );
    let config = Config::from_toml(&toml, "test.toml").unwrap();
    let SourceConfig::Postgres(cfg) = config.source else {
        panic!("postgres source expected")
    };
    let (keys, problems) = setup::check(&pg, &cfg).await.unwrap();
    let lines: Vec<String> = keys.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        vec![
            format!("table public.{ix}: key (w, u) from replica identity index {ix}_uq"),
            format!("table public.{k}: key (a, b) from primary key"),
            format!(
                "table public.{nk}: no key: replicated insert-only (on Postgres its UPDATE and DELETE \
                 are not published, on MySQL they stop cdcd); if they matter, give it a primary key \
                 or source.key_columns"
            ),
            format!("table public.{ov}: key (t, e) from source.key_columns"),
        ]
    );
    let all_keys = keys.clone();
    let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].contains(&format!("{tag}_none")) && lines[0].contains("matches no table"));
    assert!(
        lines[1].contains(&bad) && lines[1].contains("nullable"),
        "{lines:?}"
    );
    // Issue 23 stage 2: a keyless table in the publication of every operation would make
    // Postgres refuse the application's UPDATE and DELETE on it; cdcd says how to move it out.
    let problems = publication::check_publications(&pg, &p, &all_keys)
        .await
        .unwrap();
    assert!(
        problems.iter().any(|q| q.problem.contains(&nk)
            && q.fix == format!("run ALTER PUBLICATION \"{p}\" DROP TABLE \"public\".\"{nk}\" (cdcd publishes it through {p}_inserts)")),
        "{problems:?}"
    );
    pg.batch_execute(&format!("ALTER PUBLICATION {p} DROP TABLE {nk}"))
        .await
        .unwrap();

    // The override on a table without FULL is refused with the statement to run.
    pg.batch_execute(&format!("ALTER TABLE {ov} REPLICA IDENTITY DEFAULT"))
        .await
        .unwrap();
    let (keys, problems) = setup::check(&pg, &cfg).await.unwrap();
    assert_eq!(keys.len(), 3, "{keys:?}");
    assert!(
        problems.iter().any(|p| p.problem.contains(&ov)
            && p.fix.starts_with(&format!(
                "run ALTER TABLE \"public\".\"{ov}\" REPLICA IDENTITY FULL"
            ))),
        "{problems:?}"
    );
    let keys: Vec<_> = all_keys
        .into_iter()
        .filter(|t| t.table.name == k || t.table.name == nk)
        .collect();
    let problems = publication::check_publications(&pg, &p, &keys)
        .await
        .unwrap();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(
        problems[0].fix,
        format!("run ALTER PUBLICATION \"{p}\" ADD TABLE \"public\".\"{k}\"")
    );
    // A table added to `source.tables` joins the publication (issue 7: it is copied alone); the
    // keyless one gets the inserts-only publication.
    let names = publication::ensure_publications(&pg, &p, &keys)
        .await
        .unwrap();
    assert_eq!(names, vec![p.clone(), format!("{p}_inserts")]);
    assert!(publication::check_publications(&pg, &p, &keys)
        .await
        .unwrap()
        .is_empty());
    // The application's UPDATE and DELETE on the keyless table still work.
    pg.batch_execute(&format!(
        "INSERT INTO {nk} VALUES (1), (1); UPDATE {nk} SET x = 2; DELETE FROM {nk}"
    ))
    .await
    .unwrap();

    let version = setup::server_version(&pg).await.unwrap();
    assert!(setup::proto_version(version) >= 1);
    assert!(setup::slot_exists(&pg, &format!("{tag}_noslot"))
        .await
        .unwrap()
        .is_none());
}

/// A pipeline that stops reading (a commit held by a large compaction's index move for 70 s, in
/// `bench/large_table.py`) does not lose the replication connection: the source keeps sending
/// status updates while its events wait, and the walsender, here told to end a connection that
/// sent none for 12 s, keeps it. Before, the source sent none while a delivery waited, and
/// cdcd stopped with "connection reset by peer".
#[tokio::test]
async fn a_full_pipeline_keeps_the_replication_connection_alive() {
    let test = "a_full_pipeline_keeps_the_replication_connection_alive";
    let Some(url) = pg_url(test) else {
        return;
    };
    let tag = format!("tr_k_{}", std::process::id());
    let _cleanup = Cleanup {
        url: url.clone(),
        sql: vec![
            format!("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = '{tag}' AND active"),
            "SELECT pg_sleep(0.5)".to_owned(),
            format!("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '{tag}'"),
            format!("DROP PUBLICATION IF EXISTS {tag}"),
            format!("DROP TABLE IF EXISTS {tag}_t"),
        ],
    };
    let pg = client(&url).await;
    pg.batch_execute(&format!("CREATE TABLE {tag}_t (id int4 PRIMARY KEY)"))
        .await
        .unwrap();
    let cfg = source_config(&url, &tag, &format!("public.{tag}_t"));
    // Above the source's status interval (10 s), well under the 30 s the pipeline stalls.
    let mut source = PostgresSource::new(cfg).with_replication_options("-c wal_sender_timeout=12s");
    source.prepare().await.unwrap();
    let (tx, mut rx) = mpsc::channel(1);
    let (_ack_tx, ack_rx) = watch::channel(None);
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(Box::new(source).run(
        Resume {
            start: None,
            snapshot: true,
            copy: Vec::new(),
            copy_only: false,
        },
        tx,
        ack_rx,
        shutdown.clone(),
    ));
    collect(&mut rx, |g| {
        g.iter()
            .any(|e| matches!(e, SourceEvent::SnapshotDone { .. }))
    })
    .await;
    for id in 0..20 {
        pg.execute(&format!("INSERT INTO {tag}_t VALUES ({id})"), &[])
            .await
            .unwrap();
    }
    // The pipeline reads nothing for 30 s.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(!run.is_finished(), "the source stopped: {:?}", run.await);
    let streamed = collect(&mut rx, |g| txs(g).len() == 20).await;
    let ids: Vec<i32> = txs(&streamed)
        .iter()
        .flat_map(|t| t.changes.iter().flat_map(ids32))
        .collect();
    assert_eq!(ids, (0..20).collect::<Vec<_>>());
    stop(&shutdown, run).await;
}
