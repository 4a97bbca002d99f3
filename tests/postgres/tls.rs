//! Issue 22, Postgres: TLS with verification, md5 and client certificates, against the test bed's
//! second cluster (`scripts/testbed.sh`, component `pgtls`: `ssl = on`, a CA made by openssl,
//! `hostssl`-only roles). The replica is read back by lakecheck (DuckDB) as everywhere else; the
//! failures are `cdcd check`'s lines. Without `CDCD_TEST_PG_TLS` each test prints a note and passes.
//!
//! The roles (see the script): `cdcd_tls` (hostssl only, scram-sha-256), `cdcd_md5` (md5, TLS or
//! not), `cdcd_cert` (hostssl only, client certificate). The server's certificate names
//! `localhost` and `127.0.0.1` only; the cluster also listens on 127.0.0.2, a name it lacks.

use std::path::PathBuf;
use std::time::Duration;

use tokio_postgres::Client;

use crate::support::{
    connect, current_test, exec, ground, run_cdcd, unique, Pipeline, Settings, TestEnv,
};

/// Passwords the test bed's script sets for its roles.
const TLS_PASSWORD: &str = "cdcd-tls-pw";
const MD5_PASSWORD: &str = "cdcd-md5-pw";

/// The TLS cluster: its admin URL (trust, plain) as the pipeline's `TestEnv`, and its cert files.
struct TlsBed {
    env: TestEnv,
    /// `127.0.0.1:<port>`.
    addr: String,
    ca: PathBuf,
    dir: PathBuf,
}

/// The TLS server and the running test's [`unique`] name from `tag`.
fn tls_bed(tag: &str) -> Option<(TlsBed, String)> {
    let test = current_test();
    let test = test.as_str();
    let pg_url = ground::var(test, "CDCD_TEST_PG_TLS")?;
    let python = ground::var(test, "CDCD_TEST_PYTHON")?;
    let ca = PathBuf::from(ground::var(test, "CDCD_TEST_PG_TLS_CA")?);
    let dir = PathBuf::from(ground::var(test, "CDCD_TEST_PG_TLS_DIR")?);
    let url = url::Url::parse(&pg_url).unwrap();
    let addr = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap());
    let bed = TlsBed {
        env: TestEnv { pg_url, python },
        addr,
        ca,
        dir,
    };
    Some((bed, unique(tag)))
}

impl TlsBed {
    /// `postgres://<user>@<host>:<port>/cdcd_test?<query>`; `host` replaces 127.0.0.1.
    fn url(&self, user: &str, host: Option<&str>, query: &str) -> String {
        let addr = match host {
            Some(h) => self.addr.replacen("127.0.0.1", h, 1),
            None => self.addr.clone(),
        };
        format!("postgres://{user}@{addr}/cdcd_test?{query}")
    }
}

/// A table with rows before cdcd starts (the initial copy's) on the TLS cluster.
async fn table_with_rows(client: &Client, t: &str) {
    exec(
        client,
        &format!(
            "DROP TABLE IF EXISTS {t};
             CREATE TABLE {t} (id int8 PRIMARY KEY, v text, at timestamptz);
             INSERT INTO {t} SELECT g, 'copied ' || g, timestamptz '2024-01-01 00:00+00' + g * interval '1 s'
               FROM generate_series(1, 3000) g;"
        ),
    )
    .await;
}

/// Changes after the copy (the stream's).
async fn change_rows(client: &Client, t: &str) {
    exec(
        client,
        &format!(
            "INSERT INTO {t} SELECT g, 'streamed ' || g, now() FROM generate_series(3001, 3500) g;
             UPDATE {t} SET v = 'updated' WHERE id % 10 = 0;
             DELETE FROM {t} WHERE id % 7 = 0;"
        ),
    )
    .await;
}

/// `cdcd check --config <file>`: (exit 0, stdout + stderr).
fn check(config: &std::path::Path) -> (bool, String) {
    run_cdcd(&["check"], config)
}

