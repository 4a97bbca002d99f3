//! Helpers for the MySQL/MariaDB end-to-end tests: a MariaDB connection, a cdcd pipeline whose
//! source is `CDCD_TEST_MYSQL` (a drop guard like [`super::Pipeline`]: kills cdcd, drops the test's
//! database, prints cdcd's output on failure), and lakecheck with `--source mysql://…`.
//!
//! Every test works in its own database `<tag>_<pid>`, so parallel tests never see each other's
//! tables, and each pipeline registers with its own `server_id`.
//!
//! Tests that change a server's binlogs (`PURGE BINARY LOGS`, `RESET MASTER`) would take binlogs
//! from under the other tests' pipelines on the shared server; they run on a [`PrivateMaria`]: a
//! mariadbd of the same installation on its own port and data directory, started for the test.
#![allow(dead_code)]

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts};

use super::{cdcd_bin, ground, Rng, LAKECHECK, NAMESPACE};

/// The MariaDB test server and the Python readers.
#[derive(Clone, Debug)]
pub struct MyEnv {
    /// `mysql://cdc:cdcpw@127.0.0.1:53316/cdcd_test`
    pub url: String,
    pub python: String,
}

/// The test bed's MariaDB, or `None` when the test skips without it ([`ground::var`]).
pub fn my_env(test: &str) -> Option<MyEnv> {
    let (url, python) = super::server_and_readers(test, "CDCD_TEST_MYSQL")?;
    Some(MyEnv { url, python })
}

/// [`my_env`] of the running test and its [`super::unique`] name from `tag` (its database's
/// name).
pub fn my_env_and_name(tag: &str) -> Option<(MyEnv, String)> {
    Some((my_env(&super::current_test())?, super::unique(tag)))
}

impl MyEnv {
    /// The URL with `db` as its database.
    pub fn url_for(&self, db: &str) -> String {
        let base = self
            .url
            .rsplit_once('/')
            .map_or(self.url.as_str(), |(b, _)| b);
        format!("{base}/{db}")
    }
}

/// A connection to `url`.
pub async fn my_connect(url: &str) -> Conn {
    let opts = Opts::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    Conn::new(opts)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// Runs `sql` (statements separated by `;` on their own — the text protocol runs them all).
pub async fn my_exec(conn: &mut Conn, sql: &str) {
    if let Err(e) = conn.query_drop(sql).await {
        panic!("SQL failed: {e}\n--- statement:\n{sql}");
    }
}

/// Four rounds on a new table `acct`: cdcd starts, `writes` random inserts, updates and deletes
/// (seeded as [`Rng::from_env_or_clock`] says for `test`), then a kill -9 at a random moment.
/// cdcd is not running at the end.
pub async fn writes_through_kills(p: &mut MyPipeline, c: &mut Conn, test: &str, writes: u32) {
    create_acct(c).await;
    kill_rounds(p, c, test, writes).await;
}

/// Creates the table `acct` of [`writes_through_kills`].
pub async fn create_acct(c: &mut Conn) {
    my_exec(
        c,
        "CREATE TABLE acct (id INT PRIMARY KEY, n BIGINT, note VARCHAR(40))",
    )
    .await;
}

/// The rounds of [`writes_through_kills`] on an existing `acct`.
pub async fn kill_rounds(p: &mut MyPipeline, c: &mut Conn, test: &str, writes: u32) {
    let mut rng = Rng::from_env_or_clock(test);
    let mut next_id = 0;
    for round in 0..4 {
        p.start();
        for _ in 0..writes {
            let k = rng.range(0, 40);
            let sql = match rng.range(0, 4) {
                0 | 1 => {
                    next_id += 1;
                    format!("INSERT INTO acct VALUES ({next_id}, {k}, 'r{round}')")
                }
                2 => format!("UPDATE acct SET n = n + 1, note = 'u{round}' WHERE id % 40 = {k}"),
                _ => format!("DELETE FROM acct WHERE id % 40 = {k}"),
            };
            my_exec(c, &sql).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.range(50, 1500))).await;
        p.kill9();
    }
}

