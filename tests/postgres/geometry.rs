//! Issue 39: `spatial = "geometry"`. PostGIS `geometry` columns of a table that opts in become
//! Iceberg v3 `geometry(<crs>)` columns (the CRS from the column's SRID), written as ISO WKB in
//! Parquet columns annotated GEOMETRY; DuckDB reads every value back equal to the source
//! (lakecheck compares DuckDB's `ST_AsWKB` with PostGIS's `ST_AsBinary`) through the initial
//! copy, the stream, an update that leaves a TOAST geometry unchanged, deletes and a kill -9; a
//! bounding-box predicate (DuckDB core's `ST_Intersects_Extent`) finds the rows it should. A
//! `geography` column is refused with the reason.

use super::type_mapping::OptIn;

/// PostGIS in the test database (the test bed installs the package); concurrent tests may race
/// to create it, so under a lock.
const POSTGIS: &str =
    "BEGIN; SELECT pg_advisory_xact_lock(39039); CREATE EXTENSION IF NOT EXISTS postgis; COMMIT;";

fn create(t: &str) -> String {
    format!(
        r#"DROP TABLE IF EXISTS {t};
         CREATE TABLE {t} (id int8 PRIMARY KEY, n int4, p geometry(Point, 4326),
                           g geometry(Geometry, 4326), z geometry(LineStringZ, 3857), u geometry);
         ALTER TABLE {t} ALTER COLUMN g SET STORAGE EXTERNAL;
         INSERT INTO {t} VALUES
           (1, 1, 'SRID=4326;POINT(1 2)', 'SRID=4326;POLYGON((0 0, 10 0, 10 10, 0 10, 0 0), (2 2, 3 2, 3 3, 2 2))',
                  'SRID=3857;LINESTRING Z (0 0 1, 5 5 2)', 'POINT(-71.06 42.36)'),
           (2, 2, 'SRID=4326;POINT EMPTY', 'SRID=4326;MULTIPOLYGON(((20 20, 30 20, 30 30, 20 20)))',
                  NULL, 'GEOMETRYCOLLECTION(POINT(1 1), LINESTRING(0 0, 1 1))'),
           (3, 3, NULL, 'SRID=4326;MULTILINESTRING((0 0, 1 1), (2 2, 3 3))', NULL, 'POINT M (1 2 3)'),
           (4, 4, 'SRID=4326;POINT(-180 -90)', 'SRID=4326;MULTIPOINT((1 1), (2 2))', NULL, 'POINT ZM (1 2 3 4)'),
           (500, 5, 'SRID=4326;POINT(50 50)',
              (SELECT ST_SetSRID(ST_MakeLine(array_agg(ST_MakePoint(i, i * 0.5))), 4326) FROM generate_series(1, 400) i),
              NULL, NULL);"#
    )
}

fn changes(t: &str, round: u32) -> String {
    let base = 1000 + round * 100;
    format!(
        r#"INSERT INTO {t} (id, n, p, g, u)
             SELECT {base} + i, i, ST_SetSRID(ST_MakePoint(i, -i), 4326),
                    ST_SetSRID(ST_Buffer(ST_MakePoint(i, i), 1, 2), 4326),
                    CASE WHEN i % 3 = 0 THEN NULL ELSE ST_MakePoint(i, i, i) END
             FROM generate_series(1, 30) i;
           UPDATE {t} SET n = n + 1 WHERE id = 500;
           UPDATE {t} SET p = ST_SetSRID(ST_MakePoint({round}, {round}), 4326) WHERE id IN (1, {base} + 5);
           UPDATE {t} SET g = NULL WHERE id = {base} + 7;
           DELETE FROM {t} WHERE id = {base} + 9;"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn geometry_reads_back_equal_through_copy_stream_toast_and_kill() {
    let types = [
        "id long",
        "n int",
        "p geometry(EPSG:4326)",
        "g geometry(EPSG:4326)",
        "z geometry(EPSG:3857)",
        "u geometry",
    ];
    let setting = "spatial = \"geometry\"";
    let mut run =
        ground_or_skip!(OptIn::copy("geo", POSTGIS, create, (setting, true), &types).await);
    // The stream, a TOAST geometry left unchanged by an update, then kill -9 while it streams.
    run.stream_and_kill(changes).await;
    let (p, client, t) = (&mut run.p, &run.client, &run.t);

    // A spatial predicate: the rows whose polygon's box meets the box (0 0, 10 10).
    let want = super::type_mapping::source_ids(
        client,
        &format!("SELECT id FROM {t} WHERE g && ST_MakeEnvelope(0, 0, 10, 10, 4326) ORDER BY id"),
    )
    .await;
    assert!(want.len() > 3, "{want:?}");
    let out = p.python(
        super::type_mapping::INSPECT,
        &[
            p.table_dir(t).to_str().unwrap(),
            "4",
            "SELECT id FROM lake WHERE ST_Intersects_Extent(g, \
             'POLYGON((0 0, 10 0, 10 10, 0 10, 0 0))'::GEOMETRY) ORDER BY id",
        ],
    );
    let found = super::type_mapping::last_json(&out);
    let got: Vec<i64> = serde_json::from_value(found["ids"].clone()).unwrap();
    assert_eq!(got, want, "{out}");

    // Compaction ran (every 200 ms) and read and rewrote geometry files: the rows stay equal.
    let meta = crate::support::current_metadata(&p.table_dir(t));
    let ops: Vec<&str> = meta["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["summary"]["operation"].as_str())
        .collect();
    assert!(ops.contains(&"replace"), "{ops:?}");

    // Bounds in the manifests (compacted files' included): the spec's x:y points for g.
    let bounds: Vec<(usize, usize, u64)> = serde_json::from_value(found["bounds"].clone()).unwrap();
    assert!(
        bounds
            .iter()
            .all(|&(lo, hi, _)| (lo, hi) == (16, 16) || (lo, hi) == (0, 0)),
        "{out}"
    );
    // A compacted file (more rows than any commit writes) has them too: compaction's own writer.
    let compacted: Vec<_> = bounds.iter().filter(|b| b.2 > 40).collect();
    assert!(!compacted.is_empty(), "{out}");
    assert!(compacted.iter().all(|b| (b.0, b.1) == (16, 16)), "{out}");

    // The table that does not opt in: hex EWKB strings, read by pyiceberg and Spark as before.
    run.plain_table_still_read("geometry").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_geography_column_is_refused_with_the_reason() {
    super::type_mapping::assert_refused_at_start(
        "geog",
        |t| {
            format!(
                "{POSTGIS} DROP TABLE IF EXISTS {t};
                 CREATE TABLE {t} (id int8 PRIMARY KEY, g geography(Point, 4326));
                 INSERT INTO {t} VALUES (1, 'POINT(1 2)')"
            )
        },
        "spatial = \"geometry\"",
        &["column g is a PostGIS geography", "no reader here"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_the_spatial_mapping_of_an_existing_table_is_refused() {
    super::type_mapping::assert_mapping_change_refused(
        "gmap",
        POSTGIS,
        "g geometry(Point, 4326)",
        &["'SRID=4326;POINT(1 2)'", "'SRID=4326;POINT(3 4)'"],
        "spatial = \"geometry\"",
        "column g changed type from string to geometry(EPSG:4326)",
        "geometry(",
    )
    .await;
}
