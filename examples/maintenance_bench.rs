//! Long-run benchmark of the Iceberg sink's maintenance (issue 19, "Goals"). Not a test: it
//! prints figures and asserts only that each streamed table reads back equal to its baseline.
//!
//! Workload: a table `(id bigint primary key, a text, b bigint, c double)` seeded with
//! `--seed-rows` rows (default 100,000, one commit), then `--commits N` (default 10,000) small
//! commits back to back, each of 100 changes: 30 inserts of new keys, 50 whole-row updates and
//! 20 deletes of live keys picked at random over the whole table (so every commit touches rows of
//! old files, the worst case for deletes: a deletion vector or equality delete per commit). The
//! table grows by 10 rows per commit. The stream is deterministic (xorshift), so every pass and
//! mode commits the same changes.
//!
//! Maintenance runs as the daemon runs it (`daemon/maintenance.rs`, `maintain_in_background`): a
//! background task calling `Sink::maintain(None)` beside the streaming commits. The daemon's
//! defaults are a commit per `commit_interval_ms` = 1 s and a cycle per
//! `maintenance_interval_ms` = 60 s, i.e. one cycle per 60 commits; the bench compresses the clock
//! by committing back to back and waking the maintenance task every `--maintain-every` commits
//! (default 60), and when a commit asks for a cycle as the daemon's task is woken
//! (`cdcd.compaction.trigger-small-files`, 64 small files by default, which a 60-commit tick
//! never reaches; `--no-trigger`: only the ticks). Snapshot expiry is by age, and ages cannot be compressed, so the tables get
//! `history.expire.max-snapshot-age-ms = --snapshot-age-ms` (default 5,000) instead of cdcd's
//! 10 minutes (`min-snapshots-to-keep` stays Iceberg's default 1); every other property is
//! cdcd's default (manifest merging at 16, compaction's 128 MiB target, 64 MiB per cycle).
//!
//! Every `--every K` commits (default 1,000) one line: commits, the current `vN.metadata.json`
//! size, snapshots in it, manifests of the current snapshot, live data files, live delete entries
//! (vectors or delete files) and the distinct files holding them, files on disk under the table
//! directory, commit latency p50/p99 over the last K commits, commits/s over them (streaming
//! time: the probes and the wait for a running cycle to end before a probe are excluded), the
//! maintenance cycles since the last line (count, mean and longest time, bytes compaction
//! rewrote: a streaming commit waits while its table's compaction runs), the DuckDB full scan (`count(*)`, `sum(id)`, `sum(b)`; best of 3) and the process's peak RSS
//! (VmHWM, reset at the start of each pass). Manifests and live files are read with pyiceberg.
//! Then the same final rows written once into a fresh table of the same format (the baseline),
//! its scan, and the goals' ratios.
//!
//! A pass with maintenance off (no background task; manifest merging at commit stays, it is
//! part of the commit) runs the same stream for the throughput ratio, unless
//! `--maintenance-only`; `--no-maintenance` runs only that pass. `--off-commits M` stops that
//! pass after M commits (without expiry its metadata, and its commit time, grow with every
//! commit, so a long off pass mostly measures that); the ratio then compares both passes over
//! commits 1..=M. That pass skips the DuckDB scan unless `--off-scan` (with an equality delete
//! file per commit, DuckDB needs seconds per few hundred commits).
//!
//! `--sink lsm` runs the same stream into the LSM (Paimon) sink instead (issue 19: "the same
//! long-run test applies to it"), with cdcd's defaults (4 buckets, compaction at 5 runs, 30
//! snapshots kept, manifests merged at Paimon's 30). Its maintenance is the writer's own (the
//! background compactor, expiry every 10 snapshots, manifest merging at commit), so there is no
//! cycle to schedule and no maintenance-off pass. Its line shows, in the metadata column, the
//! bytes a reader reads to plan (the newest snapshot file, its manifest lists and their
//! manifests), Paimon's snapshot files, the manifests of the newest snapshot and its live data
//! files as pypaimon plans them, and pypaimon's full read (to Arrow, then the same sums) instead
//! of DuckDB's.
//!
//! `cargo run --release --example maintenance_bench -- [--commits 10000] [--every 1000]
//! [--sink iceberg|lsm] [--delete-mode dv|equality|both] [--maintain-every 60] [--snapshot-age-ms 5000]
//! [--seed-rows 100000] [--off-commits M] [--off-scan] [--no-trigger] [--no-maintenance | --maintenance-only] [--dir DIR]
//! [--property name=value …]`, with the test bed's
//! venv (`scripts/testbed.sh up`; `CDCD_TB`, default /tmp/cdcd-tb, or `CDCD_TEST_PYTHON`).

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::builder::{Float64Builder, Int64Builder, StringBuilder};
use arrow_schema::DataType;
use cdcd::changelog::{
    Column, Lsn, Op, Position, TableChanges, TableChangesBuilder, TableId, TableSchema,
};
use cdcd::checkpoint::Checkpoint;
use cdcd::config::{DeleteMode, IcebergConfig, LsmConfig, MergeEngine};
use cdcd::sinks::iceberg::IcebergSink;
use cdcd::sinks::lsm::LsmSink;
use cdcd::sinks::Sink;
use tokio::sync::{Mutex, Notify};

