//! Shared helpers for the end-to-end tests: they drive the built `cdcd` binary against a real Postgres and
//! check the Iceberg tables it writes with `tests/support/lakecheck.py` (DuckDB, which shares no code with
//! cdcd).
//!
//! Where this sits: outside the data flow. A test creates source tables, starts cdcd with a generated
//! config ([`Pipeline::start`]), changes rows, and asks the oracle whether the replica equals the source
//! ([`Pipeline::assert_equal`]).
//!
//! Why this shape: tests run in parallel (`--test-threads=2`) and against a shared server, so every name a
//! test creates (tables, slot, publication, warehouse) carries the test's tag and the process id. A
//! [`Pipeline`] is a drop guard: however the test ends it kills cdcd, then drops the slot (an unused slot
//! holds WAL forever), the publication and the test's tables, and on failure prints cdcd's stderr.
//!
//! The servers come from `scripts/testbed.sh`: `CDCD_TEST_PG` (a Postgres URL) and `CDCD_TEST_PYTHON` (the
//! venv with the readers). Without them a test fails under CI or `scripts/test.sh`, and skips with a note
//! on a developer's machine ([`ground`]).
#![allow(dead_code)] // not every area uses every helper

pub mod ground;
pub mod hadoop_table;
pub mod mysql;
pub mod proxy;
pub mod s3;
pub mod table_files;

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls};

/// The oracle: exit 0 equal, 1 different, 2 usage or I/O error; the last line is the summary.
pub const LAKECHECK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/lakecheck.py");
/// The binary cargo built for this test run; `CDCD_TEST_BIN` replaces it (another build, or a stand-in
/// when working on the tests themselves).
pub fn cdcd_bin() -> String {
    std::env::var("CDCD_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_cdcd").to_string())
}
/// A finished command's output as one text, stdout first: what a test searches for a message
/// without caring which stream carried it.
pub fn stdout_then_stderr(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The same, stderr first (where the log leads and the report follows).
pub fn stderr_then_stdout(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    )
}

/// The last ~4,000 bytes of a daemon's output (what a failure shows of it).
pub fn tail(out: &str) -> &str {
    let from = (out.len().saturating_sub(4000)..out.len())
        .find(|&i| out.is_char_boundary(i))
        .unwrap_or(out.len());
    &out[from..]
}

/// Runs `cmd` to its end; panics naming the command and with its output unless it exits 0.
pub fn output_ok(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        stderr_then_stdout(&out)
    );
    out
}

/// `cdcd <args> --config <file>`: (exit 0, stdout + stderr).
pub fn run_cdcd(args: &[&str], config: &Path) -> (bool, String) {
    let out = Command::new(cdcd_bin())
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .unwrap();
    let text = stdout_then_stderr(&out);
    (out.status.success(), text)
}

/// The ground a test needs (the `Option` of [`test_env`], [`mysql::my_env`], [`spark`], …), or
/// the test returns: [`ground::missing`] has then failed it under CI or noted why it skips.
macro_rules! ground_or_skip {
    ($ground:expr) => {
        match $ground {
            Some(ground) => ground,
            None => return,
        }
    };
}