/// Waits until cdcd's whole output satisfies `ready`; fails if cdcd exits or `timeout` passes.
pub async fn wait_for(
    p: &mut MyPipeline,
    what: &str,
    timeout: Duration,
    ready: impl Fn(&str) -> bool,
) {
    let deadline = std::time::Instant::now() + timeout;
    while !ready(&p.output()) {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        assert!(
            p.wait_exit(Duration::from_millis(50)).await.is_none(),
            "cdcd exited while waiting for {what}"
        );
    }
}

/// One cdcd pipeline on a MariaDB database. Drop guard.
pub struct MyPipeline {
    pub env: MyEnv,
    pub name: String,
    pub db: String,
    pub server_id: u32,
    pub dir: Option<tempfile::TempDir>,
    pub config: PathBuf,
    pub warehouse: PathBuf,
    pub stderr_log: PathBuf,
    /// `Some(buckets)`: the LSM sink (Paimon tables, checked with pypaimon) instead of Iceberg.
    pub lsm_buckets: Option<u32>,
    /// `Some`: the warehouse is `s3://<bucket>/wh` on this moto endpoint ([`MyPipeline::use_s3`]).
    pub s3: Option<super::s3::S3Target>,
    /// Extra environment for cdcd (a crash point, say).
    pub env_vars: Vec<(String, String)>,
    daemon: Option<Child>,
    starts: u32,
}