const INSERTS: usize = 30;
const UPDATES: usize = 50;
const DELETES: usize = 20;
/// Rows per commit of the seed and of the baseline (the pipeline's `commit_max_rows`).
const LOAD_COMMIT: usize = 100_000;

/// The table a pass streams into.
#[derive(Clone, Copy, PartialEq)]
enum Target {
    Iceberg(DeleteMode),
    /// The LSM (Paimon) sink, with cdcd's defaults.
    Lsm,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Iceberg(DeleteMode::DeletionVectors) => "dv",
            Target::Iceberg(DeleteMode::Equality) => "equality",
            Target::Lsm => "lsm",
        }
    }

    /// Who scans the table in the probes.
    fn scanner(self) -> &'static str {
        match self {
            Target::Iceberg(_) => "DuckDB",
            Target::Lsm => "pypaimon",
        }
    }
}

struct Args {
    commits: u64,
    every: u64,
    modes: Vec<Target>,
    maintain_every: u64,
    snapshot_age_ms: u64,
    seed_rows: u64,
    passes: Vec<bool>,
    /// Commits of the maintenance-off pass (see the module docs).
    off_commits: Option<u64>,
    /// Scan with DuckDB in the maintenance-off pass too (slow: thousands of delete files).
    off_scan: bool,
    /// Wake the maintenance task only every `maintain_every` commits, not when a commit asks
    /// for a cycle (`cdcd.compaction.trigger-small-files`).
    no_trigger: bool,
    dir: Option<PathBuf>,
    /// More table properties (`--property name=value`, repeatable), to compare settings.
    properties: Vec<(String, String)>,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        commits: 10_000,
        every: 1_000,
        modes: vec![Target::Iceberg(DeleteMode::DeletionVectors)],
        maintain_every: 60,
        snapshot_age_ms: 5_000,
        seed_rows: 100_000,
        passes: vec![true, false],
        off_commits: None,
        off_scan: false,
        no_trigger: false,
        dir: None,
        properties: Vec::new(),
    };
    let mut lsm = false;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--commits" => a.commits = value()?.parse()?,
            "--every" => a.every = value()?.parse()?,
            "--maintain-every" => a.maintain_every = value()?.parse()?,
            "--snapshot-age-ms" => a.snapshot_age_ms = value()?.parse()?,
            "--seed-rows" => a.seed_rows = value()?.parse()?,
            "--dir" => a.dir = Some(value()?.into()),
            "--property" => {
                let v = value()?;
                let (name, value) = v
                    .split_once('=')
                    .ok_or_else(|| anyhow::anyhow!("--property {v}: use name=value"))?;
                a.properties.push((name.to_owned(), value.to_owned()));
            }
            "--off-commits" => a.off_commits = Some(value()?.parse()?),
            "--delete-mode" => {
                let dv = Target::Iceberg(DeleteMode::DeletionVectors);
                let equality = Target::Iceberg(DeleteMode::Equality);
                a.modes = match value()?.as_str() {
                    "dv" | "deletion-vectors" => vec![dv],
                    "equality" => vec![equality],
                    "both" => vec![dv, equality],
                    other => anyhow::bail!("--delete-mode {other}: dv, equality or both"),
                }
            }
            "--sink" => match value()?.as_str() {
                "iceberg" => {}
                "lsm" => lsm = true,
                other => anyhow::bail!("--sink {other}: iceberg or lsm"),
            },
            "--no-maintenance" => a.passes = vec![false],
            "--off-scan" => a.off_scan = true,
            "--no-trigger" => a.no_trigger = true,
            "--maintenance-only" => a.passes = vec![true],
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    if lsm {
        // The LSM sink maintains its tables in the writer: there is nothing to switch off.
        a.modes = vec![Target::Lsm];
        a.passes = vec![true];
    }
    anyhow::ensure!(
        a.every > 0 && a.maintain_every > 0,
        "--every and --maintain-every must be > 0"
    );
    if let Some(m) = a.off_commits {
        anyhow::ensure!(
            m <= a.commits && (m % a.every == 0 || m == a.commits),
            "--off-commits must be at most --commits and a multiple of --every"
        );
    }
    Ok(a)
}

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

fn downcast<T: 'static>(b: &mut TableChangesBuilder, col: usize) -> anyhow::Result<&mut T> {
    b.value(col)
        .and_then(|v| v.as_any_mut().downcast_mut::<T>())
        .ok_or_else(|| anyhow::anyhow!("column {col} has another builder"))
}

