//! Issue 39: `spatial = "geometry"` on MariaDB: spatial columns (the CRS from a declared
//! `REF_SYSTEM_ID`, else the spec's default) become Iceberg `geometry` and
//! DuckDB reads every value back equal to the source's `ST_AsBinary`, through the initial copy,
//! the binlog stream (MINIMAL images leave the unchanged geometry out: completed from the row's
//! current value, read back from a geometry file), deletes and a kill -9. A value whose SRID
//! differs from its column's declared one (MariaDB does not enforce it) is refused, naming it.

use std::time::Duration;

use mysql_async::Conn;

use crate::support::mysql::{my_connect, my_env_and_name, my_exec, MyPipeline};

/// A MariaDB pipeline with `key = value` for every table, its tables made by `sql`, started and
/// its table `t` copied equal; with `t`'s columns as `"<name> <type>"`. `None` outside the test
/// bed.
pub(crate) async fn opted_in(
    tag: &str,
    (key, value): (&str, &str),
    sql: &str,
) -> Option<(MyPipeline, Conn, Vec<String>)> {
    let (env, name) = my_env_and_name(tag)?;
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    p.set_for_all_tables(key, value);
    let mut c = my_connect(&env.url_for(&name)).await;
    my_exec(&mut c, sql).await;
    p.start();
    p.assert_equal("t", 120).await;
    let meta = crate::support::current_metadata(&p.table_dir("t"));
    let types = crate::support::current_fields(&meta)
        .into_iter()
        .map(|(name, _, ty)| format!("{name} {ty}"))
        .collect();
    Some((p, c, types))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_spatial_as_geometry_reads_back_equal() {
    let (mut p, mut c, types) = ground_or_skip!(opted_in(
        "geo",
        ("spatial", "geometry"),
        r#"CREATE TABLE t (id BIGINT PRIMARY KEY, n INT, p POINT, g GEOMETRY);
           INSERT INTO t VALUES
             (1, 1, ST_GeomFromText('POINT(1 2)'), ST_GeomFromText('POLYGON((0 0, 10 0, 10 10, 0 10, 0 0))')),
             (2, 2, NULL, ST_GeomFromText('MULTILINESTRING((0 0, 1 1), (2 2, 3 3))')),
             (3, 3, ST_GeomFromText('POINT(-71.06 42.36)'), ST_GeomFromText('GEOMETRYCOLLECTION(POINT(1 1), LINESTRING(0 0, 1 1))')),
             (4, 4, ST_GeomFromText('POINT(5 5)', 4326), NULL)"#,
    )
    .await);
    assert_eq!(types[2..], ["p geometry", "g geometry"]);
    my_exec(&mut c, "SET SESSION binlog_row_image = 'MINIMAL'").await;
    my_exec(
        &mut c,
        r#"UPDATE t SET n = n + 10 WHERE id IN (1, 3);
           INSERT INTO t VALUES (9, 9, ST_GeomFromText('POINT(9 9)'), ST_GeomFromText('MULTIPOINT((1 1), (2 2))'));
           UPDATE t SET p = ST_GeomFromText('POINT(7 7)') WHERE id = 2;
           DELETE FROM t WHERE id = 4"#,
    )
    .await;
    p.assert_equal("t", 120).await;
    my_exec(
        &mut c,
        "INSERT INTO t VALUES (11, 11, ST_GeomFromText('POINT(11 11)'), NULL)",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    p.kill9();
    my_exec(
        &mut c,
        "UPDATE t SET n = n + 1 WHERE id = 9; INSERT INTO t VALUES (12, 12, ST_GeomFromText('POINT(12 12)'), NULL)",
    )
    .await;
    p.start();
    p.assert_equal("t", 120).await;
    p.stop(Duration::from_secs(60)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_declared_srid_is_the_crs_and_another_srid_is_refused() {
    // A value without an SRID (0) in a declared column is taken as the column's, as PostGIS
    // takes an EWKB without one.
    let (mut p, mut c, types) = ground_or_skip!(opted_in(
        "geosrid",
        ("spatial", "geometry"),
        r#"CREATE TABLE t (id BIGINT PRIMARY KEY, p POINT REF_SYSTEM_ID=4326,
                           g GEOMETRY REF_SYSTEM_ID=3857, u GEOMETRY);
           INSERT INTO t VALUES
             (1, ST_GeomFromText('POINT(1 2)', 4326), ST_GeomFromText('LINESTRING(0 0, 5 5)', 3857), ST_GeomFromText('POINT(3 3)', 4326)),
             (2, ST_GeomFromText('POINT(5 6)'), NULL, ST_GeomFromText('POINT(4 4)'))"#,
    )
    .await);
    assert_eq!(
        types[1..],
        [
            "p geometry(EPSG:4326)",
            "g geometry(EPSG:3857)",
            "u geometry"
        ]
    );
    my_exec(
        &mut c,
        "INSERT INTO t VALUES (3, ST_GeomFromText('POINT(7 7)', 3857), NULL, NULL)",
    )
    .await;
    let status = p.wait_exit(Duration::from_secs(120)).await;
    assert!(status.is_some_and(|s| !s.success()), "{}", p.output());
    let out = p.output();
    assert!(
        out.contains("SRID 3857") && out.contains("EPSG:4326"),
        "the refusal names both: {out}"
    );
}
