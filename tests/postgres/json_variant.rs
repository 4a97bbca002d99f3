//! Issue 39: `json = "variant"`. Postgres `json`/`jsonb` columns of a table that opts in become
//! Iceberg v3 `variant` columns; DuckDB reads every value back equal to the source as parsed JSON
//! (lakecheck casts the variant to JSON, numbers compared exactly; DuckDB reads a variant's JSON
//! null as NULL, so there the two compare as one: the unit tests of `src/sinks/iceberg/variant.rs`
//! check cdcd writes them apart), through the initial copy, the
//! stream, an update that leaves a TOAST jsonb unchanged (completed from the row's current value,
//! which went through a variant file), and a kill -9 mid-stream. A table beside it that does not
//! opt in keeps strings and is still read by pyiceberg (and Spark where the test bed has it).
//! Changing the mapping of an existing table is refused with the reason, never rewritten.

use super::type_mapping::OptIn;

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
