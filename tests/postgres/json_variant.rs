//! Issue 39: `json = "variant"`. Postgres `json`/`jsonb` columns of a table that opts in become
//! Iceberg v3 `variant` columns; DuckDB reads every value back equal to the source as parsed JSON
//! (lakecheck casts the variant to JSON, numbers compared exactly; DuckDB reads a variant's JSON
//! null as NULL, so there the two compare as one: the unit tests of `src/sinks/iceberg/variant.rs`
//! check cdcd writes them apart), through the initial copy, the
//! stream, an update that leaves a TOAST jsonb unchanged (completed from the row's current value,
//! which went through a variant file), and a kill -9 mid-stream. A table beside it that does not
//! opt in keeps strings and is still read by pyiceberg (and Spark where the test bed has it).
//! Changing the mapping of an existing table is refused with the reason, never rewritten.
//! `json_columns` makes only the columns it names variants, and refuses a name that is none.

use super::type_mapping::{OptIn, INSPECT};

/// Every kind of JSON value, in both column types; `big` is stored out of line (TOAST).
fn create(t: &str) -> String {
    format!(
        r#"DROP TABLE IF EXISTS {t};
         CREATE TABLE {t} (id int8 PRIMARY KEY, n int4, j json, jb jsonb, big jsonb);
         ALTER TABLE {t} ALTER COLUMN big SET STORAGE EXTERNAL;
         INSERT INTO {t} VALUES
           (1, 1, '{{"a": [1, 2.5, null], "b": "x", "nested": {{"deep": {{"k": [{{"z": true}}]}}}}}}',
                  '{{"z": {{"y": true}}, "a": []}}', NULL),
           (2, 2, 'null', '"str"', 'null'),
           (3, 3, NULL, NULL, NULL),
           (4, 4, '[1, "2", {{"3": 4}}, [], {{}}]', '12.50', '[]'),
           (5, 5, '12345678901234567890', '-0.1000000000000000000001', '123456789012345678901234567890.12345678'),
           (6, 6, '"héllo ✓ \"quoted\" \\ back\nnewline 😀"', '{{"ünï": "cödé", "emoji": "😀", "esc": "\u0001"}}', '1e300'),
           (7, 7, '{{"dup": 1, "dup": 2}}', '-9223372036854775808', '9223372036854775807'),
           (8, 8, 'true', 'false', '1e-30'),
           (500, 1, '{{}}', '{{"k": 1}}',
              (SELECT jsonb_build_object('chunks', jsonb_agg(md5(i::text))) FROM generate_series(1, 400) i));"#
    )
}

