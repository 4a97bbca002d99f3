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
//! `"evolve"`, that last one still stops, and its message names every way out; the setting and
//! `cdcd resync` named there each get past it. A `kill -9` after the request is written, and after
//! the copy, recovers equal.

use std::time::Duration;

use crate::ops::metrics::{free_port, get, sample};
use crate::postgres::resync::{assert_swapped, create_table, writes, Writers};
use crate::support::wait_for;
use crate::support::{
    connect, current_metadata, current_test, exec, start_output, test_env, unique, Pipeline,
    Settings, TestEnv,
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
async fn pipeline(
    env: &TestEnv,
    prefix: &str,
    sink: Sink,
    schema_change: &str,
    port: u16,
) -> (Pipeline, String, String) {
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
        sample(
            &metrics,
            "cdcd_schema_resyncs_total",
            &format!("table=\"public.{a}\"")
        ),
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
    let env = ground_or_skip!(test_env(
        "an_added_default_on_the_lsm_sink_resyncs_the_table_alone"
    ));
    resynced_while_the_other_streams(&env, "scrld", Sink::Lsm, ADDED_DEFAULT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_added_default_on_format_v2_resyncs_the_table_alone() {
    let env = ground_or_skip!(test_env(
        "an_added_default_on_format_v2_resyncs_the_table_alone"
    ));
    resynced_while_the_other_streams(&env, "scrvd", Sink::IcebergV2, ADDED_DEFAULT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_type_change_no_format_widens_resyncs_the_table_alone() {
    let env = ground_or_skip!(test_env(
        "a_type_change_no_format_widens_resyncs_the_table_alone"
    ));
    resynced_while_the_other_streams(&env, "scrty", Sink::Iceberg, INT_TO_TEXT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_without_the_trigger_inside_a_transaction_resyncs_the_table_alone() {
    let env = ground_or_skip!(test_env(&current_test()));
    resynced_while_the_other_streams(&env, "scrrn", Sink::Iceberg, RENAME_INSIDE_A_TRANSACTION)
        .await;
}

/// How a test gets past a stop.
#[derive(Clone, Copy, Debug)]
enum WayOut {
    /// `schema_change = "resync"` for the table, then a start.
    Setting,
    /// `cdcd resync --table` (still under `"evolve"`), then a start: the copy made at start
    /// meets the transaction's two shapes again, and its resync starts over online, past it.
    ResyncCommand,
}

/// Under the default `"evolve"` the rename inside a transaction stops cdcd before it, and the
/// message names the cause and every way out: the setting, `cdcd resync --table`, the DDL
/// trigger. Taking the setting ends equal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_under_evolve_names_every_way_out_and_the_setting_is_one() {
    let env = ground_or_skip!(test_env(&current_test()));
    stopped_then(&env, "screv", WayOut::Setting).await;
}

/// The same stop; `cdcd resync --table` is a way out too (the table is copied twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_under_evolve_and_the_resync_command_is_a_way_out() {
    let env = ground_or_skip!(test_env(
        "a_stop_under_evolve_and_the_resync_command_is_a_way_out"
    ));
    stopped_then(&env, "screc", WayOut::ResyncCommand).await;
}

async fn stopped_then(env: &TestEnv, prefix: &str, way_out: WayOut) {
    let port = free_port();
    let (mut p, a, b) = pipeline(env, prefix, Sink::Iceberg, "evolve", port).await;
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
    let out = p
        .assert_stops(Duration::from_secs(60), "cdcd must stop on the rename")
        .await;
    let stop = out
        .lines()
        .find(|l| l.contains(&format!("schema of public.{a} changed")))
        .unwrap_or_else(|| panic!("no stop names {a}:\n{out}"));
    for named in [
        "both before and after the change".to_owned(),
        "migrations/postgres/002_ddl_capture.sql".to_owned(),
        format!("cdcd resync --table public.{a}"),
        "source.schema_change = \"resync\"".to_owned(),
    ] {
        assert!(
            stop.contains(&named),
            "the stop does not name {named:?}:\n{stop}"
        );
    }

    match way_out {
        WayOut::Setting => {
            let text = std::fs::read_to_string(&p.config).unwrap().replace(
                "schema_change = \"evolve\"",
                &format!("schema_change = {{ \"public.{a}\" = \"resync\", \"*\" = \"evolve\" }}"),
            );
            std::fs::write(&p.config, text).unwrap();
        }
        WayOut::ResyncCommand => {
            let (ok, out) =
                crate::support::run_cdcd(&["resync", "--table", &format!("public.{a}")], &p.config);
            assert!(ok && out.contains("requested"), "{out}");
        }
    }
    p.wait_slot_inactive(&client, Duration::from_secs(30)).await;
    p.start();
    wait_for(
        &mut p,
        "the resync to finish",
        Duration::from_secs(240),
        |o| start_output(o, 2).contains("resync finished"),
    )
    .await;
    if let WayOut::ResyncCommand = way_out {
        let second = start_output(&p.output(), 2);
        assert!(
            second.contains("its resync starts over, copied again online past this change"),
            "the copy made at start did not start over past the transaction:\n{second}"
        );
    }
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

/// `kill -9` right after the resync request is durable (the table not parked yet), and right
/// after the online copy is complete (the pipeline not restarted to replay into it): each
/// restart finishes the resync online while `b` takes writes, and both end equal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_around_a_schema_resync_recover_equal() {
    let env = ground_or_skip!(test_env("crashes_around_a_schema_resync_recover_equal"));
    for (i, point) in ["schema-resync-requested", "resync-copied"]
        .into_iter()
        .enumerate()
    {
        let port = free_port();
        let (mut p, a, b) =
            pipeline(&env, &format!("scrx{i}"), Sink::Iceberg, "resync", port).await;
        let client = connect(&env.pg_url).await;
        p.env_vars.push(("CDCD_FAILPOINT".into(), point.to_owned()));
        p.start();
        p.assert_equal(&a, 120).await;
        p.assert_equal(&b, 120).await;
        let writers = Writers::start(&env.pg_url, [(&b, 20_000)]).await;
        exec(
            &client,
            &RENAME_INSIDE_A_TRANSACTION
                .sql
                .replace("{a}", &a)
                .replace("{b}", &b),
        )
        .await;
        exec(
            &client,
            &(RENAME_INSIDE_A_TRANSACTION.adapt)(writes(&a, 1, 3_000)),
        )
        .await;
        p.assert_aborts_at(Duration::from_secs(120), point).await;
        p.env_vars.retain(|(k, _)| k != "CDCD_FAILPOINT");
        p.wait_slot_inactive(&client, Duration::from_secs(30)).await;
        p.start();
        exec(
            &client,
            &(RENAME_INSIDE_A_TRANSACTION.adapt)(writes(&a, 2, 3_000)),
        )
        .await;
        wait_for(
            &mut p,
            "the resync to finish after the crash",
            Duration::from_secs(240),
            |o| start_output(o, 2).contains("resync finished"),
        )
        .await;
        let second = start_output(&p.output(), 2);
        assert!(
            !second.contains("before streaming resumes"),
            "{point}: the restart copied the table at start, not online:\n{second}"
        );
        exec(
            &client,
            &(RENAME_INSIDE_A_TRANSACTION.adapt)(writes(&a, 3, 3_000)),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let rounds = writers.stop().await;
        eprintln!("{point}: {rounds:?} write transactions to b");
        p.assert_equal(&a, 240).await;
        p.assert_equal(&b, 240).await;
        assert_swapped(&p, &a, true);
        let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
        assert_eq!(st.code(), Some(0));
    }
}
