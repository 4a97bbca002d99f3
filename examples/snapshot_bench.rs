//! Initial-copy throughput: cdcd's Postgres copy (plan, parallel key-range chunks, binary COPY
//! decoded into Arrow batches, delivered on the pipeline's channel; no sink) beside a plain
//! `COPY (SELECT …) TO STDOUT (FORMAT binary)` drained into nothing on one connection, in the same
//! run against the same table.
//!
//! ```text
//! eval "$(scripts/testbed.sh env)"
//! cargo run --release --example snapshot_bench            # 5,000,000 rows
//! CDCD_BENCH_ROWS=1000000 CDCD_BENCH_PARALLELISM=2 cargo run --release --example snapshot_bench
//! ```
//!
//! The table `cdcd_bench_snapshot` is created once (kept for the next run; `CDCD_BENCH_DROP=1`
//! drops it at the end). The slot and publication are the bench's own and are dropped.
//!
//! This measures the source side alone; `bench/pg_snapshot.py` times the `cdcd` binary end to end
//! (copy, Parquet, commits, primary-key index) on the same table.

use std::time::Instant;

use futures::{pin_mut, TryStreamExt};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use cdcd::changelog::Op;
use cdcd::config::{Config, SourceConfig};
use cdcd::sources::postgres::PostgresSource;
use cdcd::sources::{Resume, Source, SourceEvent};

const TABLE: &str = "cdcd_bench_snapshot";
const COLUMNS: &str = "id, v, d, n, t, ts";

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let url =
        std::env::var("CDCD_TEST_PG").map_err(|_| "set CDCD_TEST_PG (scripts/testbed.sh env)")?;
    let rows: u64 = env_or("CDCD_BENCH_ROWS", 5_000_000);
    let parallelism: usize = env_or("CDCD_BENCH_PARALLELISM", 4);
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);

    let have: i64 = match client
        .query_one(&format!("SELECT count(*) FROM {TABLE}"), &[])
        .await
    {
        Ok(r) => r.get(0),
        Err(_) => -1,
    };
    if have != rows as i64 {
        eprintln!("creating {TABLE} with {rows} rows…");
        let t = Instant::now();
        client
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {TABLE};
                 CREATE TABLE {TABLE} (id int8 PRIMARY KEY, v int4, d date, n numeric(12,2), t text, ts timestamptz);
                 INSERT INTO {TABLE} SELECT g, g % 100000, DATE '2020-01-01' + (g % 2000)::int, (g % 1000000) / 100.0,
                     md5(g::text), TIMESTAMPTZ '2024-01-01' + g * INTERVAL '1 second'
                   FROM generate_series(1, {rows}) g;"
            ))
            .await?;
        // VACUUM cannot run inside the implicit transaction of a multi-statement batch.
        client
            .batch_execute(&format!("VACUUM ANALYZE {TABLE}"))
            .await?;
        eprintln!("created in {:.1} s", t.elapsed().as_secs_f64());
    }

    // Baseline: one binary COPY, bytes drained.
    let t = Instant::now();
    let stream = client
        .copy_out(
            &format!("COPY (SELECT {COLUMNS} FROM {TABLE}) TO STDOUT (FORMAT binary)") as &str,
        )
        .await?;
    pin_mut!(stream);
    let mut bytes = 0u64;
    while let Some(chunk) = stream.try_next().await? {
        bytes += chunk.len() as u64;
    }
    let base = t.elapsed().as_secs_f64();

    // cdcd: the source's initial copy with a fresh slot, events drained.
    let name = format!("bench_{}", std::process::id());
    let toml = format!(
        "[pipeline]\nname = {name:?}\n[source]\nkind = \"postgres\"\nurl = {url:?}\n\
         tables = [\"public.{TABLE}\"]\nsnapshot_parallelism = {parallelism}\n\
         [sink]\nkind = \"iceberg\"\nwarehouse = \"/tmp/cdcd-bench-unused\"\n"
    );
    let config = Config::from_toml(&toml, "bench.toml")?;
    let SourceConfig::Postgres(pg) = config.source else {
        return Err("the bench config is a Postgres one".into());
    };
    let slot = pg.slot.clone();
    let publication = pg.publication.clone();
    let mut source = PostgresSource::new(pg);
    source.prepare().await?;
    let (tx, mut rx) = mpsc::channel(16);
    let (_ack_tx, ack_rx) = watch::channel(None);
    let shutdown = CancellationToken::new();
    let t = Instant::now();
    let resume = Resume {
        start: None,
        snapshot: true,
        copy: Vec::new(),
        copy_only: false,
    };
    let run = tokio::spawn(Box::new(source).run(resume, tx, ack_rx, shutdown.clone()));
    let (mut copied, mut arrow_bytes) = (0u64, 0u64);
    while let Some(event) = rx.recv().await {
        match event {
            SourceEvent::SnapshotRows(c) => {
                copied += c.ops.iter().filter(|o| **o != Op::Truncate).count() as u64;
                arrow_bytes += c.rows.get_array_memory_size() as u64;
            }
            SourceEvent::SnapshotDone { .. } => break,
            _ => {}
        }
    }
    let ours = t.elapsed().as_secs_f64();
    shutdown.cancel();
    drop(rx);
    let _ = run.await;
    client
        .batch_execute(&format!(
            "SELECT pg_drop_replication_slot('{slot}') FROM pg_replication_slots WHERE slot_name = '{slot}';
             DROP PUBLICATION IF EXISTS {publication};"
        ))
        .await?;
    if std::env::var("CDCD_BENCH_DROP").is_ok() {
        client.batch_execute(&format!("DROP TABLE {TABLE}")).await?;
    }

    let mb = bytes as f64 / 1e6;
    println!("table: {rows} rows, {mb:.0} MB of binary COPY data");
    println!(
        "COPY (FORMAT binary) → /dev/null, 1 connection: {base:>6.2} s  {:>10.0} rows/s  {:>7.1} MB/s",
        rows as f64 / base,
        mb / base
    );
    println!(
        "cdcd initial copy, {parallelism} connections:      {ours:>6.2} s  {:>10.0} rows/s  {:>7.1} MB/s  ({copied} rows, {:.0} MB Arrow)",
        copied as f64 / ours,
        mb / ours,
        arrow_bytes as f64 / 1e6
    );
    println!("ratio (cdcd / COPY): {:.2}", base / ours);
    Ok(())
}

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
