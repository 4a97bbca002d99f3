//! End to end, `cdcd check` and secrets (issue 8): a table with `REPLICA IDENTITY NOTHING` gets
//! its line and fix; a Postgres with `wal_level = replica` (a throwaway cluster started here) gets
//! the wal_level line; `cdcd status` (text and `--json`) never prints a password.

use std::path::Path;
use std::process::Command;

use crate::support::run_cdcd as cdcd;
use crate::support::{
    connect, exec, fresh_table, ground, output_ok, test_env, test_env_and_name, Pipeline, Settings,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_replica_identity_and_status_hides_passwords() {
    let (env, name) = ground_or_skip!(test_env_and_name("opsc"));
    let t = format!("{name}_t");
    let client = fresh_table(&env, &t, |t| {
        format!(
            "CREATE TABLE {t} (id int8 PRIMARY KEY, v text);
             ALTER TABLE {t} REPLICA IDENTITY NOTHING;"
        )
    })
    .await;
    let secret = format!("chksekrit-{}", std::process::id());
    let url_secret = format!("urlchksekrit-{}", std::process::id());
    let mut url = url::Url::parse(&env.pg_url).unwrap();
    url.set_password(Some(&url_secret)).unwrap();
    let settings = Settings {
        password: Some(secret.clone()),
        ..Settings::default()
    };
    let p = Pipeline::owning_tables(&env, &name, &[&t], &settings);
    let (ok, out) = cdcd(&["check"], &p.config);
    assert!(!ok, "check passed REPLICA IDENTITY NOTHING:\n{out}");
    let line = out
        .lines()
        .find(|l| l.contains("REPLICA IDENTITY NOTHING"))
        .unwrap_or_else(|| panic!("no replica identity line:\n{out}"));
    assert!(
        line.contains(&format!("public.{t}")) && line.contains("REPLICA IDENTITY DEFAULT"),
        "{line}"
    );
    assert!(!out.contains(&secret), "check printed the password:\n{out}");

    exec(
        &client,
        &format!("ALTER TABLE {t} REPLICA IDENTITY DEFAULT"),
    )
    .await;
    let (ok, out) = cdcd(&["check"], &p.config);
    assert!(ok, "check after the fix:\n{out}");

    // status, with the password in the URL and in its own key, text and JSON, and JSON logs.
    p.write_config(&Settings {
        password: Some(secret.clone()),
        url: Some(url.to_string()),
        ..Settings::default()
    });
    for args in [
        &["status"][..],
        &["status", "--json"][..],
        &["--log-format", "json", "status"][..],
    ] {
        let (ok, out) = cdcd(args, &p.config);
        assert!(ok, "cdcd {args:?}:\n{out}");
        assert!(
            !out.contains(&secret) && !out.contains(&url_secret),
            "cdcd {args:?} printed a password:\n{out}"
        );
        assert!(out.contains(&t), "cdcd {args:?} does not list {t}:\n{out}");
    }
}

/// A throwaway Postgres 15 with extra `-c` settings, run as user postgres; stopped on drop.
struct Throwaway {
    dir: tempfile::TempDir,
    port: u16,
}

impl Throwaway {
    fn start(test: &str, settings: &str) -> Option<Throwaway> {
        let bin = Path::new("/usr/lib/postgresql/15/bin");
        if !bin.join("initdb").exists() {
            ground::missing(
                test,
                &format!("no {} (Postgres 15's server)", bin.display()),
            );
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("cdcd-walrep-")
            .tempdir()
            .unwrap();
        let as_postgres = |args: &[&str]| {
            output_ok(
                Command::new("runuser")
                    .args(["-u", "postgres", "--"])
                    .args(args),
            );
        };
        let chown = Command::new("chown")
            .arg("postgres:postgres")
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(chown.success());
        let data = dir.path().join("data");
        let data = data.to_str().unwrap();
        as_postgres(&[
            bin.join("initdb").to_str().unwrap(),
            "-D",
            data,
            "-A",
            "trust",
            "-U",
            "postgres",
        ]);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let opts = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 {settings}",
            dir.path().display()
        );
        as_postgres(&[
            bin.join("pg_ctl").to_str().unwrap(),
            "-D",
            data,
            "-o",
            &opts,
            "-l",
            &format!("{data}.log"),
            "-w",
            "start",
        ]);
        Some(Throwaway { dir, port })
    }
}

impl Drop for Throwaway {
    fn drop(&mut self) {
        let data = self.dir.path().join("data");
        let _ = Command::new("runuser")
            .args([
                "-u",
                "postgres",
                "--",
                "/usr/lib/postgresql/15/bin/pg_ctl",
                "-D",
            ])
            .arg(&data)
            .args(["-m", "immediate", "stop"])
            .output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_wal_level_replica() {
    if test_env("check_names_wal_level_replica").is_none() {
        return;
    }
    let pg = ground_or_skip!(Throwaway::start(
        "check_names_wal_level_replica",
        "-c wal_level=replica"
    ));
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port);
    let client = connect(&url).await;
    exec(&client, "CREATE TABLE orders (id int8 PRIMARY KEY, v text)").await;
    let config = throwaway_config(&pg, &url);
    let (ok, out) = tokio::task::spawn_blocking(move || cdcd(&["check"], &config))
        .await
        .unwrap();
    assert!(!ok, "check passed wal_level=replica:\n{out}");
    assert!(
        out.lines()
            .any(|l| l == "wal_level is replica: set wal_level = logical in postgresql.conf and restart Postgres"),
        "no wal_level line:\n{out}"
    );
}

/// A pipeline config for the throwaway cluster at `url`, capturing `public.orders`.
fn throwaway_config(pg: &Throwaway, url: &str) -> std::path::PathBuf {
    let config = pg.dir.path().join("pipeline.toml");
    std::fs::write(
        &config,
        format!(
            "[pipeline]\nname = \"walrep\"\n[source]\nkind = \"postgres\"\nurl = \"{url}\"\n\
             tables = [\"public.orders\"]\n[sink]\nwarehouse = \"{}\"\n",
            pg.dir.path().join("wh").display()
        ),
    )
    .unwrap();
    config
}

/// A slot invalidated by `max_slot_wal_keep_size` is reported by `cdcd check` and stops `cdcd`
/// with the way out, instead of a bare START_REPLICATION error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_slot_is_reported() {
    if test_env("lost_slot_is_reported").is_none() {
        return;
    }
    let pg = ground_or_skip!(Throwaway::start(
        "lost_slot_is_reported",
        "-c wal_level=logical -c max_slot_wal_keep_size=1MB",
    ));
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port);
    let client = connect(&url).await;
    exec(&client, "CREATE TABLE orders (id int8 PRIMARY KEY, v text)").await;
    // Its own statement: a slot cannot be created in a transaction that wrote.
    exec(
        &client,
        "SELECT pg_create_logical_replication_slot('cdcd_walrep', 'pgoutput')",
    )
    .await;
    // Push the slot's restart_lsn out of the kept WAL; the checkpoint invalidates it.
    for i in 0..4 {
        exec(
            &client,
            &format!("INSERT INTO orders VALUES ({i}, repeat('x', 1000)); SELECT pg_switch_wal();"),
        )
        .await;
    }
    exec(&client, "CHECKPOINT").await;
    let status: Option<String> = client
        .query_one(
            "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'cdcd_walrep'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        status.as_deref(),
        Some("lost"),
        "the slot was not invalidated"
    );

    let config = throwaway_config(&pg, &url);
    let c2 = config.clone();
    let (ok, out) = tokio::task::spawn_blocking(move || cdcd(&["check"], &c2))
        .await
        .unwrap();
    assert!(!ok, "check passed a lost slot:\n{out}");
    assert!(
        out.lines()
            .any(|l| l.contains("cdcd_walrep was invalidated")
                && l.contains("pg_drop_replication_slot('cdcd_walrep')")),
        "no lost-slot line:\n{out}"
    );
    let (ok, out) = tokio::task::spawn_blocking(move || cdcd(&[], &config))
        .await
        .unwrap();
    assert!(!ok, "cdcd ran on a lost slot:\n{out}");
    assert!(
        out.contains("wal_status = lost") && out.contains("max_slot_wal_keep_size"),
        "cdcd's error does not explain the lost slot:\n{out}"
    );
}