/// Tests that run one case each with a value of their own (a sink, a delete mode):
/// `case_tests!(case: name(value), …)` makes `#[tokio::test] async fn name()` running
/// `case("name", value)`; doc comments before a name stay the test's.
macro_rules! case_tests {
    ($case:ident: $($(#[$doc:meta])* $name:ident($value:expr)),+ $(,)?) => {
        $(
            $(#[$doc])*
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                $case(stringify!($name), $value).await;
            }
        )+
    };
}

/// Namespace every test pipeline writes its tables to.
pub const NAMESPACE: &str = "shop";

/// Where the test servers are.
#[derive(Clone, Debug)]
pub struct TestEnv {
    pub pg_url: String,
    pub python: String,
}

/// The test bed's addresses, or `None` when the test skips without them ([`ground::var`]).
pub fn test_env(test: &str) -> Option<TestEnv> {
    let (pg_url, python) = server_and_readers(test, "CDCD_TEST_PG")?;
    Some(TestEnv { pg_url, python })
}

/// A test server's address (the test bed's variable `server`) and the readers' python.
pub fn server_and_readers(test: &str, server: &str) -> Option<(String, String)> {
    Some((
        ground::var(test, server)?,
        ground::var(test, "CDCD_TEST_PYTHON")?,
    ))
}

/// The running test's name: libtest runs each test on a thread named after it
/// (`postgres::lifecycle::restart_with_nothing_new_writes_no_snapshot`).
pub fn current_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("this test")
        .to_owned()
}

/// [`test_env`] of the running test and its [`unique`] name from `tag`: the opening of most
/// Postgres tests.
pub fn test_env_and_name(tag: &str) -> Option<(TestEnv, String)> {
    Some((test_env(&current_test())?, unique(tag)))
}

/// The test bed's Spark (its `spark` component, in the readers' venv): the python with pyspark
/// and the folder of the relocated jars, or `None` when the test skips without it.
pub fn spark(test: &str) -> Option<(String, String)> {
    let python = ground::var(test, "CDCD_TEST_SPARK_PYTHON")?;
    let jars = ground::var(test, "CDCD_TEST_SPARK_JARS")?;
    // `testbed.sh env` names the component's paths whether or not `up` installed it.
    if !Path::new(&jars).join("iceberg-shaded-hc5.jar").exists() {
        ground::missing(
            test,
            &format!(
                "no Spark in the test bed ({jars} is empty: scripts/testbed.sh up installs it)"
            ),
        );
        return None;
    }
    Some((python, jars))
}

/// `<tag>_<pid>`: unique per test and per concurrent test run, and a valid slot name (`[a-z0-9_]`, < 64).
pub fn unique(tag: &str) -> String {
    format!("{tag}_{}", std::process::id())
}

/// Starts `cdcd --config <config>` with `vars`, its output appended to `log` after a marker line
/// for its `start`th start.
pub fn spawn_daemon<'a>(
    config: &Path,
    vars: impl Iterator<Item = (&'a str, &'a str)>,
    log: &Path,
    start: u32,
) -> Child {
    let mut out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    writeln!(out, "===== cdcd start #{start} =====").unwrap();
    let bin = cdcd_bin();
    Command::new(&bin)
        .arg("--config")
        .arg(config)
        .envs(vars)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {bin}: {e}"))
}

/// Runs lakecheck (`cmd`, with its arguments) to its end, calling `watch` every 500 ms meanwhile
/// (a check that the daemon still runs); returns its exit code and output.
pub async fn run_lakecheck(
    mut cmd: tokio::process::Command,
    mut watch: impl FnMut(),
) -> (Option<i32>, String) {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let run = cmd.output();
    tokio::pin!(run);
    let out = loop {
        tokio::select! {
            out = &mut run => break out.unwrap_or_else(|e| panic!("run {LAKECHECK}: {e}")),
            _ = tokio::time::sleep(Duration::from_millis(500)) => watch(),
        }
    };
    let text = stderr_then_stdout(&out);
    (out.status.code(), text)
}

/// The row of `public.<table>` in `cdcd status --json`'s output `out`.
pub fn status_row(out: &str, table: &str) -> serde_json::Value {
    let start = out.find('[').unwrap_or_else(|| panic!("no JSON:\n{out}"));
    let rows: serde_json::Value = serde_json::from_str(&out[start..]).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .find(|r| r["table"] == format!("public.{table}"))
        .unwrap_or_else(|| panic!("status lacks {table}:\n{out}"))
        .clone()
}

/// A random writer: transactions from `transaction` (drawn with a random source seeded by `seed`)
/// run on a connection of its own until `stop`, each followed by a pause of up to `max_pause_ms`;
/// the task returns how many it ran.
pub async fn spawn_writer(
    env: &TestEnv,
    seed: u64,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    max_pause_ms: u64,
    mut transaction: impl FnMut(&mut Rng) -> String + Send + 'static,
) -> tokio::task::JoinHandle<u64> {
    let client = connect(&env.pg_url).await;
    tokio::spawn(async move {
        let mut rng = Rng::from_seed(seed);
        let mut count = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            exec(&client, &transaction(&mut rng)).await;
            count += 1;
            if max_pause_ms > 0 {
                tokio::time::sleep(Duration::from_millis(rng.range(0, max_pause_ms))).await;
            }
        }
        count
    })
}

/// A query connection (the driver task runs in the background until the client is dropped).
pub async fn connect(url: &str) -> Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            eprintln!("postgres connection ended: {e}");
        }
    });
    client
}

/// Runs `sql` (several statements allowed), panicking with the statement text on error.
pub async fn exec(client: &Client, sql: &str) {
    if let Err(e) = client.batch_execute(sql).await {
        panic!("SQL failed: {e:?}\n--- statement:\n{sql}");
    }
}

