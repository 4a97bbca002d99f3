//! Benchmark of the Iceberg sink's two delete modes on one workload (issue 3). Not a test: it
//! prints a table and asserts only that the three tables read back equal.
//!
//! Workload: a table `(id bigint primary key, a text, b bigint, c double)` loaded with ROWS
//! inserts (commits of 100,000 rows), then COMMITS commits that each update 10 % of the rows
//! (random keys, whole rows). Each mode gets its own warehouse, driven through `IcebergSink`
//! directly (the same code the daemon runs after decoding; Postgres is left out so that the
//! figures are the sink's). Printed per mode: load and update rows/s, files written; then DuckDB
//! `iceberg_scan` full-scan time (`count(*)`, sums over every column; best of 3, or one scan
//! when it takes over 10 s) for the
//! deletion-vector table, the equality-delete table, and the same final rows written once
//! without deletes. Last, the restart cost in deletion-vector mode: a fresh sink's first commit
//! (metadata, manifests, deletion vectors, primary-key index open) and the process RSS.
//!
//! `cargo run --release --example delete_mode_bench [-- ROWS [COMMITS]]` (default 200000 100),
//! with the test bed's venv (`scripts/testbed.sh up`; `CDCD_TB`, default /tmp/cdcd-tb) for DuckDB.
//! `-- restart ROWS` instead builds a ROWS-row deletion-vector table (commits of 1M rows) and
//! measures only the restart: the README's 10M-row figures.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::builder::{Float64Builder, Int64Builder, StringBuilder};
use arrow_schema::DataType;
use cdcd::changelog::TableSchema;
use cdcd::changelog::{Column, Lsn, Op, Position, TableChanges, TableChangesBuilder, TableId};
use cdcd::checkpoint::Checkpoint;
use cdcd::config::{DeleteMode, IcebergConfig};
use cdcd::sinks::iceberg::IcebergSink;
use cdcd::sinks::Sink;

const LOAD_COMMIT: u64 = 100_000;

fn schema() -> Arc<TableSchema> {
    let col = |name: &str, data_type| Column {
        name: name.into(),
        data_type,
        nullable: true,
        source_type: String::new(),
        initial_default: None,
        former_names: Vec::new(),
    };
    Arc::new(TableSchema {
        id: TableId::new("bench", "t"),
        columns: vec![
            col("id", DataType::Int64),
            col("a", DataType::Utf8),
            col("b", DataType::Int64),
            col("c", DataType::Float64),
        ],
        primary_key: vec![0],
    })
}

/// Rows `(id, version)` as whole-row changes of `op`; `a` and `c` derive from both.
fn batch(op: Op, rows: &[(u64, u64)]) -> anyhow::Result<TableChanges> {
    let mut b = TableChangesBuilder::new(schema(), rows.len());
    let mut text = String::new();
    for &(id, version) in rows {
        b.begin(op);
        downcast::<Int64Builder>(&mut b, 0)?.append_value(id as i64);
        text.clear();
        use std::fmt::Write;
        write!(text, "customer-{id:08}-version-{version:04}")?;
        downcast::<StringBuilder>(&mut b, 1)?.append_value(&text);
        downcast::<Int64Builder>(&mut b, 2)?.append_value(version as i64);
        downcast::<Float64Builder>(&mut b, 3)?.append_value(id as f64 * 0.5 + version as f64);
        b.no_old_key()?;
    }
    Ok(b.finish()?)
}

fn downcast<T: 'static>(b: &mut TableChangesBuilder, col: usize) -> anyhow::Result<&mut T> {
    b.value(col)
        .and_then(|v| v.as_any_mut().downcast_mut::<T>())
        .ok_or_else(|| anyhow::anyhow!("column {col} has another builder"))
}

fn sink(warehouse: &Path, mode: DeleteMode) -> anyhow::Result<IcebergSink> {
    let config = IcebergConfig {
        warehouse: format!("file://{}", warehouse.display()),
        namespace: None,
        delete_mode: mode,
        table_properties: Default::default(),
        maintenance_interval_ms: 0,
        catalog: Default::default(),
        tables: Default::default(),
    };
    Ok(IcebergSink::new(&config, "bench")?)
}

fn checkpoint(n: u64) -> Checkpoint {
    Checkpoint::new("bench", Position::Postgres(Lsn(n)))
}

/// xorshift64: the same "random" keys for both modes.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

