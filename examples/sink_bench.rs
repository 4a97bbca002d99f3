//! The sinks' own ceiling (issue 9), with no source in the loop: the `bench/pg_e2e.py` workload
//! (transactions of 600 inserts, 300 updates and 100 deletes on a 10-column table) built in memory
//! as [`TableChanges`] the way the Postgres source builds them (one run per transaction; whole new
//! rows for inserts and updates, only the key for deletes, every other column absent), and handed
//! to [`Sink::commit`] in commits of `--commit-rows` changes (default 100,000: the pipeline's
//! `commit_max_rows`, which is what cuts commits whenever the source delivers more than that per
//! `commit_interval_ms`), into a local warehouse.
//!
//! Prints, per sink: rows/s through `commit` (generation excluded), the CPU seconds spent inside
//! `commit` (all threads; the figure to compare on a busy machine), the slowest commit, and the
//! process's peak RSS (VmHWM). Each sink runs in a child process of its own so the peaks do not
//! mix. The table is then checked: its live row count must equal the workload's (500 per
//! transaction). LSM: the background compaction keeps running between commits as in the daemon;
//! the time to drain it after the last commit is printed separately.
//!
//! `cargo run --release --example sink_bench [-- [--transactions 1000] [--commit-rows 100000]
//! [--sinks dv,equality,lsm] [--big-tx ROWS] [--copy] [--dir DIR] [--compaction-trigger N]]`
//! (LSM's `compaction_trigger`, default 5 as in the daemon). `--big-tx ROWS` instead commits one
//! transaction of ROWS inserts (the "one 1M-row transaction" goal); with `--copy`, the same rows
//! arrive as one initial-copy commit does (issue 7): batches of 10,000 rows
//! (`sources/postgres/mod.rs`, `SNAPSHOT_BATCH`) from 4 chunk readers of consecutive key ranges,
//! interleaved; `--shuffle` also permutes the rows inside each batch (a heap out of key order).
//! Asserts only the row count.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::builder::{
    BooleanBuilder, Date32Builder, Decimal128Builder, Float64Builder, Int32Builder, Int64Builder,
    StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_schema::{DataType, TimeUnit};
use cdcd::changelog::{
    Column, Lsn, Op, Position, TableChanges, TableChangesBuilder, TableId, TableSchema,
};
use cdcd::checkpoint::Checkpoint;
use cdcd::config::{DeleteMode, IcebergConfig, LsmConfig, MergeEngine};
use cdcd::sinks::iceberg::IcebergSink;
use cdcd::sinks::lsm::LsmSink;
use cdcd::sinks::Sink;

const INSERTS: i64 = 600;
const UPDATES: i64 = 300;
const DELETES: i64 = 100;
/// 2024-01-01 as days since the epoch (column `h`).
const DAY_2024: i32 = 19_723;

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
        id: TableId::new("bench", "sink_bench"),
        columns: vec![
            col("id", DataType::Int64),
            col("a", DataType::Int32),
            col("b", DataType::Int64),
            col("c", DataType::Utf8),
            col("d", DataType::Decimal128(12, 2)),
            col("e", DataType::Float64),
            col(
                "f",
                DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
            ),
            col("g", DataType::Boolean),
            col("h", DataType::Date32),
            col("i", DataType::Utf8),
        ],
        primary_key: vec![0],
    })
}

fn typed<T: 'static>(b: &mut TableChangesBuilder, col: usize) -> anyhow::Result<&mut T> {
    b.value(col)
        .and_then(|v| v.as_any_mut().downcast_mut::<T>())
        .ok_or_else(|| anyhow::anyhow!("column {col} has another builder"))
}

