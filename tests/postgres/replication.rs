//! End to end, Postgres → cdcd → Iceberg: every mapped type and every kind of change replicates, and the
//! initial snapshot copies the rows that existed before cdcd started.
//!
//! The oracle is `tests/support/lakecheck.py` reading the lake with DuckDB (see `common`). Needs the test
//! bed (`scripts/testbed.sh`); without `CDCD_TEST_PG` each test prints a note and passes.

use std::time::Duration;

use crate::support::{connect, exec, test_env_and_name, Pipeline, Settings};

/// Every type of cdcd's mapping (DESIGN "Type mapping"), NULL-able everywhere but the key.
fn create_types_table(table: &str, mood: &str) -> String {
    format!(
        "DROP TABLE IF EXISTS {table}; DROP TYPE IF EXISTS {mood};
         CREATE TYPE {mood} AS ENUM ('sad', 'ok', 'happy');
         CREATE TABLE {table} (
           id int8 PRIMARY KEY,
           b bool, i2 int2, i4 int4, i8 int8, f4 float4, f8 float8,
           n12 numeric(12,3), n numeric,
           t text, vc varchar(20), ch char(5), bin bytea,
           d date, tm time, ts timestamp, tz timestamptz,
           u uuid, j json, jb jsonb, iv interval,
           ia int4[], ta text[], mood {mood});
         -- out of line without compression: a > 2 KB value then really is a TOAST pointer, and an UPDATE
         -- that leaves it alone sends it as 'u' (unchanged) in pgoutput (protocol-logicalrep-message-formats).
         ALTER TABLE {table} ALTER COLUMN t SET STORAGE EXTERNAL;"
    )
}

/// Hand-picked rows: extremes, special floats, empty vs NULL, quoting, unicode, arrays with NULLs.
fn insert_edge_rows(t: &str) -> String {
    let mood = format!("{t}_mood");
    format!(
        r#"INSERT INTO {t} VALUES
 (1, true, -32768, -2147483648, -9223372036854775808, 1.5, 3.141592653589793, 123456789.123,
  1234567890.0123456789012345678901234567890, 'héllo ✓ "quoted" \ back
newline', 'varchar ünï', 'ab', '\x00ff10'::bytea, '1999-12-31', '23:59:59.999999',
  '2024-02-29 12:34:56.789012', '2024-02-29 12:34:56.789012+05:30', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
  '{{"a": [1, 2.5, null], "b": "x"}}', '{{"z": {{"y": true}}, "a": []}}', '1 year 2 mons 3 days 04:05:06.789',
  '{{1,NULL,-3}}', '{{"a","b,c","d\"e",NULL,""}}', 'happy'),
 (2, false, 32767, 2147483647, 9223372036854775807, 'NaN', '-Infinity', -0.001, 'NaN', '', '', '',
  '\x'::bytea, '2038-01-19', '00:00:00', '1970-01-01 00:00:00', '1970-01-01 00:00:00+00',
  '00000000-0000-0000-0000-000000000000', 'null', '"str"', '-1 days -02:00:00', '{{}}', '{{}}', 'sad'),
 (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL, NULL),
 (4, true, 0, 0, 0, '-0', 'Infinity', 0, '-123.4500', 'x', 'y', 'z', '\xdeadbeef'::bytea, '0001-01-01',
  '12:00:00.5', '1900-01-01 00:00:00', '2262-04-11 23:47:16.854775+00', 'FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF',
  '[1, "2", {{"3": 4}}]', '12.50', 'PT0S', '{{2147483647}}', '{{"ünï"}}', 'ok');
 -- generated rows with NULLs sprinkled by column
 INSERT INTO {t} (id, b, i2, i4, i8, f4, f8, n12, n, t, vc, ch, bin, d, tm, ts, tz, u, j, jb, iv, ia, ta, mood)
 SELECT g, g % 2 = 0, (g % 100)::int2, g * 7, g::int8 * 1000000007, g / 3.0, g / 7.0, g * 1.001,
        CASE WHEN g % 4 = 0 THEN NULL ELSE (g * 3.14159)::numeric END,
        CASE WHEN g % 5 = 0 THEN NULL ELSE 'text ' || g END, 'vc' || g, (g % 10)::text,
        decode(md5(g::text), 'hex'), date '2020-01-01' + g, time '08:00' + g * interval '1 minute',
        timestamp '2020-01-01' + g * interval '1 hour', timestamptz '2020-01-01 00:00+00' + g * interval '1 second',
        md5(g::text)::uuid, json_build_object('g', g), jsonb_build_array(g, 'x'),
        g * interval '1 day 1 hour', ARRAY[g, g + 1], ARRAY['t' || g],
        (ARRAY['sad', 'ok', 'happy'])[1 + g % 3]::{mood}
 FROM generate_series(100, 199) g;
 -- a TOASTed row: 400 md5 chunks = 12,800 bytes, stored out of line
 INSERT INTO {t} (id, i4, t, mood) VALUES
   (500, 1, (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 400) i), 'ok');"#,
    )
}

