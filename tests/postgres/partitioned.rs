//! End to end, partitioned Iceberg tables (issue 36). A table cdcd created unpartitioned is given
//! `days(created_at)` + `bucket(4, id)` and `WRITE ORDERED BY n` by Spark (Iceberg-Java, hadoop
//! catalog on cdcd's filesystem warehouse) while cdcd runs, after the initial copy; cdcd's next
//! commit must write with that spec and order. Streaming changes then move rows across partitions
//! (full updates, an update whose big TOASTed column is unchanged, key changes, an insert updated
//! in the same transaction), update and delete rows of the old spec's files, in both delete modes.
//! Spark's `rewrite_data_files` runs beside cdcd, then cdcd's own compaction (`cdcd maintain`).
//! Keyless tables (an append table, a `REPLICA IDENTITY FULL` multiset) are partitioned the same
//! way.
//!
//! Oracles: Spark reads every state, pyiceberg every deletion-vector state (it refuses equality
//! deletes); DuckDB 1.5.5 is not used, since it reads tables whose spec evolved wrongly. A pyiceberg
//! script checks the layout: each data file's rows all lie in the partition its entry names, files
//! of the sort order are sorted, a deletion vector or position delete file sits in its data file's
//! spec and partition, and equality deletes in a spec without fields.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::support::{
    connect, current_metadata, exec, parse_lsn, spark, stdout_then_stderr, test_env, unique,
    Pipeline, Settings, TestEnv, NAMESPACE,
};

