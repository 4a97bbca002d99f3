//! Partitioned Paimon tables end to end (issue 36): Postgres → cdcd → a Paimon primary-key table
//! partitioned by a column outside the source's key (`region`), read back by pypaimon 2.1 through
//! lakecheck. Rows move between partitions by full updates, by updates that leave a TOASTed
//! column unchanged, and by key changes; deletes carry only the key; a kill -9 mid-stream and a
//! restart end equal. A partition column inside the key is refused with the reason.
//!
//! Needs the test bed (`scripts/testbed.sh`); without `CDCD_TEST_PG` each test prints a note and passes.

use std::time::Duration;

use object_store::ObjectStoreExt;

use crate::support::{
    append_table_settings, connect, exec, fresh_table, test_env, unique, Pipeline, Settings,
    NAMESPACE,
};

/// `[sink.tables."public.<t>"]` with `partition_by` appended to the pipeline's config.
fn partition_by(p: &Pipeline, t: &str, columns: &str) {
    append_table_settings(
        &p.config,
        &format!("public.{t}"),
        &format!("partition_by = [{columns}]\nbuckets = 2\n"),
    );
}

fn create_table(t: &str) -> String {
    format!(
        "DROP TABLE IF EXISTS {t};
         CREATE TABLE {t} (id int8 PRIMARY KEY, region text, d date, n int4, big text);
         ALTER TABLE {t} ALTER COLUMN big SET STORAGE EXTERNAL;
         INSERT INTO {t} (id, region, d, n)
         SELECT g, (ARRAY['eu', 'us', 'ap', NULL, 'south east'])[g % 5 + 1], date '2024-01-01' + g % 3, g
         FROM generate_series(1, 300) g;
         INSERT INTO {t} (id, region, n, big)
         VALUES (500, 'eu', 0, (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 400) i));"
    )
}