struct Run {
    load: Duration,
    updates: Duration,
    update_rows: u64,
    files: usize,
    deleted: u64,
}

/// Loads `rows` rows in commits of `per_commit`, all inserts of version 0; returns the time.
async fn load(
    s: &IcebergSink,
    rows: u64,
    per_commit: u64,
    lsn: &mut u64,
) -> anyhow::Result<(Duration, usize)> {
    let t = schema();
    let mut files = 0;
    let mut spent = Duration::ZERO;
    let mut start = 0;
    while start < rows {
        let end = (start + per_commit).min(rows);
        let ids: Vec<(u64, u64)> = (start..end).map(|i| (i, 0)).collect();
        let changes = batch(Op::Insert, &ids)?;
        *lsn += 1;
        let began = Instant::now();
        files += s
            .commit(&t, &[changes], &checkpoint(*lsn))
            .await?
            .files_written;
        spent += began.elapsed();
        start = end;
    }
    Ok((spent, files))
}

async fn run_mode(
    dir: &Path,
    mode: DeleteMode,
    rows: u64,
    commits: u64,
    versions: &mut [u64],
) -> anyhow::Result<Run> {
    let s = sink(dir, mode)?;
    let t = schema();
    let mut lsn = 0;
    let (load_time, mut files) = load(&s, rows, LOAD_COMMIT, &mut lsn).await?;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let per_commit = (rows / 10).max(1);
    let mut updates = Duration::ZERO;
    let mut deleted = 0;
    for c in 1..=commits {
        let mut ids = Vec::with_capacity(per_commit as usize);
        for _ in 0..per_commit {
            let id = rng.next() % rows;
            if let Some(v) = versions.get_mut(id as usize) {
                *v = c;
            }
            ids.push((id, c));
        }
        let changes = batch(Op::Update, &ids)?;
        lsn += 1;
        let began = Instant::now();
        let st = s.commit(&t, &[changes], &checkpoint(lsn)).await?;
        updates += began.elapsed();
        files += st.files_written;
        deleted += st.deleted_rows;
    }
    Ok(Run {
        load: load_time,
        updates,
        update_rows: per_commit * commits,
        files,
        deleted,
    })
}

/// Best of three DuckDB full scans of the table under `warehouse`, and what they returned.
fn duck_scan(warehouse: &Path) -> anyhow::Result<(f64, String)> {
    let bed = std::env::var("CDCD_TB").unwrap_or_else(|_| "/tmp/cdcd-tb".into());
    let table = warehouse.join("bench/t");
    let script = format!(
        "import sys, time\nsys.path.insert(0, '{bed}')\nfrom duck_load import connect\ncon = connect()\ncon.sql('SET enable_progress_bar = false')\n\
         q = \"select count(*), sum(id), sum(b), sum(length(a)), round(sum(c), 1) from iceberg_scan('{}')\"\n\
         best = None\nfor _ in range(3):\n    t = time.perf_counter(); r = con.sql(q).fetchall(); e = time.perf_counter() - t\n    best = e if best is None else min(best, e)\n    if e > 10: break\n\
         print('SCAN', best, r)\n",
        table.display()
    );
    let out = Command::new(format!("{bed}/venv/bin/python"))
        .arg("-c")
        .arg(script)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "duckdb failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("SCAN "))
        .ok_or_else(|| anyhow::anyhow!("no scan result in {text:?}"))?;
    let (secs, answer) = line.split_once(' ').unwrap_or((line, ""));
    Ok((secs.parse()?, answer.to_owned()))
}

fn rss_mib(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with(field)).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<f64>().ok())
            })
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// A fresh sink's first commit (one update of a row in the oldest file): what a restart costs.
async fn restart(dir: &Path, rows: u64, lsn: u64) -> anyhow::Result<(Duration, Duration)> {
    let t = schema();
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let s = sink(dir, DeleteMode::DeletionVectors)?;
    let began = Instant::now();
    s.commit(
        &t,
        &[batch(Op::Update, &[(rows / 2, 9_999)])?],
        &checkpoint(lsn + 1),
    )
    .await?;
    let first = began.elapsed();
    let began = Instant::now();
    s.commit(
        &t,
        &[batch(Op::Update, &[(rows / 3, 9_999)])?],
        &checkpoint(lsn + 2),
    )
    .await?;
    Ok((first, began.elapsed()))
}

