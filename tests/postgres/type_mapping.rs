//! Issue 39's opt-in type mappings (`json = "variant"`, `spatial = "geometry"`), the parts their
//! tests share: a table that opts in beside one that does not, through the initial copy, the
//! stream and a kill -9 ([`OptIn`]); a table the setting cannot apply to, refused at start
//! ([`assert_refused_at_start`]); and a mapping change of an existing table, refused
//! ([`assert_mapping_change_refused`]).

use std::time::Duration;

use tokio_postgres::Client;

use crate::support::{
    connect, current_fields, current_metadata, exec, test_env_and_name, Pipeline, Settings,
};

/// A running pipeline of `t` (with the setting) and `o` (without), both made by the same SQL.
pub(crate) struct OptIn {
    pub p: Pipeline,
    pub client: Client,
    pub t: String,
    pub o: String,
}

impl OptIn {
    /// Runs `before`, creates `t` and `o` with `create`, starts with `setting` on `t` (and
    /// compaction every 200 ms when `compact`) and checks the initial copy: equal, format v3, the
    /// columns `"<name> <type>"` as `types`.
    pub async fn copy(
        tag: &str,
        before: &str,
        create: fn(&str) -> String,
        (setting, compact): (&str, bool),
        types: &[&str],
    ) -> Option<OptIn> {
        let (env, name) = test_env_and_name(tag)?;
        let (t, o) = (format!("{name}_t"), format!("{name}_o"));
        let client = connect(&env.pg_url).await;
        exec(&client, before).await;
        exec(&client, &create(&t)).await;
        exec(&client, &create(&o)).await;
        let settings = Settings {
            sink_extra: format!("[sink.tables.\"public.{t}\"]\n{setting}\n"),
            ..Settings::default()
        };
        let mut p = Pipeline::owning_tables(&env, &name, &[&t, &o], &settings);
        if compact {
            p.compact_often();
        }
        p.start();
        p.assert_equal(&t, 120).await;
        let meta = current_metadata(&p.table_dir(&t));
        assert_eq!(meta["format-version"], 3, "{meta}");
        let got: Vec<String> = current_fields(&meta)
            .into_iter()
            .map(|(name, _, ty)| format!("{name} {ty}"))
            .collect();
        assert_eq!(got, types, "{meta}");
        Some(OptIn { p, client, t, o })
    }

    /// Four rounds of `changes` on `t`: checked equal after the first, kill -9 while the second
    /// streams, the third written while cdcd is down, checked equal after the fourth.
    pub async fn stream_and_kill(&mut self, changes: fn(&str, u32) -> String) {
        let (p, t) = (&mut self.p, &self.t);
        exec(&self.client, &changes(t, 1)).await;
        p.assert_equal(t, 120).await;
        exec(&self.client, &changes(t, 2)).await;
        tokio::time::sleep(Duration::from_millis(150)).await;
        p.kill9();
        exec(&self.client, &changes(t, 3)).await;
        p.start();
        exec(&self.client, &changes(t, 4)).await;
        p.assert_equal(t, 120).await;
    }

    /// The table that does not opt in has no `kept_out` type and is still read by pyiceberg and
    /// Spark (where the test bed has it); then cdcd stops.
    pub async fn plain_table_still_read(mut self, kept_out: &str) {
        let (p, o) = (&mut self.p, &self.o);
        let other = current_metadata(&p.table_dir(o));
        assert!(!other.to_string().contains(kept_out), "{other}");
        p.assert_equal(o, 120).await;
        let (code, out) = p.lakecheck(o, 60, &["--reader", "pyiceberg"]).await;
        assert_eq!(code, Some(0), "pyiceberg reads the plain table:\n{out}");
        p.assert_equal_by_spark(o).await;
        p.sigterm_and_wait(Duration::from_secs(60)).await;
    }
}

