//! End to end, Postgres → cdcd → Apache Paimon (the LSM sink): every type the LSM sink maps and every
//! kind of change replicates; pypaimon 2.1 (via `tests/support/lakecheck.py --paimon`) reads the tables
//! equal to the source while cdcd streams and compacts in the background, and again after a full
//! compaction.
//!
//! Needs the test bed (`scripts/testbed.sh`); without `CDCD_TEST_PG` each test prints a note and passes.

use std::time::Duration;

use crate::postgres::replication::one_row_changed_in_one_transaction;
use crate::support::{connect, exec, test_env_and_name, Pipeline, Settings};
use cdcd::changelog::TableId;

/// The types the LSM sink stores (`time` is kept to milliseconds, as Paimon's TIME is, so the rows
/// use no finer times).
fn create_table(t: &str) -> String {
    format!(
        "DROP TABLE IF EXISTS {t};
         CREATE TABLE {t} (
           id int8 PRIMARY KEY,
           b bool, i2 int2, i4 int4, i8 int8, f4 float4, f8 float8,
           n12 numeric(12,3), n numeric, t text, vc varchar(20), bin bytea,
           d date, tm time, ts timestamp, tz timestamptz, u uuid, jb jsonb, iv interval,
           ia int4[], ta text[]);
         ALTER TABLE {t} ALTER COLUMN t SET STORAGE EXTERNAL;
         INSERT INTO {t} VALUES
          (1, true, -32768, -2147483648, -9223372036854775808, 1.5, 3.141592653589793, 123456789.123,
           1234567890.0123456789, 'héllo ✓ \"q\"', 'ünï', '\\x00ff10'::bytea, '1999-12-31', '23:59:59.999',
           '2024-02-29 12:34:56.789012', '2024-02-29 12:34:56.789012+05:30',
           'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{{\"a\": [1, null]}}', '1 year 2 mons',
           '{{1,NULL,-3}}', '{{\"a\",\"b,c\",NULL,\"\"}}'),
          (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
           NULL, NULL, NULL, NULL, '{{}}');
         INSERT INTO {t} (id, b, i4, f8, n12, t, vc, d, ts, tz, u)
         SELECT g, g % 2 = 0, g * 7, g / 7.0, g * 1.001, 'text ' || g, 'vc' || g, date '2020-01-01' + g,
                timestamp '2020-01-01' + g * interval '1 hour', timestamptz '2020-01-01 00:00+00' + g * interval '1 second',
                md5(g::text)::uuid
         FROM generate_series(100, 299) g;
         INSERT INTO {t} (id, i4, t) VALUES (500, 1, (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 400) i));"
    )
}

fn change_everything(t: &str) -> String {
    let one_transaction = one_row_changed_in_one_transaction(t);
    format!(
        "UPDATE {t} SET i4 = i4 + 1, vc = 'upd' WHERE id IN (1, 100);
         UPDATE {t} SET i4 = 42 WHERE id = 500;
         UPDATE {t} SET t = NULL, tz = NULL, jb = NULL, bin = NULL, ia = NULL WHERE id = 1;
         UPDATE {t} SET ia = ARRAY[id::int4, 2] WHERE id BETWEEN 200 AND 210;
         UPDATE {t} SET b = NOT b, f8 = f8 * 2 WHERE id BETWEEN 100 AND 149;
         DELETE FROM {t} WHERE id IN (2, 150, 151);
         INSERT INTO {t} (id, t, iv) VALUES (2, 'reborn', '3 hours');
         UPDATE {t} SET id = 1100 WHERE id = 101;
         UPDATE {t} SET id = 1500, i2 = 7 WHERE id = 500;
         {one_transaction}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_into_paimon_and_reads_equal_after_compaction() {
    let (env, name) = ground_or_skip!(test_env_and_name("lsm"));
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t)).await;
    let mut p = Pipeline::new_lsm(&env, &name, &[&t], &Settings::default(), 3);
    p.on_cleanup(format!("DROP TABLE IF EXISTS {t}"));
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    p.assert_equal(&t, 120).await;

    exec(&client, &change_everything(&t)).await;
    // Many small commits: level-0 runs pile up and the background compactor merges them.
    for i in 0..40 {
        exec(
            &client,
            &format!("UPDATE {t} SET i4 = coalesce(i4, 0) + 1, i2 = {i} WHERE id % 40 = {i}"),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    p.assert_equal(&t, 120).await;
    let position = p.position_line(&t).await;
    assert!(position.contains(&name), "{position}");
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "exit status after SIGTERM: {st}");

    p.assert_compacted(&t);

    // A full compaction (every bucket to one bottom run, deletes dropped), then read again.
    let sink = p.lsm_sink();
    let id = TableId::new("public", t.clone());
    let stats = sink.compact(&id, true).await.unwrap();
    eprintln!("full compaction: {stats:?}");
    let per_bucket = sink.files_per_bucket(&id).await.unwrap();
    assert!(per_bucket.values().all(|&n| n == 1), "{per_bucket:?}");
    p.assert_equal(&t, 0).await;
}
