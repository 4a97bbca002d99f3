//! Issue 22, MySQL/MariaDB: TLS with verification and client certificates, against the test
//! bed's second MariaDB (`scripts/testbed.sh`, component `mytls`: `ssl_cert`/`ssl_key`/`ssl_ca`
//! from the CA the script makes, binlog on). The replica is read back by lakecheck (DuckDB, with
//! pymysql reading the source over the plain admin account); the failures are `cdcd check`'s
//! lines. Without `CDCD_TEST_MY_TLS` each test prints a note and passes.
//!
//! Accounts (see the script): `cdc` (TLS or not: set-up and lakecheck), `cdc_tls` (REQUIRE SSL),
//! `cdc_x509` (REQUIRE X509), `cdc_ed` (MariaDB's ed25519 authentication). The server's certificate names `localhost` and `127.0.0.1` only;
//! the server also listens on 127.0.0.2, a name it lacks.

use std::path::PathBuf;
use std::time::Duration;

use mysql_async::prelude::Queryable;

use crate::support::mysql::{my_connect, my_exec, MyEnv, MyPipeline};
use crate::support::{current_test, ground, unique};

/// Passwords the test bed's script sets.
const TLS_PASSWORD: &str = "cdc-tls-pw";
const X509_PASSWORD: &str = "cdc-x509-pw";
const ED25519_PASSWORD: &str = "cdc-ed-pw";

/// The TLS server: its admin account as the pipeline's `MyEnv`, and the certificate files.
struct TlsBed {
    env: MyEnv,
    /// `127.0.0.1:<port>`.
    addr: String,
    ca: PathBuf,
    dir: PathBuf,
}

/// The TLS server and the running test's [`unique`] name from `tag`.
fn tls_bed(tag: &str) -> Option<(TlsBed, String)> {
    let test = current_test();
    let test = test.as_str();
    let url = ground::var(test, "CDCD_TEST_MY_TLS")?;
    let python = ground::var(test, "CDCD_TEST_PYTHON")?;
    let ca = PathBuf::from(ground::var(test, "CDCD_TEST_MY_TLS_CA")?);
    let dir = PathBuf::from(ground::var(test, "CDCD_TEST_MY_TLS_DIR")?);
    let parsed = url::Url::parse(&url).unwrap();
    let addr = format!("{}:{}", parsed.host_str().unwrap(), parsed.port().unwrap());
    let bed = TlsBed {
        env: MyEnv { url, python },
        addr,
        ca,
        dir,
    };
    Some((bed, unique(tag)))
}

impl TlsBed {
    /// `mysql://<user>@<host>:<port>/<db>?<query>`; `host` replaces 127.0.0.1.
    fn url(&self, user: &str, host: Option<&str>, db: &str, query: &str) -> String {
        let addr = match host {
            Some(h) => self.addr.replacen("127.0.0.1", h, 1),
            None => self.addr.clone(),
        };
        format!("mysql://{user}@{addr}/{db}?{query}")
    }
}

/// Points `p`'s config at `url` with `password` and `extra` `[source]` lines; set-up and
/// lakecheck keep the admin account.
fn use_source(p: &MyPipeline, url: &str, password: Option<&str>, extra: &str) {
    p.write_config("initial", extra);
    let text = std::fs::read_to_string(&p.config).unwrap();
    let admin = format!("url = {:?}\n", p.env.url_for(&p.db));
    assert!(text.contains(&admin), "{text}");
    let mut source = format!("url = {url:?}\n");
    if let Some(pw) = password {
        source.push_str(&format!("password = {pw:?}\n"));
    }
    std::fs::write(&p.config, text.replacen(&admin, &source, 1)).unwrap();
}