/// A whole row `(id, version)`; `a` and `c` derive from both.
fn row(
    b: &mut TableChangesBuilder,
    id: u64,
    version: u64,
    text: &mut String,
) -> anyhow::Result<()> {
    use std::fmt::Write;
    downcast::<Int64Builder>(b, 0)?.append_value(id as i64);
    text.clear();
    write!(text, "customer-{id:08}-version-{version:05}")?;
    downcast::<StringBuilder>(b, 1)?.append_value(text.as_str());
    downcast::<Int64Builder>(b, 2)?.append_value(version as i64);
    downcast::<Float64Builder>(b, 3)?.append_value(id as f64 * 0.5 + version as f64);
    b.no_old_key()?;
    Ok(())
}

/// What one commit changes, in order.
enum Change {
    Upsert(Op, u64, u64),
    Delete(u64),
}

fn changes(list: &[Change]) -> anyhow::Result<TableChanges> {
    let schema = schema();
    let mut b = TableChangesBuilder::new(schema.clone(), list.len());
    let mut text = String::new();
    for c in list {
        match *c {
            Change::Upsert(op, id, version) => {
                b.begin(op);
                row(&mut b, id, version, &mut text)?;
            }
            // A delete carries the key only, as the sources send it.
            Change::Delete(id) => {
                b.begin(Op::Delete);
                downcast::<Int64Builder>(&mut b, 0)?.append_value(id as i64);
                for col in 1..schema.columns.len() {
                    b.absent(col)?;
                }
                b.no_old_key()?;
            }
        }
    }
    Ok(b.finish()?)
}

/// xorshift64: the same "random" stream for every pass and mode.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The source table: each live key's version, and the live keys in a vector for random picks.
struct Model {
    version: Vec<Option<u64>>,
    live: Vec<u64>,
    /// Where each live key is in `live` (for O(1) removal).
    slot: Vec<usize>,
    rng: Rng,
}

impl Model {
    fn seeded(rows: u64) -> Model {
        Model {
            version: vec![Some(0); rows as usize],
            live: (0..rows).collect(),
            slot: (0..rows as usize).collect(),
            rng: Rng(0x9E37_79B9_7F4A_7C15),
        }
    }

    /// Commit `c`'s changes, applied to the model.
    fn commit(&mut self, c: u64) -> Vec<Change> {
        let mut out = Vec::with_capacity(INSERTS + UPDATES + DELETES);
        // One change per key per commit: a source transaction can change a key twice, but the
        // point here is the table's growth in files, not the sink's in-commit folding.
        let mut touched = HashSet::new();
        for _ in 0..INSERTS {
            let id = self.version.len() as u64;
            self.version.push(Some(c));
            self.slot.push(self.live.len());
            self.live.push(id);
            touched.insert(id);
            out.push(Change::Upsert(Op::Insert, id, c));
        }
        let mut updates = 0;
        while updates < UPDATES && touched.len() < self.live.len() {
            let id = self.live[(self.rng.next() % self.live.len() as u64) as usize];
            if touched.insert(id) {
                self.version[id as usize] = Some(c);
                out.push(Change::Upsert(Op::Update, id, c));
                updates += 1;
            }
        }
        let mut deletes = 0;
        while deletes < DELETES && touched.len() < self.live.len() {
            let at = (self.rng.next() % self.live.len() as u64) as usize;
            let id = self.live[at];
            if touched.insert(id) {
                self.version[id as usize] = None;
                self.live.swap_remove(at);
                if let Some(&moved) = self.live.get(at) {
                    self.slot[moved as usize] = at;
                }
                out.push(Change::Delete(id));
                deletes += 1;
            }
        }
        out
    }
}

fn sink(
    warehouse: &Path,
    target: Target,
    snapshot_age_ms: u64,
    properties: &[(String, String)],
) -> anyhow::Result<Arc<dyn Sink>> {
    let mode = match target {
        Target::Iceberg(mode) => mode,
        Target::Lsm => {
            let config = LsmConfig {
                warehouse: format!("file://{}", warehouse.display()),
                namespace: None,
                buckets: 4,
                merge_engine: MergeEngine::Deduplicate,
                compaction_trigger: 5,
                snapshots_retained: 30,
                snapshot_time_retained_ms: None,
                deletion_vectors: false,
                tables: Default::default(),
            };
            return Ok(Arc::new(LsmSink::new(&config, "bench")?));
        }
    };
    let mut table_properties = BTreeMap::from([(
        "history.expire.max-snapshot-age-ms".to_owned(),
        snapshot_age_ms.to_string(),
    )]);
    table_properties.extend(properties.iter().cloned());
    let config = IcebergConfig {
        warehouse: format!("file://{}", warehouse.display()),
        namespace: None,
        delete_mode: mode,
        table_properties,
        // The bench schedules the cycles itself (see the module docs).
        maintenance_interval_ms: 0,
        catalog: Default::default(),
        tables: Default::default(),
    };
    Ok(Arc::new(IcebergSink::new(&config, "bench")?))
}