/// Runs SQL statements with Spark on a hadoop catalog `h` over a local warehouse.
/// Usage: python -c SPARK_SQL JARS_DIR WAREHOUSE STATEMENT...
const SPARK_SQL: &str = r#"
import glob, json, os, sys
import snowpark_connect_deps_iceberg as dep
from pyspark.sql import SparkSession
jars_dir, warehouse = sys.argv[1:3]
wheel = os.path.join(os.path.dirname(dep.__file__), "jars")
jars = [glob.glob(f"{wheel}/iceberg-spark-runtime-3.5_2.12-*.jar")[0],
        glob.glob(f"{wheel}/iceberg-spark-extensions-3.5_2.12-*.jar")[0],
        f"{jars_dir}/iceberg-shaded-jackson.jar"]
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
spark = (SparkSession.builder.master("local[2]").appName("partitioned")
         .config("spark.jars", ",".join(jars))
         .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
         .config("spark.sql.catalog.h", "org.apache.iceberg.spark.SparkCatalog")
         .config("spark.sql.catalog.h.type", "hadoop")
         .config("spark.sql.catalog.h.warehouse", "file://" + warehouse)
         .config("spark.sql.session.timeZone", "UTC").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").config("spark.driver.memory", "1g").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
for statement in sys.argv[3:]:
    rows = spark.sql(statement).collect()
    print("result:", json.dumps([r.asDict() for r in rows], default=str), flush=True)
"#;

/// Checks the layout of the table at argv[1] with pyiceberg; prints a JSON summary, exits 1 with
/// the first problem.
const LAYOUT: &str = r#"
import fastavro, json, os, re, sys
import pyarrow as pa, pyarrow.parquet as pq
from pyiceberg.table import StaticTable
d = sys.argv[1]
md = d + "/metadata"
vs = sorted(int(m.group(1)) for n in os.listdir(md) if (m := re.fullmatch(r"v(\d+)\.metadata\.json", n)))
t = StaticTable.from_metadata(f"{md}/v{vs[-1]}.metadata.json")
meta, io, schema = t.metadata, t.io, t.schema()
specs = {s.spec_id: s for s in meta.partition_specs}
order = meta.sort_order_by_id(meta.default_sort_order_id)
local = lambda p: p[len("file://"):] if p.startswith("file://") else p
def problem(what):
    print(json.dumps({"problem": what}), flush=True); sys.exit(1)
def tuple_of(spec, partition):
    return tuple(partition[i] for i in range(len(spec.fields)))
def norm(v):
    import datetime
    if isinstance(v, datetime.date):
        return (v - datetime.date(1970, 1, 1)).days
    return v
data, deletes, referenced = {}, [], {}
for mf in meta.snapshot_by_id(meta.current_snapshot_id).manifests(io):
    # pyiceberg 0.12 reads no referenced_data_file/content_offset: the same live entries, raw.
    raw = [r for r in fastavro.reader(open(local(mf.manifest_path), "rb")) if r["status"] != 2]
    for e, r in zip(mf.fetch_manifest_entry(io, discard_deleted=True), raw):
        f = e.data_file
        referenced[id(f)] = r["data_file"].get("referenced_data_file")
        if mf.partition_spec_id != f.spec_id:
            problem(f"{f.file_path}: spec {f.spec_id} in a manifest of spec {mf.partition_spec_id}")
        # The tuple as the manifest file wrote it (its own Avro schema) has the spec's fields.
        if len(f.partition) != len(specs[f.spec_id].fields):
            problem(f"{f.file_path}: partition {f.partition} under spec {f.spec_id} of {len(specs[f.spec_id].fields)} fields")
        (data.__setitem__(f.file_path, f) if f.content == 0 else deletes.append(f))
counts = {"data_files": 0, "partitions": set(), "sorted_files": 0, "dvs": 0, "position_files": 0, "equality_files": 0, "old_spec_files": 0, "unsorted_files": 0}
for path, f in data.items():
    spec = specs[f.spec_id]
    counts["old_spec_files"] += f.spec_id != meta.default_spec_id
    counts["unsorted_files"] += bool(order.fields) and f.sort_order_id != order.order_id
    rows = pq.read_table(local(path))
    if order.fields and f.sort_order_id == order.order_id:
        key = schema.find_field(order.fields[0].source_id).name
        values = rows.column(key).to_pylist()
        if values != sorted(values):
            problem(f"{path}: written under sort order {order.order_id} but not sorted by {key}")
        counts["sorted_files"] += 1
    if not spec.fields:
        continue
    got = tuple(norm(v) for v in tuple_of(spec, f.partition))
    for i, field in enumerate(spec.fields):
        src = schema.find_field(field.source_id)
        col = rows.column(src.name)
        if pa.types.is_timestamp(col.type):
            col = col.cast(pa.timestamp("us", tz=col.type.tz)).cast(pa.int64())
        fn = field.transform.transform(src.field_type)
        for v in col.to_pylist():
            want = norm(fn(v)) if v is not None else None
            if want != got[i]:
                problem(f"{path}: a row's {field.name} is {want}, its entry says {got[i]}")
    counts["data_files"] += 1
    counts["partitions"].add((f.spec_id, got))
for f in deletes:
    spec = specs[f.spec_id]
    if f.content == 2:
        counts["equality_files"] += 1
        if spec.fields:
            problem(f"{f.file_path}: an equality delete file in partitioned spec {f.spec_id}")
        continue
    if f.file_format.name == "PUFFIN":
        # A commit's Puffin file holds all its vectors: the entry's own data file.
        targets = [referenced[id(f)]]
        counts["dvs"] += 1
    else:
        targets = sorted(set(pq.read_table(local(f.file_path), columns=["file_path"]).column(0).to_pylist()))
        counts["position_files"] += 1
    for target in targets:
        d = data.get(target)
        if d is None:
            continue
        if (d.spec_id, tuple_of(specs[d.spec_id], d.partition)) != (f.spec_id, tuple_of(spec, f.partition)):
            problem(f"{f.file_path}: placed in spec {f.spec_id} {f.partition}, its data file {target} in spec {d.spec_id} {d.partition}")
replaces = [s for s in meta.snapshots if s.summary and s.summary.operation.value == "replace"]
counts["partitions"] = len(counts["partitions"])
counts["cdcd_replaces"] = sum(1 for s in replaces if (s.summary.additional_properties or {}).get("cdcd.pipeline"))
counts["specs"] = sorted(specs)
counts["default_spec"] = meta.default_spec_id
counts["manifests"] = len(meta.snapshot_by_id(meta.current_snapshot_id).manifests(io))
print(json.dumps(counts), flush=True)
"#;

fn layout(p: &Pipeline, table: &str) -> Value {
    layout_of(&p.env.python, &p.table_dir(table))
}

/// The [`LAYOUT`] check of the table directory `dir`, with the readers' `python`.
pub(crate) fn layout_of(python: &str, dir: &std::path::Path) -> Value {
    let out = Command::new(python)
        .args(["-c", LAYOUT])
        .arg(dir)
        .output()
        .unwrap();
    let text = stdout_then_stderr(&out);
    assert!(out.status.success(), "layout of {}:\n{text}", dir.display());
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or("");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn run_spark(spark: &(String, String), p: &Pipeline, statements: &[String]) {
    spark_sql(spark, &p.warehouse, statements);
}

/// The opening of the tests of a table Spark creates partitioned: the table `<name>_t` made by
/// `create`, a format v2 pipeline over it (no background maintenance) into which Spark created it
/// first, `PARTITIONED BY (<partitioned_by>)` with key `id`, started and read back equal after its
/// copy.
pub(crate) async fn created_partitioned_by_spark(
    env: &TestEnv,
    spark: &(String, String),
    name: &str,
    create: impl Fn(&str) -> String,
    partitioned_by: &str,
) -> (Pipeline, tokio_postgres::Client, String) {
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(&client, &create(&t)).await;
    let settings = Settings {
        sink_extra: "maintenance_interval_ms = 0\n".into(),
        ..Settings::default()
    };
    let mut p = Pipeline::owning_tables(env, name, &[&t], &settings);
    // Spark's Iceberg creates format v2 tables; cdcd writes them with equality deletes.
    p.force_equality();
    let table = format!("h.{NAMESPACE}.{t}");
    spark_sql(
        spark,
        &p.warehouse,
        &[
            format!(
                "CREATE TABLE {table} (id bigint NOT NULL, created_at timestamp NOT NULL, n int, big string) USING iceberg \
                 PARTITIONED BY ({partitioned_by}) TBLPROPERTIES ('format-version' = '2')"
            ),
            format!("ALTER TABLE {table} SET IDENTIFIER FIELDS id"),
        ],
    );
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    p.assert_equal(&t, 90).await;
    (p, client, t)
}

/// Runs `statements` with Spark on the hadoop catalog `h` over the local `warehouse`.
pub(crate) fn spark_sql(
    spark: &(String, String),
    warehouse: &std::path::Path,
    statements: &[String],
) {
    let (python, jars) = spark;
    let out = Command::new(python)
        .args(["-c", SPARK_SQL, jars])
        .arg(warehouse)
        .args(statements)
        .output()
        .unwrap();
    let text = stdout_then_stderr(&out);
    assert!(out.status.success(), "spark {statements:?}:\n{text}");
    eprintln!(
        "spark: {}",
        text.lines()
            .filter(|l| l.starts_with("result:"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
}

/// Equal to the source by Spark, and by pyiceberg where it reads the table (no equality deletes).
/// Spark reads once: first cdcd's checkpoint must pass `lsn`, read before the changes' last
/// transaction committed.
pub(crate) async fn equal(p: &mut Pipeline, t: &str, equality: bool, lsn: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let meta = current_metadata(&p.table_dir(t));
        let committed = meta["snapshots"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["summary"]["cdcd.position"].as_str())
            .map(parse_lsn)
            .max()
            .unwrap_or(0);
        if committed >= lsn {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "cdcd did not commit past {lsn:X} (at {committed:X})"
        );
        p.assert_running();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    if !equality {
        let (code, out) = p.lakecheck(t, 30, &["--reader", "pyiceberg"]).await;
        assert_eq!(code, Some(0), "pyiceberg reads otherwise:\n{out}");
        eprintln!("pyiceberg: {}", out.lines().last().unwrap_or(""));
    }
    p.assert_equal_by_spark(t).await;
}

/// Runs `sql`, then one more transaction on `t` whose WAL position (read inside it, so below its
/// commit) is returned.
pub(crate) async fn change(
    client: &tokio_postgres::Client,
    t: &str,
    sql: &str,
    marker: i64,
) -> u64 {
    exec(client, sql).await;
    exec(
        client,
        &format!("BEGIN; INSERT INTO {t} VALUES ({marker}, '2024-01-05 00:00+00', 0, 'marker')"),
    )
    .await;
    let lsn: String = client
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    exec(client, "COMMIT").await;
    parse_lsn(&lsn)
}

/// Streams the [`moving`] changes of each of `rounds` (each with its marker), each read back
/// equal by [`equal`].
async fn stream(
    p: &mut Pipeline,
    client: &tokio_postgres::Client,
    t: &str,
    equality: bool,
    rounds: std::ops::RangeInclusive<i64>,
) {
    for round in rounds {
        let lsn = change(client, t, &moving(t, round), -round).await;
        equal(p, t, equality, lsn).await;
    }
}

/// The rows: ten days of `created_at`, every seventh row with a big value stored out of line
/// (`STORAGE EXTERNAL`: > 2 KB, uncompressed), which an update leaving it alone sends as unchanged.
fn create(t: &str) -> String {
    format!(
        "DROP TABLE IF EXISTS {t};
         CREATE TABLE {t} (id int8 PRIMARY KEY, created_at timestamptz NOT NULL, n int4, big text);
         ALTER TABLE {t} ALTER COLUMN big SET STORAGE EXTERNAL;
         INSERT INTO {t} SELECT g, timestamptz '2024-01-01 00:00+00' + (g % 10) * interval '1 day' + g * interval '1 minute', g,
           CASE WHEN g % 7 = 0 THEN repeat(md5(g::text), 200) ELSE 'small ' || g END
         FROM generate_series(1, 300) g;"
    )
}

/// Changes that move rows across partitions, in every way a row can move.
pub(crate) fn moving(t: &str, round: i64) -> String {
    let base = 1000 * round;
    format!(
        "INSERT INTO {t} SELECT g, timestamptz '2024-01-01 00:00+00' + (g % 15) * interval '1 day', g % 50, 'new ' || g
           FROM generate_series({base} + 1, {base} + 60) g;
         UPDATE {t} SET created_at = created_at + interval '3 days', n = n + 1 WHERE id % 5 = {r5};
         UPDATE {t} SET created_at = created_at - interval '20 days' WHERE id % 7 = 0 AND id % 3 = {r3};
         UPDATE {t} SET id = id + 100000 WHERE id % 11 = {r11} AND id < 100000;
         DELETE FROM {t} WHERE id % 13 = {r13};
         BEGIN;
           INSERT INTO {t} VALUES ({base} + 500, '2024-01-02 10:00+00', 1, 'moved twice');
           UPDATE {t} SET created_at = '2024-01-09 10:00+00' WHERE id = {base} + 500;
           UPDATE {t} SET n = 2, created_at = '2024-01-04 10:00+00' WHERE id = {base} + 500;
         COMMIT;",
        r5 = round % 5,
        r3 = round % 3,
        r11 = round % 11,
        r13 = round % 13,
    )
}

/// A pipeline (config `sink_extra`; format v2 if `equality`) on a new table of [`create`]'s rows,
/// started, its initial copy equal; with its source client, its table and Spark. `None`: the
/// test bed has no Postgres or no Spark.
async fn copied(
    test: &str,
    tag: &str,
    equality: bool,
    sink_extra: &str,
) -> Option<(Pipeline, tokio_postgres::Client, String, (String, String))> {
    let env = test_env(test)?;
    let spark = spark(test)?;
    let name = unique(tag);
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(&client, &create(&t)).await;
    let settings = Settings {
        sink_extra: sink_extra.into(),
        ..Settings::default()
    };
    let mut p = Pipeline::new(&env, &name, &[t.as_str()], &settings);
    p.on_cleanup(format!("DROP TABLE IF EXISTS {t}"));
    if equality {
        p.force_equality();
    }
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    p.assert_equal(&t, 90).await;
    Some((p, client, t, spark))
}

async fn partitioned_by_spark(test: &str, tag: &str, equality: bool) {
    let extra = "maintenance_interval_ms = 0\n[sink.table_properties]\n\"cdcd.compaction.min-input-files\" = \"2\"\n";
    let (mut p, client, t, spark) = ground_or_skip!(copied(test, tag, equality, extra).await);

    // Another engine partitions and orders the table while cdcd runs (nothing in flight).
    let table = format!("h.{NAMESPACE}.{t}");
    run_spark(
        &spark,
        &p,
        &[
            format!("ALTER TABLE {table} ADD PARTITION FIELD days(created_at)"),
            format!("ALTER TABLE {table} ADD PARTITION FIELD bucket(4, id)"),
            format!("ALTER TABLE {table} WRITE ORDERED BY n"),
        ],
    );
    stream(&mut p, &client, &t, equality, 1..=3).await;
    let seen = layout(&p, &t);
    eprintln!("layout after streaming: {seen}");
    assert!(
        seen["partitions"].as_u64().unwrap_or(0) >= 8,
        "cdcd's commits did not split by the new spec: {seen}"
    );
    assert!(seen["sorted_files"].as_u64().unwrap_or(0) >= 8, "{seen}");
    if equality {
        assert!(seen["equality_files"].as_u64().unwrap_or(0) > 0, "{seen}");
    } else {
        assert!(seen["dvs"].as_u64().unwrap_or(0) > 0, "{seen}");
    }

    // Spark rewrites the table beside cdcd (old-spec files into the new spec); cdcd goes on.
    run_spark(
        &spark,
        &p,
        &[format!(
            "CALL h.system.rewrite_data_files(table => '{NAMESPACE}.{t}', options => map('min-input-files', '2', 'rewrite-all', 'true'))"
        )],
    );
    stream(&mut p, &client, &t, equality, 4..=4).await;

    // cdcd's own compaction: small files of one partition merge, never across partitions.
    stream(&mut p, &client, &t, equality, 5..=6).await;
    p.sigterm_and_wait(Duration::from_secs(60)).await;
    compacted_by_cdcd(&p, &t);
    equal(&mut p, &t, equality, 0).await;
    // And commits go on after it.
    p.start();
    stream(&mut p, &client, &t, equality, 7..=7).await;
    layout(&p, &t);
    p.sigterm_and_wait(Duration::from_secs(60)).await;
}

/// Runs `cdcd maintain` on the stopped pipeline's table `t`; returns its output and the layout
/// after it, in which cdcd's compaction committed.
fn compacted_by_cdcd(p: &Pipeline, t: &str) -> (String, Value) {
    let out = super::maintenance::maintain(p, &["--table", &format!("public.{t}")]);
    let text = stdout_then_stderr(&out);
    assert!(out.status.success(), "cdcd maintain:\n{text}");
    let seen = layout(p, t);
    eprintln!("layout after cdcd's compaction: {seen}");
    assert!(
        seen["cdcd_replaces"].as_u64().unwrap_or(0) > 0,
        "cdcd's compaction rewrote nothing:\n{text}\n{seen}"
    );
    (text, seen)
}

/// Issue 36, keyless tables: an append table (inserts only) and a `REPLICA IDENTITY FULL`
/// multiset, partitioned by Spark mid-stream; single-duplicate updates that move a row and
/// deletes find it in its partition (a deletion vector, or a v2 position delete file of that
/// partition with `CDCD_TEST_DELETE_MODE = equality`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spark_partitions_keyless_tables_and_cdcd_stays_exact() {
    let test = "spark_partitions_keyless_tables_and_cdcd_stays_exact";
    let env = ground_or_skip!(test_env(test));
    let spark = ground_or_skip!(spark(test));
    let name = unique("ptkl");
    let (a, m) = (format!("{name}_a"), format!("{name}_m"));
    let client = connect(&env.pg_url).await;
    exec(
        &client,
        &format!(
            "DROP TABLE IF EXISTS {a}, {m};
             CREATE TABLE {a} (created_at timestamptz NOT NULL, g int4, note text);
             CREATE TABLE {m} (created_at timestamptz NOT NULL, g int4, note text);
             ALTER TABLE {m} REPLICA IDENTITY FULL;
             INSERT INTO {a} SELECT timestamptz '2024-03-01 00:00+00' + (i % 6) * interval '1 day', i % 4, 'a' FROM generate_series(1, 120) i;
             INSERT INTO {m} SELECT timestamptz '2024-03-01 00:00+00' + (i % 6) * interval '1 day', i % 4, 'a' FROM generate_series(1, 120) i;"
        ),
    )
    .await;
    let settings = Settings {
        sink_extra: "maintenance_interval_ms = 0\n".into(),
        ..Settings::default()
    };
    let mut p = Pipeline::new(&env, &name, &[a.as_str(), m.as_str()], &settings);
    p.on_cleanup(format!("DROP TABLE IF EXISTS {a}, {m}"));
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    p.assert_equal(&a, 90).await;
    p.assert_equal(&m, 90).await;
    let mut statements = Vec::new();
    for t in [&a, &m] {
        statements.push(format!(
            "ALTER TABLE h.{NAMESPACE}.{t} ADD PARTITION FIELD days(created_at)"
        ));
        statements.push(format!(
            "ALTER TABLE h.{NAMESPACE}.{t} ADD PARTITION FIELD truncate(2, note)"
        ));
    }
    run_spark(&spark, &p, &statements);
    for i in 1..=3 {
        exec(
            &client,
            &format!(
                "INSERT INTO {a} SELECT timestamptz '2024-03-01 00:00+00' + (j % 9) * interval '1 day', {i}, 'new{i}' FROM generate_series(1, 30) j;
                 BEGIN;
                 UPDATE {m} SET created_at = created_at + interval '2 days', note = 'moved{i}'
                   WHERE ctid = (SELECT ctid FROM {m} WHERE g = {g} AND note = 'a' LIMIT 1);
                 UPDATE {m} SET created_at = created_at - interval '4 days' WHERE g = {h} AND note = 'a';
                 DELETE FROM {m} WHERE ctid = (SELECT ctid FROM {m} WHERE g = {h} LIMIT 1);
                 INSERT INTO {m} VALUES ('2024-03-03 00:00+00', {i}, 'a'), ('2024-03-03 00:00+00', {i}, 'a');
                 COMMIT;",
                g = i % 4,
                h = (i + 1) % 4,
            ),
        )
        .await;
        // Position deletes only (none by equality, even on format v2): pyiceberg reads both.
        for t in [&a, &m] {
            let (code, out) = p.lakecheck(t, 90, &["--reader", "pyiceberg"]).await;
            assert_eq!(code, Some(0), "pyiceberg reads {t} otherwise:\n{out}");
        }
    }
    for t in [&a, &m] {
        p.assert_equal_by_spark(t).await;
        let seen = layout(&p, t);
        eprintln!("layout of {t}: {seen}");
        assert!(seen["partitions"].as_u64().unwrap_or(0) >= 4, "{seen}");
    }
    p.sigterm_and_wait(Duration::from_secs(60)).await;
}

/// Issue 36: a format v2 table created partitioned (by Spark, before cdcd's first start) has no
/// spec without fields; cdcd's first equality deletes add one (not as the default) and go under
/// it, so they delete rows in every partition, also rows that moved partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equality_deletes_on_a_table_created_partitioned_apply_in_every_partition() {
    let test = "equality_deletes_on_a_table_created_partitioned_apply_in_every_partition";
    let env = ground_or_skip!(test_env(test));
    let spark = ground_or_skip!(spark(test));
    let (mut p, client, t) = created_partitioned_by_spark(
        &env,
        &spark,
        &unique("ptcr"),
        create,
        "days(created_at), bucket(4, id)",
    )
    .await;
    let copied = layout(&p, &t);
    eprintln!("layout after the copy: {copied}");
    assert!(copied["partitions"].as_u64().unwrap_or(0) >= 10, "{copied}");
    for round in 1..=2 {
        let lsn = change(&client, &t, &moving(&t, round), -round).await;
        equal(&mut p, &t, true, lsn).await;
    }
    let seen = layout(&p, &t);
    eprintln!("layout after streaming: {seen}");
    assert!(seen["equality_files"].as_u64().unwrap_or(0) > 0, "{seen}");
    assert_eq!(seen["default_spec"], copied["default_spec"], "{seen}");
    assert_eq!(seen["specs"].as_array().map(Vec::len), Some(2), "{seen}");
    p.sigterm_and_wait(Duration::from_secs(60)).await;
}

/// Issue 36, deletion vectors (format v3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spark_partitions_the_table_and_cdcd_stays_exact_with_vectors() {
    partitioned_by_spark(
        "spark_partitions_the_table_and_cdcd_stays_exact_with_vectors",
        "ptdv",
        false,
    )
    .await;
}

/// Issue 36, equality deletes (format v2): they go under a spec without fields, so they apply to
/// the deleted row in any partition of any spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spark_partitions_the_table_and_cdcd_stays_exact_with_equality_deletes() {
    partitioned_by_spark(
        "spark_partitions_the_table_and_cdcd_stays_exact_with_equality_deletes",
        "pteq",
        true,
    )
    .await;
}

/// Issue 36, maintenance after partition evolution: Spark partitions the table cdcd copied
/// (`bucket(4, id)`), cdcd streams into that spec, Spark evolves it again (`days(created_at)`
/// added, `WRITE ORDERED BY n`), cdcd updates and deletes rows of both older specs' files; then
/// one `cdcd maintain` rewrites every data file of an older spec into the current spec, sorted:
/// no live data file of an older spec or without the sort order is left, and Spark and
/// pyiceberg read the source's rows, before and after more streaming.
async fn compaction_moves_old_spec_files(test: &str, tag: &str, equality: bool) {
    let extra = "maintenance_interval_ms = 0\n";
    let (mut p, client, t, spark) = ground_or_skip!(copied(test, tag, equality, extra).await);
    let table = format!("h.{NAMESPACE}.{t}");
    run_spark(
        &spark,
        &p,
        &[format!(
            "ALTER TABLE {table} ADD PARTITION FIELD bucket(4, id)"
        )],
    );
    stream(&mut p, &client, &t, equality, 1..=1).await;
    run_spark(
        &spark,
        &p,
        &[
            format!("ALTER TABLE {table} ADD PARTITION FIELD days(created_at)"),
            format!("ALTER TABLE {table} WRITE ORDERED BY n"),
        ],
    );
    stream(&mut p, &client, &t, equality, 2..=3).await;
    let seen = layout(&p, &t);
    eprintln!("layout before cdcd's compaction: {seen}");
    assert!(seen["old_spec_files"].as_u64().unwrap_or(0) >= 2, "{seen}");
    p.sigterm_and_wait(Duration::from_secs(60)).await;

    let (text, seen) = compacted_by_cdcd(&p, &t);
    assert_eq!(seen["old_spec_files"], 0, "{text}\n{seen}");
    assert_eq!(seen["unsorted_files"], 0, "{text}\n{seen}");
    assert_eq!(seen["default_spec"], 2, "{seen}");
    equal(&mut p, &t, equality, 0).await;
    // Updates and deletes of the moved rows find them (the index followed the rewrite).
    p.start();
    stream(&mut p, &client, &t, equality, 4..=5).await;
    layout(&p, &t);
    p.sigterm_and_wait(Duration::from_secs(60)).await;
}

/// Issue 36, [`compaction_moves_old_spec_files`] with deletion vectors (format v3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdcd_compaction_moves_old_spec_files_into_the_spec_spark_evolved() {
    compaction_moves_old_spec_files(
        "cdcd_compaction_moves_old_spec_files_into_the_spec_spark_evolved",
        "ptrespec",
        false,
    )
    .await;
}

/// Issue 36, [`compaction_moves_old_spec_files`] with equality deletes (format v2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdcd_compaction_moves_old_spec_files_into_the_spec_spark_evolved_v2() {
    compaction_moves_old_spec_files(
        "cdcd_compaction_moves_old_spec_files_into_the_spec_spark_evolved_v2",
        "ptrespec2",
        true,
    )
    .await;
}