/// A table `(id int8 PRIMARY KEY, <column>)` replicated without a mapping setting, then with
/// `setting` (`[sink.tables."…"]`) from its next change (the column's `values`, one per start):
/// refused with `refusal` and the reason (a resync), the table left as it is (no `kept_out`).
pub(crate) async fn assert_mapping_change_refused(
    tag: &str,
    before: &str,
    column: &str,
    values: &[&str; 2],
    setting: &str,
    refusal: &str,
    kept_out: &str,
) {
    let (env, name) = ground_or_skip!(test_env_and_name(tag));
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(
        &client,
        &format!(
            "{before} DROP TABLE IF EXISTS {t}; CREATE TABLE {t} (id int8 PRIMARY KEY, {column});
             INSERT INTO {t} VALUES (1, {})",
            values[0]
        ),
    )
    .await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &Settings::default());
    p.start();
    p.assert_equal(&t, 120).await;
    p.restart_with_table_settings(&t, &format!("{setting}\n"))
        .await;
    exec(
        &client,
        &format!("INSERT INTO {t} VALUES (2, {})", values[1]),
    )
    .await;
    let out = p
        .assert_stops(Duration::from_secs(120), "cdcd must stop")
        .await;
    assert!(out.contains(refusal) && out.contains("resync"), "{out}");
    let meta = current_metadata(&p.table_dir(&t));
    assert!(
        !meta.to_string().contains(kept_out),
        "the table is not rewritten: {meta}"
    );
}

/// A table made by `create` (given its name) with `setting`: cdcd stops before writing anything,
/// with a message containing every one of `reasons`.
pub(crate) async fn assert_refused_at_start(
    tag: &str,
    create: impl Fn(&str) -> String,
    setting: &str,
    reasons: &[&str],
) {
    let (env, name) = ground_or_skip!(test_env_and_name(tag));
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(&client, &create(&t)).await;
    let settings = Settings {
        sink_extra: format!("[sink.tables.\"public.{t}\"]\n{setting}\n"),
        ..Settings::default()
    };
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &settings);
    p.start();
    let out = p
        .assert_stops(Duration::from_secs(120), "cdcd must stop")
        .await;
    assert!(reasons.iter().all(|r| out.contains(r)), "{out}");
    assert_eq!(p.metadata_versions(&t), 0, "nothing is written");
}

/// The JSON object a test's Python inspection prints on its last line of `out`.
pub(crate) fn last_json(out: &str) -> serde_json::Value {
    let last = out.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The ids `sql` selects on the source.
pub(crate) async fn source_ids(client: &Client, sql: &str) -> Vec<i64> {
    let rows = client.query(sql, &[]).await.unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

/// Runs a DuckDB query on a table directory (`lake` names the table) and reads the bounds of
/// one field in its live data files' manifest entries and the names in their Parquet schemas:
/// `{"ids": [...], "bounds": [[lower length, upper length, rows], ...], "schemas": [[rows,
/// [name, ...]], ...]}`. DuckDB's avro reader reads the manifests (pyiceberg 0.12 cannot load a
/// table with a variant or geometry column).
pub(crate) const INSPECT: &str = r#"
import json, os, re, sys
sys.path.insert(0, os.environ["LAKECHECK_DIR"])
import lakecheck
d, field_id, query = sys.argv[1], int(sys.argv[2]), sys.argv[3]
md = d + "/metadata"
n = max(int(m.group(1)) for x in os.listdir(md) if (m := re.fullmatch(r"v(\d+)\.metadata\.json", x)))
path = f"{md}/v{n}.metadata.json"
m = json.load(open(path))
con = lakecheck.duck()
con.execute("SET enable_progress_bar = false")   # a slow query would print one on stdout
ids = [r[0] for r in con.execute(query.replace("lake", "iceberg_scan('%s')" % path)).fetchall()]
snap = next(s for s in m["snapshots"] if s["snapshot-id"] == m["current-snapshot-id"])
strip = lambda p: p[len("file://"):] if p.startswith("file://") else p
bounds, schemas = [], []
for (mp,) in con.execute("select manifest_path from read_avro('%s')" % strip(snap["manifest-list"])).fetchall():
    for (df,) in con.execute("select data_file from read_avro('%s') where status != 2" % strip(mp)).fetchall():
        if df["content"] != 0:
            continue
        lo, hi = df["lower_bounds"] or {}, df["upper_bounds"] or {}
        bounds.append([len(lo.get(field_id, b"")), len(hi.get(field_id, b"")), df["record_count"]])
        names = con.execute("select name from parquet_schema('%s')" % strip(df["file_path"])).fetchall()
        schemas.append([df["record_count"], [r[0] for r in names]])
print(json.dumps({"ids": ids, "bounds": bounds, "schemas": schemas}))
"#;
