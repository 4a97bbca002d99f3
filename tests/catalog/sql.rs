//! `[sink.catalog] kind = "sql"`: replication read back through pyiceberg's `SqlCatalog`, a
//! foreign commit, a crash before the row update. Needs the test bed (`scripts/testbed.sh`).

use std::path::Path;
use std::time::Duration;

use super::{changes, create_table};
use crate::support::{
    connect, exec, ground, run_cdcd, test_env, test_env_and_name, unique, Pipeline, Settings,
    TestEnv, NAMESPACE,
};

/// Where a test's catalog is, as cdcd and as pyiceberg (SQLAlchemy) spell it.
struct CatalogDb {
    cdcd_uri: String,
    sqlalchemy_uri: String,
    /// Postgres: the database to drop at the end.
    database: Option<String>,
    sqlite: Option<std::path::PathBuf>,
}

impl CatalogDb {
    fn sqlite(dir: &Path) -> CatalogDb {
        let file = dir.join("catalog.db");
        CatalogDb {
            cdcd_uri: format!("sqlite://{}", file.display()),
            // SQLAlchemy: three slashes, then the absolute path's own.
            sqlalchemy_uri: format!("sqlite:///{}", file.display()),
            database: None,
            sqlite: Some(file),
        }
    }

    async fn postgres(env: &TestEnv, name: &str) -> CatalogDb {
        let database = format!("{name}_catalog");
        let client = connect(&env.pg_url).await;
        exec(
            &client,
            &format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"),
        )
        .await;
        exec(&client, &format!("CREATE DATABASE {database}")).await;
        let (server, _) = env.pg_url.rsplit_once('/').unwrap();
        let cdcd_uri = format!("{server}/{database}");
        let rest = cdcd_uri.split_once("://").unwrap().1;
        CatalogDb {
            sqlalchemy_uri: format!("postgresql+psycopg2://{rest}"),
            cdcd_uri,
            database: Some(database),
            sqlite: None,
        }
    }

    fn settings(&self) -> Settings {
        Settings {
            sink_extra: format!(
                "\n[sink.catalog]\nkind = \"sql\"\nuri = {:?}\n",
                self.cdcd_uri
            ),
            ..Settings::default()
        }
    }

    /// Runs `sql` on the catalog database.
    async fn exec(&self, sql: &str) {
        match &self.sqlite {
            Some(file) => {
                rusqlite::Connection::open(file)
                    .unwrap()
                    .execute_batch(sql)
                    .unwrap();
            }
            None => exec(&connect(&self.cdcd_uri).await, sql).await,
        }
    }

    /// The row's metadata_location and previous_metadata_location.
    async fn row(&self, table: &str) -> (String, String) {
        let sql = format!(
            "SELECT metadata_location, previous_metadata_location FROM iceberg_tables \
             WHERE catalog_name = 'cdcd' AND table_namespace = '{NAMESPACE}' AND table_name = '{table}'"
        );
        match &self.sqlite {
            Some(file) => rusqlite::Connection::open(file)
                .unwrap()
                .query_row(&sql, [], |r| {
                    Ok((
                        r.get(0)?,
                        r.get::<_, Option<String>>(1)?.unwrap_or_default(),
                    ))
                })
                .unwrap(),
            None => {
                let client = connect(&self.cdcd_uri).await;
                let row = client.query_one(&sql, &[]).await.unwrap();
                (
                    row.get(0),
                    row.get::<_, Option<String>>(1).unwrap_or_default(),
                )
            }
        }
    }

    async fn drop(&self, env: &TestEnv) {
        if let Some(db) = &self.database {
            let client = connect(&env.pg_url).await;
            exec(
                &client,
                &format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"),
            )
            .await;
        }
    }
}