fn checkpoint(n: u64) -> Checkpoint {
    Checkpoint::new("bench", Position::Postgres(Lsn(n)))
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

fn table_dir(warehouse: &Path, target: Target) -> PathBuf {
    match target {
        Target::Iceberg(_) => warehouse.join("bench/t"),
        Target::Lsm => warehouse.join("bench.db/t"),
    }
}

/// The newest `vN.metadata.json` of the table and its size.
fn current_metadata(table: &Path) -> anyhow::Result<(PathBuf, u64)> {
    let mut best: Option<(u64, PathBuf)> = None;
    for entry in std::fs::read_dir(table.join("metadata"))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let version = name
            .strip_prefix('v')
            .and_then(|r| r.strip_suffix(".metadata.json"))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(v) = version {
            if best.as_ref().is_none_or(|(b, _)| v > *b) {
                best = Some((v, path));
            }
        }
    }
    let (_, path) = best.ok_or_else(|| anyhow::anyhow!("no metadata under {}", table.display()))?;
    let size = std::fs::metadata(&path)?.len();
    Ok((path, size))
}

/// Files (and their bytes) under `dir`, recursively. A file that vanishes during the walk is
/// not counted: the sink deletes replaced metadata files after its commits, in the background.
fn files_on_disk(dir: &Path) -> anyhow::Result<(u64, u64)> {
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    let (mut files, mut bytes) = (0, 0);
    let entries = match std::fs::read_dir(dir) {
        Err(e) if gone(&e) => return Ok((0, 0)),
        other => other?,
    };
    for entry in entries {
        let entry = entry?;
        let meta = match entry.metadata() {
            Err(e) if gone(&e) => continue,
            other => other?,
        };
        if meta.is_dir() {
            let (f, b) = files_on_disk(&entry.path())?;
            files += f;
            bytes += b;
        } else {
            files += 1;
            bytes += meta.len();
        }
    }
    Ok((files, bytes))
}

fn python() -> (String, String) {
    let bed = std::env::var("CDCD_TB").unwrap_or_else(|_| "/tmp/cdcd-tb".into());
    let python =
        std::env::var("CDCD_TEST_PYTHON").unwrap_or_else(|_| format!("{bed}/venv/bin/python"));
    (bed, python)
}

/// The six space-separated fields of a reader script's `READ …` line, taken in order (the last,
/// the scan's answer, may hold spaces).
struct Fields(std::vec::IntoIter<String>);

impl Fields {
    fn next(&mut self) -> anyhow::Result<String> {
        self.0
            .next()
            .ok_or_else(|| anyhow::anyhow!("a reader's result is short"))
    }
}

