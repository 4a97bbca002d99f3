//! End to end, `source.schema_change = "resync"` (issue 34, part 5): a schema change the lake
//! table cannot express is no outage. cdcd copies that table again online by itself while the
//! other table streams on, and both end equal to the source (lakecheck's independent readers:
//! DuckDB on Iceberg, pypaimon on Paimon).
//!
//! Each test changes table `a` in a way its lake table cannot store, while a writer keeps
//! changing table `b` (and `a` goes on changing under its new shape), and proves:
//! - cdcd never exits: the change is logged as a resync, `cdcd_schema_resyncs_total{table}` says
//!   1, and the resync finishes;
//! - `b` took commits between the change and the end of `a`'s resync (it streamed on);
//! - both tables end equal, so `a`'s changes from the changing transaction on are in it exactly
//!   once, and the changing transaction's rows of `b` too;
//! - the swap was one commit and never took `a` back.
//!
//! The changes: `ADD COLUMN … DEFAULT` on the LSM (Paimon) sink and on a format v2 Iceberg table
//! (`delete_mode = "equality"`), `int4 → text`, and a rename without the DDL trigger inside a
//! transaction that writes the table before and after it (and `b` too). Under the default
//! `"evolve"`, that last one still stops, and its message names every way out; the setting named
//! there is one.

use std::time::Duration;

use crate::ops::metrics::{free_port, get, sample};
use crate::postgres::resync::{assert_swapped, create_table, wait_for, writes, Writers};
use crate::support::{
    connect, current_metadata, exec, start_output, test_env, unique, Pipeline, Settings, TestEnv,
};

/// What a test changes in table `a`.
struct Change {
    /// The statements (`{a}` and `{b}` stand for the tables).
    sql: &'static str,
    /// A [`writes`] transaction on `a` rewritten for its new shape.
    adapt: fn(String) -> String,
}

/// `ADD COLUMN … DEFAULT` that older rows must read (neither Paimon nor Iceberg v2 can say so).
const ADDED_DEFAULT: Change = Change {
    sql: "ALTER TABLE {a} ADD COLUMN d int4 NOT NULL DEFAULT 7;
          UPDATE {a} SET d = 8, v = v + 1 WHERE id % 9 = 0;
          INSERT INTO {b} VALUES (900001, 1, 1, 'after');",
    adapt: |w| w,
};

/// A type change no format widens.
const INT_TO_TEXT: Change = Change {
    sql: "ALTER TABLE {a} ALTER COLUMN v TYPE text USING 'v' || v::text;
          UPDATE {a} SET v = v || '!' WHERE id % 7 = 0;
          INSERT INTO {b} VALUES (900001, 1, 1, 'after');",
    adapt: |w| w.replace("v = v + 1", "v = v || '+'"),
};

/// A rename without the DDL trigger (pgoutput shows `t` dropped and `t2` added), inside a
/// transaction that writes `a` before and after it, and `b`.
const RENAME_INSIDE_A_TRANSACTION: Change = Change {
    sql: "BEGIN;
          UPDATE {a} SET v = v + 1 WHERE id % 5 = 0;
          INSERT INTO {b} VALUES (900001, 1, 1, 'in the transaction');
          ALTER TABLE {a} RENAME COLUMN t TO t2;
          UPDATE {a} SET t2 = t2 || '!' WHERE id % 7 = 0;
          INSERT INTO {a} VALUES (900002, 2, 2, 'after the rename');
          INSERT INTO {b} VALUES (900003, 3, 3, 'after the rename');
          COMMIT;",
    adapt: |w| w.replace("t = t ||", "t2 = t2 ||"),
};

/// Which sink `a` and `b` go to.
#[derive(Clone, Copy)]
enum Sink {
    /// The Iceberg sink as the suite runs it (v3 unless `CDCD_TEST_DELETE_MODE` says otherwise).
    Iceberg,
    /// Iceberg format v2 (`delete_mode = "equality"`).
    IcebergV2,
    Lsm,
}