/// lakecheck of `public.<table>` read through pyiceberg's SqlCatalog, polling up to `wait_secs`.
async fn assert_equal_through_catalog(
    p: &mut Pipeline,
    cat: &CatalogDb,
    table: &str,
    wait_secs: u32,
) {
    let t = format!("{NAMESPACE}.{table}");
    // pyiceberg refuses equality deletes: under CDCD_TEST_DELETE_MODE=equality DuckDB reads the
    // metadata file the catalog row names instead.
    let reader = match std::env::var("CDCD_TEST_DELETE_MODE").as_deref() {
        Ok("equality") => "duckdb",
        _ => "pyiceberg",
    };
    let args = [
        "--sql-catalog",
        &cat.sqlalchemy_uri,
        "--catalog-table",
        &t,
        "--reader",
        reader,
    ];
    let (code, out) = p.lakecheck(table, wait_secs, &args).await;
    assert_eq!(
        code,
        Some(0),
        "lakecheck through SqlCatalog differs:\n{out}"
    );
    eprintln!(
        "lakecheck public.{table}: {}",
        out.lines().last().unwrap_or("")
    );
}

async fn replicates(env: TestEnv, postgres: bool) {
    let name = unique(if postgres { "catpg" } else { "catsq" });
    let t = format!("{name}_orders");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t)).await;
    let scratch = tempfile::tempdir().unwrap();
    let cat = if postgres {
        CatalogDb::postgres(&env, &name).await
    } else {
        CatalogDb::sqlite(scratch.path())
    };
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &cat.settings());

    let (ok, out) = run_cdcd(&["check"], &p.config);
    let line = format!("catalog sql {}: ok", cat.cdcd_uri);
    assert!(ok && out.contains(&line), "cdcd check:\n{out}");

    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    assert_equal_through_catalog(&mut p, &cat, &t, 60).await;
    for round in 1..=2 {
        exec(&client, &changes(&t, round)).await;
        assert_equal_through_catalog(&mut p, &cat, &t, 60).await;
        // Postgres: the server ends cdcd's catalog connection; the next commit reconnects.
        if let Some(db) = &cat.database {
            exec(
                &client,
                &format!(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = '{db}' AND pid <> pg_backend_pid()"
                ),
            )
            .await;
        }
    }
    // The row's previous location is the metadata the last commit replaced.
    let (current, previous) = cat.row(&t).await;
    assert!(
        current.ends_with(".metadata.json")
            && previous.ends_with(".metadata.json")
            && current != previous
    );

    let (ok, out) = run_cdcd(&["status"], &p.config);
    assert!(ok && out.contains(&t), "cdcd status:\n{out}");
    p.sigterm_and_wait(Duration::from_secs(60)).await;
    // pyiceberg's list_namespaces finds the namespace cdcd registered, and list_tables the table.
    let script = format!(
        "from pyiceberg.catalog import load_catalog\n\
         c = load_catalog('cdcd', type='sql', uri={uri:?})\n\
         print(c.list_namespaces(), c.list_tables({NAMESPACE:?}))",
        uri = cat.sqlalchemy_uri
    );
    let out = std::process::Command::new(&env.python)
        .args(["-c", &script])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("('{NAMESPACE}',)"))
            && text.contains(&format!("('{NAMESPACE}', '{t}')")),
        "pyiceberg: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    cat.drop(&env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_catalog_on_sqlite_replicates() {
    let env = ground_or_skip!(test_env("sql_catalog_on_sqlite_replicates"));
    replicates(env, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_catalog_on_postgres_replicates() {
    let env = ground_or_skip!(test_env("sql_catalog_on_postgres_replicates"));
    replicates(env, true).await;
}

/// Another writer commits (its metadata file, then the row swapped to it, as Iceberg-Java's
/// JdbcCatalog would); cdcd's next commit finds the row moved (its update matches no row), never
/// swaps the row back, loads the other writer's metadata and commits on top of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_commit_is_built_upon_not_overwritten() {
    let (env, name) = ground_or_skip!(test_env_and_name("catfc"));
    let t = format!("{name}_orders");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t)).await;
    let scratch = tempfile::tempdir().unwrap();
    let cat = CatalogDb::sqlite(scratch.path());
    // No maintenance cycle: its load would refresh cdcd's cached base before the next commit.
    let mut settings = cat.settings();
    settings.sink_extra = format!("maintenance_interval_ms = 0\n{}", settings.sink_extra);
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &settings);
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    assert_equal_through_catalog(&mut p, &cat, &t, 60).await;

    let (ours, _) = cat.row(&t).await;
    let theirs = ours.replace(
        ours.rsplit('/').next().unwrap(),
        "00099-4a0c1e7e-foreign.metadata.json",
    );
    let path = |url: &str| url.strip_prefix("file://").unwrap().to_owned();
    std::fs::copy(path(&ours), path(&theirs)).unwrap();
    cat.exec(
        &format!(
            "UPDATE iceberg_tables SET metadata_location = '{theirs}', previous_metadata_location = '{ours}' \
             WHERE table_name = '{t}'"
        ),
    )
    .await;

    exec(&client, &changes(&t, 1)).await;
    assert_equal_through_catalog(&mut p, &cat, &t, 60).await;
    let out = p.output();
    assert!(
        out.contains("planning the commit again on top of it"),
        "{out}"
    );
    let (now, previous) = cat.row(&t).await;
    assert_eq!(
        previous, theirs,
        "cdcd did not commit on top of the other writer's metadata"
    );
    assert_ne!(now, theirs);
    p.sigterm_and_wait(Duration::from_secs(60)).await;
}