impl MyPipeline {
    /// A pipeline `name` capturing `<db>.*`, where `db` = `name` is created empty.
    pub async fn new(env: &MyEnv, name: &str, snapshot: &str, extra_source: &str) -> MyPipeline {
        let dir = tempfile::Builder::new()
            .prefix(&format!("cdcd-{name}-"))
            .tempdir()
            .unwrap();
        let p = MyPipeline {
            env: env.clone(),
            name: name.to_owned(),
            db: name.to_owned(),
            // Two replicas with one server_id kick each other off the server: derive it from the
            // whole name (FNV-1a), not only the process, since tests of one binary run together.
            server_id: 10_000
                + (name.bytes().fold(0x811c_9dc5u32, |h, b| {
                    (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
                }) ^ std::process::id())
                    % 1_000_000_000,
            config: dir.path().join("pipeline.toml"),
            warehouse: dir.path().join("wh"),
            stderr_log: dir.path().join("cdcd.stderr"),
            dir: Some(dir),
            lsm_buckets: None,
            s3: None,
            env_vars: Vec::new(),
            daemon: None,
            starts: 0,
        };
        let mut c = my_connect(&env.url).await;
        my_exec(
            &mut c,
            &format!("DROP DATABASE IF EXISTS `{0}`; CREATE DATABASE `{0}`", p.db),
        )
        .await;
        p.write_config(snapshot, extra_source);
        p
    }

    /// Switches this pipeline to the LSM sink with `buckets` and rewrites its config.
    pub fn use_lsm(&mut self, buckets: u32, snapshot: &str, extra_source: &str) {
        self.lsm_buckets = Some(buckets);
        self.write_config(snapshot, extra_source);
    }

    /// Moves this pipeline's warehouse to a fresh bucket on the moto at `endpoint` and rewrites
    /// its config; lakecheck then reads the tables from there.
    pub fn use_s3(&mut self, endpoint: &str, snapshot: &str, extra_source: &str) {
        let bucket = super::s3::bucket_name(&self.name);
        let env = super::TestEnv {
            pg_url: String::new(),
            python: self.env.python.clone(),
        };
        super::s3::create_bucket(&env, endpoint, &bucket);
        self.s3 = Some(super::s3::S3Target {
            endpoint: endpoint.to_owned(),
            warehouse_url: format!("s3://{bucket}/wh"),
        });
        self.write_config(snapshot, extra_source);
    }

    pub fn write_config(&self, snapshot: &str, extra_source: &str) {
        let sink = match self.lsm_buckets {
            Some(b) => format!("kind = \"lsm\"\nbuckets = {b}"),
            None => "kind = \"iceberg\"".to_owned(),
        };
        let (wh, s3) = match &self.s3 {
            Some(t) => (
                t.warehouse_url.clone(),
                super::s3::sink_s3_section(&t.endpoint),
            ),
            None => (self.warehouse.display().to_string(), String::new()),
        };
        let text = format!(
            "[pipeline]\nname = {name:?}\ncommit_interval_ms = 200\n\n\
             [source]\nkind = \"mysql\"\nurl = {url:?}\ntables = [\"{db}.*\"]\nserver_id = {sid}\n\
             snapshot = {snapshot:?}\n{extra_source}\n\n\
             [sink]\n{sink}\nwarehouse = {wh:?}\nnamespace = {NAMESPACE:?}\n{s3}",
            name = self.name,
            url = self.env.url_for(&self.db),
            db = self.db,
            sid = self.server_id,
        );
        fs::write(&self.config, text).unwrap();
    }

    /// Appends `key = value` in a `[sink.tables."<db>.*"]` section to the config.
    pub fn set_for_all_tables(&self, key: &str, value: &str) {
        let mut config = OpenOptions::new().append(true).open(&self.config).unwrap();
        writeln!(
            config,
            "\n[sink.tables.\"{}.*\"]\n{key} = {value:?}",
            self.db
        )
        .unwrap();
    }

    pub fn start(&mut self) {
        assert!(self.daemon.is_none(), "cdcd is already running");
        self.starts += 1;
        let vars = std::iter::once(("CDCD_LOG", "info"))
            .chain(self.env_vars.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        self.daemon = Some(super::spawn_daemon(
            &self.config,
            vars,
            &self.stderr_log,
            self.starts,
        ));
    }

    /// Runs `cdcd check` on this pipeline's config; returns exit code and output.
    pub fn check(&self) -> (Option<i32>, String) {
        let out = Command::new(cdcd_bin())
            .arg("check")
            .arg("--config")
            .arg(&self.config)
            .output()
            .unwrap();
        (out.status.code(), crate::support::stdout_then_stderr(&out))
    }

    /// The running daemon's pid.
    pub fn pid(&self) -> Option<u32> {
        self.daemon.as_ref().map(Child::id)
    }

    /// SIGTERM, then waits for the exit (panics after `timeout`).
    pub async fn sigterm_and_wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let pid = self.pid().expect("cdcd is not running");
        super::sigterm(pid);
        match self.wait_exit(timeout).await {
            Some(st) => st,
            None => {
                self.kill9();
                panic!("cdcd did not exit within {timeout:?} of SIGTERM");
            }
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.daemon.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM (a clean stop: cdcd commits what is buffered), then waits up to `timeout` for the
    /// exit; panics if it does not exit or exits non-zero.
    pub async fn stop(&mut self, timeout: Duration) {
        let child = self.daemon.as_ref().expect("cdcd is not running");
        super::sigterm(child.id());
        match self.wait_exit(timeout).await {
            Some(st) => assert!(st.success(), "cdcd exited with {st} after SIGTERM"),
            None => panic!("cdcd did not exit within {timeout:?} of SIGTERM"),
        }
    }

    /// A refusal or a stop: waits up to `timeout` for cdcd to exit, fails the test with `why`
    /// unless it exited with an error, and returns its output.
    pub async fn assert_stops(&mut self, timeout: Duration, why: &str) -> String {
        let st = self.wait_exit(timeout).await;
        assert!(
            matches!(st, Some(s) if !s.success()),
            "{why}, got {st:?}:\n{}",
            self.output()
        );
        self.output()
    }

    /// Waits for cdcd to exit on its own (e.g. after an error); returns its status.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(c) = self.daemon.as_mut() {
                if let Some(st) = c.try_wait().unwrap() {
                    self.daemon = None;
                    return Some(st);
                }
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub fn output(&self) -> String {
        fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }

    pub fn table_dir(&self, table: &str) -> PathBuf {
        match self.lsm_buckets {
            Some(_) => self.warehouse.join(format!("{NAMESPACE}.db")).join(table),
            None => self.warehouse.join(NAMESPACE).join(table),
        }
    }

    fn assert_running(&mut self) {
        if let Some(c) = self.daemon.as_mut() {
            if let Some(st) = c.try_wait().unwrap() {
                self.daemon = None;
                let out = self.output();
                panic!(
                    "cdcd exited on its own: {st}; its last output:\n{}",
                    super::tail(&out)
                );
            }
        }
    }

    /// lakecheck `<db>.<table>` against the lake, polling up to `wait_secs`.
    pub async fn lakecheck(&mut self, table: &str, wait_secs: u32) -> (Option<i32>, String) {
        if let Some(t) = self.s3.clone() {
            use super::s3::{lakecheck_s3, Lake};
            let (table_url, paimon_table) = (
                format!("{}/{NAMESPACE}/{table}", t.warehouse_url),
                format!("{NAMESPACE}.{table}"),
            );
            let lake = match self.lsm_buckets {
                Some(_) => Lake::Paimon {
                    warehouse: &t.warehouse_url,
                    table: &paimon_table,
                },
                None => Lake::Iceberg {
                    table_url: &table_url,
                    reader: "duckdb",
                },
            };
            let (python, source) = (self.env.python.clone(), self.env.url_for(&self.db));
            let source_table = format!("{}.{table}", self.db);
            let check = lakecheck_s3(
                &python,
                &t.endpoint,
                &source,
                &source_table,
                lake,
                wait_secs,
            );
            tokio::pin!(check);
            return loop {
                tokio::select! {
                    out = &mut check => break out,
                    _ = tokio::time::sleep(Duration::from_millis(500)) => self.assert_running(),
                }
            };
        }
        let mut cmd = tokio::process::Command::new(&self.env.python);
        cmd.arg(LAKECHECK)
            .args(["--source", &self.env.url_for(&self.db)])
            .args(["--source-table", &format!("{}.{table}", self.db)]);
        match self.lsm_buckets {
            Some(_) => cmd
                .arg("--paimon")
                .arg(&self.warehouse)
                .args(["--paimon-table", &format!("{NAMESPACE}.{table}")]),
            None => cmd.arg("--iceberg").arg(self.table_dir(table)),
        };
        cmd.args(["--wait", &wait_secs.to_string()]);
        super::run_lakecheck(cmd, || self.assert_running()).await
    }

    pub async fn assert_equal(&mut self, table: &str, wait_secs: u32) {
        let (code, out) = self.lakecheck(table, wait_secs).await;
        assert_eq!(
            code,
            Some(0),
            "lakecheck {}.{table}: differs:\n{out}",
            self.db
        );
        eprintln!(
            "lakecheck {}.{table}: {}",
            self.db,
            out.lines().last().unwrap_or("")
        );
    }

    /// The newest snapshot's `cdcd.position` of `table`.
    pub fn position(&self, table: &str) -> String {
        let out = Command::new(&self.env.python)
            .arg(LAKECHECK)
            .arg("--iceberg")
            .arg(self.table_dir(table))
            .arg("--position")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    }
}

impl Drop for MyPipeline {
    fn drop(&mut self) {
        self.kill9();
        let url = self.env.url.clone();
        let db = self.db.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async move {
                let mut c = my_connect(&url).await;
                let _ = c
                    .query_drop(format!("DROP DATABASE IF EXISTS `{db}`"))
                    .await;
            });
            Some(())
        })
        .join();
        if std::thread::panicking() {
            let out = self.output();
            let tail: Vec<&str> = out.lines().rev().take(200).collect();
            eprintln!("----- cdcd output ({}) -----", self.stderr_log.display());
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
            if let Some(dir) = self.dir.take() {
                eprintln!("----- kept for inspection: {}", dir.keep().display());
            }
        }
    }
}