/// A pipeline over `a` (3,000 rows) and `b` (20,000 rows) with `schema_change` and `[metrics]`
/// on `port`.
async fn pipeline(env: &TestEnv, prefix: &str, sink: Sink, schema_change: &str, port: u16) -> (Pipeline, String, String) {
    let name = unique(prefix);
    let (a, b) = (format!("{name}_a"), format!("{name}_b"));
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&a, 3_000)).await;
    exec(&client, &create_table(&b, 20_000)).await;
    let equality_pass = std::env::var("CDCD_TEST_DELETE_MODE").is_ok_and(|m| m == "equality");
    let settings = Settings {
        source_extra: format!("schema_change = {schema_change:?}"),
        sink_extra: match sink {
            Sink::IcebergV2 if !equality_pass => "delete_mode = \"equality\"\n".to_owned(),
            _ => String::new(),
        },
        ..Settings::default()
    };
    let mut p = match sink {
        Sink::Lsm => Pipeline::new_lsm(env, &name, &[&a, &b], &settings, 2),
        Sink::Iceberg | Sink::IcebergV2 => Pipeline::new(env, &name, &[&a, &b], &settings),
    };
    p.on_cleanup(format!("DROP TABLE IF EXISTS {a}, {b}"));
    let text = std::fs::read_to_string(&p.config).unwrap();
    std::fs::write(
        &p.config,
        format!("{text}\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n"),
    )
    .unwrap();
    (p, a, b)
}