/// Appends row `id` as pg_e2e.py's INSERT computes it; `updated` applies its UPDATE
/// (`a + 1, c || 'u', e * 2`).
fn row(
    b: &mut TableChangesBuilder,
    id: i64,
    updated: bool,
    text: &mut String,
) -> anyhow::Result<()> {
    use std::fmt::Write;
    let bump = i32::from(updated);
    typed::<Int64Builder>(b, 0)?.append_value(id);
    typed::<Int32Builder>(b, 1)?.append_value((id % 1000) as i32 + bump);
    typed::<Int64Builder>(b, 2)?.append_value(id * 7);
    text.clear();
    write!(text, "row {id}{}", if updated { "u" } else { "" })?;
    typed::<StringBuilder>(b, 3)?.append_value(&*text);
    typed::<Decimal128Builder>(b, 4)?.append_value(i128::from(id % 100_000));
    let e = id as f64 / 3.0;
    typed::<Float64Builder>(b, 5)?.append_value(if updated { e * 2.0 } else { e });
    typed::<TimestampMicrosecondBuilder>(b, 6)?.append_value(1_732_000_000_000_000 + id);
    typed::<BooleanBuilder>(b, 7)?.append_value(id % 2 == 0);
    typed::<Date32Builder>(b, 8)?.append_value(DAY_2024 + (id % 365) as i32);
    text.clear();
    write!(
        text,
        "{:032x}",
        (id as u128).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835)
    )?;
    typed::<StringBuilder>(b, 9)?.append_value(&*text);
    b.no_old_key()?;
    Ok(())
}

/// Transaction `t` of the workload (ids from 1, 600 new per transaction): inserts, then updates
/// and deletes of the previous transaction's rows (of its own rows for the first). As in
/// pg_e2e.py, the second transaction's deletes name rows the first already deleted: Postgres
/// deletes nothing and sends nothing, so they are left out here too.
fn transaction(
    schema: &Arc<TableSchema>,
    t: i64,
    text: &mut String,
) -> anyhow::Result<TableChanges> {
    let first = 1 + t * INSERTS;
    let lo = if t > 0 { first - INSERTS } else { first };
    let mut b = TableChangesBuilder::new(schema.clone(), (INSERTS + UPDATES + DELETES) as usize);
    for id in first..first + INSERTS {
        b.begin(Op::Insert);
        row(&mut b, id, false, text)?;
    }
    for id in lo..lo + UPDATES {
        b.begin(Op::Update);
        row(&mut b, id, true, text)?;
    }
    let deletes = if t == 1 { 0 } else { DELETES };
    for id in lo + UPDATES..lo + UPDATES + deletes {
        b.begin(Op::Delete);
        typed::<Int64Builder>(&mut b, 0)?.append_value(id);
        for col in 1..schema.columns.len() {
            b.absent(col)?;
        }
        b.no_old_key()?;
    }
    Ok(b.finish()?)
}

/// One run of inserts of `ids`.
fn big_transaction(schema: &Arc<TableSchema>, ids: &[i64]) -> anyhow::Result<TableChanges> {
    let mut b = TableChangesBuilder::new(schema.clone(), ids.len());
    let mut text = String::new();
    for &id in ids {
        b.begin(Op::Insert);
        row(&mut b, id, false, &mut text)?;
    }
    Ok(b.finish()?)
}

/// CPU seconds (user + system, every thread) this process has used, from `/proc/self/stat`
/// (clock ticks: 10 ms resolution, plenty for commits of a second). A busy machine stretches a
/// commit's wall time but not its CPU time, so this is the figure to compare there.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces, so split after its closing paren):
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the paren.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: f64 = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse::<f64>().ok())
        .sum();
    ticks / 100.0
}

/// Rows of one initial-copy batch (`sources/postgres/mod.rs`, `SNAPSHOT_BATCH`).
const COPY_BATCH_ROWS: i64 = 10_000;
/// Chunk readers of the copy (`source.snapshot_parallelism`, bench/pg_snapshot.py's default).
const COPY_READERS: i64 = 4;

