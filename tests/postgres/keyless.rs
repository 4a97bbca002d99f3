//! End to end, keyless Postgres tables as insert-only append tables (issue 23 stage 2):
//! `pgbench -i` then `pgbench -T` in a schema of their own, captured with `tables = ["<schema>.*"]`:
//! `pgbench_history` has no key and is replicated beside the keyed pgbench tables. The lake must
//! equal the source, the keyless table as a multiset (lakecheck compares whole rows when there is
//! no key), read by DuckDB (both delete modes through `CDCD_TEST_DELETE_MODE`) and pyiceberg.
//! Duplicate rows stay duplicates, a TRUNCATE empties the replica, the application's UPDATE and
//! DELETE on the keyless table still succeed (cdcd publishes it through an inserts-only
//! publication), and a kill -9 while pgbench runs resumes exactly.

use std::time::Duration;

use crate::support::table_files::assert_no_identifier_fields;
use crate::support::{
    connect, exec, fresh_table, run_cdcd, test_env, test_env_and_name, unique, Pipeline, Settings,
    NAMESPACE,
};

const TABLES: [&str; 4] = [
    "pgbench_accounts",
    "pgbench_branches",
    "pgbench_tellers",
    "pgbench_history",
];

/// Runs pgbench with `args` against the test bed's Postgres, its tables in `schema`.
async fn pgbench(url: &str, schema: &str, args: &[&str]) {
    let out = tokio::process::Command::new("pgbench")
        .args(args)
        .arg(url)
        .env("PGOPTIONS", format!("-c search_path={schema}"))
        .output()
        .await
        .unwrap_or_else(|e| panic!("run pgbench (install postgresql-client): {e}"));
    assert!(
        out.status.success(),
        "pgbench {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

case_tests!(pgbench_history_case:
    pgbench_history_replicates_as_an_append_table(false),
    /// The same on the `lsm` sink: `pgbench_history` is a Paimon append table (`bucket = -1`, no
    /// primary keys) read back by pypaimon as a multiset.
    pgbench_history_replicates_as_a_paimon_append_table(true),
);

async fn pgbench_history_case(test: &str, lsm: bool) {
    let env = ground_or_skip!(test_env(test));
    if lsm && std::env::var("CDCD_TEST_DELETE_MODE").is_ok_and(|m| m == "equality") {
        eprintln!("note: {test}: the delete mode is an Iceberg setting; the lsm case ran already");
        return;
    }
    let name = unique(if lsm { "keylessl" } else { "keyless" });
    let client = connect(&env.pg_url).await;
    exec(
        &client,
        &format!("DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name}"),
    )
    .await;
    pgbench(&env.pg_url, &name, &["-i", "-s", "1", "-q"]).await;
    // History rows for the copy, two of them equal.
    pgbench(&env.pg_url, &name, &["-T", "2", "-c", "2"]).await;
    let history = format!("{name}.pgbench_history");
    exec(
        &client,
        &format!(
            "INSERT INTO {history} VALUES (1, 1, 1, 5, '2026-01-01', NULL), (1, 1, 1, 5, '2026-01-01', NULL)"
        ),
    )
    .await;

    let settings = Settings::default();
    let mut p = if lsm {
        Pipeline::new_lsm(&env, &name, &[], &settings, 2)
    } else {
        Pipeline::new(&env, &name, &[], &settings)
    };
    p.tables = vec![format!("{name}.*")];
    p.write_config(&settings);
    p.on_cleanup(format!("DROP SCHEMA IF EXISTS {name} CASCADE"));

    let (ok, out) = run_cdcd(&["check"], &p.config);
    assert!(ok, "cdcd check:\n{out}");
    let line = format!("table {history}: no key");
    assert!(out.contains(&line), "cdcd check lacks {line:?}:\n{out}");

    p.start();
    p.wait_slot_active(&client, Duration::from_secs(180)).await;
    pgbench(&env.pg_url, &name, &["-T", "5", "-c", "2"]).await;
    // The application's UPDATE and DELETE on the keyless table succeed: it is in the
    // inserts-only publication, so Postgres needs no replica identity for them (and sends
    // nothing: these leave the rows as they were, so the replica stays equal).
    exec(
        &client,
        &format!(
            "UPDATE {history} SET delta = delta WHERE tid = 1;
             DELETE FROM {history} WHERE false;"
        ),
    )
    .await;
    let equality = std::env::var("CDCD_TEST_DELETE_MODE").is_ok_and(|m| m == "equality");
    for t in TABLES {
        let (code, out) = p.lakecheck_in(&name, t, 180, &[]).await;
        assert_eq!(code, Some(0), "lakecheck {name}.{t}:\n{out}");
        eprintln!("lakecheck {name}.{t}: {}", out.lines().last().unwrap_or(""));
    }
    if lsm {
        // A Paimon append table: no primary keys, unaware buckets.
        let schema_file = p
            .warehouse
            .join(format!("{NAMESPACE}.db/pgbench_history/schema/schema-0"));
        let text = std::fs::read_to_string(&schema_file).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(doc["primaryKeys"], serde_json::json!([]), "{text}");
        assert_eq!(doc["options"]["bucket"], "-1", "{text}");
    }
    // pyiceberg reads no equality deletes (the suite's equality pass).
    if !equality && !lsm {
        let (code, out) = p
            .lakecheck_in(&name, "pgbench_history", 60, &["--reader", "pyiceberg"])
            .await;
        assert_eq!(code, Some(0), "pyiceberg {history}:\n{out}");
    }
    if !lsm {
        // The Iceberg table of `pgbench_history` is an append table.
        assert_no_identifier_fields(&p.table_dir("pgbench_history"));
    }

    // kill -9 while pgbench writes, more while cdcd is down: the restart resumes exactly (the
    // checkpoint in the snapshot: no keyless row is lost or doubled).
    let url = env.pg_url.clone();
    let schema = name.clone();
    let bench = tokio::spawn(async move { pgbench(&url, &schema, &["-T", "4", "-c", "2"]).await });
    tokio::time::sleep(Duration::from_secs(2)).await;
    p.kill9();
    bench.await.unwrap();
    pgbench(&env.pg_url, &name, &["-T", "1", "-c", "1"]).await;
    p.start();
    for t in TABLES {
        let (code, out) = p.lakecheck_in(&name, t, 180, &[]).await;
        assert_eq!(code, Some(0), "lakecheck {name}.{t} after kill -9:\n{out}");
    }

    // TRUNCATE still reaches an append table.
    exec(
        &client,
        &format!(
            "TRUNCATE {history}; INSERT INTO {history} VALUES (2, 2, 2, 7, '2026-01-02', 'x'), (2, 2, 2, 7, '2026-01-02', 'x')"
        ),
    )
    .await;
    let (code, out) = p.lakecheck_in(&name, "pgbench_history", 120, &[]).await;
    assert_eq!(code, Some(0), "lakecheck {history} after TRUNCATE:\n{out}");
    p.assert_running();
}

/// A kill -9 in the middle of a keyless table's copy: the restart copies it again whole, at the
/// snapshot a temporary slot exports, and declares it complete at that slot's consistent point,
/// so the stream's replayed inserts from before it are skipped and later ones applied: the
/// multiset ends equal, with rows written while cdcd was down and during the second copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_mid_copy_of_a_keyless_table_is_copied_again_exactly() {
    let (env, name) = ground_or_skip!(test_env_and_name("keylessk"));
    let t = format!("{name}_t");
    let client = fresh_table(&env, &t, |t| {
        format!(
            "CREATE TABLE {t} (g int8, note text);
             INSERT INTO {t} SELECT g % 1000, repeat('x', 50) FROM generate_series(1, 400000) g;"
        )
    })
    .await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &Settings::default());
    // Several commits per copy, so a kill lands between two commits of the table's copy.
    let text = std::fs::read_to_string(&p.config).unwrap();
    let text = text.replacen(
        "[pipeline]\n",
        "[pipeline]\nsnapshot_commit_rows = 20000\n",
        1,
    );
    std::fs::write(&p.config, text).unwrap();

    p.start();
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    while p.output().matches("position=0/0").count() < 2 {
        assert!(std::time::Instant::now() < deadline, "no copy commits");
        p.assert_running();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !p.output().contains("initial copy finished"),
        "the copy ended before the kill; make the table bigger"
    );
    p.kill9();
    p.wait_slot_inactive(&client, Duration::from_secs(30)).await;
    exec(
        &client,
        &format!("INSERT INTO {t} VALUES (1, 'down'), (1, 'down')"),
    )
    .await;
    p.start();
    // Rows while the second copy runs: each lands in the copy or in the stream, never both.
    for k in 0..5 {
        exec(
            &client,
            &format!("INSERT INTO {t} VALUES ({k}, 'during'), ({k}, 'during')"),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    p.assert_equal(&t, 240).await;
    assert!(
        p.output()
            .contains("copying tables whole at a temporary slot's snapshot"),
        "{}",
        p.output()
    );
    exec(&client, &format!("INSERT INTO {t} VALUES (2, 'after')")).await;
    p.assert_equal(&t, 60).await;
}
