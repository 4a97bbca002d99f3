//! Issue 17.3: the lease really fences a stale writer. MariaDB is the source (no replication
//! slot keeps a second reader out, so only the lease does):
//! - `paused_holder_is_fenced` (Iceberg) and `paused_holder_is_fenced_paimon`: the holder is
//!   SIGSTOPped past the ttl with changes in hand, the standby takes over and commits, the holder
//!   is SIGCONTed: it writes nothing more to the warehouse (not a data file, not an index run),
//!   exits non-zero saying it lost the lease, the tables equal the source and every later
//!   restart works. Before the fix the Iceberg variant ended as the issue says: the new holder
//!   had deleted the old one's unnamed index run, which the old one then named;
//! - `s3_stalled_lease_renewal_fences_the_holder` and `…_paimon` (issue 22): on S3 (serial moto)
//!   the fault proxy holds only the holder's lease renewals; the holder stops writing at its
//!   deadline (the proxy's log of its requests shows no write after it), exits saying it lost
//!   the lease, the standby takes over, and the table equals the source, also after restarts.
//!
//! Readers: lakecheck (DuckDB; pypaimon for the Paimon variants) against MariaDB.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::mysql::{my_connect, my_env, my_exec, MyPipeline};
use crate::support::proxy::{ProxyProcess, FAULTPROXY};
use crate::support::s3::{bucket_name, create_bucket, lakecheck_s3, moto, wait_until, Lake};
use crate::support::{sigterm, unique, TestEnv, NAMESPACE};

/// A second cdcd on the same config (the standby); killed on drop.
struct Daemon {
    child: Option<Child>,
    log: PathBuf,
}

