//! Benchmark of the LSM (Apache Paimon) sink (`src/sinks/lsm/`): streams commits of inserts and
//! updates of random existing keys into one table on local disk, with the background universal
//! compactor running, and prints write throughput (rows/s), live files per bucket over time, how
//! often commits stalled, then a full compaction's throughput. Prints; asserts nothing.
//!
//! `cargo run --release --example lsm_bench [-- ROWS [COMMIT_ROWS [BUCKETS]]]`
//! (defaults 2,000,000, 20,000, 4). Set `CDCD_BENCH_DIR` to keep the warehouse somewhere.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::builder::{Float64Builder, Int64Builder, StringBuilder};
use arrow_schema::DataType;
use cdcd::changelog::{
    Column, Lsn, Op, Position, TableChanges, TableChangesBuilder, TableId, TableSchema,
};
use cdcd::checkpoint::Checkpoint;
use cdcd::config::{LsmConfig, MergeEngine};
use cdcd::sinks::lsm::LsmSink;
use cdcd::sinks::Sink;

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .and_then(|a| a.replace('_', "").parse().ok())
        .unwrap_or(default)
}

fn schema() -> Arc<TableSchema> {
    let col = |name: &str, dt: DataType| Column {
        name: name.into(),
        data_type: dt,
        nullable: true,
        source_type: String::new(),
        initial_default: None,
        former_names: Vec::new(),
    };
    Arc::new(TableSchema {
        id: TableId::new("public", "bench"),
        columns: vec![
            col("id", DataType::Int64),
            col("name", DataType::Utf8),
            col("qty", DataType::Int64),
            col("price", DataType::Float64),
        ],
        primary_key: vec![0],
    })
}

/// A commit: 70% inserts of new keys, 30% updates of random earlier keys.
fn batch(schema: &Arc<TableSchema>, next_key: &mut i64, rows: u64, rng: &mut u64) -> TableChanges {
    let mut b = TableChangesBuilder::new(schema.clone(), rows as usize);
    let mut name = String::new();
    for _ in 0..rows {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        let update = *next_key > 0 && *rng % 10 < 3;
        let id = if update {
            (*rng >> 8) as i64 % *next_key
        } else {
            *next_key += 1;
            *next_key
        };
        b.begin(if update { Op::Update } else { Op::Insert });
        if let Some(v) = any(&mut b, 0).and_then(|a| a.downcast_mut::<Int64Builder>()) {
            v.append_value(id);
        }
        name.clear();
        name.push_str("customer-");
        name.push_str(&(id % 100_000).to_string());
        if let Some(v) = any(&mut b, 1).and_then(|a| a.downcast_mut::<StringBuilder>()) {
            v.append_value(&name);
        }
        if let Some(v) = any(&mut b, 2).and_then(|a| a.downcast_mut::<Int64Builder>()) {
            v.append_value((*rng % 1000) as i64);
        }
        if let Some(v) = any(&mut b, 3).and_then(|a| a.downcast_mut::<Float64Builder>()) {
            v.append_value((*rng % 100_000) as f64 / 100.0);
        }
        let _ = b.no_old_key();
    }
    match b.finish() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("building a batch: {e}");
            std::process::exit(1);
        }
    }
}

fn any(b: &mut TableChangesBuilder, i: usize) -> Option<&mut dyn std::any::Any> {
    b.value(i).map(|v| v.as_any_mut())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let total = arg(1, 2_000_000);
    let per_commit = arg(2, 20_000).max(1);
    let buckets = arg(3, 4) as u32;
    let tmp = tempfile::tempdir()?;
    let dir = std::env::var("CDCD_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| tmp.path().to_path_buf());
    let config = LsmConfig {
        warehouse: format!("file://{}", dir.display()),
        namespace: None,
        buckets,
        merge_engine: MergeEngine::Deduplicate,
        compaction_trigger: 5,
        snapshots_retained: 30,
        snapshot_time_retained_ms: None,
        deletion_vectors: false,
        tables: Default::default(),
    };
    let sink = LsmSink::new(&config, "bench")?;
    let schema = schema();
    println!(
        "lsm_bench: {total} rows in commits of {per_commit}, {buckets} buckets, warehouse {}",
        dir.display()
    );
    let mut rng = 0x2545_F491_4F6C_DD1D_u64;
    let mut next_key = 0i64;
    let mut written = 0u64;
    let mut commits = 0u64;
    let mut in_sink = Duration::ZERO;
    let mut slowest = Duration::ZERO;
    let start = Instant::now();
    println!(
        "{:>8} {:>10} {:>12} {:>10}  files per bucket",
        "commit", "rows", "rows/s", "commit ms"
    );
    while written < total {
        let n = per_commit.min(total - written);
        let changes = batch(&schema, &mut next_key, n, &mut rng);
        commits += 1;
        let cp = Checkpoint::new("bench", Position::Postgres(Lsn(commits)));
        let t = Instant::now();
        sink.commit(&schema, &[changes], &cp).await?;
        let took = t.elapsed();
        in_sink += took;
        slowest = slowest.max(took);
        written += n;
        if commits.is_multiple_of(10) || written >= total {
            let files = sink.files_per_bucket(&schema.id).await?;
            let rate = written as f64 / start.elapsed().as_secs_f64();
            println!(
                "{commits:>8} {written:>10} {rate:>12.0} {:>10.1}  {:?}",
                took.as_secs_f64() * 1e3,
                files.values().collect::<Vec<_>>()
            );
        }
    }
    let wall = start.elapsed();
    println!(
        "write: {written} rows, {commits} commits in {:.2} s = {:.0} rows/s (time inside commit {:.2} s; slowest commit {:.0} ms, includes stalls)",
        wall.as_secs_f64(),
        written as f64 / wall.as_secs_f64(),
        in_sink.as_secs_f64(),
        slowest.as_secs_f64() * 1e3
    );
    sink.wait_compaction(&schema.id).await;
    let (bg, bg_time) = sink.background_compaction(&schema.id);
    println!(
        "background compaction: {} COMPACT snapshots, {} files ({:.1} MiB) -> {} files, {} rows in {:.2} s = {:.1} MiB/s",
        bg.snapshots,
        bg.files_in,
        bg.bytes_in as f64 / 1048576.0,
        bg.files_out,
        bg.rows_out,
        bg_time.as_secs_f64(),
        bg.bytes_in as f64 / 1048576.0 / bg_time.as_secs_f64().max(1e-9)
    );
    let before = sink.files_per_bucket(&schema.id).await?;
    let t = Instant::now();
    let stats = sink.compact(&schema.id, true).await?;
    let took = t.elapsed().as_secs_f64();
    let after = sink.files_per_bucket(&schema.id).await?;
    println!(
        "full compaction: {} files ({:.1} MiB) -> {} files, {} rows in {:.2} s = {:.1} MiB/s, {:.0} rows/s; files per bucket {:?} -> {:?}",
        stats.files_in,
        stats.bytes_in as f64 / 1048576.0,
        stats.files_out,
        stats.rows_out,
        took,
        stats.bytes_in as f64 / 1048576.0 / took.max(1e-9),
        stats.rows_out as f64 / took.max(1e-9),
        before.values().collect::<Vec<_>>(),
        after.values().collect::<Vec<_>>()
    );
    Ok(())
}