/// Updates (some columns, to NULL, of a row with an unchanged TOAST value), deletes, re-inserts, key
/// changes, several changes of one row in one transaction.
fn change_everything(t: &str) -> String {
    let one_transaction = one_row_changed_in_one_transaction(t);
    format!(
        "UPDATE {t} SET i4 = i4 + 1, vc = 'upd' WHERE id IN (1, 4);
         UPDATE {t} SET i4 = 42 WHERE id = 500;
         UPDATE {t} SET t = NULL, ia = NULL, mood = NULL, tz = NULL, jb = NULL, bin = NULL WHERE id = 1;
         UPDATE {t} SET b = NOT b, f8 = f8 * 2 WHERE id BETWEEN 100 AND 149;
         UPDATE {t} SET i2 = 1 WHERE id = 3;
         DELETE FROM {t} WHERE id IN (2, 150, 151);
         INSERT INTO {t} (id, t, mood, iv) VALUES (2, 'reborn', 'ok', '3 hours');
         UPDATE {t} SET id = 1004 WHERE id = 4;
         UPDATE {t} SET id = 1500, i2 = 7 WHERE id = 500;
         {one_transaction}"
    )
}

/// Several changes of one row in one transaction (an insert, an update, a delete, an insert again,
/// a key change) and a change of another row: the end of both sinks' `change_everything`.
pub(crate) fn one_row_changed_in_one_transaction(t: &str) -> String {
    format!(
        "BEGIN;
           INSERT INTO {t} (id, t) VALUES (600, 'first');
           UPDATE {t} SET t = 'second' WHERE id = 600;
           DELETE FROM {t} WHERE id = 600;
           INSERT INTO {t} (id, t, i4) VALUES (600, 'third', 3);
           UPDATE {t} SET id = 601 WHERE id = 600;
           UPDATE {t} SET i8 = -1 WHERE id = 1500;
         COMMIT;"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_type_and_every_change_replicates() {
    let (env, name) = ground_or_skip!(test_env_and_name("ev"));
    let (t, o) = (format!("{name}_types"), format!("{name}_other"));
    let client = connect(&env.pg_url).await;
    exec(&client, &create_types_table(&t, &format!("{t}_mood"))).await;
    exec(
        &client,
        &format!(
            "DROP TABLE IF EXISTS {o}; CREATE TABLE {o} (id int4 PRIMARY KEY, v text, at timestamptz)"
        ),
    )
    .await;
    let settings = Settings {
        snapshot: "never",
        ..Settings::default()
    };
    let mut p = Pipeline::new(&env, &name, &[&t, &o], &settings);
    p.on_cleanup(format!(
        "DROP TABLE IF EXISTS {t}, {o}; DROP TYPE IF EXISTS {t}_mood"
    ));
    p.start();
    // snapshot = "never": only changes after the slot exists are streamed.
    p.wait_slot_active(&client, Duration::from_secs(60)).await;

    exec(&client, &insert_edge_rows(&t)).await;
    exec(&client, &change_everything(&t)).await;
    // One 50,000-row transaction that also updates and deletes some of its own rows (several changes of
    // one key inside one commit of cdcd's).
    exec(
        &client,
        &format!(
            "BEGIN;
             INSERT INTO {t} (id, i4, t, f8, tz, ia, mood)
               SELECT 100000 + g, g, 'row ' || g, g * 0.5, timestamptz '2021-06-01 00:00+00' + g * interval '1 ms',
                      ARRAY[g], (ARRAY['sad', 'ok', 'happy'])[1 + g % 3]::{t}_mood
               FROM generate_series(1, 50000) g;
             UPDATE {t} SET t = t || ' upd' WHERE id > 100000 AND id % 7 = 0;
             DELETE FROM {t} WHERE id > 100000 AND id % 11 = 0;
             COMMIT;"
        ),
    )
    .await;
    // Two tables in one transaction.
    exec(
        &client,
        &format!(
            "BEGIN;
             INSERT INTO {o} SELECT g, 'o' || g, now() FROM generate_series(1, 100) g;
             UPDATE {t} SET vc = 'two-table' WHERE id = 1;
             DELETE FROM {o} WHERE id = 5;
             UPDATE {o} SET v = NULL WHERE id = 6;
             UPDATE {o} SET id = 1000 WHERE id = 7;
             COMMIT;"
        ),
    )
    .await;

    p.assert_equal(&t, 180).await;
    p.assert_equal(&o, 60).await;
    let pos = p.position_line(&t).await;
    assert!(
        pos.contains(&format!("cdcd.pipeline={name}")),
        "checkpoint keys: {pos}"
    );
    p.assert_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_snapshot_copies_existing_rows() {
    let (env, name) = ground_or_skip!(test_env_and_name("snap"));
    let (a, b) = (format!("{name}_a"), format!("{name}_b"));
    let client = connect(&env.pg_url).await;
    exec(
        &client,
        &format!(
            "DROP TABLE IF EXISTS {a}, {b};
             CREATE TABLE {a} (id int8 PRIMARY KEY, v text, n numeric(10,2), at timestamptz, tags text[]);
             ALTER TABLE {a} ALTER COLUMN v SET STORAGE EXTERNAL;
             CREATE TABLE {b} (k1 int4, k2 text, payload jsonb, PRIMARY KEY (k1, k2));
             INSERT INTO {a} SELECT g, CASE WHEN g % 9 = 0 THEN NULL ELSE 'v' || g END, g / 3.0,
                    timestamptz '2022-01-01 00:00+00' + g * interval '1 minute', ARRAY['x', g::text]
               FROM generate_series(1, 20000) g;
             INSERT INTO {a} (id, v) VALUES (-1, (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 400) i));
             INSERT INTO {b} SELECT g % 100, 'k' || g, jsonb_build_object('g', g) FROM generate_series(1, 3000) g;"
        ),
    )
    .await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&a, &b], &Settings::default());
    p.start();
    // Changes while the snapshot may still be running: the hand-off from the copy to the stream must
    // neither lose nor double them.
    exec(
        &client,
        &format!(
            "UPDATE {a} SET v = 'changed early' WHERE id % 1000 = 0;
             DELETE FROM {b} WHERE k1 = 3;"
        ),
    )
    .await;
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    exec(
        &client,
        &format!(
            "INSERT INTO {a} SELECT g, 'late ' || g FROM generate_series(20001, 21000) g;
             UPDATE {a} SET n = NULL, tags = '{{}}' WHERE id BETWEEN 500 AND 600;
             UPDATE {a} SET id = 30000 WHERE id = 7;
             UPDATE {a} SET n = 1 WHERE id = -1;
             DELETE FROM {a} WHERE id BETWEEN 10000 AND 10100;
             UPDATE {b} SET payload = NULL WHERE k1 = 4;
             UPDATE {b} SET k2 = k2 || '!' WHERE k1 = 5;"
        ),
    )
    .await;
    p.assert_equal(&a, 180).await;
    p.assert_equal(&b, 60).await;
    p.assert_running();
}