impl Daemon {
    fn spawn(config: &Path, log: &Path) -> Daemon {
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let child = Command::new(crate::support::cdcd_bin())
            .arg("--config")
            .arg(config)
            .env("CDCD_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .spawn()
            .unwrap();
        Daemon {
            child: Some(child),
            log: log.to_owned(),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn assert_running(&mut self) {
        if let Some(c) = self.child.as_mut() {
            if let Some(st) = c.try_wait().unwrap() {
                panic!("the standby exited: {st}\n{}", self.log());
            }
        }
    }

    async fn sigterm_and_wait(&mut self) {
        let mut child = self.child.take().unwrap();
        sigterm(child.id());
        for _ in 0..600 {
            if let Some(st) = child.try_wait().unwrap() {
                assert!(st.success(), "standby: {st}\n{}", self.log());
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = child.kill();
        panic!("the standby did not stop on SIGTERM\n{}", self.log());
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("----- standby output -----\n{}", self.log());
        }
    }
}

fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status();
    assert!(
        matches!(st, Ok(s) if s.success()),
        "kill -{sig} {pid}: {st:?}"
    );
}

/// Adds `[pipeline]` keys to a config written by [`MyPipeline::write_config`].
fn with_pipeline_keys(config: &Path, keys: &str) {
    let text = std::fs::read_to_string(config).unwrap();
    let text = text.replacen("[pipeline]\n", &format!("[pipeline]\n{keys}"), 1);
    std::fs::write(config, text).unwrap();
}

/// Every file under `dir` with its size, but the lease and the progress file (the live holder
/// renews the one and rewrites the other on acknowledgements).
fn listing(dir: &Path) -> BTreeMap<String, u64> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, u64>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path.strip_prefix(root).unwrap().display().to_string();
                // `<name>#<n>`: object_store's local staging file of a put in progress (renamed
                // to `<name>` when it completes); a put the holder was paused in finishes after
                // SIGCONT, and its staging file then leaves: not a delete of a file.
                let staging = rel
                    .rsplit_once('#')
                    .is_some_and(|(_, n)| n.parse::<u64>().is_ok());
                if !rel.contains("lease.json") && !rel.ends_with("progress.json") && !staging {
                    out.insert(rel, e.metadata().map(|m| m.len()).unwrap_or(0));
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

async fn create_tables(p: &MyPipeline, tables: &[&str], rows: u32) {
    let mut c = my_connect(&p.env.url_for(&p.db)).await;
    for t in tables {
        my_exec(
            &mut c,
            &format!(
                "CREATE TABLE {t} (id BIGINT PRIMARY KEY, v INT, s VARCHAR(40));
                 INSERT INTO {t} SELECT seq, seq, MD5(seq) FROM seq_1_to_{rows};"
            ),
        )
        .await;
    }
}

/// One round of changes to `t`: inserts past `base`, updates and deletes of earlier rows.
async fn churn(c: &mut mysql_async::Conn, t: &str, base: u64) {
    my_exec(
        c,
        &format!(
            "INSERT INTO {t} SELECT seq, seq, MD5(seq) FROM seq_{base}_to_{end};
             UPDATE {t} SET v = v + 1 WHERE id % 7 = {m};
             DELETE FROM {t} WHERE id % 11 = {m} AND id < {base};",
            end = base + 19,
            m = base % 7
        ),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_is_fenced() {
    let my = ground_or_skip!(my_env("paused_holder_is_fenced"));
    // cdcd must not start while another test has the server's binlog_format flipped.
    let _globals = super::replication::SERVER_GLOBALS.read().await;
    let p = MyPipeline::new(&my, &unique("fence_stop"), "initial", "").await;
    paused_holder(p).await;
}

/// The same with the Paimon sink (read back by pypaimon).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_is_fenced_paimon() {
    let my = ground_or_skip!(my_env("paused_holder_is_fenced_paimon"));
    // cdcd must not start while another test has the server's binlog_format flipped.
    let _globals = super::replication::SERVER_GLOBALS.read().await;
    let mut p = MyPipeline::new(&my, &unique("fence_stop_lsm"), "initial", "").await;
    p.use_lsm(2, "initial", "");
    paused_holder(p).await;
}

async fn paused_holder(mut p: MyPipeline) {
    create_tables(&p, &["a", "b"], 500).await;
    with_pipeline_keys(&p.config, "lease_ttl_ms = 3000\n");
    p.start();
    p.assert_equal("a", 60).await;
    p.assert_equal("b", 60).await;

    let mut standby = Daemon::spawn(&p.config, &p.config.with_file_name("standby.log"));
    assert!(
        wait_until(Duration::from_secs(30), || standby
            .log()
            .contains("standby"))
        .await,
        "the second cdcd did not wait as a standby:\n{}",
        standby.log()
    );
    let mut c = my_connect(&p.env.url_for(&p.db)).await;
    // A few rounds so the holder's index has runs, then stop it with changes in hand (its
    // commit interval is 200 ms).
    let mut base = 10_000u64;
    for _ in 0..5 {
        churn(&mut c, "a", base).await;
        churn(&mut c, "b", base).await;
        base += 100;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    churn(&mut c, "a", base).await;
    churn(&mut c, "b", base).await;
    base += 100;
    tokio::time::sleep(Duration::from_millis(60)).await;
    let holder = p.pid().unwrap();
    signal(holder, "STOP");

    assert!(
        wait_until(Duration::from_secs(30), || standby
            .log()
            .contains("lease acquired"))
        .await,
        "the standby did not take over from the stopped holder:\n{}",
        standby.log()
    );
    for _ in 0..3 {
        churn(&mut c, "a", base).await;
        churn(&mut c, "b", base).await;
        base += 100;
    }
    p.assert_equal("a", 60).await;
    p.assert_equal("b", 60).await;
    standby.assert_running();

    // The standby is idle now; the old holder wakes up with its changes and its in-flight work.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = listing(&p.warehouse);
    signal(holder, "CONT");
    let st = p
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the old holder kept running after SIGCONT");
    assert!(!st.success(), "the old holder exited 0");
    let out = p.output();
    assert!(
        out.contains("lost the lease"),
        "the old holder did not say it lost the lease:\n{out}"
    );
    eprintln!(
        "old holder: {}",
        out.lines()
            .rev()
            .find(|l| l.contains("lost the lease"))
            .unwrap_or("")
    );
    let after = listing(&p.warehouse);
    // A put the holder had already started when it was paused completes when it resumes (the
    // window storage/fence.rs documents): a new data or manifest file no commit names is
    // allowed, and the lake is checked below. Never a commit point, an overwrite or a delete.
    let commit_point = |f: &str| {
        f.ends_with(".metadata.json")
            || f.contains("/snapshot/")
            || f.contains("version-hint")
            || (f.contains("_cdcd/") && !f.contains("/run-"))
            || f.ends_with("LATEST")
            || f.ends_with("EARLIEST")
    };
    let written: Vec<_> = after
        .iter()
        .filter(|(f, len)| before.get(*f) != Some(len))
        .filter(|(f, _)| commit_point(f.as_str()) || before.contains_key(*f))
        .collect();
    let deleted: Vec<_> = before.keys().filter(|f| !after.contains_key(*f)).collect();
    assert!(
        written.is_empty() && deleted.is_empty(),
        "the old holder wrote {written:?} and deleted {deleted:?} after waking up"
    );
    p.assert_equal("a", 30).await;
    p.assert_equal("b", 30).await;
    standby.assert_running();
    churn(&mut c, "a", base).await;
    base += 100;
    p.assert_equal("a", 60).await;

    // Every later restart works: the standby stops, the pipeline restarts twice.
    standby.sigterm_and_wait().await;
    for _ in 0..2 {
        p.start();
        churn(&mut c, "a", base).await;
        churn(&mut c, "b", base).await;
        base += 100;
        p.assert_equal("a", 60).await;
        p.assert_equal("b", 60).await;
        let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
        assert!(st.success(), "{st}\n{}", p.output());
    }
}

/// The fault proxy in front of moto, holding the lease renewals while `flag` exists; killed on
/// drop.
struct StallProxy {
    _process: ProxyProcess,
    url: String,
    flag: PathBuf,
    log: PathBuf,
}

impl StallProxy {
    fn start(python: &str, upstream: &str, dir: &Path) -> StallProxy {
        let flag = dir.join("stall-lease");
        let log = dir.join("proxy.log");
        let args = ["--fail", "0", "--delay", "0", "--stall-path", "lease.json"];
        let args = args.iter().map(OsStr::new).chain([
            OsStr::new("--stall-flag"),
            flag.as_os_str(),
            OsStr::new("--log"),
            log.as_os_str(),
        ]);
        let process = ProxyProcess::start(python, FAULTPROXY, upstream, args, Stdio::null());
        StallProxy {
            url: process.url.clone(),
            _process: process,
            flag,
            log,
        }
    }

    /// (time, kind, method, path) of every logged request.
    fn requests(&self) -> Vec<(f64, String, String, String)> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut it = l.splitn(4, ' ');
                Some((
                    it.next()?.parse().ok()?,
                    it.next()?.to_owned(),
                    it.next()?.to_owned(),
                    it.next()?.to_owned(),
                ))
            })
            .collect()
    }
}

impl Drop for StallProxy {
    // Fields drop after this: the flag is gone before the proxy is killed.
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.flag);
    }
}

/// `config` rewritten to the S3 warehouse `s3://<bucket>/wh` through `endpoint`.
fn s3_config_text(config: &Path, local_wh: &Path, bucket: &str, endpoint: &str) -> String {
    let text = std::fs::read_to_string(config).unwrap();
    let wh_line = format!("warehouse = {:?}", local_wh.display().to_string());
    assert!(text.contains(&wh_line), "{text}");
    let mut text = text.replace(&wh_line, &format!("warehouse = \"s3://{bucket}/wh\""));
    text.push_str(&format!(
        "\n[sink.s3]\nendpoint = {endpoint:?}\nregion = \"us-east-1\"\naccess_key_id = \"test\"\n\
         secret_access_key = \"test\"\nallow_http = true\n"
    ));
    text
}

/// lakecheck of `<db>.<table>` against the table on S3 (Iceberg: DuckDB; LSM: pypaimon), read
/// through moto directly.
async fn assert_equal_s3(p: &mut MyPipeline, bucket: &str, endpoint: &str, table: &str) {
    let warehouse = format!("s3://{bucket}/wh");
    let table_url = format!("{warehouse}/{NAMESPACE}/{table}");
    let paimon_table = format!("{NAMESPACE}.{table}");
    let lake = match p.lsm_buckets {
        Some(_) => Lake::Paimon {
            warehouse: &warehouse,
            table: &paimon_table,
        },
        None => Lake::Iceberg {
            table_url: &table_url,
            reader: "duckdb",
        },
    };
    let (code, text) = lakecheck_s3(
        &p.env.python,
        endpoint,
        &p.env.url_for(&p.db),
        &format!("{}.{table}", p.db),
        lake,
        90,
    )
    .await;
    assert_eq!(
        code,
        Some(0),
        "lakecheck {}.{table} over S3 differs:\n{text}\n--- cdcd:\n{}",
        p.db,
        p.output()
    );
    eprintln!(
        "lakecheck {}.{table} (S3): {}",
        p.db,
        text.lines().last().unwrap_or("")
    );
}

case_tests!(stalled_renewal:
    s3_stalled_lease_renewal_fences_the_holder(false),
    /// Issue 22: the same with the Paimon sink on S3 (read back by pypaimon from S3).
    s3_stalled_lease_renewal_fences_the_holder_paimon(true),
);

async fn stalled_renewal(test: &str, lsm: bool) {
    let my = ground_or_skip!(my_env(test));
    // cdcd must not start while another test has the server's binlog_format flipped.
    let _globals = super::replication::SERVER_GLOBALS.read().await;
    let endpoint = ground_or_skip!(moto(test, true));
    const TTL_MS: u64 = 4000;
    let name = unique(if lsm { "fence_s3l" } else { "fence_s3" });
    let mut p = MyPipeline::new(&my, &name, "initial", "").await;
    if lsm {
        p.use_lsm(2, "initial", "");
    }
    create_tables(&p, &["a"], 500).await;
    with_pipeline_keys(&p.config, &format!("lease_ttl_ms = {TTL_MS}\n"));
    let bucket = bucket_name(&name);
    let tb = TestEnv {
        pg_url: String::new(),
        python: my.python.clone(),
    };
    create_bucket(&tb, &endpoint, &bucket);
    let dir = p.config.parent().unwrap().to_owned();
    let proxy = StallProxy::start(&my.python, &endpoint, &dir);
    let direct = s3_config_text(&p.config, &p.warehouse, &bucket, &endpoint);
    let proxied = s3_config_text(&p.config, &p.warehouse, &bucket, &proxy.url);
    let standby_config = dir.join("standby.toml");
    std::fs::write(&standby_config, &direct).unwrap();
    std::fs::write(&p.config, &proxied).unwrap();

    p.start();
    assert_equal_s3(&mut p, &bucket, &endpoint, "a").await;
    let mut standby = Daemon::spawn(&standby_config, &dir.join("standby.log"));
    assert!(
        wait_until(Duration::from_secs(30), || standby
            .log()
            .contains("standby"))
        .await,
        "the second cdcd did not wait as a standby:\n{}",
        standby.log()
    );

    // From now on the holder's renewals hang in the proxy; it keeps streaming meanwhile.
    std::fs::write(&proxy.flag, b"").unwrap();
    let mut c = my_connect(&p.env.url_for(&p.db)).await;
    let mut base = 10_000u64;
    let mut exited = None;
    for _ in 0..40 {
        churn(&mut c, "a", base).await;
        base += 100;
        tokio::time::sleep(Duration::from_millis(250)).await;
        if let Some(st) = p.wait_exit(Duration::ZERO).await {
            exited = Some(st);
            break;
        }
    }
    let stalled_for = proxy
        .requests()
        .iter()
        .find(|r| r.1 == "stall")
        .map(|r| r.0);
    let st = match exited {
        Some(st) => st,
        None => p
            .wait_exit(Duration::from_secs(20))
            .await
            .expect("the holder kept running with its lease renewals stalled"),
    };
    assert!(!st.success(), "the holder exited 0");
    let out = p.output();
    assert!(
        out.contains("lost the lease"),
        "the holder did not say it lost the lease:\n{out}"
    );
    eprintln!(
        "holder (stall began at {stalled_for:?}): {}",
        out.lines()
            .rev()
            .find(|l| l.contains("lost the lease"))
            .unwrap_or("")
    );
    assert!(
        wait_until(Duration::from_secs(30), || standby
            .log()
            .contains("lease acquired"))
        .await,
        "the standby did not take over:\n{}",
        standby.log()
    );

    // The renewal that stalled was sent ttl/3 after the last successful one, so the holder's
    // deadline was 5/12 ttl after the stall began: nothing may arrive after that.
    let requests = proxy.requests();
    let stalled_at = requests
        .iter()
        .find(|r| r.1 == "stall")
        .map(|r| r.0)
        .expect("no lease renewal was stalled");
    let deadline = stalled_at + (TTL_MS as f64 / 1000.0) * 5.0 / 12.0 + 0.05;
    let late: Vec<_> = requests
        .iter()
        .filter(|r| r.1 == "req" && r.2 != "GET" && r.2 != "HEAD" && r.0 > deadline)
        .collect();
    assert!(
        late.is_empty(),
        "the holder wrote after its lease deadline ({:.3} s after the stall): {late:?}",
        deadline - stalled_at
    );
    let writes_before = requests
        .iter()
        .filter(|r| r.1 == "req" && r.2 == "PUT" && r.0 > stalled_at && !r.3.contains("lease"))
        .count();
    eprintln!("holder writes between the stall and its deadline: {writes_before}");
    // The stalled renewals go through now and find the lease taken.
    std::fs::remove_file(&proxy.flag).unwrap();

    for _ in 0..3 {
        churn(&mut c, "a", base).await;
        base += 100;
    }
    assert_equal_s3(&mut p, &bucket, &endpoint, "a").await;
    standby.assert_running();

    // Later restarts work, straight to moto.
    standby.sigterm_and_wait().await;
    std::fs::write(&p.config, &direct).unwrap();
    for _ in 0..2 {
        p.start();
        churn(&mut c, "a", base).await;
        base += 100;
        assert_equal_s3(&mut p, &bucket, &endpoint, "a").await;
        let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
        assert!(st.success(), "{st}\n{}", p.output());
    }
}