/// Runs a reader `script` with `python` and returns the fields of its `READ …` line.
fn run_reader(python: &str, script: &str) -> anyhow::Result<Fields> {
    let out = Command::new(python).arg("-c").arg(script).output()?;
    anyhow::ensure!(
        out.status.success(),
        "{python} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("READ "))
        .ok_or_else(|| anyhow::anyhow!("no result in {text:?}"))?;
    let fields: Vec<String> = line.splitn(6, ' ').map(str::to_owned).collect();
    Ok(Fields(fields.into_iter()))
}

/// What pyiceberg and DuckDB see of the table at one metadata file.
struct Reader {
    manifests: u64,
    data_files: u64,
    delete_entries: u64,
    delete_files: u64,
    scan_secs: f64,
    answer: String,
}

/// pyiceberg counts the current snapshot's manifests and live entries (delete entries are
/// vectors in v3, whose Puffin files may hold several, hence the distinct files too); DuckDB
/// scans the table (best of 3, one scan when it takes over 10 s; `scan_secs` is negative without
/// `scan`). `files` false: scan only.
fn read_table(table: &Path, metadata: &Path, files: bool, scan: bool) -> anyhow::Result<Reader> {
    let (bed, python) = python();
    let script = format!(
        r#"import sys, time
sys.path.insert(0, '{bed}')
from duck_load import connect
m = d = de = 0
df = set()
if {files}:
    from pyiceberg.table import StaticTable
    from pyiceberg.manifest import DataFileContent
    t = StaticTable.from_metadata('{metadata}')
    snap = t.current_snapshot()
    mans = snap.manifests(t.io) if snap else []
    m = len(mans)
    for man in mans:
        for e in man.fetch_manifest_entry(t.io, discard_deleted=True):
            if e.data_file.content == DataFileContent.DATA:
                d += 1
            else:
                de += 1
                df.add(e.data_file.file_path)
best, r = -1, []
if {scan}:
    con = connect()
    con.sql('SET enable_progress_bar = false')
    q = "select count(*), sum(id), sum(b) from iceberg_scan('{table}')"
    best = None
    for _ in range(3):
        t0 = time.perf_counter(); r = con.sql(q).fetchall(); e = time.perf_counter() - t0
        best = e if best is None else min(best, e)
        if e > 10: break
print('READ', m, d, de, len(df), best, r)
"#,
        files = if files { "True" } else { "False" },
        scan = if scan { "True" } else { "False" },
        metadata = metadata.display(),
        table = table.display(),
    );
    let mut fields = run_reader(&python, &script)?;
    let mut next = || fields.next();
    Ok(Reader {
        manifests: next()?.parse()?,
        data_files: next()?.parse()?,
        delete_entries: next()?.parse()?,
        delete_files: next()?.parse()?,
        scan_secs: next()?.parse()?,
        answer: next()?,
    })
}

/// What pypaimon sees of an LSM table: the bytes a reader reads to plan (the newest snapshot
/// file, its base and delta manifest lists and every manifest they name), the snapshot files,
/// and, as for Iceberg, the newest snapshot's manifests, its live data files (as pypaimon plans
/// the read) and the full read to Arrow (best of 3; `scan_secs` is negative without `scan`).
fn read_lsm(table: &Path, scan: bool) -> anyhow::Result<(u64, u64, Reader)> {
    let (_, python) = python();
    let script = format!(
        r#"import os, json, time
from fastavro import reader
import pyarrow.compute as pc
from pypaimon import CatalogFactory
tbl = '{table}'
sd = os.path.join(tbl, 'snapshot')
names = [n for n in os.listdir(sd) if n.startswith('snapshot-')]
latest = max(int(n[len('snapshot-'):]) for n in names)
path = os.path.join(sd, 'snapshot-%d' % latest)
snap = json.load(open(path))
size, m = os.path.getsize(path), 0
for key in ('baseManifestList', 'deltaManifestList'):
    name = snap.get(key)
    if not name:
        continue
    lp = os.path.join(tbl, 'manifest', name)
    size += os.path.getsize(lp)
    with open(lp, 'rb') as f:
        for r in reader(f):
            m += 1
            size += os.path.getsize(os.path.join(tbl, 'manifest', r['_FILE_NAME']))
wh, ident = os.path.dirname(os.path.dirname(tbl)), '{ident}'
t = CatalogFactory.create({{'warehouse': wh}}).get_table(ident)
rb = t.new_read_builder()
d = sum(len(s.files) for s in rb.new_scan().plan().splits())
best, r = -1, []
if {scan}:
    best = None
    for _ in range(3):
        t0 = time.perf_counter()
        rb = t.new_read_builder()
        a = rb.new_read().to_arrow(rb.new_scan().plan().splits())
        r = [(a.num_rows, pc.sum(a['id']).as_py(), pc.sum(a['b']).as_py())]
        e = time.perf_counter() - t0
        best = e if best is None else min(best, e)
        if e > 10: break
print('READ', size, len(names), m, d, best, r)
"#,
        table = table.display(),
        ident = table
            .parent()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".db"))
            .map(|ns| format!("{ns}.t"))
            .ok_or_else(|| anyhow::anyhow!("{} is not <ns>.db/t", table.display()))?,
        scan = if scan { "True" } else { "False" },
    );
    let mut fields = run_reader(&python, &script)?;
    let mut next = || fields.next();
    let plan_bytes = next()?.parse()?;
    let snapshots = next()?.parse()?;
    let read = Reader {
        manifests: next()?.parse()?,
        data_files: next()?.parse()?,
        delete_entries: 0,
        delete_files: 0,
        scan_secs: next()?.parse()?,
        answer: next()?,
    };
    Ok((plan_bytes, snapshots, read))
}

/// The full scan of a table alone (no file counts).
fn scan_only(table: &Path, target: Target) -> anyhow::Result<Reader> {
    match target {
        Target::Iceberg(_) => {
            let (metadata, _) = current_metadata(table)?;
            read_table(table, &metadata, false, true)
        }
        Target::Lsm => Ok(read_lsm(table, true)?.2),
    }
}

/// One printed line.
struct Probe {
    commits: u64,
    metadata_bytes: u64,
    snapshots: u64,
    disk_files: u64,
    p50_ms: f64,
    p99_ms: f64,
    commits_per_s: f64,
    /// Streaming time from the first commit to this probe.
    stream: Duration,
    scan_secs: f64,
    answer: String,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let at = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[at].as_secs_f64() * 1000.0
}

/// The background maintenance's totals over a pass.
#[derive(Default)]
struct Cycles {
    runs: u64,
    busy: Duration,
    snapshots_expired: u64,
    files_deleted: u64,
    metadata_files_deleted: u64,
    files_rewritten: u64,
    bytes_rewritten: u64,
    errors: Vec<String>,
    /// Since the last probe: cycles, their time, the longest, bytes rewritten. Streaming commits
    /// wait while a compaction runs (it holds the table's lock), so these explain the p99.
    window: (u64, Duration, Duration, u64),
}

struct Pass {
    probes: Vec<Probe>,
    stream: Duration,
    /// Process CPU seconds (every thread: commits and cycles) over the streaming time.
    cpu_secs: f64,
    peak_rss_mib: f64,
    cycles: Cycles,
    /// With maintenance (Iceberg): the scan right after one more cycle, past the last commit.
    scan_after_cycle: Option<f64>,
}