/// `rows` inserts (ids from 1) as one initial-copy commit receives them: each reader copies a
/// consecutive quarter of the keys in batches of [`COPY_BATCH_ROWS`], and the readers' batches
/// arrive in turn.
fn copy_batches(
    schema: &Arc<TableSchema>,
    rows: i64,
    shuffle: bool,
) -> anyhow::Result<Vec<TableChanges>> {
    let per_reader = (rows + COPY_READERS - 1) / COPY_READERS;
    let mut next: Vec<i64> = (0..COPY_READERS).map(|r| 1 + r * per_reader).collect();
    let mut batches = Vec::new();
    loop {
        let mut any = false;
        for (r, from) in next.iter_mut().enumerate() {
            let end = ((r as i64 + 1) * per_reader).min(rows);
            if *from > end {
                continue;
            }
            let to = (*from + COPY_BATCH_ROWS - 1).min(end);
            let mut ids: Vec<i64> = (*from..=to).collect();
            if shuffle {
                // A fixed permutation (multiplying by a large odd number modulo a power of two
                // is a bijection), so runs are comparable.
                let n = ids.len();
                let bits = n.next_power_of_two().max(2);
                let slot = |i: usize| i.wrapping_mul(0x9E37_79B1) & (bits - 1);
                let mut order: Vec<usize> = (0..bits).map(slot).filter(|&j| j < n).collect();
                order.truncate(n);
                ids = order.into_iter().map(|j| *from + j as i64).collect();
            }
            batches.push(big_transaction(schema, &ids)?);
            *from = to + 1;
            any = true;
        }
        if !any {
            return Ok(batches);
        }
    }
}