/// The initial copy, streaming and the heartbeat/slot-watch connection over `verify-full` TLS
/// with SCRAM: the role can only come in through `hostssl`, so any plain connection would fail
/// the pipeline, and `pg_stat_ssl` shows each of cdcd's live backends (walsender, monitor) in TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_copy_and_heartbeat_run_over_verified_tls() {
    let (bed, name) = ground_or_skip!(tls_bed("tlsrep"));
    let t = format!("{name}_t");
    let client = connect(&bed.env.pg_url).await;
    table_with_rows(&client, &t).await;
    let settings = Settings {
        url: Some(bed.url(
            "cdcd_tls",
            None,
            &format!("sslmode=verify-full&sslrootcert={}", bed.ca.display()),
        )),
        password: Some(TLS_PASSWORD.into()),
        ..Settings::default()
    };
    let mut p = Pipeline::new(&bed.env, &name, &[&t], &settings);
    p.on_cleanup(format!("DROP TABLE IF EXISTS {t}"));
    let (ok, out) = check(&p.config);
    assert!(ok, "check over verify-full:\n{out}");
    assert!(
        out.contains(&format!(
            "source TLS: sslmode=verify-full (URL), sslrootcert={} (URL)",
            bed.ca.display()
        )),
        "{out}"
    );
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    change_rows(&client, &t).await;
    p.assert_equal(&t, 120).await;

    // Every backend of cdcd's role is in TLS, and both kinds are there: the walsender and the
    // monitor's query connection (heartbeats and slot watch).
    let rows = client
        .query(
            "SELECT a.backend_type, s.ssl, coalesce(s.version, '') FROM pg_stat_activity a
               JOIN pg_stat_ssl s USING (pid)
              WHERE a.usename = 'cdcd_tls' AND a.application_name = 'cdcd'",
            &[],
        )
        .await
        .unwrap();
    let seen: Vec<(String, bool, String)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert!(
        seen.iter().all(|(_, ssl, _)| *ssl),
        "a plain backend: {seen:?}"
    );
    for kind in ["walsender", "client backend"] {
        assert!(
            seen.iter().any(|(k, _, _)| k == kind),
            "no {kind} of cdcd: {seen:?}"
        );
    }
    assert!(
        !p.output().contains(TLS_PASSWORD),
        "the password was logged"
    );
    p.assert_running();
}

/// A wrong CA, a host name the certificate lacks, and `sslmode=disable` against a `hostssl`-only
/// role each fail `cdcd check` with a line naming the host, the CA file or the setting to change;
/// `verify-ca` at the same unlisted name passes (it checks the chain, not the name), as do
/// `allow` (plain refused, then TLS) and `require` (no verification).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_misconfigurations_fail_clearly() {
    let (bed, name) = ground_or_skip!(tls_bed("tlsbad"));
    let t = format!("{name}_t");
    let client = connect(&bed.env.pg_url).await;
    table_with_rows(&client, &t).await;
    let other_ca = bed.dir.join("other-ca.crt");
    let ca = bed.ca.display().to_string();
    let cases: [(String, bool, Vec<String>); 6] = [
        // libpq's allow: the plain attempt is refused (hostssl only), the TLS retry gets in.
        (bed.url("cdcd_tls", None, "sslmode=allow"), true, vec![]),
        // require verifies nothing: neither the chain (not in the system's roots) nor the name.
        (
            bed.url("cdcd_tls", Some("127.0.0.2"), "sslmode=require"),
            true,
            vec!["source TLS: sslmode=require (URL)".into()],
        ),
        (
            bed.url(
                "cdcd_tls",
                None,
                &format!("sslmode=verify-full&sslrootcert={}", other_ca.display()),
            ),
            false,
            vec![
                "does not verify against".into(),
                other_ca.display().to_string(),
                "127.0.0.1".into(),
            ],
        ),
        (
            bed.url(
                "cdcd_tls",
                Some("127.0.0.2"),
                &format!("sslmode=verify-full&sslrootcert={ca}"),
            ),
            false,
            vec![
                "not valid for the name \"127.0.0.2\"".into(),
                "verify-ca".into(),
            ],
        ),
        (
            bed.url("cdcd_tls", None, "sslmode=disable"),
            false,
            vec!["the server requires TLS: set sslmode=require or stronger".into()],
        ),
        (
            bed.url(
                "cdcd_tls",
                Some("127.0.0.2"),
                &format!("sslmode=verify-ca&sslrootcert={ca}"),
            ),
            true,
            vec![],
        ),
    ];
    let mut p = Pipeline::new(&bed.env, &name, &[&t], &Settings::default());
    p.on_cleanup(format!("DROP TABLE IF EXISTS {t}"));
    for (url, passes, words) in cases {
        p.write_config(&Settings {
            url: Some(url.clone()),
            password: Some(TLS_PASSWORD.into()),
            ..Settings::default()
        });
        let (ok, out) = check(&p.config);
        assert_eq!(ok, passes, "check with {url}:\n{out}");
        for w in &words {
            assert!(
                out.contains(w.as_str()),
                "check with {url} lacks {w:?}:\n{out}"
            );
        }
        assert!(
            !out.contains(TLS_PASSWORD),
            "check printed the password:\n{out}"
        );
    }

    // `[source]` keys win over the URL's parameters, and check shows both.
    p.write_config(&Settings {
        url: Some(bed.url("cdcd_tls", None, "sslmode=disable")),
        password: Some(TLS_PASSWORD.into()),
        ..Settings::default()
    });
    let text = std::fs::read_to_string(&p.config).unwrap().replacen(
        "[source]\n",
        &format!("[source]\nsslmode = \"verify-full\"\nsslrootcert = {ca:?}\n"),
        1,
    );
    std::fs::write(&p.config, text).unwrap();
    let (ok, out) = check(&p.config);
    assert!(ok, "check with source.sslmode over the URL's:\n{out}");
    assert!(
        out.contains("sslmode=verify-full (source.sslmode, over the URL's disable)")
            && out.contains(&format!("sslrootcert={ca} (source.sslrootcert)")),
        "{out}"
    );
}