/// CPU seconds (user + system, every thread) this process has used, from `/proc/self/stat`
/// (clock ticks, assumed 100 per second as on Linux x86-64 and arm64). On a busy machine wall
/// times stretch but CPU times do not, so this is the figure to compare there.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat(5); `rest` starts at field 3.
    (ticks(11) + ticks(12)) / 100.0
}

#[allow(clippy::too_many_arguments)]
async fn probe(
    dir: &Path,
    target: Target,
    commits: u64,
    window: &mut Vec<Duration>,
    window_time: Duration,
    stream: Duration,
    cycles: &std::sync::Mutex<Cycles>,
    scan: bool,
) -> anyhow::Result<Probe> {
    let (runs, busy, longest, bytes) =
        std::mem::take(&mut cycles.lock().unwrap_or_else(|e| e.into_inner()).window);
    let table = table_dir(dir, target);
    let (metadata_bytes, snapshots, read) = match target {
        Target::Iceberg(_) => {
            let (metadata, metadata_bytes) = current_metadata(&table)?;
            let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&metadata)?)?;
            let snapshots = json
                .get("snapshots")
                .and_then(|s| s.as_array())
                .map_or(0, |s| s.len() as u64);
            let read = read_table(&table, &metadata, true, scan)?;
            (metadata_bytes, snapshots, read)
        }
        Target::Lsm => read_lsm(&table, scan)?,
    };
    let (disk_files, disk_bytes) = files_on_disk(&table)?;
    window.sort();
    let p = Probe {
        commits,
        metadata_bytes,
        snapshots,
        disk_files,
        p50_ms: percentile(window, 0.5),
        p99_ms: percentile(window, 0.99),
        commits_per_s: window.len() as f64 / window_time.as_secs_f64(),
        stream,
        scan_secs: read.scan_secs,
        answer: read.answer,
    };
    println!(
        "| {} | {:.1} | {} | {} | {} | {} / {} | {} ({:.1} MB) | {:.0} / {:.0} | {:.1} | {} | {} | {:.0} |",
        p.commits,
        p.metadata_bytes as f64 / 1024.0,
        p.snapshots,
        read.manifests,
        read.data_files,
        read.delete_entries,
        read.delete_files,
        p.disk_files,
        disk_bytes as f64 / 1e6,
        p.p50_ms,
        p.p99_ms,
        p.commits_per_s,
        if runs == 0 {
            "–".to_owned()
        } else {
            format!(
                "{runs}: {:.0} / {:.0} ms, {:.1} MB",
                busy.as_secs_f64() * 1000.0 / runs as f64,
                longest.as_secs_f64() * 1000.0,
                bytes as f64 / 1e6
            )
        },
        if p.scan_secs < 0.0 {
            "–".to_owned()
        } else {
            format!("{:.3}", p.scan_secs)
        },
        rss_mib("VmHWM:"),
    );
    window.clear();
    Ok(p)
}

