//! Issue 36: the initial copy of a partitioned table whose rows arrive in random partition order
//! (`created_at` unrelated to the key, so every copy batch touches every day). Each copy commit
//! writes one file per partition its rows touch, so the copy commits by bytes alone (the memory
//! budget's share), not every `snapshot_commit_rows` rows: the file count read from the metadata
//! (pyiceberg) is about one per partition, and the table equals the source (DuckDB, pyiceberg).
//! Under a tiny memory budget with a thousand partitions the copy commits often, stays within the
//! budget, and still equals the source. The kill -9 in the middle of a partitioned copy is
//! `snapshot.rs`'s. Compaction then merges each partition's small files however many
//! partitions share a cycle's budget, into few manifests.

use std::time::Duration;

use serde_json::Value;

use super::memory_budget::{peak_rss_kib, MARGIN_MIB};
use super::partitioned::layout_of;
use crate::support::{
    add_config_lines, append_config, connect, exec, stdout_then_stderr, test_env_and_name,
    tune_copy, wait_for, Pipeline, Settings,
};

/// A table of `rows` rows whose `created_at` falls on one of `days` days, unrelated to the key.
fn create_random_days(t: &str, rows: u64, days: u64) -> String {
    format!(
        "DROP TABLE IF EXISTS {t};
         CREATE TABLE {t} (id int8 PRIMARY KEY, created_at timestamptz NOT NULL, n int4, note text);
         INSERT INTO {t} SELECT g,
             timestamptz '2024-01-01 00:00+00' + ((g * 7919) % {days}) * interval '1 day'
               + (g % 86400) * interval '1 second',
             g, 'note ' || g
           FROM generate_series(1, {rows}) g;
         ANALYZE {t};"
    )
}

/// A pipeline copying a new [`create_random_days`] table partitioned by `day(created_at)`, in
/// chunks of 10,000 rows on two connections with `snapshot_commit_rows = 10000`, then
/// `configure`d; started, its copy finished. `None`: no test bed.
async fn copied(
    tag: &str,
    rows: u64,
    days: u64,
    configure: impl Fn(&Pipeline),
) -> Option<(Pipeline, String)> {
    let (env, name) = test_env_and_name(tag)?;
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_random_days(&t, rows, days)).await;
    let settings = Settings {
        // No compaction: the files counted are the copy's.
        sink_extra: "maintenance_interval_ms = 0\n[sink.tables.\"public.*\"]\npartition_by = [\"day(created_at)\"]\n".into(),
        ..Settings::default()
    };
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &settings);
    tune_copy(&p.config, 10_000, Some(2), Some(10_000));
    configure(&p);
    p.start();
    wait_for(
        &mut p,
        "the copy to finish",
        Duration::from_secs(600),
        |o| o.contains("initial copy finished"),
    )
    .await;
    Some((p, t))
}