/// Connects to the test bed's Postgres and creates `table` afresh: dropped if an earlier run left
/// it, then `ddl(table)` (its `CREATE` and first rows).
pub async fn fresh_table(env: &TestEnv, table: &str, ddl: impl Fn(&str) -> String) -> Client {
    let client = connect(&env.pg_url).await;
    exec(
        &client,
        &format!("DROP TABLE IF EXISTS {table};\n{}", ddl(table)),
    )
    .await;
    client
}

/// A Postgres LSN `X/Y` (hex halves) as a number, for ordering.
pub fn parse_lsn(text: &str) -> u64 {
    let (hi, lo) = text
        .split_once('/')
        .unwrap_or_else(|| panic!("not an LSN: {text:?}"));
    (u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()
}

/// Sends SIGTERM (std only knows SIGKILL; the `kill` utility saves a libc dependency).
pub fn sigterm(pid: u32) {
    let st = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    assert!(
        matches!(st, Ok(s) if s.success()),
        "kill -TERM {pid}: {st:?}"
    );
}

/// A small deterministic generator (xorshift64*) for the random moments of crash tests. The seed is
/// printed, and `CDCD_TEST_SEED` replays a run.
pub struct Rng(u64);

impl Rng {
    pub fn from_env_or_clock(test: &str) -> Rng {
        let seed = std::env::var("CDCD_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
        eprintln!("{test}: CDCD_TEST_SEED={seed}");
        Rng(seed | 1)
    }
    pub fn from_seed(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `lo..hi` (hi > lo).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
}

/// Settings a test may change in the generated config.
#[derive(Clone, Debug)]
pub struct Settings {
    pub snapshot: &'static str,
    pub commit_interval_ms: u64,
    pub commit_max_rows: u64,
    /// `[source] password = …` (trust auth on the test bed ignores it; tests check it is never echoed).
    pub password: Option<String>,
    /// Replaces the source URL (e.g. one with a password in it).
    pub url: Option<String>,
    /// Extra `[source]` lines, e.g. `key_columns = { … }`.
    pub source_extra: String,
    /// Lines after the `[sink]` keys, e.g. a `[sink.catalog]` section.
    pub sink_extra: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            snapshot: "initial",
            commit_interval_ms: 200,
            commit_max_rows: 100_000,
            password: None,
            url: None,
            source_extra: String::new(),
            sink_extra: String::new(),
        }
    }
}

/// One cdcd pipeline under test: its config, warehouse, the running process, and the cleanup of
/// everything it made in Postgres. Drop guard (see the module doc).
pub struct Pipeline {
    pub env: TestEnv,
    pub name: String,
    pub slot: String,
    pub publication: String,
    /// `schema.table` names replicated (explicit, so parallel tests never pick up each other's tables).
    pub tables: Vec<String>,
    pub dir: Option<tempfile::TempDir>,
    pub config: PathBuf,
    pub warehouse: PathBuf,
    pub stderr_log: PathBuf,
    daemon: Option<Child>,
    starts: u32,
    /// `Some(buckets)`: the pipeline writes LSM (Paimon) tables instead of Iceberg ones.
    lsm_buckets: Option<u32>,
    /// SQL run at cleanup after the slot and publication are gone (drops the test's tables and types).
    cleanup_sql: Vec<String>,
    /// Environment for the cdcd processes this pipeline starts (never the test process's own:
    /// every test shares it, so a `set_var` would reach other tests' daemons).
    pub env_vars: Vec<(String, String)>,
}

impl Pipeline {
    /// A pipeline named `name` (already unique) replicating `tables` (bare names, schema `public`).
    pub fn new(env: &TestEnv, name: &str, tables: &[&str], settings: &Settings) -> Pipeline {
        let dir = tempfile::Builder::new()
            .prefix(&format!("cdcd-{name}-"))
            .tempdir()
            .unwrap();
        let warehouse = dir.path().join("wh");
        let config = dir.path().join("pipeline.toml");
        let stderr_log = dir.path().join("cdcd.stderr");
        let p = Pipeline {
            env: env.clone(),
            name: name.to_string(),
            slot: format!("cdcd_{name}"),
            publication: format!("cdcd_{name}"),
            tables: tables.iter().map(|t| format!("public.{t}")).collect(),
            dir: Some(dir),
            config,
            warehouse,
            stderr_log,
            daemon: None,
            starts: 0,
            lsm_buckets: None,
            cleanup_sql: Vec::new(),
            env_vars: Vec::new(),
        };
        p.write_config(settings);
        // A leftover of an earlier run under the same pid would make cdcd resume from it.
        p.cleanup_postgres();
        p
    }

    /// Like [`Pipeline::new`] over tables the test created for it: they are dropped at cleanup
    /// (one `DROP TABLE`, so tables referring to each other go together).
    pub fn owning_tables(
        env: &TestEnv,
        name: &str,
        tables: &[&str],
        settings: &Settings,
    ) -> Pipeline {
        let mut p = Pipeline::new(env, name, tables, settings);
        p.on_cleanup(format!("DROP TABLE IF EXISTS {}", tables.join(", ")));
        p
    }

    /// Rewrites the config to format v2 (`delete_mode = "equality"`) whatever
    /// `CDCD_TEST_DELETE_MODE` says.
    pub fn force_equality(&self) {
        let text = fs::read_to_string(&self.config).unwrap();
        let kept: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with("delete_mode"))
            .collect();
        let text = kept
            .join("\n")
            .replacen("[sink]\n", "[sink]\ndelete_mode = \"equality\"\n", 1);
        fs::write(&self.config, text + "\n").unwrap();
    }

    /// Like [`Pipeline::new`], writing LSM (Apache Paimon) tables with `buckets` buckets; the
    /// oracle then reads them with pypaimon.
    pub fn new_lsm(
        env: &TestEnv,
        name: &str,
        tables: &[&str],
        settings: &Settings,
        buckets: u32,
    ) -> Pipeline {
        let mut p = Pipeline::new(env, name, tables, settings);
        p.lsm_buckets = Some(buckets);
        p.write_config(settings);
        p
    }

    /// (Re)writes the config file with `settings`.
    pub fn write_config(&self, s: &Settings) {
        let list = self
            .tables
            .iter()
            .map(|t| format!("{t:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        let url = s.url.as_deref().unwrap_or(&self.env.pg_url);
        let password = s
            .password
            .as_ref()
            .map(|p| format!("password = {p:?}\n"))
            .unwrap_or_default();
        let text = format!(
            "[pipeline]\nname = {name:?}\ncommit_interval_ms = {ci}\ncommit_max_rows = {cm}\n\n\
             [source]\nkind = \"postgres\"\nurl = {url:?}\n{password}tables = [{list}]\n\
             slot = {slot:?}\npublication = {publication:?}\nsnapshot = {snap:?}\n{extra}\n\n\
             [sink]\nkind = \"iceberg\"\nwarehouse = {wh:?}\nnamespace = {NAMESPACE:?}\n\
             {mode}{sink_extra}",
            name = self.name,
            ci = s.commit_interval_ms,
            cm = s.commit_max_rows,
            slot = self.slot,
            publication = self.publication,
            snap = s.snapshot,
            extra = s.source_extra,
            wh = self.warehouse.display().to_string(),
            // Unset: the config's default (deletion vectors); CDCD_TEST_DELETE_MODE=equality runs
            // the suite on format v2 (scripts/test.sh's second pass).
            mode = std::env::var("CDCD_TEST_DELETE_MODE")
                .map(|m| format!("delete_mode = {m:?}\n"))
                .unwrap_or_default(),
            sink_extra = s.sink_extra,
        );
        let text = match self.lsm_buckets {
            Some(buckets) => {
                let iceberg_sink = text.find("[sink]").unwrap_or(text.len());
                format!(
                    "{}[sink]\nkind = \"lsm\"\nwarehouse = {wh:?}\nnamespace = {NAMESPACE:?}\nbuckets = {buckets}\n\
                     compaction_trigger = 3\nsnapshots_retained = 10\n",
                    &text[..iceberg_sink],
                    wh = self.warehouse.display().to_string(),
                )
            }
            None => text,
        };
        fs::write(&self.config, text).unwrap();
    }

    /// Background maintenance every 200 ms that compacts a table once it has 3 files under 1 MB:
    /// table properties after `[sink]`, the config's last table.
    pub fn compact_often(&mut self) {
        let mut text = fs::read_to_string(&self.config).unwrap();
        text.push_str(
            "\n[sink.table_properties]\n\"write.target-file-size-bytes\" = \"1000000\"\n\
             \"cdcd.compaction.min-input-files\" = \"3\"\n",
        );
        fs::write(&self.config, text).unwrap();
        self.env_vars
            .push(("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "200".into()));
    }

    /// An LSM sink of the test's own over the pipeline's warehouse, set up as the generated config
    /// sets cdcd's (for a full compaction the test runs itself).
    pub fn lsm_sink(&self) -> cdcd::sinks::lsm::LsmSink {
        let buckets = self.lsm_buckets.expect("not an LSM pipeline");
        cdcd::sinks::lsm::LsmSink::new(
            &cdcd::config::LsmConfig {
                warehouse: format!("file://{}", self.warehouse.display()),
                namespace: Some(NAMESPACE.into()),
                buckets,
                merge_engine: cdcd::config::MergeEngine::Deduplicate,
                compaction_trigger: 3,
                snapshots_retained: 10,
                snapshot_time_retained_ms: None,
                deletion_vectors: false,
                tables: Default::default(),
            },
            &self.name,
        )
        .unwrap()
    }

    /// SQL to run at cleanup (after cdcd is gone and the slot dropped), e.g. `DROP TABLE IF EXISTS x`.
    pub fn on_cleanup(&mut self, sql: impl Into<String>) {
        self.cleanup_sql.push(sql.into());
    }

    /// Starts `cdcd --config <file>`; stderr is appended to [`Self::stderr_log`] with a marker per start.
    pub fn start(&mut self) {
        assert!(self.daemon.is_none(), "cdcd is already running");
        self.starts += 1;
        let vars = self.env_vars.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        self.daemon = Some(spawn_daemon(
            &self.config,
            vars,
            &self.stderr_log,
            self.starts,
        ));
    }

    /// Whether a cdcd this pipeline started has not been seen to exit.
    pub fn is_running(&self) -> bool {
        self.daemon.is_some()
    }

    pub fn pid(&self) -> u32 {
        self.daemon.as_ref().expect("cdcd is not running").id()
    }

    /// Panics (with cdcd's stderr, printed by the guard) if cdcd has exited on its own.
    pub fn assert_running(&mut self) {
        if let Some(child) = self.daemon.as_mut() {
            if let Some(st) = child.try_wait().unwrap() {
                self.daemon = None;
                let out = self.output();
                panic!(
                    "cdcd exited on its own: {st}; its last output:\n{}",
                    tail(&out)
                );
            }
        } else {
            panic!("cdcd is not running");
        }
    }

    /// SIGKILL and reap; no chance to commit or clean up.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.daemon.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits up to `timeout` for the exit; kills it (and panics) if it does not exit.
    pub async fn sigterm_and_wait(&mut self, timeout: Duration) -> ExitStatus {
        sigterm(self.pid());
        self.wait_exit(timeout).await
    }

    /// Stops cdcd (SIGTERM), gives `public.<table>` the settings `lines` (each ending in a
    /// newline) and starts it again.
    pub async fn restart_with_table_settings(&mut self, table: &str, lines: &str) {
        self.sigterm_and_wait(Duration::from_secs(60)).await;
        append_table_settings(&self.config, &format!("public.{table}"), lines);
        self.start();
    }

    /// cdcd's exit status if it has exited (then it is no longer running), else `None`.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        let child = self.daemon.as_mut()?;
        let st = child.try_wait().unwrap()?;
        self.daemon = None;
        Some(st)
    }

    /// A refusal or a stop: waits up to `timeout` for cdcd to exit, fails the test with `why`
    /// unless it exited with an error, and returns its output.
    pub async fn assert_stops(&mut self, timeout: Duration, why: &str) -> String {
        let status = self.wait_exit(timeout).await;
        assert!(!status.success(), "{why}, got {status}:\n{}", self.output());
        self.output()
    }

    /// A failpoint's abort: cdcd exits with an error within `timeout`, its output naming
    /// `failpoint <point>` (it aborted there, not elsewhere).
    pub async fn assert_aborts_at(&mut self, timeout: Duration, point: &str) {
        let out = self
            .assert_stops(timeout, &format!("{point}: cdcd must abort"))
            .await;
        assert!(
            out.contains(&format!("failpoint {point}")),
            "{point}: aborted elsewhere:\n{out}"
        );
    }

    /// Waits up to `timeout` for cdcd to exit (on its own, or after a signal sent before);
    /// kills it (and panics) if it does not.
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let mut child = self.daemon.take().expect("cdcd is not running");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                let out = self.output();
                let tail: Vec<&str> = out.lines().rev().take(40).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                panic!(
                    "cdcd did not exit within {timeout:?}; its last output:\n{}",
                    tail.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Everything cdcd wrote to stdout/stderr so far, over all starts.
    pub fn output(&self) -> String {
        fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }

    /// Runs `code` with the test bed's Python (`LAKECHECK_DIR` set, for `duck_load` and
    /// lakecheck's helpers) and returns its stdout; panics when it fails.
    pub fn python(&self, code: &str, args: &[&str]) -> String {
        let lakecheck_dir = Path::new(LAKECHECK)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let out = output_ok(
            Command::new(&self.env.python)
                .env("LAKECHECK_DIR", lakecheck_dir)
                .arg("-c")
                .arg(code)
                .args(args),
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// Whether this pipeline writes with the LSM (Paimon) sink.
    pub fn is_lsm(&self) -> bool {
        self.lsm_buckets.is_some()
    }

    /// The directory of a bare table name: `<warehouse>/<namespace>/<table>` (Iceberg), or
    /// `<warehouse>/<namespace>.db/<table>` (the LSM sink, Paimon's layout).
    pub fn table_dir(&self, table: &str) -> PathBuf {
        match self.lsm_buckets {
            Some(_) => self.warehouse.join(format!("{NAMESPACE}.db")).join(table),
            None => self.warehouse.join(NAMESPACE).join(table),
        }
    }

    /// Panics unless a Paimon snapshot of `table` (LSM sink) is a `COMPACT` commit.
    pub fn assert_compacted(&self, table: &str) {
        let kinds: Vec<String> = std::fs::read_dir(self.table_dir(table).join("snapshot"))
            .unwrap()
            .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
            .filter_map(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
            .filter_map(|v| v["commitKind"].as_str().map(String::from))
            .collect();
        assert!(
            kinds.iter().any(|k| k == "COMPACT"),
            "no COMPACT snapshot among {kinds:?}"
        );
    }

    /// How many `v<N>.metadata.json` the table has (0 before its first commit).
    pub fn metadata_versions(&self, table: &str) -> usize {
        let Ok(rd) = fs::read_dir(self.table_dir(table).join("metadata")) else {
            return 0;
        };
        rd.filter_map(|e| e.ok())
            .filter(|e| {
                let n = e.file_name();
                let n = n.to_string_lossy();
                n.strip_prefix('v')
                    .and_then(|r| r.strip_suffix(".metadata.json"))
                    .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            })
            .count()
    }

    /// Waits (at most `timeout`) until cdcd has created its slot and holds it open.
    pub async fn wait_slot_active(&mut self, client: &Client, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.slot_active(client).await {
            self.assert_running();
            assert!(
                Instant::now() < deadline,
                "slot {} not active after {timeout:?}",
                self.slot
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until no walsender holds the slot (after a kill, Postgres notices the closed socket).
    pub async fn wait_slot_inactive(&self, client: &Client, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.slot_active(client).await {
            assert!(
                Instant::now() < deadline,
                "slot {} still active {timeout:?} after cdcd died",
                self.slot
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Whether the slot exists and a walsender holds it.
    async fn slot_active(&self, client: &Client) -> bool {
        let row = client
            .query_opt(
                "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.slot],
            )
            .await
            .unwrap();
        row.is_some_and(|r| r.get::<_, bool>(0))
    }

    /// The slot's `confirmed_flush_lsn` (what cdcd acknowledged as durable), if the slot exists.
    pub async fn confirmed_flush_lsn(&self, client: &Client) -> Option<u64> {
        let row = client
            .query_opt(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.slot],
            )
            .await
            .unwrap()?;
        row.get::<_, Option<String>>(0).map(|s| parse_lsn(&s))
    }

    /// Runs lakecheck on `public.<table>` against the lake, polling up to `wait_secs`; panics with its
    /// output unless equal. While it polls, a cdcd that dies fails the test at once.
    pub async fn assert_equal(&mut self, table: &str, wait_secs: u32) {
        let (code, out) = self.lakecheck(table, wait_secs, &[]).await;
        assert_eq!(
            code,
            Some(0),
            "lakecheck public.{table}: replica differs from the source:\n{out}"
        );
        eprintln!(
            "lakecheck public.{table}: {}",
            out.lines().last().unwrap_or("")
        );
    }

    /// lakecheck with Iceberg-Java, the reference implementation (`--reader spark`, through the
    /// test bed's `spark` component), on a local table: equal, or the test fails.
    pub async fn assert_equal_by_spark(&mut self, table: &str) {
        if spark(&format!("the Spark read of pipeline {}", self.name)).is_none() {
            return;
        }
        let (code, out) = self.lakecheck(table, 0, &["--reader", "spark"]).await;
        assert_eq!(
            code,
            Some(0),
            "Spark (Iceberg-Java) reads otherwise:\n{out}"
        );
        eprintln!(
            "lakecheck public.{table}: {}",
            out.lines().last().unwrap_or("")
        );
    }

    /// Runs lakecheck with `extra` arguments; returns its exit code and combined output.
    pub async fn lakecheck(
        &mut self,
        table: &str,
        wait_secs: u32,
        extra: &[&str],
    ) -> (Option<i32>, String) {
        self.lakecheck_in("public", table, wait_secs, extra).await
    }

    /// [`Pipeline::lakecheck`] of source table `schema.table` (the lake table is `table` in the
    /// sink's namespace).
    pub async fn lakecheck_in(
        &mut self,
        schema: &str,
        table: &str,
        wait_secs: u32,
        extra: &[&str],
    ) -> (Option<i32>, String) {
        let mut cmd = tokio::process::Command::new(&self.env.python);
        cmd.arg(LAKECHECK)
            .args(["--source", &self.env.pg_url])
            .args(["--source-table", &format!("{schema}.{table}")])
            .args(self.lake_args(table));
        cmd.args(["--wait", &wait_secs.to_string()]).args(extra);
        run_lakecheck(cmd, || {
            if self.daemon.is_some() {
                self.assert_running();
            }
        })
        .await
    }

    /// lakecheck's arguments naming `table` in the lake: the Paimon table or the Iceberg table's
    /// directory.
    fn lake_args(&self, table: &str) -> Vec<std::ffi::OsString> {
        if self.lsm_buckets.is_some() {
            vec![
                "--paimon".into(),
                self.warehouse.clone().into(),
                "--paimon-table".into(),
                format!("{NAMESPACE}.{table}").into(),
            ]
        } else {
            vec!["--iceberg".into(), self.table_dir(table).into()]
        }
    }

    /// `lakecheck --position` on the table: the newest snapshot's `cdcd.pipeline` / `cdcd.position` line.
    pub async fn position_line(&mut self, table: &str) -> String {
        let mut cmd = std::process::Command::new(&self.env.python);
        cmd.arg(LAKECHECK).args(self.lake_args(table));
        let out = cmd.arg("--position").output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "no cdcd.position in {}: {text}{}",
            table,
            String::from_utf8_lossy(&out.stderr)
        );
        text
    }

    /// Drops the slot (terminating a walsender still holding it), the publication and the test's
    /// objects. Blocking: it runs on its own thread and runtime, as it is called from `Drop`.
    fn cleanup_postgres(&self) {
        let url = self.env.pg_url.clone();
        let slot = self.slot.clone();
        let publication = self.publication.clone();
        let extra = self.cleanup_sql.clone();
        let res = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async move {
                let (client, conn) = tokio_postgres::connect(&url, NoTls)
                    .await
                    .map_err(|e| e.to_string())?;
                tokio::spawn(conn);
                drop_slot(&client, &slot).await?;
                // `_inserts`: the publication of keyless tables (issue 23).
                client
                    .batch_execute(&format!(
                        "DROP PUBLICATION IF EXISTS \"{publication}\"; DROP PUBLICATION IF EXISTS \"{publication}_inserts\""
                    ))
                    .await
                    .map_err(|e| e.to_string())?;
                for sql in extra {
                    client
                        .batch_execute(&sql)
                        .await
                        .map_err(|e| format!("{sql}: {e}"))?;
                }
                Ok::<(), String>(())
            })
        })
        .join();
        match res {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("cleanup of pipeline {}: {e}", self.name),
            Err(_) => eprintln!("cleanup of pipeline {}: panicked", self.name),
        }
    }
}

/// Waits until cdcd's whole output satisfies `ready`; fails if cdcd dies or `timeout` passes.
pub async fn wait_for(
    p: &mut Pipeline,
    what: &str,
    timeout: Duration,
    ready: impl Fn(&str) -> bool,
) {
    let deadline = Instant::now() + timeout;
    while !ready(&p.output()) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        p.assert_running();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Drops `slot` if it exists; a walsender still attached (cdcd just died) is terminated first.
pub async fn drop_slot(client: &Client, slot: &str) -> Result<(), String> {
    for _ in 0..50 {
        let r = client
            .query_opt(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .map_err(|e| e.to_string())?;
        let Some(row) = r else { return Ok(()) };
        if let Some(pid) = row.get::<_, Option<i32>>(0) {
            let _ = client
                .execute("SELECT pg_terminate_backend($1)", &[&pid])
                .await;
        } else if client
            .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
            .await
            .is_ok()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!("could not drop replication slot {slot}"))
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.kill9();
        self.cleanup_postgres();
        if std::thread::panicking() {
            let out = self.output();
            let tail: Vec<&str> = out.lines().rev().take(300).collect();
            eprintln!(
                "----- cdcd output ({}, last {} lines) -----",
                self.stderr_log.display(),
                tail.len()
            );
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
            if let Some(dir) = self.dir.take() {
                eprintln!("----- kept for inspection: {}", dir.keep().display());
            }
        }
    }
}

/// Writes `text` to `path` (helper for tests that hand-edit a config).
pub fn write_file(path: &Path, text: &str) {
    File::create(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .unwrap();
}

/// Adds `lines` (each ending in a newline) at the top of `section` (`"[source]"`) of the config
/// file `config`: keys a test sets beyond those its pipeline writes.
pub fn add_config_lines(config: &Path, section: &str, lines: &str) {
    let header = format!("{section}\n");
    let text = fs::read_to_string(config).unwrap();
    write_file(
        config,
        &text.replacen(&header, &format!("{header}{lines}"), 1),
    );
}

/// Appends `text` (sections of its own) to the config file `config`.
pub fn append_config(config: &Path, text: &str) {
    let mut config_text = fs::read_to_string(config).unwrap();
    config_text.push_str(text);
    write_file(config, &config_text);
}

/// Appends `lines` (each ending in a newline) as the settings of `table` (`schema.table`) to the
/// config file `config`: a `[sink.tables."<table>"]` section.
pub fn append_table_settings(config: &Path, table: &str, lines: &str) {
    append_config(config, &format!("\n[sink.tables.{table:?}]\n{lines}"));
}

/// Sizes the initial copy in the config file `config`: chunks of `chunk_rows` rows, `parallelism`
/// tables at once and a commit every `commit_rows` copied rows (the config's defaults where
/// `None`), so the copy of a large table is several commits and a kill lands between two.
pub fn tune_copy(
    config: &Path,
    chunk_rows: u64,
    parallelism: Option<usize>,
    commit_rows: Option<u64>,
) {
    let parallelism = parallelism
        .map(|n| format!("snapshot_parallelism = {n}\n"))
        .unwrap_or_default();
    let chunks = format!("snapshot_chunk_rows = {chunk_rows}\n{parallelism}");
    add_config_lines(config, "[source]", &chunks);
    if let Some(rows) = commit_rows {
        let commits = format!("snapshot_commit_rows = {rows}\n");
        add_config_lines(config, "[pipeline]", &commits);
    }
}

/// The part of a pipeline's output (`Pipeline::output`, `MyPipeline::output`) written by its
/// `n`-th start (1-based).
pub fn start_output(out: &str, n: u32) -> String {
    let marker = format!("===== cdcd start #{n} =====");
    let from = out.find(&marker).map_or(out.len(), |i| i + marker.len());
    let rest = &out[from..];
    let to = rest.find("===== cdcd start #").unwrap_or(rest.len());
    rest[..to].to_owned()
}

/// The number in `key=value` of a tracing line.
pub fn log_field(line: &str, key: &str) -> Option<u64> {
    let at = line.find(&format!(" {key}="))? + key.len() + 2;
    line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// An Iceberg table's current metadata file (the highest `v<N>.metadata.json`), parsed.
pub fn current_metadata(table_dir: &Path) -> serde_json::Value {
    let dir = table_dir.join("metadata");
    let newest = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            let n: u64 = name
                .strip_prefix('v')?
                .strip_suffix(".metadata.json")?
                .parse()
                .ok()?;
            Some((n, name))
        })
        .max()
        .unwrap()
        .1;
    serde_json::from_slice(&std::fs::read(dir.join(newest)).unwrap()).unwrap()
}

/// `(name, id, type)` of the current schema's top-level fields.
pub fn current_fields(meta: &serde_json::Value) -> Vec<(String, i64, String)> {
    let current = meta["current-schema-id"].as_i64().unwrap();
    let schema = meta["schemas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["schema-id"].as_i64() == Some(current))
        .unwrap();
    schema_fields(schema)
}

/// `(name, id, type)` of a schema's top-level fields: an Iceberg schema, or Paimon's `schema-N`.
pub fn schema_fields(schema: &serde_json::Value) -> Vec<(String, i64, String)> {
    schema["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap().to_owned(),
                f["id"].as_i64().unwrap(),
                f["type"].to_string().trim_matches('"').to_owned(),
            )
        })
        .collect()
}