async fn run_pass(
    dir: &Path,
    target: Target,
    maintenance: bool,
    commits: u64,
    a: &Args,
) -> anyhow::Result<(Pass, Model)> {
    // Peak RSS per pass: "5" resets VmHWM to the current RSS (proc(5), clear_refs).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let s = sink(dir, target, a.snapshot_age_ms, &a.properties)?;
    let t = schema();
    let mut model = Model::seeded(a.seed_rows);
    let mut lsn = 0;
    for chunk in (0..a.seed_rows).collect::<Vec<_>>().chunks(LOAD_COMMIT) {
        let rows: Vec<Change> = chunk
            .iter()
            .map(|&id| Change::Upsert(Op::Insert, id, 0))
            .collect();
        lsn += 1;
        s.commit(&t, &[changes(&rows)?], &checkpoint(lsn)).await?;
    }

    // The daemon's background task, woken by the stream instead of a timer (compressed clock).
    // `gate` is held for a whole cycle, so a probe waits for a running cycle and none starts
    // during a probe (the probe is not the workload).
    let gate = Arc::new(Mutex::new(()));
    let tick = Arc::new(Notify::new());
    let cycles = Arc::new(std::sync::Mutex::new(Cycles::default()));
    // The LSM sink maintains its tables in the writer (`Sink::maintain` does nothing there).
    let task = (maintenance && target != Target::Lsm).then(|| {
        let (s, gate, tick, cycles) = (s.clone(), gate.clone(), tick.clone(), cycles.clone());
        tokio::spawn(async move {
            loop {
                tick.notified().await;
                let _held = gate.lock().await;
                let began = Instant::now();
                let result = s.maintain(None).await;
                let mut c = cycles.lock().unwrap_or_else(|e| e.into_inner());
                c.runs += 1;
                let took = began.elapsed();
                c.busy += took;
                c.window.0 += 1;
                c.window.1 += took;
                c.window.2 = c.window.2.max(took);
                match result {
                    Ok(reports) => {
                        for r in reports {
                            c.snapshots_expired += r.snapshots_expired;
                            c.files_deleted += r.files_deleted;
                            c.metadata_files_deleted += r.metadata_files_deleted;
                            c.files_rewritten += r.files_rewritten;
                            c.bytes_rewritten += r.bytes_rewritten;
                            c.window.3 += r.bytes_rewritten;
                            if let Some(e) = r.error {
                                c.errors.push(e);
                            }
                        }
                    }
                    Err(e) => c.errors.push(e.to_string()),
                }
            }
        })
    });

    let metadata = match target {
        Target::Iceberg(_) => "metadata.json KiB",
        Target::Lsm => "snapshot, lists and manifests KiB",
    };
    println!(
        "| commits | {metadata} | snapshots | manifests | data files | delete entries / files | files on disk | commit p50 / p99 ms | commits/s | cycles: mean / max, rewritten | {} scan s | peak RSS MiB |",
        target.scanner()
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut probes = Vec::new();
    let mut window = Vec::with_capacity(a.every as usize);
    let mut window_time = Duration::ZERO;
    let mut stream = Duration::ZERO;
    let mut cpu_secs = 0.0;
    let mut since = Instant::now();
    let mut cpu_since = cpu_seconds();
    for c in 1..=commits {
        let batch = changes(&model.commit(c))?;
        lsn += 1;
        let began = Instant::now();
        s.commit(&t, &[batch], &checkpoint(lsn)).await?;
        window.push(began.elapsed());
        // The daemon serves a commit's ask at once (`daemon/maintenance.rs`; its minimum gap
        // between asked cycles, 1/20 of the interval, is 3 commits at this compressed clock:
        // ignored).
        let asked = !a.no_trigger && s.maintenance_wanted().is_some_and(|w| !w.take().is_empty());
        if maintenance && (c % a.maintain_every == 0 || asked) {
            tick.notify_one();
        }
        if c % a.every == 0 || c == commits {
            let spent = since.elapsed();
            window_time += spent;
            stream += spent;
            let _held = gate.lock().await;
            // A cycle still running at the probe is finished before the probe, and its CPU is
            // the workload's.
            cpu_secs += cpu_seconds() - cpu_since;
            let scan = maintenance || a.off_scan;
            probes.push(
                probe(
                    dir,
                    target,
                    c,
                    &mut window,
                    window_time,
                    stream,
                    &cycles,
                    scan,
                )
                .await?,
            );
            window_time = Duration::ZERO;
            since = Instant::now();
            cpu_since = cpu_seconds();
        }
    }
    let mut scan_after_cycle = None;
    if let Some(task) = task {
        // Waits for a running cycle, then stops the task where it waits for the next tick.
        let _held = gate.lock().await;
        task.abort();
        // What a reader sees right after a cycle (the probes land anywhere between two).
        s.maintain(None).await?;
        scan_after_cycle = Some(scan_only(&table_dir(dir, target), target)?.scan_secs);
    }
    s.settle().await;
    let peak_rss_mib = rss_mib("VmHWM:");
    let cycles = std::mem::take(&mut *cycles.lock().unwrap_or_else(|e| e.into_inner()));
    Ok((
        Pass {
            probes,
            stream,
            cpu_secs,
            peak_rss_mib,
            cycles,
            scan_after_cycle,
        },
        model,
    ))
}

/// The model's rows written once, as inserts, into a fresh table of the same format.
async fn baseline(dir: &Path, target: Target, model: &Model) -> anyhow::Result<()> {
    let s = sink(dir, target, 600_000, &[])?;
    let t = schema();
    let rows: Vec<Change> = model
        .version
        .iter()
        .enumerate()
        .filter_map(|(id, v)| v.map(|v| Change::Upsert(Op::Insert, id as u64, v)))
        .collect();
    for (n, chunk) in rows.chunks(LOAD_COMMIT).enumerate() {
        s.commit(&t, &[changes(chunk)?], &checkpoint(n as u64 + 1))
            .await?;
    }
    s.settle().await;
    Ok(())
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}×", a / b)
    } else {
        "–".into()
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = args()?;
    let temp = tempfile::tempdir()?;
    let root = a.dir.clone().unwrap_or_else(|| temp.path().to_owned());
    println!(
        "seed {} rows; {} commits of {INSERTS} inserts, {UPDATES} updates, {DELETES} deletes; a line every {}; maintenance every {} commits; max-snapshot-age-ms {}; warehouses under {}",
        a.seed_rows,
        a.commits,
        a.every,
        a.maintain_every,
        a.snapshot_age_ms,
        root.display()
    );
    let mut summary = Vec::new();
    for &mode in &a.modes {
        let name = mode.name();
        let mut passes = Vec::new();
        for &maintenance in &a.passes {
            let label = if maintenance { "on" } else { "off" };
            println!("\n### {name}, maintenance {label}\n");
            let dir = root.join(format!("{name}-{label}"));
            let commits = if maintenance {
                a.commits
            } else {
                a.off_commits.unwrap_or(a.commits)
            };
            let (pass, m) = run_pass(&dir, mode, maintenance, commits, &a).await?;
            let c = &pass.cycles;
            println!(
                "\nstreaming {:.1} commits/s over {:.1} s ({:.1} CPU s, {:.1} CPU ms per commit); peak RSS {:.0} MiB; {} cycles ({:.1} s busy): {} snapshots expired, {} files and {} metadata files deleted, {} data files ({:.1} MB) rewritten{}",
                commits as f64 / pass.stream.as_secs_f64(),
                pass.stream.as_secs_f64(),
                pass.cpu_secs,
                pass.cpu_secs * 1000.0 / commits as f64,
                pass.peak_rss_mib,
                c.runs,
                c.busy.as_secs_f64(),
                c.snapshots_expired,
                c.files_deleted,
                c.metadata_files_deleted,
                c.files_rewritten,
                c.bytes_rewritten as f64 / 1e6,
                if c.errors.is_empty() {
                    String::new()
                } else {
                    format!("; errors: {:?}", c.errors)
                }
            );
            if maintenance {
                let dir = root.join(format!("{name}-baseline"));
                baseline(&dir, mode, &m).await?;
                let read = scan_only(&table_dir(&dir, mode), mode)?;
                println!(
                    "baseline (final rows written once): {} scan {:.3} s, {}",
                    mode.scanner(),
                    read.scan_secs,
                    read.answer
                );
                if let Some(last) = pass.probes.last() {
                    anyhow::ensure!(
                        last.answer == read.answer,
                        "{name}: the streamed table reads {} but the baseline {}",
                        last.answer,
                        read.answer
                    );
                }
                passes.push((maintenance, pass, Some(read.scan_secs)));
            } else {
                passes.push((maintenance, pass, None));
            }
        }
        summary.push((mode, passes));
    }

    println!("\n### Goals\n");
    println!("| mode | goal | figure | target |");
    println!("|---|---|---|---|");
    for (target, passes) in &summary {
        let (name, scanner) = (target.name(), target.scanner());
        let metadata = match target {
            Target::Iceberg(_) => "metadata.json",
            Target::Lsm => "planning metadata",
        };
        let on = passes.iter().find(|(m, _, _)| *m);
        let off = passes.iter().find(|(m, _, _)| !*m);
        if let Some((_, pass, base)) = on {
            let at_1000 = pass.probes.iter().find(|p| p.commits == 1_000);
            let last = pass.probes.last();
            if let (Some(first), Some(last)) = (at_1000, last) {
                let n = last.commits;
                println!(
                    "| {name} | {metadata} at {n} vs 1,000 | {} ({} vs {} B) | ≤ 1.2× |",
                    ratio(last.metadata_bytes as f64, first.metadata_bytes as f64),
                    last.metadata_bytes,
                    first.metadata_bytes
                );
                println!(
                    "| {name} | commit p99 at {n} vs 1,000 | {} ({:.0} vs {:.0} ms) | ≤ 1.2× |",
                    ratio(last.p99_ms, first.p99_ms),
                    last.p99_ms,
                    first.p99_ms
                );
                println!(
                    "| {name} | files on disk at {n} vs 1,000 | {} ({} vs {}) | ≤ 1.3× |",
                    ratio(last.disk_files as f64, first.disk_files as f64),
                    last.disk_files,
                    first.disk_files
                );
            }
            if let (Some(last), Some(base)) = (last, base) {
                println!(
                    "| {name} | {scanner} scan vs baseline | {} ({:.3} vs {:.3} s) | ≤ 2× |",
                    ratio(last.scan_secs, *base),
                    last.scan_secs,
                    base
                );
                if let Some(after) = pass.scan_after_cycle {
                    println!(
                        "| {name} | {scanner} scan right after a cycle vs baseline | {} ({after:.3} vs {base:.3} s) | ≤ 2× |",
                        ratio(after, *base),
                    );
                }
            }
            println!(
                "| {name} | peak RSS, maintenance on | {:.0} MiB | ≤ 256 MiB |",
                pass.peak_rss_mib
            );
        }
        // Over the commits both passes ran (the off pass may stop early: without expiry its
        // metadata grows by every commit, and so does its commit time).
        let last = |p: &Pass| p.probes.last().map(|p| (p.commits, p.stream));
        if let (Some((_, on, _)), Some((_, off, _))) = (on, off) {
            let (Some((n, off_time)), Some(on_time)) = (
                last(off),
                on.probes
                    .iter()
                    .find_map(|p| (Some(p.commits) == last(off).map(|l| l.0)).then_some(p.stream)),
            ) else {
                continue;
            };
            let (r_on, r_off) = (
                n as f64 / on_time.as_secs_f64(),
                n as f64 / off_time.as_secs_f64(),
            );
            println!(
                "| {name} | streaming over commits 1–{n}, maintenance on vs off | {} ({r_on:.1} vs {r_off:.1} commits/s) | ≥ 0.9× |",
                ratio(r_on, r_off),
            );
        }
    }
    Ok(())
}