/// Reads `t` back with pyiceberg: equal to the source, or the test fails.
async fn assert_equal_by_pyiceberg(p: &mut Pipeline, t: &str) {
    let (code, out) = p.lakecheck(t, 0, &["--reader", "pyiceberg"]).await;
    assert_eq!(code, Some(0), "pyiceberg reads otherwise:\n{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_order_partitioned_copy_writes_about_one_file_per_partition() {
    one_file_per_partition("pcopy", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_order_partitioned_copy_writes_about_one_file_per_partition_v2() {
    one_file_per_partition("pcopye", true).await;
}

/// The copy of 120,000 rows over 60 days (format v2 with equality deletes if `equality`).
async fn one_file_per_partition(tag: &str, equality: bool) {
    let (rows, days) = (120_000, 60);
    let v2 = |p: &Pipeline| {
        if equality {
            p.force_equality();
        }
    };
    let Some((mut p, t)) = copied(tag, rows, days, v2).await else {
        return;
    };
    p.assert_equal(&t, 120).await;
    assert_equal_by_pyiceberg(&mut p, &t).await;
    let layout: Value = layout_of(&p.env.python, &p.table_dir(&t));
    eprintln!(
        "{} metadata versions; layout {layout}",
        p.metadata_versions(&t)
    );
    assert_eq!(layout["partitions"], days, "{layout}");
    assert_eq!(layout["cdcd_replaces"], 0, "{layout}");
    // Every 10,000 rows a commit of 60 files (720 in all) before: now the rows commit together
    // (the last chunks' rows may commit apart when the copy ends).
    let files = layout["data_files"].as_u64().unwrap();
    assert!(
        files <= 2 * days,
        "{files} data files for {days} partitions: {layout}"
    );
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_copy_under_a_tiny_budget_stays_within_it() {
    const BUDGET_MIB: u64 = 16;
    let (rows, days) = (150_000, 1_000);
    let budget = |p: &Pipeline| {
        let line = format!("memory_budget = \"{BUDGET_MIB}MiB\"\n");
        add_config_lines(&p.config, "[pipeline]", &line);
    };
    let Some((mut p, t)) = copied("pcopyb", rows, days, budget).await else {
        return;
    };
    p.assert_equal(&t, 120).await;
    assert_equal_by_pyiceberg(&mut p, &t).await;
    let peak_mib = peak_rss_kib(p.pid()) / 1024;
    let versions = p.metadata_versions(&t);
    eprintln!("{versions} metadata versions, peak RSS {peak_mib} MiB");
    // 2 MiB of rows a commit (1/8 of the budget), well short of the table: the creation, two
    // commits or more.
    assert!(versions >= 3, "{versions} metadata versions");
    assert!(
        peak_mib <= BUDGET_MIB + MARGIN_MIB,
        "peak RSS {peak_mib} MiB over the budget {BUDGET_MIB} MiB + margin {MARGIN_MIB} MiB"
    );
    let layout: Value = layout_of(&p.env.python, &p.table_dir(&t));
    assert_eq!(layout["partitions"], days, "{layout}");
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0));
}

/// Issue 36: a copy over 40 days, then six streamed rounds each touching every day, so each
/// partition holds a copy file and six small ones. With a cycle's budget (64 KiB) far below the
/// table's small files, `cdcd maintain` took the table's smallest files across all partitions,
/// one or two per partition, under `min-input-files` in each, and rewrote nothing, cycle after
/// cycle; and each compaction rewrote every manifest it touched on its own, so the manifests
/// never became fewer. Now a cycle takes whole partitions and packs the manifests it rewrites:
/// within a few cycles each day holds at most two files (its copy file stays in its size tier),
/// the snapshot lists few manifests, and DuckDB and pyiceberg read the source's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_merges_many_partitions_within_a_small_budget_into_few_manifests() {
    let (rows, days) = (20_000, 40);
    let budget = |p: &Pipeline| {
        append_config(
            &p.config,
            "\n[sink.table_properties]\n\"cdcd.compaction.max-bytes-per-cycle\" = \"65536\"\n",
        );
    };
    let Some((mut p, t)) = copied("pcompact", rows, days, budget).await else {
        return;
    };
    let client = connect(&p.env.pg_url).await;
    for round in 0..6u64 {
        let first = rows + 1 + round * 2 * days;
        exec(
            &client,
            &format!(
                "INSERT INTO {t} SELECT g, timestamptz '2024-01-01 00:00+00'
                   + (g % {days}) * interval '1 day', g, 'streamed'
                 FROM generate_series({first}, {first} + 2 * {days} - 1) g"
            ),
        )
        .await;
        p.assert_equal(&t, 120).await;
    }
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0));
    let before: Value = layout_of(&p.env.python, &p.table_dir(&t));
    eprintln!("layout before compaction: {before}");
    assert!(
        before["data_files"].as_u64().unwrap() >= 6 * days,
        "{before}"
    );

    let mut rewrote = Vec::new();
    for _ in 0..20 {
        let out = super::maintenance::maintain(&p, &["--table", &format!("public.{t}")]);
        let text = stdout_then_stderr(&out);
        assert!(out.status.success(), "cdcd maintain:\n{text}");
        let files: u64 = text
            .split("rewrote ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no rewrite count in:\n{text}"));
        rewrote.push(files);
        if files == 0 {
            break;
        }
    }
    let after: Value = layout_of(&p.env.python, &p.table_dir(&t));
    eprintln!("files rewritten per cycle {rewrote:?}; layout after: {after}");
    assert!(
        rewrote[0] > 0,
        "the first cycle rewrote nothing: {rewrote:?}"
    );
    assert_eq!(rewrote.last(), Some(&0), "still rewriting: {rewrote:?}");
    assert_eq!(after["partitions"], days, "{after}");
    let files = after["data_files"].as_u64().unwrap();
    assert!(
        files <= 2 * days,
        "{files} data files for {days} days: {after}"
    );
    let manifests = after["manifests"].as_u64().unwrap();
    assert!(manifests <= 4, "{manifests} manifests: {after}");
    p.assert_equal(&t, 0).await;
    assert_equal_by_pyiceberg(&mut p, &t).await;
}