/// A table with rows before cdcd starts (the initial copy's).
async fn table_with_rows(p: &MyPipeline, t: &str) {
    let mut c = my_connect(&p.env.url_for(&p.db)).await;
    my_exec(
        &mut c,
        &format!(
            "CREATE TABLE {t} (id BIGINT PRIMARY KEY, v VARCHAR(40), at DATETIME(6));
             INSERT INTO {t} SELECT seq, CONCAT('copied ', seq), TIMESTAMP('2024-01-01') + INTERVAL seq SECOND
               FROM seq_1_to_3000"
        ),
    )
    .await;
}

/// Every connection of `user` the server has now: (command, Ssl_version, connection id), from
/// performance_schema (MariaDB keeps each session's status there; the script turns it on).
async fn sessions_of(p: &MyPipeline, user: &str) -> Vec<(String, String, u64)> {
    let mut c = my_connect(&p.env.url_for(&p.db)).await;
    c.exec(
        "SELECT t.PROCESSLIST_COMMAND, COALESCE(s.VARIABLE_VALUE, ''), t.PROCESSLIST_ID
           FROM performance_schema.threads t
           LEFT JOIN performance_schema.status_by_thread s
             ON s.THREAD_ID = t.THREAD_ID AND s.VARIABLE_NAME = 'Ssl_version'
          WHERE t.PROCESSLIST_USER = ?",
        (user,),
    )
    .await
    .unwrap()
}

/// The initial copy and the binlog stream over `verify_identity` TLS with the test CA: the
/// account can only come in over TLS (REQUIRE SSL), lakecheck reads the replica back, and the
/// server shows cdcd's binlog connection with a TLS version, also after the server killed it and
/// cdcd reconnected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_and_copy_run_over_verified_tls() {
    let (bed, name) = ground_or_skip!(tls_bed("mytlsrep"));
    let mut p = MyPipeline::new(&bed.env, &name, "initial", "").await;
    table_with_rows(&p, "t").await;
    let query = format!("ssl-mode=verify_identity&ssl-ca={}", bed.ca.display());
    use_source(
        &p,
        &bed.url("cdc_tls", None, &p.db, &query),
        Some(TLS_PASSWORD),
        "",
    );
    let (code, out) = p.check();
    assert_eq!(code, Some(0), "check over verify_identity:\n{out}");
    assert!(
        out.contains(&format!(
            "source TLS: ssl-mode=verify_identity (URL), ssl-ca={} (URL)",
            bed.ca.display()
        )),
        "{out}"
    );
    p.start();
    let mut c = my_connect(&p.env.url_for(&p.db)).await;
    my_exec(
        &mut c,
        "INSERT INTO t SELECT seq, CONCAT('streamed ', seq), NOW() FROM seq_3001_to_3500;
         UPDATE t SET v = 'updated' WHERE id % 10 = 0;
         DELETE FROM t WHERE id % 7 = 0",
    )
    .await;
    p.assert_equal("t", 120).await;
    let first = binlog_session_over_tls(&p, None).await;

    // The server drops the binlog connection: cdcd reconnects, again over verified TLS (the
    // account would refuse anything else), and loses nothing written meanwhile.
    my_exec(&mut c, &format!("KILL {first}")).await;
    my_exec(
        &mut c,
        "INSERT INTO t SELECT seq, 'after the kill', NOW() FROM seq_4001_to_4200;
         UPDATE t SET v = 'updated again' WHERE id % 11 = 0",
    )
    .await;
    p.assert_equal("t", 120).await;
    let second = binlog_session_over_tls(&p, Some(first)).await;
    assert_ne!(first, second);
    assert!(
        !p.output().contains(TLS_PASSWORD),
        "the password was logged"
    );
}