/// kill -9 between the metadata file and the row update (crash point `commit-after-create`):
/// the file is an orphan the row never names; the restarted cdcd commits past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_the_row_update_leaves_only_an_orphan() {
    let (env, name) = ground_or_skip!(test_env_and_name("catcr"));
    let t = format!("{name}_orders");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t)).await;
    let scratch = tempfile::tempdir().unwrap();
    let cat = CatalogDb::sqlite(scratch.path());
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &cat.settings());
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    assert_equal_through_catalog(&mut p, &cat, &t, 60).await;
    p.sigterm_and_wait(Duration::from_secs(60)).await;
    let (before, _) = cat.row(&t).await;

    // The first metadata file the next run creates is its crash point.
    p.env_vars
        .push(("CDCD_FAILPOINT".into(), "commit-after-create".into()));
    p.start();
    exec(&client, &changes(&t, 1)).await;
    let status = p.wait_exit(Duration::from_secs(60)).await;
    assert!(
        !status.success(),
        "the crash point did not fire:\n{}",
        p.output()
    );
    let (after_crash, _) = cat.row(&t).await;
    assert_eq!(
        after_crash, before,
        "the row moved although the update never ran"
    );
    let metadata_dir = p.table_dir(&t).join("metadata");
    let newest = std::fs::read_dir(&metadata_dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|f| {
            f.strip_prefix('v')?
                .strip_suffix(".metadata.json")?
                .parse::<u64>()
                .ok()
        })
        .max()
        .unwrap();
    let orphan = format!("v{newest}.metadata.json");
    assert!(
        !before.ends_with(&orphan),
        "no file was written past the row's"
    );

    p.env_vars.clear();
    p.start();
    assert_equal_through_catalog(&mut p, &cat, &t, 60).await;
    let (now, previous) = cat.row(&t).await;
    assert_eq!(previous, before);
    assert!(!now.ends_with(&orphan), "the orphan name was reused");
    assert!(
        metadata_dir.join(&orphan).exists(),
        "the orphan was deleted"
    );
    p.sigterm_and_wait(Duration::from_secs(60)).await;

    // `cdcd cleanup` works from the file the row names: the crashed commit's data files and
    // manifests go, no metadata file does, and the table still reads equal.
    let (ok, out) = run_cdcd(&["cleanup", "--grace-secs", "0"], &p.config);
    assert!(ok, "cdcd cleanup:\n{out}");
    let deleted: Vec<&str> = out.lines().filter(|l| l.starts_with("deleted ")).collect();
    assert!(
        !deleted.is_empty(),
        "the crashed commit left no orphan:\n{out}"
    );
    assert!(
        deleted.iter().all(|l| !l.ends_with(".metadata.json")),
        "cleanup deleted a metadata file:\n{out}"
    );
    assert!(metadata_dir.join(&orphan).exists());
    assert_equal_through_catalog(&mut p, &cat, &t, 0).await;
}