/// A MariaDB server of the test bed's installation, on its own port and data directory, for tests
/// that purge or reset binlogs. Drop guard: the server is killed and its directory removed.
pub struct PrivateMaria {
    pub env: MyEnv,
    /// The unix socket root logs in through (`mariadb --socket … -uroot`).
    pub socket: PathBuf,
    server: Option<Child>,
    dir: Option<tempfile::TempDir>,
}

impl PrivateMaria {
    /// Starts one, or `None` (after printing why) without the test bed or its MariaDB binaries.
    pub async fn start(test: &str) -> Option<PrivateMaria> {
        let base = my_env(test)?;
        let found = |bin: &str| {
            Command::new(bin)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if !found("mariadbd") || !found("mariadb-install-db") {
            ground::missing(test, "mariadbd / mariadb-install-db are not installed");
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("cdcd-maria-")
            .tempdir()
            .unwrap();
        let root = dir.path().to_path_buf();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let socket = root.join("mysqld.sock");
        // The test bed's settings (scripts/testbed.sh), small: tests hold a few rows.
        let cnf = root.join("my.cnf");
        fs::create_dir_all(root.join("binlog")).unwrap();
        fs::write(
            &cnf,
            format!(
                "[mariadbd]\ndatadir={r}/data\nsocket={sock}\npid-file={r}/mysqld.pid\n\
                 bind-address=127.0.0.1\nport={port}\nlog_error={r}/mariadb.err\nserver_id=1\n\
                 log_bin={r}/binlog/mariadb-bin\nbinlog_format=ROW\nbinlog_row_image=FULL\n\
                 binlog_row_metadata=FULL\ninnodb_buffer_pool_size=32M\n\
                 innodb_flush_log_at_trx_commit=2\nperformance_schema=OFF\nskip-name-resolve\n\
                 character-set-server=utf8mb4\ncollation-server=utf8mb4_general_ci\n{user}",
                r = root.display(),
                sock = socket.display(),
                // As root, mariadbd runs as the mysql user (the owner of the directory).
                user = if is_root() { "user=mysql\n" } else { "" },
            ),
        )
        .unwrap();
        if is_root() {
            let st = Command::new("chown")
                .args(["-R", "mysql:mysql"])
                .arg(&root)
                .status()
                .unwrap();
            assert!(st.success(), "chown mysql {}", root.display());
        }
        let defaults = format!("--defaults-file={}", cnf.display());
        super::output_ok(
            Command::new("mariadb-install-db")
                .arg(&defaults)
                .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
                .args(if is_root() {
                    &["--user=mysql"][..]
                } else {
                    &[]
                }),
        );
        let server = Command::new("mariadbd")
            .arg(&defaults)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let url = format!("mysql://cdc:cdcpw@127.0.0.1:{port}/mysql");
        let mut me = PrivateMaria {
            env: MyEnv {
                url,
                python: base.python,
            },
            socket,
            server: Some(server),
            dir: Some(dir),
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let ok = me
                .root_sql(
                    "CREATE USER IF NOT EXISTS 'cdc'@'127.0.0.1' IDENTIFIED BY 'cdcpw';\
                     GRANT ALL ON *.* TO 'cdc'@'127.0.0.1' WITH GRANT OPTION",
                )
                .is_ok();
            if ok {
                break;
            }
            let err = fs::read_to_string(root.join("mariadb.err")).unwrap_or_default();
            assert!(
                std::time::Instant::now() < deadline,
                "the private mariadbd did not start:\n{err}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Some(me)
    }

    /// Runs `sql` as root through the socket; `Err(output)` when it fails.
    pub fn root_sql(&mut self, sql: &str) -> Result<String, String> {
        if let Some(st) = self
            .server
            .as_mut()
            .and_then(|s| s.try_wait().ok().flatten())
        {
            return Err(format!("mariadbd exited: {st}"));
        }
        let out = Command::new("mariadb")
            .arg(format!("--socket={}", self.socket.display()))
            .args(["-uroot", "--batch", "--skip-column-names", "-e", sql])
            .output()
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(text)
        } else {
            Err(format!("{text}{}", String::from_utf8_lossy(&out.stderr)))
        }
    }

    /// The binlog files the server still has (`SHOW BINARY LOGS`).
    pub fn binlogs(&mut self) -> Vec<String> {
        self.root_sql("SHOW BINARY LOGS")
            .unwrap_or_else(|e| panic!("SHOW BINARY LOGS: {e}"))
            .lines()
            .filter_map(|l| l.split('\t').next().map(str::to_owned))
            .collect()
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

impl Drop for PrivateMaria {
    fn drop(&mut self) {
        if let Some(mut server) = self.server.take() {
            let _ = server.kill();
            let _ = server.wait();
        }
        if std::thread::panicking() {
            if let Some(dir) = self.dir.take() {
                let err = dir.path().join("mariadb.err");
                eprintln!("----- private mariadbd log: {}", err.display());
                eprintln!("{}", fs::read_to_string(&err).unwrap_or_default());
                let _ = dir.keep();
            }
        }
    }
}