/// Waits for cdcd's binlog connection (one other than `not`), checks that every session of
/// `cdc_tls` is in TLS, and returns the binlog connection's id.
async fn binlog_session_over_tls(p: &MyPipeline, not: Option<u64>) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let seen = sessions_of(p, "cdc_tls").await;
        let dump = seen
            .iter()
            .find(|(cmd, _, id)| cmd == "Binlog Dump" && Some(*id) != not);
        if let Some((_, _, id)) = dump {
            assert!(
                seen.iter().all(|(_, v, _)| v.starts_with("TLSv1.")),
                "a session of cdcd without TLS: {seen:?}"
            );
            return *id;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no binlog connection of cdcd: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A wrong CA, a host name the certificate lacks, `ssl-mode=disabled` against a REQUIRE SSL
/// account, `required` against a server without TLS and a wrong password each fail `cdcd check`
/// with a line naming the host, the CA file, the user or the setting to change; `verify_ca` at
/// the unlisted name passes (it checks the chain, not the name), as do `required` (no
/// verification) and the default (`preferred`: TLS since the server offers it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_misconfigurations_fail_clearly() {
    let (bed, name) = ground_or_skip!(tls_bed("mytlsbad"));
    let p = MyPipeline::new(&bed.env, &name, "initial", "").await;
    table_with_rows(&p, "t").await;
    let db = p.db.clone();
    let ca = bed.ca.display().to_string();
    let other_ca = bed.dir.join("other-ca.crt").display().to_string();
    let url = |host: Option<&str>, query: &str| bed.url("cdc_tls", host, &db, query);
    let mut cases: Vec<(String, &str, bool, Vec<String>)> = vec![
        (
            url(None, ""),
            TLS_PASSWORD,
            true,
            vec!["source TLS: ssl-mode=preferred (default)".into()],
        ),
        (
            url(Some("127.0.0.2"), "ssl-mode=REQUIRED"),
            TLS_PASSWORD,
            true,
            vec!["source TLS: ssl-mode=REQUIRED (URL)".into()],
        ),
        (
            url(None, &format!("ssl-mode=verify_identity&ssl-ca={other_ca}")),
            TLS_PASSWORD,
            false,
            vec![
                "does not verify against".into(),
                other_ca.clone(),
                "127.0.0.1".into(),
            ],
        ),
        (
            url(
                Some("127.0.0.2"),
                &format!("ssl-mode=verify_identity&ssl-ca={ca}"),
            ),
            TLS_PASSWORD,
            false,
            vec![
                "not valid for the name \"127.0.0.2\"".into(),
                "verify_ca".into(),
            ],
        ),
        (
            url(
                Some("127.0.0.2"),
                &format!("ssl-mode=verify_ca&ssl-ca={ca}"),
            ),
            TLS_PASSWORD,
            true,
            vec![],
        ),
        // ssl-ca alone is verify_ca: the wrong CA still fails.
        (
            url(Some("127.0.0.2"), &format!("ssl-ca={other_ca}")),
            TLS_PASSWORD,
            false,
            vec!["does not verify against".into(), other_ca.clone()],
        ),
        (
            url(None, "ssl-mode=disabled"),
            TLS_PASSWORD,
            false,
            vec![
                "\"cdc_tls\"".into(),
                "set ssl-mode=required or stronger".into(),
            ],
        ),
        (
            url(None, &format!("ssl-mode=verify_identity&ssl-ca={ca}")),
            "not-the-tls-pw",
            false,
            vec!["Access denied for user 'cdc_tls'".into()],
        ),
    ];
    if let Some(plain) = crate::support::mysql::my_env("tls_misconfigurations_fail_clearly") {
        // The shared test bed's MariaDB has no TLS at all.
        let plain_url = format!("{}?ssl-mode=required", plain.url_for(&db));
        cases.push((
            plain_url,
            "cdcpw",
            false,
            vec![
                "does not accept TLS connections".into(),
                "ssl-mode=required".into(),
            ],
        ));
    }
    for (url, password, passes, words) in cases {
        use_source(&p, &url, Some(password), "");
        let (code, out) = p.check();
        assert_eq!(code == Some(0), passes, "check with {url}:\n{out}");
        for w in &words {
            assert!(
                out.contains(w.as_str()),
                "check with {url} lacks {w:?}:\n{out}"
            );
        }
        assert!(
            !out.contains(password),
            "check printed the password:\n{out}"
        );
    }

    // `[source]` keys win over the URL's parameters, and check shows both.
    use_source(
        &p,
        &url(None, "ssl-mode=disabled"),
        Some(TLS_PASSWORD),
        &format!("ssl_mode = \"verify_identity\"\nssl_ca = {ca:?}"),
    );
    let (code, out) = p.check();
    assert_eq!(
        code,
        Some(0),
        "check with source.ssl_mode over the URL's:\n{out}"
    );
    assert!(
        out.contains("ssl-mode=verify_identity (source.ssl_mode, over the URL's disabled)")
            && out.contains(&format!("ssl-ca={ca} (source.ssl_ca)")),
        "{out}"
    );
}