/// Inserts, updates of the JSON values, an update that leaves the TOAST `big` unchanged, deletes.
fn changes(t: &str, round: u32) -> String {
    let base = 1000 + round * 100;
    format!(
        r#"INSERT INTO {t} (id, n, j, jb, big)
             SELECT {base} + g, g, json_build_object('g', g, 'f', g / 3.0, 's', 'v' || g),
                    jsonb_build_array(g, 'x', NULL, jsonb_build_object('n', g::int8 * 1000000007)),
                    CASE WHEN g % 3 = 0 THEN NULL ELSE to_jsonb(g) END
             FROM generate_series(1, 40) g;
           UPDATE {t} SET n = n + 1 WHERE id = 500;
           UPDATE {t} SET jb = jsonb_build_object('r', {round}, 'prev', jb) WHERE id IN (1, 4, {base} + 5);
           UPDATE {t} SET j = 'null', jb = NULL WHERE id = {base} + 7;
           DELETE FROM {t} WHERE id = {base} + 9;"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_as_variant_reads_back_equal_through_copy_stream_toast_and_kill() {
    let types = ["id long", "n int", "j variant", "jb variant", "big variant"];
    let Some(mut run) =
        OptIn::copy("jvar", "", create, ("json = \"variant\"", false), &types).await
    else {
        return;
    };
    // The stream, with a TOAST jsonb left unchanged by an update, then kill -9 while it streams.
    run.stream_and_kill(changes).await;
    // The table that does not opt in: strings, read by pyiceberg and Spark as before.
    run.plain_table_still_read("\"variant\"").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_columns_make_only_the_named_columns_variants() {
    // `json_columns` narrows the opt-in: jb is a variant, j and big stay strings, and the mixed
    // table reads back equal through the copy, the stream (TOAST big unchanged) and kill -9.
    let types = ["id long", "n int", "j string", "jb variant", "big string"];
    let setting = "json = \"variant\"\njson_columns = [\"jb\"]";
    let mut run = ground_or_skip!(OptIn::copy("jcols", "", create, (setting, false), &types).await);
    run.stream_and_kill(changes).await;
    run.plain_table_still_read("\"variant\"").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_columns_name_that_is_no_json_column_is_refused() {
    super::type_mapping::assert_refused_at_start(
        "jcolx",
        create,
        "json = \"variant\"\njson_columns = [\"jb\", \"n\"]",
        &[
            "json_columns names \"n\", which is not a JSON column",
            "j, jb, big",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_the_json_mapping_of_an_existing_table_is_refused() {
    super::type_mapping::assert_mapping_change_refused(
        "jmap",
        "",
        "jb jsonb",
        &["'{\"a\": 1}'", "'[2]'"],
        "json = \"variant\"",
        "column jb changed type from string to variant",
        "\"variant\"",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyless_table_with_json_as_variant_is_refused_with_the_reason() {
    // Deletes of a keyless table compare whole rows with the source's JSON text, which a variant
    // does not keep: refused before anything is written, not at the first delete.
    super::type_mapping::assert_refused_at_start(
        "jkl",
        |t| {
            format!(
                "DROP TABLE IF EXISTS {t}; CREATE TABLE {t} (g int8, jb jsonb);
                 ALTER TABLE {t} REPLICA IDENTITY FULL;
                 INSERT INTO {t} VALUES (1, '{{\"a\": 1}}'), (1, '{{\"a\": 1}}')"
            )
        },
        "json = \"variant\"",
        &["json = \"variant\" needs a primary key"],
    )
    .await;
}

/// Objects whose fields recur (`n`, `s`, `o.x`, `o.y`, and `m`, an integer in three rows of four
/// and a string in the fourth), a field of one row in twenty (`rare`), and rows that break the
/// pattern: an array, NULL, a string `n` and an integer `o`.
fn recurring(t: &str) -> String {
    format!(
        r#"DROP TABLE IF EXISTS {t};
         CREATE TABLE {t} (id int8 PRIMARY KEY, jb jsonb);
         {}
         UPDATE {t} SET jb = '[1, 2]' WHERE id = 7;
         UPDATE {t} SET jb = NULL WHERE id = 8;
         UPDATE {t} SET jb = jb || '{{"n": "nine", "o": 5}}' WHERE id = 9;"#,
        recurring_rows(t, 1, 300)
    )
}

fn recurring_rows(t: &str, from: u32, to: u32) -> String {
    format!(
        r#"INSERT INTO {t}
             SELECT g, jsonb_build_object('n', g, 's', 'v' || g, 'o', jsonb_build_object('x', g * 2, 'y', 'k'),
                                          'm', CASE WHEN g % 4 = 0 THEN to_jsonb('t' || g) ELSE to_jsonb(g) END)
                       || CASE WHEN g % 20 = 0 THEN jsonb_build_object('rare', g) ELSE '{{}}'::jsonb END
             FROM generate_series({from}, {to}) g;"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recurring_variant_fields_are_shredded_in_every_data_file() {
    let Some(mut run) = OptIn::copy(
        "jshred",
        "",
        recurring,
        ("json = \"variant\"", true),
        &["id long", "jb variant"],
    )
    .await
    else {
        return;
    };
    let (p, client, t) = (&mut run.p, &run.client, &run.t);
    // The stream (compaction every 200 ms rewrites and re-picks): more rows, and values of
    // other types in shredded fields.
    crate::support::exec(
        client,
        &format!(
            r#"{}
             UPDATE {t} SET jb = jb || '{{"n": 1.5, "m": true}}' WHERE id IN (5, 305);
             UPDATE {t} SET jb = jb - 's' WHERE id = 306;
             DELETE FROM {t} WHERE id = 10;"#,
            recurring_rows(t, 301, 340)
        ),
    )
    .await;
    p.assert_equal(t, 120).await;
    crate::support::exec(client, &recurring_rows(t, 341, 380)).await;
    p.assert_equal(t, 120).await;

    // A query on shredded paths finds the rows Postgres finds.
    let want = super::type_mapping::source_ids(
        client,
        &format!(
            "SELECT id FROM {t} WHERE jsonb_typeof(jb->'n') = 'number'
               AND (jb->>'n')::numeric BETWEEN 100 AND 360 AND (jb->'o'->>'x')::int8 % 7 = 0
             ORDER BY id"
        ),
    )
    .await;
    assert!(want.len() > 20, "{want:?}");
    let query = "SELECT id FROM lake WHERE TRY_CAST(variant_extract(jb, 'n') AS DECIMAL(10, 1)) BETWEEN 100 AND 360
               AND variant_extract(variant_extract(jb, 'o'), 'x')::BIGINT % 7 = 0 ORDER BY id";
    let dir = p.table_dir(t).to_str().unwrap().to_owned();
    assert_shredded(&p.python(INSPECT, &[&dir, "2", query]), &want);
    // Compaction (every 200 ms) re-picks for the files it writes: checked again once it ran.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !crate::support::current_metadata(&p.table_dir(t))
        .to_string()
        .contains("\"replace\"")
    {
        assert!(std::time::Instant::now() < deadline, "no compaction ran");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_shredded(&p.python(INSPECT, &[&dir, "2", query]), &want);
    p.sigterm_and_wait(std::time::Duration::from_secs(60)).await;
}

/// `out` (of [`INSPECT`]): the query found `want`, and every live data file carries
/// typed_value columns for the recurring fields, none for the rare one.
fn assert_shredded(out: &str, want: &[i64]) {
    let found = super::type_mapping::last_json(out);
    let got: Vec<i64> = serde_json::from_value(found["ids"].clone()).unwrap();
    assert_eq!(got, want, "{out}");
    let files: Vec<(u64, Vec<String>)> = serde_json::from_value(found["schemas"].clone()).unwrap();
    assert!(files.iter().any(|(rows, _)| *rows >= 300), "{out}");
    for (rows, names) in &files {
        for name in ["typed_value", "n", "s", "o", "x", "y", "m"] {
            assert!(
                names.iter().any(|n| n == name),
                "a file of {rows} rows has no {name}: {names:?}"
            );
        }
        assert!(!names.iter().any(|n| n == "rare"), "{names:?}");
    }
}
