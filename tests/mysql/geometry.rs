//! Issue 39: `spatial = "geometry"` on MariaDB: spatial columns (SRID 0: the MySQL source drops
//! each value's SRID, so the column takes the spec's default CRS) become Iceberg `geometry` and
//! DuckDB reads every value back equal to the source's `ST_AsBinary`, through the initial copy,
//! the binlog stream (MINIMAL images leave the unchanged geometry out: completed from the row's
//! current value, read back from a geometry file), deletes and a kill -9.

use std::time::Duration;

use crate::support::mysql::{my_connect, my_env_and_name, my_exec, MyPipeline};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_spatial_as_geometry_reads_back_equal() {
    let (env, name) = ground_or_skip!(my_env_and_name("geo"));
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    p.set_for_all_tables("spatial", "geometry");
    let url = env.url_for(&name);
    let mut c = my_connect(&url).await;
    my_exec(
        &mut c,
        r#"CREATE TABLE t (id BIGINT PRIMARY KEY, n INT, p POINT, g GEOMETRY);
           INSERT INTO t VALUES
             (1, 1, ST_GeomFromText('POINT(1 2)'), ST_GeomFromText('POLYGON((0 0, 10 0, 10 10, 0 10, 0 0))')),
             (2, 2, NULL, ST_GeomFromText('MULTILINESTRING((0 0, 1 1), (2 2, 3 3))')),
             (3, 3, ST_GeomFromText('POINT(-71.06 42.36)'), ST_GeomFromText('GEOMETRYCOLLECTION(POINT(1 1), LINESTRING(0 0, 1 1))')),
             (4, 4, ST_GeomFromText('POINT(5 5)', 4326), NULL)"#,
    )
    .await;
    p.start();
    p.assert_equal("t", 120).await;
    let meta = crate::support::current_metadata(&p.table_dir("t"));
    let fields = &meta["schemas"].as_array().unwrap().last().unwrap()["fields"];
    assert_eq!(
        (&fields[2]["type"], &fields[3]["type"]),
        (&"geometry".into(), &"geometry".into()),
        "{meta}"
    );
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