/// The TLS test cluster (`pgtls`, see tests/postgres/tls.rs): its admin URL (trust, plain), its
/// `127.0.0.1:<port>`, the test CA and the directory of its certificates; `None` without it.
fn tls_cluster(test: &str) -> Option<(String, String, std::path::PathBuf, std::path::PathBuf)> {
    let admin = ground::var(test, "CDCD_TEST_PG_TLS")?;
    let ca = ground::var(test, "CDCD_TEST_PG_TLS_CA")?;
    let dir = ground::var(test, "CDCD_TEST_PG_TLS_DIR")?;
    let url = url::Url::parse(&admin).unwrap();
    let addr = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap());
    Some((admin, addr, ca.into(), dir.into()))
}

/// The catalog on Postgres reached only over verified TLS: its database is owned by the TLS
/// cluster's `cdcd_tls` role, which `pg_hba.conf` lets in through `hostssl` lines only, so a
/// plain connection could not commit anything. cdcd connects with `sslmode=verify-full` and the
/// test CA, rows are replicated and read back through pyiceberg's SqlCatalog (psycopg2, with the
/// CA in its URL), and `pg_stat_ssl` shows cdcd's catalog backend in TLS. A wrong CA fails
/// `cdcd check` with a line naming the host and the CA file, never the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_catalog_on_postgres_over_verified_tls() {
    let test = "sql_catalog_on_postgres_over_verified_tls";
    let env = ground_or_skip!(test_env(test));
    let (admin, addr, ca, dir) = ground_or_skip!(tls_cluster(test));
    // The password the test bed's script sets for cdcd_tls.
    let password = "cdcd-tls-pw";
    let name = unique("cattls");
    let t = format!("{name}_orders");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t)).await;

    let database = format!("{name}_catalog");
    let admin_client = connect(&admin).await;
    // Two calls: DROP DATABASE may not share a batch (an implicit transaction) with another.
    exec(
        &admin_client,
        &format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"),
    )
    .await;
    exec(
        &admin_client,
        &format!("CREATE DATABASE {database} OWNER cdcd_tls"),
    )
    .await;
    let server = format!("cdcd_tls:{password}@{addr}/{database}");
    let verified = format!("sslmode=verify-full&sslrootcert={}", ca.display());
    let cat = CatalogDb {
        cdcd_uri: format!("postgres://{server}?{verified}"),
        sqlalchemy_uri: format!("postgresql+psycopg2://{server}?{verified}"),
        database: Some(database.clone()),
        sqlite: None,
    };
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &cat.settings());

    let (ok, out) = run_cdcd(&["check"], &p.config);
    let shown = format!("postgres://cdcd_tls:***@{addr}/{database}?{verified}");
    assert!(
        ok && out.contains(&format!(
            "catalog sql {shown}: ok (TLS: sslmode=verify-full sslrootcert={})",
            ca.display()
        )) && !out.contains(password),
        "cdcd check:\n{out}"
    );

    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    assert_equal_through_catalog(&mut p, &cat, &t, 60).await;
    exec(&client, &changes(&t, 1)).await;
    assert_equal_through_catalog(&mut p, &cat, &t, 60).await;
    // Every backend of cdcd's catalog connection is in TLS (hostssl would refuse it otherwise;
    // this says so directly).
    let rows = admin_client
        .query(
            "SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.datname = $1 AND a.usename = 'cdcd_tls'",
            &[&database],
        )
        .await
        .unwrap();
    assert!(
        !rows.is_empty() && rows.iter().all(|r| r.get::<_, bool>(0)),
        "cdcd's catalog backends: {} row(s), not all in TLS",
        rows.len()
    );
    p.sigterm_and_wait(Duration::from_secs(60)).await;

    // A CA that did not sign the server's certificate: check names the host and the file.
    let other_ca = dir.join("other-ca.crt");
    let wrong = format!(
        "postgres://{server}?sslmode=verify-full&sslrootcert={}",
        other_ca.display()
    );
    let config = std::fs::read_to_string(&p.config).unwrap().replace(
        &format!("uri = {:?}", cat.cdcd_uri),
        &format!("uri = {wrong:?}"),
    );
    let wrong_config = p.config.with_file_name("wrong-ca.toml");
    std::fs::write(&wrong_config, config).unwrap();
    let (ok, out) = run_cdcd(&["check"], &wrong_config);
    assert!(
        !ok && out.contains("does not verify against")
            && out.contains(&other_ca.display().to_string())
            && out.contains("127.0.0.1")
            && !out.contains(password),
        "cdcd check with a wrong CA:\n{out}"
    );

    exec(
        &admin_client,
        &format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"),
    )
    .await;
}