/// A REQUIRE X509 account: refused without a client certificate (with the hint), then the copy
/// and the stream with `ssl-cert`/`ssl-key` over `verify_identity`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_account_replicates() {
    let (bed, name) = ground_or_skip!(tls_bed("mytlscrt"));
    let mut p = MyPipeline::new(&bed.env, &name, "initial", "").await;
    table_with_rows(&p, "t").await;
    let verify = format!("ssl-mode=verify_identity&ssl-ca={}", bed.ca.display());
    use_source(
        &p,
        &bed.url("cdc_x509", None, &p.db, &verify),
        Some(X509_PASSWORD),
        "",
    );
    let (code, out) = p.check();
    assert_ne!(
        code,
        Some(0),
        "REQUIRE X509 passed without a certificate:\n{out}"
    );
    assert!(
        out.contains("REQUIRE X509") && out.contains("ssl-cert"),
        "{out}"
    );
    let query = format!(
        "{verify}&ssl-cert={}&ssl-key={}",
        bed.dir.join("client.crt").display(),
        bed.dir.join("client.key").display(),
    );
    use_source(
        &p,
        &bed.url("cdc_x509", None, &p.db, &query),
        Some(X509_PASSWORD),
        "",
    );
    let (code, out) = p.check();
    assert_eq!(code, Some(0), "check with a client certificate:\n{out}");
    p.start();
    let mut c = my_connect(&p.env.url_for(&p.db)).await;
    my_exec(
        &mut c,
        "INSERT INTO t VALUES (5000, 'streamed', NOW()); DELETE FROM t WHERE id <= 10",
    )
    .await;
    p.assert_equal("t", 120).await;
}

/// MariaDB's ed25519 authentication (the server asks for it by the account's plugin), over plain
/// TCP: a wrong password names the user, then the copy and the stream. Before the feature was
/// enabled, mysql_common panicked on this request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ed25519_account_replicates() {
    let (bed, name) = ground_or_skip!(tls_bed("mytlsed"));
    let mut p = MyPipeline::new(&bed.env, &name, "initial", "").await;
    table_with_rows(&p, "t").await;
    let url = bed.url("cdc_ed", None, &p.db, "ssl-mode=disabled");
    use_source(&p, &url, Some("not-the-ed-pw"), "");
    let (code, out) = p.check();
    assert_ne!(code, Some(0), "a wrong ed25519 password passed:\n{out}");
    assert!(
        out.contains("Access denied for user 'cdc_ed'") && !out.contains("not-the-ed-pw"),
        "{out}"
    );
    use_source(&p, &url, Some(ED25519_PASSWORD), "");
    let (code, out) = p.check();
    assert_eq!(code, Some(0), "check with ed25519:\n{out}");
    p.start();
    let mut c = my_connect(&p.env.url_for(&p.db)).await;
    my_exec(
        &mut c,
        "INSERT INTO t VALUES (6000, 'streamed', NOW()); UPDATE t SET v = 'ed' WHERE id < 100",
    )
    .await;
    p.assert_equal("t", 120).await;
    let seen = sessions_of(&p, "cdc_ed").await;
    assert!(
        seen.iter().all(|(_, v, _)| v.is_empty()),
        "ssl-mode=disabled used TLS: {seen:?}"
    );
}