async fn restart_only(rows: u64) -> anyhow::Result<()> {
    let root = tempfile::tempdir()?;
    let s = sink(root.path(), DeleteMode::DeletionVectors)?;
    let mut lsn = 0;
    let (spent, files) = load(&s, rows, 1_000_000, &mut lsn).await?;
    println!(
        "loaded {rows} rows in {:.1}s ({:.0} rows/s, {files} files); peak RSS {:.0} MiB",
        spent.as_secs_f64(),
        rows as f64 / spent.as_secs_f64(),
        rss_mib("VmHWM:")
    );
    drop(s);
    let before = rss_mib("VmRSS:");
    let (first, next) = restart(root.path(), rows, lsn).await?;
    println!(
        "restart: first commit {:.3}s (index reopen + table load), next commit {:.3}s; RSS {:.0} MiB before, peak {:.0} MiB after",
        first.as_secs_f64(),
        next.as_secs_f64(),
        before,
        rss_mib("VmHWM:")
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("restart") {
        let rows = args
            .get(1)
            .map(|a| a.parse())
            .transpose()?
            .unwrap_or(10_000_000);
        return restart_only(rows).await;
    }
    let rows: u64 = args
        .first()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(200_000);
    let commits: u64 = args.get(1).map(|a| a.parse()).transpose()?.unwrap_or(100);
    let root = tempfile::tempdir()?;
    println!(
        "{rows} rows, {commits} commits updating 10 % each; warehouses under {}",
        root.path().display()
    );

    let mut results = Vec::new();
    let mut final_versions = Vec::new();
    for (name, mode) in [
        ("deletion-vectors", DeleteMode::DeletionVectors),
        ("equality", DeleteMode::Equality),
    ] {
        let dir = root.path().join(name);
        let mut versions = vec![0u64; rows as usize];
        let run = run_mode(&dir, mode, rows, commits, &mut versions).await?;
        println!(
            "{name}: load {:.0} rows/s, updates {:.0} rows/s, {} files, {} rows deleted",
            rows as f64 / run.load.as_secs_f64(),
            run.update_rows as f64 / run.updates.as_secs_f64(),
            run.files,
            run.deleted
        );
        final_versions = versions;
        results.push((name, dir, Some(run)));
    }
    // The same final rows, written once as inserts: no delete files at all.
    let dir = root.path().join("rewritten");
    {
        let s = sink(&dir, DeleteMode::DeletionVectors)?;
        let t = schema();
        let mut lsn = 0;
        for chunk in final_versions.chunks(LOAD_COMMIT as usize).enumerate() {
            let (n, versions) = chunk;
            let base = n as u64 * LOAD_COMMIT;
            let ids: Vec<(u64, u64)> = versions
                .iter()
                .enumerate()
                .map(|(i, v)| (base + i as u64, *v))
                .collect();
            lsn += 1;
            s.commit(&t, &[batch(Op::Insert, &ids)?], &checkpoint(lsn))
                .await?;
        }
    }
    results.push(("rewritten, no deletes", dir, None));

    println!();
    println!("| table | load rows/s | update rows/s | files written | DuckDB full scan |");
    println!("|---|---|---|---|---|");
    let mut answers = Vec::new();
    for (name, dir, run) in &results {
        let (secs, answer) = duck_scan(dir)?;
        answers.push(answer);
        match run {
            Some(r) => println!(
                "| {name} | {:.0} | {:.0} | {} | {:.3} s |",
                rows as f64 / r.load.as_secs_f64(),
                r.update_rows as f64 / r.updates.as_secs_f64(),
                r.files,
                secs
            ),
            None => println!("| {name} | – | – | – | {secs:.3} s |"),
        }
    }
    anyhow::ensure!(
        answers.windows(2).all(|w| w[0] == w[1]),
        "the tables read back differently: {answers:?}"
    );
    println!(
        "all three read back equal: {}",
        answers.first().map_or("", |a| a.as_str())
    );

    let dv_dir = &results[0].1;
    let (first, next) = restart(dv_dir, rows, LOAD_COMMIT + commits + 10).await?;
    println!(
        "deletion-vectors restart: first commit of a fresh sink {:.3}s, the next {:.3}s; peak RSS {:.0} MiB",
        first.as_secs_f64(),
        next.as_secs_f64(),
        rss_mib("VmHWM:")
    );
    Ok(())
}