/// `change` on `a` under `schema_change = "resync"`: see the module doc.
async fn resynced_while_the_other_streams(env: &TestEnv, prefix: &str, sink: Sink, change: Change) {
    let port = free_port();
    let (mut p, a, b) = pipeline(env, prefix, sink, "resync", port).await;
    let client = connect(&env.pg_url).await;
    p.start();
    p.assert_equal(&a, 120).await;
    p.assert_equal(&b, 120).await;

    let writers = Writers::start(&env.pg_url, [(&b, 20_000)]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    exec(&client, &change.sql.replace("{a}", &a).replace("{b}", &b)).await;
    // `a` goes on changing under its new shape, while it is copied and after.
    for round in 1..=3 {
        exec(&client, &(change.adapt)(writes(&a, round, 3_000))).await;
    }
    wait_for(
        &mut p,
        "the resync of the changed table to finish",
        Duration::from_secs(240),
        |o| o.contains("resync finished"),
    )
    .await;
    exec(&client, &(change.adapt)(writes(&a, 4, 3_000))).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let rounds = writers.stop().await;
    eprintln!("{rounds:?} write transactions to b");

    let out = start_output(&p.output(), 1);
    let table_a = format!("table=public.{a}");
    let started = out
        .lines()
        .position(|l| l.contains("copies the table again, online") && l.contains(&table_a))
        .unwrap_or_else(|| panic!("no log line says that {a} is resynced:\n{out}"));
    eprintln!("{}", out.lines().nth(started).unwrap_or(""));
    let finished = out
        .lines()
        .position(|l| l.contains("resync finished") && l.contains(&table_a))
        .unwrap_or_else(|| panic!("no log line says that the resync of {a} finished:\n{out}"));
    let table_b = format!("table=public.{b} ");
    let b_commits = out
        .lines()
        .skip(started)
        .take(finished.saturating_sub(started))
        .filter(|l| l.contains(" committed") && l.contains(&table_b))
        .count();
    assert!(
        b_commits > 0,
        "{b} took no commit while {a} was resynced (lines {started}..{finished}):\n{out}"
    );
    let (_, metrics) = get(port, "/metrics").await.expect("no /metrics");
    assert_eq!(
        sample(&metrics, "cdcd_schema_resyncs_total", &format!("table=\"public.{a}\"")),
        Some(1.0),
        "cdcd_schema_resyncs_total of {a}:\n{metrics}"
    );

    p.assert_equal(&a, 240).await;
    p.assert_equal(&b, 240).await;
    assert_swapped(&p, &a, true);
    if let Sink::IcebergV2 = sink {
        let meta = current_metadata(&p.table_dir(&a));
        assert_eq!(meta["format-version"], 2, "{a} is not a format v2 table");
    }
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_added_default_on_the_lsm_sink_resyncs_the_table_alone() {
    let Some(env) = test_env("an_added_default_on_the_lsm_sink_resyncs_the_table_alone") else {
        return;
    };
    resynced_while_the_other_streams(&env, "scrld", Sink::Lsm, ADDED_DEFAULT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_added_default_on_format_v2_resyncs_the_table_alone() {
    let Some(env) = test_env("an_added_default_on_format_v2_resyncs_the_table_alone") else {
        return;
    };
    resynced_while_the_other_streams(&env, "scrvd", Sink::IcebergV2, ADDED_DEFAULT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_type_change_no_format_widens_resyncs_the_table_alone() {
    let Some(env) = test_env("a_type_change_no_format_widens_resyncs_the_table_alone") else {
        return;
    };
    resynced_while_the_other_streams(&env, "scrty", Sink::Iceberg, INT_TO_TEXT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_without_the_trigger_inside_a_transaction_resyncs_the_table_alone() {
    let Some(env) =
        test_env("a_rename_without_the_trigger_inside_a_transaction_resyncs_the_table_alone")
    else {
        return;
    };
    resynced_while_the_other_streams(&env, "scrrn", Sink::Iceberg, RENAME_INSIDE_A_TRANSACTION)
        .await;
}

/// Under the default `"evolve"` the same rename stops cdcd before its transaction, and the
/// message names the cause and every way out: the DDL trigger, `cdcd resync --table`, and the
/// setting. Taking the last one (the config changed, cdcd started again) ends equal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_under_evolve_names_every_way_out_and_the_setting_is_one() {
    let Some(env) = test_env("a_stop_under_evolve_names_every_way_out_and_the_setting_is_one")
    else {
        return;
    };
    let port = free_port();
    let (mut p, a, b) = pipeline(&env, "screv", Sink::Iceberg, "evolve", port).await;
    let client = connect(&env.pg_url).await;
    p.start();
    p.assert_equal(&a, 120).await;
    p.assert_equal(&b, 120).await;
    exec(&client, &writes(&b, 1, 20_000)).await;
    exec(
        &client,
        &RENAME_INSIDE_A_TRANSACTION
            .sql
            .replace("{a}", &a)
            .replace("{b}", &b),
    )
    .await;
    exec(&client, &writes(&b, 2, 20_000)).await;
    let status = p.wait_exit(Duration::from_secs(60)).await;
    assert!(!status.success(), "cdcd must stop on the rename, got {status}");
    let out = p.output();
    let stop = out
        .lines()
        .find(|l| l.contains(&format!("schema of public.{a} changed")))
        .unwrap_or_else(|| panic!("no stop names {a}:\n{out}"));
    for way_out in [
        "both before and after the change".to_owned(),
        "migrations/postgres/002_ddl_capture.sql".to_owned(),
        format!("cdcd resync --table public.{a}"),
        "source.schema_change = \"resync\"".to_owned(),
    ] {
        assert!(stop.contains(&way_out), "the stop does not name {way_out:?}:\n{stop}");
    }

    // The setting, for `a` only.
    let text = std::fs::read_to_string(&p.config).unwrap().replace(
        "schema_change = \"evolve\"",
        &format!("schema_change = {{ \"public.{a}\" = \"resync\", \"*\" = \"evolve\" }}"),
    );
    std::fs::write(&p.config, text).unwrap();
    p.wait_slot_inactive(&client, Duration::from_secs(30)).await;
    p.start();
    wait_for(
        &mut p,
        "the resync to finish",
        Duration::from_secs(240),
        |o| start_output(o, 2).contains("resync finished"),
    )
    .await;
    exec(
        &client,
        &(RENAME_INSIDE_A_TRANSACTION.adapt)(writes(&a, 1, 3_000)),
    )
    .await;
    exec(&client, &writes(&b, 3, 20_000)).await;
    p.assert_equal(&a, 240).await;
    p.assert_equal(&b, 240).await;
    assert_swapped(&p, &a, true);
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0));
}
