//! Issue 38: `deletes = "soft"` and `row_metadata = true` (docs/table-settings.md). A table with
//! soft deletes keeps each deleted row with `_cdc_deleted = true` and its last values (a delete
//! that carries only the key, of a row whose TOASTed value arrived unchanged, included); a key
//! inserted again is live again; a key change flags the old key's row and inserts the new key; a
//! table without a key keeps its deleted images flagged. A table without the settings keeps hard
//! deletes. `_cdc_commit_ts` and `_cdc_position` of every streamed row are those of the source
//! transaction that last wrote it, as Postgres's own `test_decoding` plugin reports them (commit
//! end LSN and commit time), through a kill -9 mid-stream. Read back by DuckDB and pyiceberg
//! (DuckDB only in the suite's `CDCD_TEST_DELETE_MODE=equality` pass).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::{connect, exec, fresh_table, run_cdcd, test_env, unique, Pipeline, Settings};

/// DuckDB, and pyiceberg unless the suite runs `CDCD_TEST_DELETE_MODE=equality` (pyiceberg reads
/// no equality deletes).
fn readers() -> Vec<&'static str> {
    match std::env::var("CDCD_TEST_DELETE_MODE") {
        Ok(mode) if mode == "equality" => vec!["duckdb"],
        _ => vec!["duckdb", "pyiceberg"],
    }
}

/// The rows of `table` as the reader (`duckdb` | `pyiceberg`) returns them, by `id`.
async fn rows(p: &mut Pipeline, table: &str, reader: &str) -> Vec<serde_json::Value> {
    let (code, out) = p.lakecheck(table, 0, &["--reader", reader, "--dump"]).await;
    assert!(code.is_some(), "lakecheck --dump {table}: {out}");
    let mut rows: Vec<serde_json::Value> = out
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    rows.sort_by_key(|r| (r["id"].as_i64(), r["_cdc_deleted"].as_bool()));
    rows
}

/// The one row of `id`; panics unless there is exactly one.
fn row(rows: &[serde_json::Value], id: i64) -> &serde_json::Value {
    let found: Vec<_> = rows.iter().filter(|r| r["id"] == id).collect();
    assert_eq!(found.len(), 1, "rows of id {id}: {found:?}");
    found[0]
}

/// A timestamp as text (`2026-12-06 01:52:20.708652+00`, Python's `…+00:00`) in microseconds.
fn micros(text: &str) -> i64 {
    chrono::DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f%#z")
        .unwrap_or_else(|e| panic!("{e}: {text}"))
        .timestamp_micros()
}

/// Per key of `table`, the commit end LSN and commit time of the transaction that last wrote it,
/// from the `test_decoding` slot `slot` (a key change writes both keys: the old one flagged).
async fn last_writes(
    client: &tokio_postgres::Client,
    slot: &str,
    table: &str,
) -> BTreeMap<i64, (String, i64)> {
    let lines = client
        .query(
            "SELECT lsn::text, data FROM pg_logical_slot_peek_changes($1, NULL, NULL, 'include-timestamp', '1')",
            &[&slot],
        )
        .await
        .unwrap();
    let prefix = format!("table public.{table}: ");
    let mut written = BTreeMap::new();
    let mut pending: Vec<i64> = Vec::new();
    for line in lines {
        let (lsn, data): (String, String) = (line.get(0), line.get(1));
        if let Some(change) = data.strip_prefix(&prefix) {
            // `id[bigint]:N` once, or twice for a key change (old-key, new-tuple).
            for part in change.split("id[bigint]:").skip(1) {
                let digits: String = part.chars().take_while(|c| c.is_ascii_digit()).collect();
                pending.push(digits.parse().unwrap());
            }
        } else if let Some(at) = data.split("(at ").nth(1) {
            let ts = micros(at.trim_end_matches(')'));
            for id in pending.drain(..) {
                written.insert(id, (lsn.clone(), ts));
            }
        }
    }
    written
}