/// A pipeline that ran with the filesystem catalog switches to a SQL catalog: its table is
/// registered as it is at start, the checkpoint holds (no second copy), replication goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_from_the_filesystem_catalog_keeps_the_checkpoint() {
    let (env, name) = ground_or_skip!(test_env_and_name("catsqswitch"));
    let t = format!("{name}_orders");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t)).await;
    let scratch = tempfile::tempdir().unwrap();
    let cat = CatalogDb::sqlite(scratch.path());
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &Settings::default());
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    exec(&client, &changes(&t, 1)).await;
    p.assert_equal(&t, 60).await;
    p.sigterm_and_wait(Duration::from_secs(60)).await;

    exec(&client, &changes(&t, 2)).await;
    p.write_config(&cat.settings());
    p.start();
    assert_equal_through_catalog(&mut p, &cat, &t, 60).await;
    let out = p.output();
    let second = out.split("===== cdcd start #2").nth(1).unwrap_or("");
    assert!(
        second.contains("registering the table's existing metadata in the catalog")
            && !second.contains("initial copy starting"),
        "the table was not registered, or copied again, after the switch:\n{second}"
    );
    p.sigterm_and_wait(Duration::from_secs(60)).await;
}

/// `cdcd resync` through the SQL catalog (SQLite): the lineage is kept on the filesystem, and the
/// swap is one update of the catalog's row, to metadata that is the lineage's with the table's
/// identity and `cdcd.resync-id`. A row the replica kept after the source deleted it (while the
/// table was out of the publication) is gone; pyiceberg's SqlCatalog reads the table equal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_swaps_through_the_sql_catalog() {
    let (env, name) = ground_or_skip!(test_env_and_name("catrs"));
    let t = format!("{name}_orders");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t)).await;
    let scratch = tempfile::tempdir().unwrap();
    let cat = CatalogDb::sqlite(scratch.path());
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &cat.settings());
    p.start();
    assert_equal_through_catalog(&mut p, &cat, &t, 60).await;
    p.sigterm_and_wait(Duration::from_secs(60)).await;
    crate::postgres::resync::damage(&client, &p, &t).await;
    let (before, _) = cat.row(&t).await;

    let (ok, out) = run_cdcd(&["resync", "--table", &format!("public.{t}")], &p.config);
    assert!(ok && out.contains("requested"), "{out}");
    p.start();
    crate::support::wait_for(&mut p, "the resync", Duration::from_secs(120), |o| {
        o.contains("resync finished")
    })
    .await;
    exec(&client, &changes(&t, 1)).await;
    assert_equal_through_catalog(&mut p, &cat, &t, 60).await;
    let (current, _) = cat.row(&t).await;
    assert_ne!(current, before);
    let path = current.strip_prefix("file://").unwrap_or(&current);
    let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    assert!(
        meta["properties"]["cdcd.resync-id"].is_string(),
        "the catalog's current metadata is not the resync's lineage: {}",
        meta["properties"]
    );
    assert!(
        !meta["location"].as_str().unwrap_or("").contains("resync-"),
        "{}",
        meta["location"]
    );
    p.sigterm_and_wait(Duration::from_secs(60)).await;
}