/// Updates that move rows across partitions, TOAST-unchanged ones among them, key changes and
/// key-only deletes.
fn move_rows(t: &str) -> String {
    format!(
        "UPDATE {t} SET region = 'us', n = n + 1000 WHERE region = 'eu' AND id % 3 = 0;
         UPDATE {t} SET region = NULL WHERE id IN (2, 3);
         UPDATE {t} SET region = 'ap' WHERE id = 500;
         UPDATE {t} SET n = 7 WHERE id = 500;
         DELETE FROM {t} WHERE id IN (4, 5, 6);
         UPDATE {t} SET id = 1100, region = 'eu' WHERE id = 101;
         UPDATE {t} SET id = 1200 WHERE id = 102;
         INSERT INTO {t} (id, region, n) VALUES (4, 'us', 4);
         BEGIN;
           UPDATE {t} SET region = 'eu' WHERE id = 7;
           UPDATE {t} SET region = 'us' WHERE id = 7;
           DELETE FROM {t} WHERE id = 8;
           INSERT INTO {t} (id, region) VALUES (8, 'zz');
           UPDATE {t} SET region = 'ap' WHERE id = 9;
           DELETE FROM {t} WHERE id = 9;
         COMMIT;"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_move_between_partitions_of_a_paimon_table_and_read_equal() {
    let env = ground_or_skip!(test_env(
        "rows_move_between_partitions_of_a_paimon_table_and_read_equal"
    ));
    let name = unique("lsmpart");
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t)).await;
    let mut p = Pipeline::new_lsm(&env, &name, &[&t], &Settings::default(), 2);
    partition_by(&p, &t, "\"region\"");
    p.on_cleanup(format!("DROP TABLE IF EXISTS {t}"));
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    p.assert_equal(&t, 120).await;

    // Paimon's layout: the schema's partition and primary keys, `<col>=<value>/bucket-<n>/`.
    let dir = p.warehouse.join(format!("{NAMESPACE}.db")).join(&t);
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("schema/schema-0")).unwrap())
            .unwrap();
    assert_eq!(schema["partitionKeys"], serde_json::json!(["region"]));
    assert_eq!(schema["primaryKeys"], serde_json::json!(["id", "region"]));
    for partition in [
        "region=eu",
        "region=us",
        "region=__DEFAULT_PARTITION__",
        "region=south east",
    ] {
        assert!(
            dir.join(partition).join("bucket-0").is_dir()
                || dir.join(partition).join("bucket-1").is_dir(),
            "no {partition}/bucket-N under {}",
            dir.display()
        );
    }

    exec(&client, &move_rows(&t)).await;
    p.assert_equal(&t, 120).await;

    // Many small commits moving rows back and forth: compaction runs per partition and bucket.
    for i in 0..20 {
        exec(
            &client,
            &format!(
                "UPDATE {t} SET region = (ARRAY['eu', 'us', 'ap'])[({i} + id) % 3 + 1], n = n + 1
                 WHERE id % 20 = {i}"
            ),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    p.assert_equal(&t, 120).await;
    p.assert_compacted(&t);

    // kill -9 while rows move, then a restart: equal.
    let writer = {
        let url = env.pg_url.clone();
        let t = t.clone();
        tokio::spawn(async move {
            let client = connect(&url).await;
            for i in 0..60 {
                exec(
                    &client,
                    &format!(
                        "UPDATE {t} SET region = (ARRAY['us', 'ap', 'eu'])[({i} + id) % 3 + 1]
                         WHERE id % 30 = {}",
                        i % 30
                    ),
                )
                .await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(600)).await;
    p.kill9();
    writer.await.unwrap();
    p.start();
    p.assert_equal(&t, 120).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "exit status after SIGTERM: {st}");

    // Expiry ran (snapshots_retained = 10) and deleted files by their partition directory:
    // every file a snapshot kept references is there, under its partition.
    let url = format!("file://{}", p.warehouse.display());
    let wh = cdcd::storage::Warehouse::from_url(&url).unwrap();
    let earliest = std::fs::read_to_string(dir.join("snapshot/EARLIEST")).unwrap();
    assert!(earliest.trim() != "1", "no snapshot expired");
    let files =
        cdcd::sinks::lsm::cleanup::referenced_files(&wh, &format!("{url}/{NAMESPACE}.db/{t}"))
            .await
            .unwrap();
    assert!(
        files.iter().any(|f| f.contains("/region=us/bucket-")),
        "{files:?}"
    );
    for f in &files {
        wh.store()
            .head(&object_store::path::Path::from(f.as_str()))
            .await
            .unwrap_or_else(|e| panic!("referenced file {f} is missing: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paimon_partition_column_inside_the_key_is_refused_with_the_reason() {
    let env = ground_or_skip!(test_env(
        "a_paimon_partition_column_inside_the_key_is_refused_with_the_reason"
    ));
    let name = unique("lsmpkey");
    let t = format!("{name}_t");
    let _client = fresh_table(&env, &t, |t| {
        format!(
            "CREATE TABLE {t} (tenant int4, id int8, v text, PRIMARY KEY (tenant, id));
             INSERT INTO {t} VALUES (1, 1, 'a'), (2, 1, 'b');"
        )
    })
    .await;
    let mut p = Pipeline::new_lsm(&env, &name, &[&t], &Settings::default(), 2);
    partition_by(&p, &t, "\"tenant\"");
    p.on_cleanup(format!("DROP TABLE IF EXISTS {t}"));
    p.start();
    let out = p
        .assert_stops(
            Duration::from_secs(60),
            "cdcd went on with a partition key inside the primary key",
        )
        .await;
    assert!(
        out.contains(&t) && out.contains("partition_by") && out.contains("primary key"),
        "the refusal names the table, the setting and the reason:\n{out}"
    );
    assert!(
        !p.warehouse
            .join(format!("{NAMESPACE}.db"))
            .join(&t)
            .join("snapshot")
            .exists(),
        "nothing was written"
    );
}

/// MariaDB with MINIMAL row images: an update's image holds the key and the changed columns only
/// and a delete's the key only, so the partition a row is in comes from the table (the lookup of
/// the row, and the key's current partition); a row whose `region` changes moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_minimal_images_move_rows_between_paimon_partitions() {
    use crate::support::mysql::{my_connect, my_env, my_exec, MyPipeline};
    let env = ground_or_skip!(my_env(
        "mariadb_minimal_images_move_rows_between_paimon_partitions"
    ));
    let name = unique("mylsmpart");
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    p.use_lsm(2, "initial", "");
    append_table_settings(
        &p.config,
        &format!("{}.item", p.db),
        "partition_by = [\"region\"]\n",
    );
    let mut c = my_connect(&env.url_for(&p.db)).await;
    my_exec(
        &mut c,
        "CREATE TABLE item (id BIGINT PRIMARY KEY, region VARCHAR(10), n INT, body TEXT)",
    )
    .await;
    my_exec(
        &mut c,
        "INSERT INTO item SELECT seq, ELT(seq % 4 + 1, 'eu', 'us', 'ap', NULL), seq, REPEAT('b', seq)
         FROM seq_1_to_200",
    )
    .await;
    p.start();
    p.assert_equal("item", 120).await;
    let dir = p.table_dir("item");
    assert!(
        dir.join("region=us").is_dir() && dir.join("region=__DEFAULT_PARTITION__").is_dir(),
        "not partitioned by region: {}",
        dir.display()
    );
    my_exec(&mut c, "SET SESSION binlog_row_image = 'MINIMAL'").await;
    my_exec(
        &mut c,
        "UPDATE item SET n = n + 1 WHERE id % 7 = 0;
         UPDATE item SET region = 'us' WHERE id % 5 = 0;
         UPDATE item SET region = NULL, body = 'x' WHERE id % 11 = 0;
         UPDATE item SET id = id + 1000 WHERE id % 13 = 0;
         DELETE FROM item WHERE id % 17 = 0;
         INSERT INTO item (id, n) VALUES (5000, 1);
         UPDATE item SET region = 'eu' WHERE id = 5000;
         UPDATE item SET n = 2 WHERE id = 5000;",
    )
    .await;
    p.assert_equal("item", 120).await;
}