/// md5 (the role's password is stored as an md5 hash), plain TCP: the copy and the stream, then a
/// wrong password names the user and the method.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn md5_authentication_replicates() {
    let (bed, name) = ground_or_skip!(tls_bed("tlsmd5"));
    let t = format!("{name}_t");
    let client = connect(&bed.env.pg_url).await;
    table_with_rows(&client, &t).await;
    let url = bed.url("cdcd_md5", None, "sslmode=disable");
    let mut p = Pipeline::new(
        &bed.env,
        &name,
        &[&t],
        &Settings {
            url: Some(url.clone()),
            password: Some("not-the-md5-pw".into()),
            ..Settings::default()
        },
    );
    p.on_cleanup(format!("DROP TABLE IF EXISTS {t}"));
    let (ok, out) = check(&p.config);
    assert!(!ok, "a wrong md5 password passed:\n{out}");
    assert!(
        out.contains("\"cdcd_md5\"")
            && out.contains("method md5")
            && !out.contains("not-the-md5-pw"),
        "{out}"
    );
    p.write_config(&Settings {
        url: Some(url),
        password: Some(MD5_PASSWORD.into()),
        ..Settings::default()
    });
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    change_rows(&client, &t).await;
    p.assert_equal(&t, 120).await;
    p.assert_running();
}

/// A client certificate (`cert` authentication, no password) over `verify-ca`: copy and stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_authentication_replicates() {
    let (bed, name) = ground_or_skip!(tls_bed("tlscrt"));
    let t = format!("{name}_t");
    let client = connect(&bed.env.pg_url).await;
    table_with_rows(&client, &t).await;
    let query = format!(
        "sslmode=verify-ca&sslrootcert={}&sslcert={}&sslkey={}",
        bed.ca.display(),
        bed.dir.join("client.crt").display(),
        bed.dir.join("client.key").display(),
    );
    let mut p = Pipeline::new(
        &bed.env,
        &name,
        &[&t],
        &Settings {
            url: Some(bed.url("cdcd_cert", None, &query)),
            ..Settings::default()
        },
    );
    p.on_cleanup(format!("DROP TABLE IF EXISTS {t}"));
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    change_rows(&client, &t).await;
    p.assert_equal(&t, 120).await;
    let plain: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
              WHERE a.usename = 'cdcd_cert' AND NOT s.ssl",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(plain, 0);
    p.assert_running();
}