/// Every streamed row's `_cdc_position` / `_cdc_commit_ts` is its last writer's.
fn assert_metadata(
    rows: &[serde_json::Value],
    written: &BTreeMap<i64, (String, i64)>,
    reader: &str,
) {
    assert!(!written.is_empty());
    for (id, (lsn, ts)) in written {
        let r = row(rows, *id);
        assert_eq!(
            r["_cdc_position"], *lsn,
            "{reader}: position of id {id}: {r}"
        );
        let got = r["_cdc_commit_ts"]
            .as_str()
            .unwrap_or_else(|| panic!("{reader}: no commit ts: {r}"));
        assert_eq!(micros(got), *ts, "{reader}: commit time of id {id}: {r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_deletes_keep_flagged_rows_and_row_metadata_is_the_sources() {
    let env = ground_or_skip!(test_env(
        "soft_deletes_keep_flagged_rows_and_row_metadata_is_the_sources"
    ));
    let name = unique("soft");
    let (s, h, k) = (
        format!("{name}_s"),
        format!("{name}_h"),
        format!("{name}_k"),
    );
    let slot = format!("{name}_td");
    let client = connect(&env.pg_url).await;
    exec(
        &client,
        &format!(
            "DROP TABLE IF EXISTS {s}, {h}, {k};
             CREATE TABLE {s} (id int8 PRIMARY KEY, name text, n int4, big text);
             ALTER TABLE {s} ALTER COLUMN big SET STORAGE EXTERNAL;
             CREATE TABLE {h} (id int8 PRIMARY KEY, name text);
             CREATE TABLE {k} (id int8, name text);
             ALTER TABLE {k} REPLICA IDENTITY FULL;
             INSERT INTO {s} SELECT g, 'n' || g, g, NULL FROM generate_series(1, 50) g;
             INSERT INTO {h} SELECT g, 'n' || g FROM generate_series(1, 50) g;
             INSERT INTO {k} VALUES (1, 'x'), (1, 'x'), (2, 'y'), (3, 'z');"
        ),
    )
    .await;
    let settings = Settings {
        sink_extra: format!(
            "[sink.tables.\"public.{s}\"]\ndeletes = \"soft\"\nrow_metadata = true\n\
             [sink.tables.\"public.{k}\"]\ndeletes = \"soft\"\n"
        ),
        ..Settings::default()
    };
    let mut p = Pipeline::owning_tables(&env, &name, &[&s, &h, &k], &settings);
    p.on_cleanup(format!(
        "SELECT pg_drop_replication_slot('{slot}') FROM pg_replication_slots WHERE slot_name = '{slot}'"
    ));

    let (ok, out) = run_cdcd(&["check"], &p.config);
    assert!(ok, "cdcd check:\n{out}");
    assert!(
        out.contains(&format!("table public.{s}:")) && out.contains("deletes soft, row_metadata"),
        "cdcd check shows the settings:\n{out}"
    );

    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    exec(
        &client,
        &format!("SELECT pg_create_logical_replication_slot('{slot}', 'test_decoding')"),
    )
    .await;
    // One transaction per statement (a multi-statement string would be one transaction).
    for sql in [
        format!("UPDATE {s} SET big = (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 300) i) WHERE id = 5"),
        // `big` arrives unchanged (TOAST): absent, completed from the row.
        format!("UPDATE {s} SET n = 77 WHERE id = 5"),
        format!("DELETE FROM {s} WHERE id IN (2, 5)"),
        format!("UPDATE {s} SET name = 'u1' WHERE id = 1"),
        format!("BEGIN; DELETE FROM {s} WHERE id = 3; INSERT INTO {s} VALUES (3, 'again', 3, NULL); COMMIT"),
        format!("DELETE FROM {s} WHERE id = 6"),
        format!("UPDATE {s} SET id = 104, n = 104 WHERE id = 4"),
        format!("DELETE FROM {h} WHERE id IN (2, 3)"),
        format!("UPDATE {h} SET id = 104 WHERE id = 4"),
        format!("DELETE FROM {k} WHERE id = 1"),
        format!("UPDATE {k} SET name = 'y2' WHERE id = 2"),
    ] {
        exec(&client, &sql).await;
    }
    // Later commits: a key deleted in an earlier commit comes back; one deleted now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    exec(
        &client,
        &format!("INSERT INTO {s} VALUES (6, 'back', 6, NULL)"),
    )
    .await;
    exec(&client, &format!("DELETE FROM {s} WHERE id = 7")).await;
    exec(&client, &format!("DELETE FROM {s} WHERE id = 104")).await;
    exec(
        &client,
        &format!("INSERT INTO {s} VALUES (104, 'new104', 1, NULL)"),
    )
    .await;

    // The live rows are the source's; the hard table has no flag and no deleted row.
    for reader in readers() {
        for t in [&s, &k] {
            let (code, out) = p.lakecheck(t, 120, &["--reader", reader, "--live"]).await;
            assert_eq!(code, Some(0), "lakecheck --live {t} ({reader}):\n{out}");
        }
        let (code, out) = p.lakecheck(&h, 120, &["--reader", reader]).await;
        assert_eq!(code, Some(0), "lakecheck {h} ({reader}):\n{out}");
        assert!(
            !out.contains("_cdc_"),
            "the hard table has cdcd's columns:\n{out}"
        );
    }

    let big_len = 300 * 32;
    let written = last_writes(&client, &slot, &s).await;
    for reader in readers() {
        let all = rows(&mut p, &s, reader).await;
        let flagged = |id: i64| row(&all, id)["_cdc_deleted"].clone();
        for (id, deleted) in [
            (1, false),
            (2, true),
            (3, false),
            (4, true),
            (5, true),
            (6, false),
            (7, true),
            (8, false),
            (104, false),
        ] {
            assert_eq!(
                flagged(id),
                deleted,
                "{reader}: _cdc_deleted of {id}: {}",
                row(&all, id)
            );
        }
        assert_eq!(
            row(&all, 2)["name"],
            "n2",
            "{reader}: a deleted row keeps its values"
        );
        assert_eq!(row(&all, 5)["n"], 77, "{reader}");
        assert_eq!(
            row(&all, 5)["big"].as_str().map(str::len),
            Some(big_len),
            "{reader}: the TOASTed value of a deleted row"
        );
        assert_eq!(
            row(&all, 4)["name"],
            "n4",
            "{reader}: the old key keeps its last values"
        );
        assert_eq!(row(&all, 4)["n"], 4, "{reader}");
        assert_eq!(row(&all, 3)["name"], "again", "{reader}");
        assert_eq!(row(&all, 6)["name"], "back", "{reader}");
        assert_eq!(row(&all, 104)["name"], "new104", "{reader}");
        assert_eq!(all.len(), 50 + 1, "{reader}: 50 keys and 104: {all:?}");
        assert_metadata(&all, &written, reader);

        let keyless = rows(&mut p, &k, reader).await;
        let flags: Vec<(i64, String, bool)> = keyless
            .iter()
            .map(|r| {
                (
                    r["id"].as_i64().unwrap(),
                    r["name"].as_str().unwrap().to_owned(),
                    r["_cdc_deleted"].as_bool().unwrap(),
                )
            })
            .collect::<Vec<_>>();
        let mut flags = flags;
        flags.sort();
        assert_eq!(
            flags,
            vec![
                (1, "x".into(), true),
                (1, "x".into(), true),
                (2, "y".into(), true),
                (2, "y2".into(), false),
                (3, "z".into(), false),
            ],
            "{reader}: a keyless table's deleted images stay flagged"
        );
    }

    // kill -9 with soft deletes and re-inserts in flight, more while cdcd is down: the restart
    // resumes exactly (no row flagged twice, none lost, the metadata of the last writer).
    for i in 10..20 {
        exec(&client, &format!("DELETE FROM {s} WHERE id = {i}")).await;
        if i % 2 == 0 {
            exec(
                &client,
                &format!("INSERT INTO {s} VALUES ({i}, 'r{i}', {i}, NULL)"),
            )
            .await;
        }
    }
    p.kill9();
    for i in 20..30 {
        exec(&client, &format!("DELETE FROM {s} WHERE id = {i}")).await;
        if i % 3 == 0 {
            exec(
                &client,
                &format!("INSERT INTO {s} VALUES ({i}, 'r{i}', {i}, NULL)"),
            )
            .await;
        }
    }
    exec(&client, &format!("UPDATE {s} SET id = 204 WHERE id = 40")).await;
    p.start();
    let written = last_writes(&client, &slot, &s).await;
    for reader in readers() {
        let (code, out) = p.lakecheck(&s, 120, &["--reader", reader, "--live"]).await;
        assert_eq!(
            code,
            Some(0),
            "lakecheck --live {s} after kill -9 ({reader}):\n{out}"
        );
        let all = rows(&mut p, &s, reader).await;
        for i in 10..30 {
            let back = (i < 20 && i % 2 == 0) || (i >= 20 && i % 3 == 0);
            assert_eq!(
                row(&all, i)["_cdc_deleted"],
                !back,
                "{reader}: {}",
                row(&all, i)
            );
        }
        assert_eq!(row(&all, 40)["_cdc_deleted"], true, "{reader}");
        assert_eq!(row(&all, 204)["_cdc_deleted"], false, "{reader}");
        assert_eq!(all.len(), 50 + 2, "{reader}: {all:?}");
        assert_metadata(&all, &written, reader);
    }
    p.assert_running();
}

/// `deletes = "soft"` added to an existing table is a schema change (the column is added, rows
/// from before read false); a column the source adds afterwards comes after it; removing the
/// setting is refused with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_deletes_added_to_an_existing_table_then_a_source_column() {
    let env = ground_or_skip!(test_env(
        "soft_deletes_added_to_an_existing_table_then_a_source_column"
    ));
    let name = unique("softadd");
    let t = format!("{name}_t");
    let client = fresh_table(&env, &t, |t| {
        format!(
            "CREATE TABLE {t} (id int8 PRIMARY KEY, name text);
             INSERT INTO {t} SELECT g, 'n' || g FROM generate_series(1, 20) g;"
        )
    })
    .await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &Settings::default());
    p.start();
    p.assert_equal(&t, 120).await;
    p.restart_with_table_settings(&t, "deletes = \"soft\"\n")
        .await;
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    exec(&client, &format!("DELETE FROM {t} WHERE id = 2")).await;
    exec(&client, &format!("ALTER TABLE {t} ADD COLUMN extra int4")).await;
    exec(&client, &format!("INSERT INTO {t} VALUES (100, 'n100', 7)")).await;
    exec(&client, &format!("DELETE FROM {t} WHERE id = 3")).await;
    for reader in readers() {
        let (code, out) = p.lakecheck(&t, 120, &["--reader", reader, "--live"]).await;
        assert_eq!(code, Some(0), "lakecheck --live ({reader}):\n{out}");
        let all = rows(&mut p, &t, reader).await;
        assert_eq!(all.len(), 21, "{reader}: {all:?}");
        // v3 stores the column's initial default (false); v2 cannot, so such rows read NULL.
        let before = if readers().len() == 1 {
            serde_json::Value::Null
        } else {
            false.into()
        };
        assert_eq!(
            row(&all, 1)["_cdc_deleted"],
            before,
            "{reader}: a row from before the setting: {}",
            row(&all, 1)
        );
        assert_eq!(row(&all, 2)["_cdc_deleted"], true, "{reader}");
        assert_eq!(row(&all, 3)["_cdc_deleted"], true, "{reader}");
        assert_eq!(row(&all, 100)["extra"], 7, "{reader}");
    }
    let meta = crate::support::current_metadata(&p.table_dir(&t));
    let names: Vec<String> = crate::support::current_fields(&meta)
        .into_iter()
        .map(|(n, _, _)| n)
        .collect();
    assert_eq!(names, ["id", "name", "_cdc_deleted", "extra"], "{meta}");
    p.sigterm_and_wait(Duration::from_secs(60)).await;

    // Without the setting the flagged rows would read as live: refused, saying so.
    p.write_config(&Settings::default());
    p.start();
    exec(&client, &format!("DELETE FROM {t} WHERE id = 4")).await;
    p.assert_stops(Duration::from_secs(120), "cdcd dropped _cdc_deleted")
        .await;
    assert!(
        p.output().contains("no longer ask for") && p.output().contains("resync"),
        "{}",
        p.output()
    );
}