fn rss_mib(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// The sink to commit through, and the same sink as `LsmSink` when it is one (to wait for its
/// compaction).
type Opened = (Arc<dyn Sink>, Option<Arc<LsmSink>>);

fn open_sink(kind: &str, dir: &Path, compaction_trigger: usize) -> anyhow::Result<Opened> {
    let warehouse = format!("file://{}", dir.display());
    let iceberg = |delete_mode| -> anyhow::Result<Arc<dyn Sink>> {
        let config = IcebergConfig {
            warehouse: warehouse.clone(),
            namespace: None,
            delete_mode,
            table_properties: Default::default(),
            maintenance_interval_ms: 0,
            catalog: Default::default(),
            tables: Default::default(),
        };
        Ok(Arc::new(IcebergSink::new(&config, "bench")?))
    };
    Ok(match kind {
        "dv" => (iceberg(DeleteMode::DeletionVectors)?, None),
        "equality" => (iceberg(DeleteMode::Equality)?, None),
        "lsm" => {
            let config = LsmConfig {
                warehouse: warehouse.clone(),
                namespace: None,
                buckets: 4,
                merge_engine: MergeEngine::Deduplicate,
                compaction_trigger,
                snapshots_retained: 30,
                snapshot_time_retained_ms: None,
                deletion_vectors: false,
                tables: Default::default(),
            };
            let lsm = Arc::new(LsmSink::new(&config, "bench")?);
            (lsm.clone(), Some(lsm))
        }
        other => anyhow::bail!("unknown sink {other:?} (dv, equality, lsm)"),
    })
}

struct Args {
    transactions: i64,
    commit_rows: usize,
    sinks: Vec<String>,
    big_tx: Option<i64>,
    copy: bool,
    shuffle: bool,
    dir: Option<PathBuf>,
    child: Option<String>,
    compaction_trigger: usize,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        transactions: 1000,
        commit_rows: 100_000,
        sinks: vec!["dv".into(), "equality".into(), "lsm".into()],
        big_tx: None,
        copy: false,
        shuffle: false,
        dir: None,
        child: None,
        compaction_trigger: 5,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--transactions" => a.transactions = value()?.parse()?,
            "--commit-rows" => a.commit_rows = value()?.parse()?,
            "--sinks" => a.sinks = value()?.split(',').map(str::to_owned).collect(),
            "--big-tx" => a.big_tx = Some(value()?.parse()?),
            "--copy" => a.copy = true,
            "--shuffle" => a.shuffle = true,
            "--dir" => a.dir = Some(PathBuf::from(value()?)),
            "--child" => a.child = Some(value()?),
            "--compaction-trigger" => a.compaction_trigger = value()?.parse()?,
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    Ok(a)
}

/// Runs one sink in this process and prints one result line.
async fn child(kind: &str, a: &Args, dir: &Path) -> anyhow::Result<()> {
    let schema = schema();
    let (sink, lsm) = open_sink(kind, dir, a.compaction_trigger)?;
    let mut in_sink = Duration::ZERO;
    let mut cpu_in_sink = 0.0;
    let mut slowest = Duration::ZERO;
    let mut commits = 0u64;
    let mut changes_total = 0u64;
    let expected_rows: u64;
    if let Some(rows) = a.big_tx {
        let batches = if a.copy {
            copy_batches(&schema, rows, a.shuffle)?
        } else {
            vec![big_transaction(&schema, &(1..=rows).collect::<Vec<_>>())?]
        };
        let cp = Checkpoint::new("bench", Position::Postgres(Lsn(1)));
        let began = Instant::now();
        let cpu = cpu_seconds();
        sink.commit(&schema, &batches, &cp).await?;
        cpu_in_sink = cpu_seconds() - cpu;
        in_sink = began.elapsed();
        slowest = in_sink;
        commits = 1;
        changes_total = rows as u64;
        expected_rows = rows as u64;
    } else {
        let per_commit = (a.commit_rows / (INSERTS + UPDATES + DELETES) as usize).max(1) as i64;
        let mut text = String::new();
        let mut t = 0;
        while t < a.transactions {
            let end = (t + per_commit).min(a.transactions);
            let mut buffer = Vec::with_capacity((end - t) as usize);
            for n in t..end {
                buffer.push(transaction(&schema, n, &mut text)?);
            }
            changes_total += buffer.iter().map(|c| c.len() as u64).sum::<u64>();
            commits += 1;
            let cp = Checkpoint::new("bench", Position::Postgres(Lsn(end as u64)));
            let began = Instant::now();
            let cpu = cpu_seconds();
            sink.commit(&schema, &buffer, &cp).await?;
            cpu_in_sink += cpu_seconds() - cpu;
            let took = began.elapsed();
            in_sink += took;
            slowest = slowest.max(took);
            t = end;
        }
        expected_rows =
            (a.transactions * (INSERTS - DELETES) + DELETES.min(a.transactions - 1).max(0)) as u64;
    }
    let peak = rss_mib("VmHWM:");
    let drained = match &lsm {
        Some(l) => {
            let began = Instant::now();
            l.wait_compaction(&schema.id).await;
            Some(began.elapsed())
        }
        None => None,
    };
    let status = sink.status(&schema.id).await?;
    let rows = status.as_ref().and_then(|s| s.rows);
    println!(
        "| {kind} | {changes_total} | {commits} | {:.0} | {cpu_in_sink:.2} s | {:.0} ms | {peak:.0} MiB | {} | {} |",
        changes_total as f64 / in_sink.as_secs_f64(),
        slowest.as_secs_f64() * 1000.0,
        drained.map_or("–".into(), |d| format!("{:.2} s", d.as_secs_f64())),
        rows.map_or("?".into(), |r| r.to_string()),
    );
    if let Some(r) = rows {
        anyhow::ensure!(
            r == expected_rows || lsm.is_some(),
            "{kind}: the table holds {r} live rows, expected {expected_rows}"
        );
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    // As the daemon does (src/malloc.rs).
    cdcd::malloc::limit_arenas();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let a = args()?;
    let tmp = tempfile::tempdir()?;
    let root = a.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    if let Some(kind) = &a.child {
        return child(kind, &a, &root.join(kind)).await;
    }
    match a.big_tx {
        Some(rows) => println!(
            "sink_bench: {rows} inserts in one commit ({}); load average {}",
            if a.copy {
                "initial-copy batches"
            } else {
                "one transaction"
            },
            std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
        ),
        None => println!(
            "sink_bench: {} transactions × ({INSERTS} ins / {UPDATES} upd / {DELETES} del), commits of ~{} changes; load average {}",
            a.transactions,
            a.commit_rows,
            std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
        ),
    }
    println!("| sink | changes | commits | rows/s | commit CPU | slowest commit | peak RSS | compaction drain | live rows |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let exe = std::env::current_exe()?;
    for kind in &a.sinks {
        let mut cmd = Command::new(&exe);
        cmd.args(["--child", kind, "--dir"]).arg(&root);
        cmd.args(["--transactions", &a.transactions.to_string()]);
        cmd.args(["--commit-rows", &a.commit_rows.to_string()]);
        cmd.args(["--compaction-trigger", &a.compaction_trigger.to_string()]);
        if let Some(rows) = a.big_tx {
            cmd.args(["--big-tx", &rows.to_string()]);
        }
        if a.copy {
            cmd.arg("--copy");
        }
        if a.shuffle {
            cmd.arg("--shuffle");
        }
        let status = cmd.status()?;
        anyhow::ensure!(status.success(), "{kind}: the child failed ({status})");
    }
    Ok(())
}
