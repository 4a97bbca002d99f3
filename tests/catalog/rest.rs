//! `[sink.catalog] kind = "rest"` against a real Iceberg REST catalog server (rustberg, built by
//! `scripts/testbed.sh`; each test starts its own, with its own catalog file and warehouse), read
//! back through the same catalog by pyiceberg's `RestCatalog` and DuckDB's `ATTACH … (TYPE
//! iceberg)`. Faults through `tests/support/restproxy.py`: commit answers lost after the commit
//! landed, commits refused before reaching the server, OAuth2 tokens that expire early. Sharing: a
//! second cdcd process compacts the table through the catalog while the daemon streams updates
//! and deletes to it; the daemon's next commit conflicts (409) and is planned again on the
//! rewritten files.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{changes, create_table};
use crate::support::proxy::{ProxyProcess, RESTPROXY};
use crate::support::{
    connect, current_test, exec, fresh_table, run_cdcd, spark, test_env, test_env_and_name, unique,
    write_file, Pipeline, Settings, TestEnv, NAMESPACE,
};

/// The API key every test server accepts (rustberg: `^rb_[A-Za-z0-9_-]{7,61}$`).
const KEY: &str = "rb_cdcd_test_key_0001";

/// A rustberg server of one test.
struct Rustberg {
    child: Child,
    uri: String,
    log: PathBuf,
}

impl Rustberg {
    /// Starts rustberg with its catalog in `dir` and `warehouse` as its warehouse.
    ///
    /// The port `free_port` found can be taken by another test's rustberg before ours binds it;
    /// ours then exits, and the other one answers our requests (every test uses the same key),
    /// so a test once committed to a neighbour's catalog. Ready means ours listens on the port;
    /// if it exits first it starts again on another port.
    fn start(dir: &Path, warehouse: &Path) -> Rustberg {
        for _ in 0..5 {
            if let Some(server) = Rustberg::start_once(dir, warehouse) {
                return server;
            }
        }
        panic!("rustberg could not take a free port in 5 attempts");
    }

    /// One attempt of [`Rustberg::start`]: `None` when rustberg exited before it listened.
    fn start_once(dir: &Path, warehouse: &Path) -> Option<Rustberg> {
        let bin = rustberg_binary();
        std::fs::create_dir_all(warehouse).unwrap();
        let port = free_port();
        let config = dir.join("rustberg.toml");
        write_file(
            &config,
            &format!(
                "[server]\nhost = \"127.0.0.1\"\nport = {port}\n\n\
                 [server.auth]\napi_key_enabled = true\njwt_enabled = false\n\n\
                 [[server.auth.api_keys]]\nname = \"cdcd-test\"\ntenant = \"default\"\nroles = [\"admin\"]\nkey_env = \"RB_KEY\"\n\n\
                 [storage]\ncatalog_url = \"file://{catalog}\"\nwarehouse_location = \"file://{wh}\"\n\n\
                 [rate_limit]\nenabled = false\n\n[audit]\nsink = \"none\"\n",
                catalog = dir.join("rustberg-catalog").display(),
                wh = warehouse.display(),
            ),
        );
        let log = dir.join("rustberg.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(bin)
            .args(["--config", config.to_str().unwrap(), "--insecure-http"])
            .env("RB_KEY", KEY)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let mut server = Rustberg {
            child,
            uri: format!("http://127.0.0.1:{port}"),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !(listens_on(server.child.id(), port)
            && http_status(port, "/v1/config", KEY) == Some(200))
        {
            if let Ok(Some(status)) = server.child.try_wait() {
                eprintln!(
                    "rustberg exited ({status}) before listening on {port}; starting again:\n{}",
                    std::fs::read_to_string(&server.log).unwrap_or_default()
                );
                return None;
            }
            assert!(
                Instant::now() < deadline,
                "rustberg did not answer /v1/config:\n{}",
                std::fs::read_to_string(&server.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        Some(server)
    }
}

impl Drop for Rustberg {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One source table `<tag>_<pid>_orders` (`create_table`), a pipeline replicating it, and a
/// rustberg server of its own in the pipeline's directory; the test writes the config once it
/// knows the server's URI.
struct Bed {
    p: Pipeline,
    server: Rustberg,
    dir: PathBuf,
    client: tokio_postgres::Client,
    t: String,
}

impl Bed {
    async fn orders(env: &TestEnv, tag: &str) -> Bed {
        let name = unique(tag);
        let t = format!("{name}_orders");
        let client = connect(&env.pg_url).await;
        exec(&client, &create_table(&t)).await;
        let mut p = Pipeline::new(env, &name, &[&t], &Settings::default());
        p.on_cleanup(format!("DROP TABLE IF EXISTS {t}"));
        let dir = p.dir.as_ref().unwrap().path().to_owned();
        let server = Rustberg::start(&dir, &p.warehouse);
        Bed {
            p,
            server,
            dir,
            client,
            t,
        }
    }
}

impl Bed {
    /// [`Bed::orders`] with cdcd started on it through the REST catalog, without maintenance
    /// cycles; `properties`: the lines of its `[sink.table_properties]`.
    async fn streaming(env: &TestEnv, tag: &str, properties: &str) -> Bed {
        let mut bed = Bed::orders(env, tag).await;
        let settings = Settings {
            sink_extra: format!(
                "maintenance_interval_ms = 0\n{}\n[sink.table_properties]\n{properties}",
                catalog_section(&bed.server.uri, &format!("token = {KEY:?}"))
            ),
            ..Settings::default()
        };
        bed.p.write_config(&settings);
        bed.p.start();
        bed.p
            .wait_slot_active(&bed.client, Duration::from_secs(60))
            .await;
        bed
    }
}

/// A restproxy.py in front of a server.
struct Proxy {
    _process: ProxyProcess,
    uri: String,
    log: PathBuf,
}

impl Proxy {
    fn start(env: &TestEnv, upstream: &Rustberg, dir: &Path, args: &[&str]) -> Proxy {
        let log = dir.join("restproxy.log");
        let upstream_args = ["--upstream-token", KEY, "--log", log.to_str().unwrap()];
        let args = upstream_args.iter().chain(args);
        let process = ProxyProcess::start(
            &env.python,
            RESTPROXY,
            &upstream.uri,
            args,
            Stdio::inherit(),
        );
        Proxy {
            uri: process.url.clone(),
            _process: process,
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The test bed's rustberg, waiting for its background build when it is not there yet.
fn rustberg_binary() -> String {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!(
                "{name} is unset: run scripts/testbed.sh up and eval \"$(scripts/testbed.sh env)\""
            )
        })
    };
    let bin = var("CDCD_TEST_RUSTBERG");
    let status = var("CDCD_TEST_RUSTBERG_STATUS");
    let deadline = Instant::now() + Duration::from_secs(45 * 60);
    while !Path::new(&bin).exists() {
        match std::fs::read_to_string(&status) {
            Ok(s) if s.trim() == "failed" => {
                panic!("building rustberg failed: see the test bed's logs/rustberg-build.log")
            }
            _ if Instant::now() > deadline => panic!("rustberg is still not built ({bin})"),
            _ => std::thread::sleep(Duration::from_secs(5)),
        }
    }
    bin
}

/// Whether process `pid` holds a socket listening on TCP port `port` (IPv4), from `/proc`.
fn listens_on(pid: u32, port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return false;
    };
    let local = format!(":{port:04X}");
    // Columns: sl, local_address, rem_address, st (0A: LISTEN), …, inode (the tenth).
    let sockets: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let listening = fields.get(1)?.ends_with(&local) && *fields.get(3)? == "0A";
            let inode = fields.get(9)?;
            listening.then(|| format!("socket:[{inode}]"))
        })
        .collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|target| sockets.iter().any(|s| target.as_os_str() == s.as_str()))
    })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The status of `GET path` with a bearer token (`None`: no answer).
fn http_status(port: u16, path: &str, token: &str) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}

fn catalog_section(uri: &str, auth: &str) -> String {
    format!("\n[sink.catalog]\nkind = \"rest\"\nuri = {uri:?}\n{auth}\n")
}

/// lakecheck of `public.<table>` through the REST catalog, by pyiceberg (by DuckDB's REST
/// attach under equality deletes, which pyiceberg refuses) and then by DuckDB too.
async fn assert_equal_through_catalog(p: &mut Pipeline, uri: &str, table: &str, wait_secs: u32) {
    let first = match std::env::var("CDCD_TEST_DELETE_MODE").as_deref() {
        Ok("equality") => "duckdb",
        _ => "pyiceberg",
    };
    assert_equal_through_catalog_by(p, uri, table, wait_secs, &[first, "duckdb"]).await;
}

/// lakecheck of `public.<table>` through the REST catalog by each of `readers` in turn (the
/// first waits up to `wait_secs` for the rows to match).
async fn assert_equal_through_catalog_by(
    p: &mut Pipeline,
    uri: &str,
    table: &str,
    wait_secs: u32,
    readers: &[&str],
) {
    let t = format!("{NAMESPACE}.{table}");
    for (i, reader) in readers.iter().copied().enumerate() {
        let wait = if i == 0 { wait_secs } else { 0 };
        let args = [
            "--rest-catalog",
            uri,
            "--catalog-token",
            KEY,
            "--catalog-table",
            &t,
            "--reader",
            reader,
        ];
        let (code, out) = p.lakecheck(table, wait, &args).await;
        assert_eq!(
            code,
            Some(0),
            "lakecheck through the REST catalog ({reader}) differs:\n{out}"
        );
        eprintln!(
            "lakecheck public.{table}: {}",
            out.lines().last().unwrap_or("")
        );
    }
}

/// Replication through rustberg: `cdcd check`, the copy, three rounds of changes with a restart
/// in between, `cdcd status` and `cdcd cleanup` through the catalog; pyiceberg lists what cdcd
/// created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_catalog_replicates_and_readers_find_the_table() {
    let (env, name) = ground_or_skip!(test_env_and_name("catrest"));
    let t = format!("{name}_orders");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t)).await;
    let settings = Settings {
        sink_extra: String::new(),
        ..Settings::default()
    };
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &settings);
    let dir = p.dir.as_ref().unwrap().path().to_owned();
    let server = Rustberg::start(&dir, &p.warehouse);
    // Snapshots expire as soon as they are not the newest: `cdcd maintain` below expires
    // through the catalog.
    let settings = Settings {
        sink_extra: format!(
            "maintenance_interval_ms = 0\n{}\n[sink.table_properties]\n\
             \"history.expire.max-snapshot-age-ms\" = \"1\"\n\"cdcd.expiry.delete-delay-ms\" = \"0\"\n\"history.expire.min-snapshots-to-keep\" = \"1\"\n",
            catalog_section(&server.uri, &format!("token = {KEY:?}"))
        ),
        ..Settings::default()
    };
    p.write_config(&settings);

    let (ok, out) = run_cdcd(&["check"], &p.config);
    let line = format!("catalog rest {}: ok (bearer token;", server.uri);
    assert!(
        ok && out.contains(&line) && out.contains(&format!("namespace {NAMESPACE}: ok")),
        "cdcd check:\n{out}"
    );
    assert!(!out.contains(KEY), "cdcd check shows the token:\n{out}");

    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    for round in 1..=3 {
        exec(&client, &changes(&t, round)).await;
        assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
        if round == 2 {
            p.sigterm_and_wait(Duration::from_secs(60)).await;
            p.start();
        }
    }
    let (ok, out) = run_cdcd(&["status"], &p.config);
    assert!(ok && out.contains(&t), "cdcd status:\n{out}");
    p.sigterm_and_wait(Duration::from_secs(60)).await;
    let (ok, out) = run_cdcd(&["maintain"], &p.config);
    assert!(
        ok && out.contains(&t) && !out.contains("expired 0 snapshots"),
        "cdcd maintain expired nothing through the catalog:\n{out}"
    );
    assert_equal_through_catalog(&mut p, &server.uri, &t, 0).await;
    let (ok, out) = run_cdcd(&["cleanup", "--dry-run"], &p.config);
    assert!(ok, "cdcd cleanup through the catalog:\n{out}");
    assert!(!out.contains(KEY), "cdcd cleanup shows the token:\n{out}");

    // pyiceberg lists the namespace and the table cdcd created, as a v3 (or v2) table with cdcd's
    // properties and its checkpoint in the current snapshot.
    let script = format!(
        "from pyiceberg.catalog import load_catalog\n\
         c = load_catalog('rest', type='rest', uri={uri:?}, token={KEY:?})\n\
         t = c.load_table(({NAMESPACE:?}, {t:?}))\n\
         print(c.list_namespaces(), c.list_tables({NAMESPACE:?}))\n\
         print('format', t.metadata.format_version)\n\
         print('position', t.current_snapshot().summary.additional_properties.get('cdcd.position'))",
        uri = server.uri,
    );
    let out = Command::new(&env.python)
        .args(["-c", &script])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("('{NAMESPACE}',)"))
            && text.contains(&format!("('{NAMESPACE}', '{t}')"))
            && !text.contains("position None"),
        "pyiceberg: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let format = if std::env::var("CDCD_TEST_DELETE_MODE").as_deref() == Ok("equality") {
        "format 2"
    } else {
        "format 3"
    };
    assert!(text.contains(format), "pyiceberg: {text}");
}

/// The catalog loses the answers of two commits that landed, and refuses two before they reach
/// it (503): cdcd loads the table to learn each outcome, goes on after the landed ones without
/// committing them again, and sends the refused ones again. The replica ends equal, with no key
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_commits_whose_answers_are_lost_or_refused_land_once() {
    let env = ground_or_skip!(test_env(
        "rest_commits_whose_answers_are_lost_or_refused_land_once"
    ));
    let Bed {
        mut p,
        server,
        dir,
        client,
        t,
    } = Bed::orders(&env, "catrestlost").await;
    // Commit 1 is the copy; 2 and 4 land unanswered, 3 and 6 are refused unsent.
    let proxy = Proxy::start(
        &env,
        &server,
        &dir,
        &["--lose-answer", "2,4", "--refuse", "3,6"],
    );
    let settings = Settings {
        sink_extra: format!(
            "maintenance_interval_ms = 0\n{}",
            catalog_section(&proxy.uri, "token = \"ignored-by-the-proxy\"")
        ),
        ..Settings::default()
    };
    p.write_config(&settings);
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    for round in 1..=5 {
        exec(&client, &changes(&t, round)).await;
        assert_equal_through_catalog(&mut p, &server.uri, &t, 90).await;
    }
    let log = proxy.log();
    assert!(
        log.matches("lost POST").count() == 2 && log.matches("refused POST").count() == 2,
        "the proxy did not inject every fault:\n{log}"
    );
    let out = p.output();
    assert!(
        out.contains("commit landed on an earlier attempt"),
        "cdcd did not find its landed commit:\n{out}"
    );
    p.sigterm_and_wait(Duration::from_secs(60)).await;
}

/// OAuth2 client credentials against a token server whose tokens die after 2 s though it
/// announces an hour: every request after that gets 401, cdcd gets a new token and sends the
/// request again. Replication goes on across several expiries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_oauth2_tokens_that_expire_are_renewed() {
    let env = ground_or_skip!(test_env("rest_oauth2_tokens_that_expire_are_renewed"));
    let Bed {
        mut p,
        server,
        dir,
        client,
        t,
    } = Bed::orders(&env, "catrestoauth").await;
    let proxy = Proxy::start(
        &env,
        &server,
        &dir,
        &[
            "--oauth",
            "cdcd-client:s3cret-Value",
            "--token-ttl",
            "2",
            "--announce-ttl",
            "3600",
        ],
    );
    let settings = Settings {
        sink_extra: catalog_section(&proxy.uri, "credential = \"cdcd-client:s3cret-Value\""),
        ..Settings::default()
    };
    p.write_config(&settings);
    let (ok, out) = run_cdcd(&["check"], &p.config);
    assert!(
        ok && out.contains("OAuth2 client credentials of \"cdcd-client\""),
        "cdcd check:\n{out}"
    );
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    for round in 1..=3 {
        tokio::time::sleep(Duration::from_secs(3)).await;
        exec(&client, &changes(&t, round)).await;
        assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    }
    let log = proxy.log();
    assert!(
        log.matches("token POST").count() >= 3 && log.contains("401 "),
        "no token expired and was renewed:\n{log}"
    );
    let out = p.output();
    assert!(
        !out.contains("s3cret-Value") && !out.contains(KEY),
        "a secret reached the log:\n{out}"
    );
    p.sigterm_and_wait(Duration::from_secs(60)).await;
}

/// Another engine rewrites the table's data files through the catalog while cdcd streams updates
/// and deletes to it (here a second cdcd, `cdcd maintain` under another pipeline name, compacting
/// the way Spark's `rewrite_data_files` does: new files, old ones removed, one snapshot on
/// `main`). The daemon's next commit is refused (409); it loads the table, catches its
/// primary-key index up with the rewritten files, plans the commit again and lands it: the
/// replica stays equal, no update or delete lost or applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewrite_by_another_engine_is_built_upon() {
    let env = ground_or_skip!(test_env("a_rewrite_by_another_engine_is_built_upon"));
    let Bed {
        mut p,
        server,
        dir,
        client,
        t,
    } = Bed::orders(&env, "catrestshare").await;
    // The daemon's own maintenance off (the other engine maintains this table); compaction
    // eager so the other engine's cycle rewrites the few small files there are, and the file
    // the first cycle wrote once the next changes delete some of its rows.
    let sink_extra = format!(
        "maintenance_interval_ms = 0\n{}\n[sink.table_properties]\n\"cdcd.compaction.min-input-files\" = \"2\"\n\"cdcd.compaction.delete-ratio-percent\" = \"1\"\n",
        catalog_section(&server.uri, &format!("token = {KEY:?}"))
    );
    let settings = Settings {
        sink_extra: sink_extra.clone(),
        ..Settings::default()
    };
    p.write_config(&settings);
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    for round in 1..=2 {
        exec(&client, &changes(&t, round)).await;
        assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    }

    // The other engine: the same catalog and table, another pipeline (its own lease and index).
    let other = dir.join("other.toml");
    let text = std::fs::read_to_string(&p.config).unwrap().replace(
        &format!("name = {:?}", p.name),
        &format!("name = \"{}_other\"", p.name),
    );
    write_file(&other, &text);
    for round in 3..=4 {
        let (ok, out) = run_cdcd(&["maintain", "--table", &format!("public.{t}")], &other);
        assert!(ok, "cdcd maintain (the other engine):\n{out}");
        assert!(
            out.contains(": rewrote ") && !out.contains(": rewrote 0 data files"),
            "the other engine rewrote nothing:\n{out}"
        );
        // Updates and deletes of rows the rewrite moved.
        exec(&client, &changes(&t, round)).await;
        assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    }
    let out = p.output();
    assert!(
        out.contains("planning the commit again on top of it"),
        "the daemon never met the other engine's commit:\n{out}"
    );
    p.sigterm_and_wait(Duration::from_secs(60)).await;
}

/// Two tables changed by the same source transactions, committed through a catalog that offers
/// `transactions/commit`: every flush is one catalog transaction, so a reader never sees a source
/// transaction in one table and not in the other. A watcher loads table `a` then table `b`
/// through the catalog over and over; both only grow, one row per source transaction each, so
/// seeing more rows in `a` than in `b` would be a torn transaction. The catalog also loses the
/// answer of one transaction that landed and refuses one before it arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_transaction_over_two_tables_appears_in_both_at_once() {
    let (env, name) = ground_or_skip!(test_env_and_name("catresttx"));
    let (a, b) = (format!("{name}_a"), format!("{name}_b"));
    let client = connect(&env.pg_url).await;
    for t in [&a, &b] {
        exec(
            &client,
            &format!("DROP TABLE IF EXISTS {t}; CREATE TABLE {t} (id int8 PRIMARY KEY, n int8); INSERT INTO {t} VALUES (0, 0);"),
        )
        .await;
    }
    let mut p = Pipeline::owning_tables(&env, &name, &[&a, &b], &Settings::default());
    let dir = p.dir.as_ref().unwrap().path().to_owned();
    let server = Rustberg::start(&dir, &p.warehouse);
    let proxy = Proxy::start(
        &env,
        &server,
        &dir,
        &["--lose-answer", "5", "--refuse", "8"],
    );
    let settings = Settings {
        sink_extra: format!(
            "maintenance_interval_ms = 0\n{}",
            catalog_section(&proxy.uri, "token = \"ignored-by-the-proxy\"")
        ),
        ..Settings::default()
    };
    p.write_config(&settings);
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    assert_equal_through_catalog(&mut p, &server.uri, &a, 60).await;
    assert_equal_through_catalog(&mut p, &server.uri, &b, 60).await;

    let stop = dir.join("watcher.stop");
    let progress = dir.join("watcher.checks");
    let watcher = format!(
        "import os, time\n\
         from pyiceberg.catalog import load_catalog\n\
         c = load_catalog('rest', type='rest', uri={uri:?}, token={KEY:?})\n\
         def rows(t):\n\
         \x20   s = c.load_table(({NAMESPACE:?}, t)).current_snapshot()\n\
         \x20   return int(s.summary.additional_properties.get('total-records', 0)) - int(s.summary.additional_properties.get('total-position-deletes', 0)) - int(s.summary.additional_properties.get('total-equality-deletes', 0)) if s else 0\n\
         checks = torn = 0\n\
         while not os.path.exists({stop:?}):\n\
         \x20   na = rows({a:?}); nb = rows({b:?}); checks += 1\n\
         \x20   if na > nb: torn += 1; print('torn', na, nb, flush=True)\n\
         \x20   open({progress:?}, 'w').write(str(checks))\n\
         print('checks', checks, 'torn', torn, flush=True)\n",
        uri = server.uri,
        stop = stop.display().to_string(),
        progress = progress.display().to_string(),
    );
    let watch = tokio::process::Command::new(&env.python)
        .args(["-c", &watcher])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // At least 60 transactions, and on until the watcher has looked 20 times (a loaded machine
    // makes its loads slow).
    let checks_so_far = || {
        std::fs::read_to_string(&progress)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
            .unwrap_or(0)
    };
    for i in 1..=600 {
        if i > 60 && checks_so_far() >= 20 {
            break;
        }
        exec(
            &client,
            &format!(
                "BEGIN; INSERT INTO {a} VALUES ({i}, {i}); INSERT INTO {b} VALUES ({i}, {i}); COMMIT;"
            ),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(70)).await;
    }
    assert_equal_through_catalog(&mut p, &server.uri, &a, 60).await;
    assert_equal_through_catalog(&mut p, &server.uri, &b, 60).await;
    write_file(&stop, "");
    let out = watch.wait_with_output().await.unwrap();
    let said = crate::support::stdout_then_stderr(&out);
    let checks: u32 = said
        .split_whitespace()
        .skip_while(|w| *w != "checks")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("watcher: {said}"));
    eprintln!("watcher: {said}");
    assert!(
        said.contains("torn 0") && checks >= 20,
        "a reader saw a source transaction in one table only (or watched too little):\n{said}"
    );
    let log = proxy.log();
    assert!(
        // Under load a flush gathers more transactions, so there may be few.
        log.matches("POST /v1/transactions/commit").count() >= 3,
        "cdcd did not commit the tables together:\n{log}"
    );
    assert!(
        log.contains("lost POST /v1/transactions/commit")
            && log.contains("refused POST /v1/transactions/commit"),
        "the faults did not hit a transaction:\n{log}"
    );
    p.sigterm_and_wait(Duration::from_secs(60)).await;
}

/// `sigv4 = true` (AWS Glue's and S3 Tables' REST endpoints): every request cdcd sends carries a
/// SigV4 signature that botocore, AWS's own signer, recomputes to the same value (the proxy
/// refuses any other with 403), with the credentials from the `AWS_*` environment. A wrong
/// secret is refused and named by `cdcd check` without showing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_sigv4_signatures_verify() {
    let env = ground_or_skip!(test_env("rest_sigv4_signatures_verify"));
    let Bed {
        mut p,
        server,
        dir,
        client,
        t,
    } = Bed::orders(&env, "catrestsig").await;
    let (key_id, secret) = ("AKIDCDCDSIGV4TEST", "sIgV4/s3cret+Key");
    let proxy = Proxy::start(
        &env,
        &server,
        &dir,
        &["--sigv4", &format!("glue:eu-west-1:{key_id}:{secret}")],
    );
    let settings = Settings {
        sink_extra: catalog_section(
            &proxy.uri,
            "sigv4 = true\nsigning_name = \"glue\"\nsigning_region = \"eu-west-1\"",
        ),
        ..Settings::default()
    };
    p.write_config(&settings);
    let aws = |secret: &str| {
        vec![
            ("AWS_ACCESS_KEY_ID".to_owned(), key_id.to_owned()),
            ("AWS_SECRET_ACCESS_KEY".to_owned(), secret.to_owned()),
            (
                "AWS_SESSION_TOKEN".to_owned(),
                "session-token-0001".to_owned(),
            ),
        ]
    };
    let check = |secret: &str| {
        let out = Command::new(crate::support::cdcd_bin())
            .args(["check", "--config", p.config.to_str().unwrap()])
            .envs(aws(secret))
            .output()
            .unwrap();
        let text = crate::support::stdout_then_stderr(&out);
        (out.status.success(), text)
    };
    let (ok, out) = check("a-wrong-secret");
    assert!(
        !ok && out.contains("403") && !out.contains("a-wrong-secret"),
        "cdcd check with a wrong secret:\n{out}"
    );
    let (ok, out) = check(secret);
    assert!(
        ok && out.contains("AWS SigV4 for \"glue\""),
        "cdcd check:\n{out}"
    );
    p.env_vars.extend(aws(secret));
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    exec(&client, &changes(&t, 1)).await;
    assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    let log = proxy.log();
    assert!(
        // The one refused: `cdcd check` with the wrong secret.
        log.matches("sigv4-ok POST").count() >= 3 && log.matches("sigv4: ").count() == 1,
        "not every request was signed right:\n{log}"
    );
    let out = p.output();
    assert!(!out.contains(secret), "the secret reached the log:\n{out}");
    p.sigterm_and_wait(Duration::from_secs(60)).await;
}

/// Spark (Iceberg-Java 1.10) maintains cdcd's table through the same REST catalog while cdcd
/// streams updates and deletes to it: `rewrite_data_files`, `rewrite_position_delete_files` and
/// `expire_snapshots`, each followed by changes to rows they moved. The table ends equal, read by
/// pyiceberg, DuckDB and Spark. Spark is the test bed's `spark` component:
/// `CDCD_TEST_SPARK_PYTHON` (a python with pyspark 3.5 and snowpark-connect-deps-iceberg) and
/// `CDCD_TEST_SPARK_JARS` (iceberg-shaded-jackson.jar, iceberg-shaded-hc5.jar).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spark_maintenance_beside_cdcd() {
    let env = ground_or_skip!(test_env("spark_maintenance_beside_cdcd"));
    let (spark, jars) = ground_or_skip!(spark("spark_maintenance_beside_cdcd"));
    let properties =
        "\"cdcd.compaction.enabled\" = \"false\"\n\"cdcd.expiry.enabled\" = \"false\"\n";
    let Bed {
        mut p,
        server,
        dir: _,
        client,
        t,
    } = Bed::streaming(&env, "catrestspark", properties).await;
    for round in 1..=2 {
        exec(&client, &changes(&t, round)).await;
        assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    }
    let run_spark = |procedure: &str| spark_procedure((&spark, &jars), &server.uri, &t, procedure);
    // The last round expires right after a rewrite, before cdcd commits again: the snapshot
    // holding cdcd's checkpoint is gone, and only the rewrite's parent id still names it.
    for (round, procedures) in [
        (3, &["rewrite_data_files"][..]),
        (4, &["rewrite_position_delete_files"][..]),
        (5, &["expire_snapshots"][..]),
        (6, &["rewrite_data_files", "expire_snapshots"][..]),
    ] {
        for procedure in procedures {
            run_spark(procedure);
        }
        exec(&client, &changes(&t, round)).await;
        assert_equal_through_catalog(&mut p, &server.uri, &t, 90).await;
    }
    assert_spark_counts_the_source(&client, &t, &run_spark("count")).await;
    let out = p.output();
    assert!(
        out.contains("planning the commit again on top of it"),
        "cdcd never met Spark's commits:\n{out}"
    );
    p.sigterm_and_wait(Duration::from_secs(60)).await;
}

/// Spark's `count` of `t` (its output `counted`) is the source's row count.
async fn assert_spark_counts_the_source(client: &tokio_postgres::Client, t: &str, counted: &str) {
    let source: i64 = client
        .query_one(&format!("SELECT count(*) FROM {t}"), &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        counted.contains(&format!("rows: {source}")),
        "Spark counts otherwise than the source ({source}):\n{counted}"
    );
}

/// Runs `procedure` of `tests/support/spark_maintain.py` with Spark (`(python, jars)`) on table
/// `t` of the REST catalog at `uri`; returns its output.
fn spark_procedure(spark: (&str, &str), uri: &str, t: &str, procedure: &str) -> String {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/support/spark_maintain.py"
    );
    let table = format!("{NAMESPACE}.{t}");
    let out = Command::new(spark.0)
        .args([script, spark.1, uri, KEY, &table, procedure])
        .output()
        .unwrap();
    let text = crate::support::stdout_then_stderr(&out);
    assert!(out.status.success(), "spark {procedure}:\n{text}");
    eprintln!(
        "spark {procedure}: {}",
        text.lines()
            .find(|l| ["result:", "rows:", "specs:"]
                .iter()
                .any(|p| l.starts_with(p)))
            .unwrap_or("")
    );
    text
}

/// Issue 36: Spark partitions cdcd's table through the same REST catalog mid-stream
/// (`bucket(4, id)`, `WRITE ORDERED BY n`): cdcd's next commits write the new spec, its updates
/// and deletes of rows in the old spec's files stay exact, and `cdcd maintain` (through the
/// catalog) moves the old spec's files into the new one. pyiceberg reads the rows through the
/// catalog (DuckDB 1.5.5 misreads a table whose spec evolved), Spark counts them and lists the
/// live files' specs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spark_evolves_the_spec_through_the_rest_catalog_mid_stream() {
    let test = "spark_evolves_the_spec_through_the_rest_catalog_mid_stream";
    let env = ground_or_skip!(test_env(test));
    if std::env::var("CDCD_TEST_DELETE_MODE").as_deref() == Ok("equality") {
        eprintln!("skipped: pyiceberg reads no equality deletes, DuckDB no evolved spec");
        return;
    }
    let (spark, jars) = ground_or_skip!(spark(test));
    let Bed {
        mut p,
        server,
        dir: _,
        client,
        t,
    } = Bed::streaming(&env, "catrestspec", "").await;
    let by_pyiceberg = ["pyiceberg"];
    exec(&client, &changes(&t, 1)).await;
    assert_equal_through_catalog_by(&mut p, &server.uri, &t, 60, &by_pyiceberg).await;
    let run_spark = |procedure: &str| spark_procedure((&spark, &jars), &server.uri, &t, procedure);
    run_spark("partition");
    for round in 2..=3 {
        exec(&client, &changes(&t, round)).await;
        assert_equal_through_catalog_by(&mut p, &server.uri, &t, 90, &by_pyiceberg).await;
    }
    assert!(
        run_spark("specs").contains("specs: [0, 1]"),
        "cdcd's commits after Spark's change wrote spec 1 beside spec 0's files"
    );
    p.sigterm_and_wait(Duration::from_secs(60)).await;
    let out = crate::postgres::maintenance::maintain(&p, &[]);
    let text = crate::support::stdout_then_stderr(&out);
    assert!(out.status.success(), "cdcd maintain:\n{text}");
    assert!(
        run_spark("specs").contains("specs: [1]"),
        "cdcd maintain left files of spec 0:\n{text}"
    );
    assert_equal_through_catalog_by(&mut p, &server.uri, &t, 0, &by_pyiceberg).await;
    p.start();
    exec(&client, &changes(&t, 4)).await;
    assert_equal_through_catalog_by(&mut p, &server.uri, &t, 90, &by_pyiceberg).await;
    assert_spark_counts_the_source(&client, &t, &run_spark("count")).await;
    p.sigterm_and_wait(Duration::from_secs(60)).await;
}

/// `ALTER TABLE … ADD COLUMN` (nullable, then with a constant default) and a widening through the
/// REST catalog: the commit carries `add-schema` and `set-current-schema` with the schema
/// requirements; old rows read NULL or the default, new rows their values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_schema_changes_commit_through_the_catalog() {
    let env = ground_or_skip!(test_env("rest_schema_changes_commit_through_the_catalog"));
    let Bed {
        mut p,
        server,
        dir: _,
        client,
        t,
    } = Bed::orders(&env, "catrestddl").await;
    let settings = Settings {
        sink_extra: catalog_section(&server.uri, &format!("token = {KEY:?}")),
        ..Settings::default()
    };
    p.write_config(&settings);
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    exec(
        &client,
        &format!(
            "ALTER TABLE {t} ADD COLUMN note text; ALTER TABLE {t} ALTER COLUMN n TYPE int8;
             UPDATE {t} SET note = 'noted', n = n + 5000000000 WHERE id % 5 = 0;
             INSERT INTO {t} VALUES (90001, 'after', 7, 'new');"
        ),
    )
    .await;
    assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    // v3 only: a constant default becomes the field's initial-default.
    if std::env::var("CDCD_TEST_DELETE_MODE").as_deref() != Ok("equality") {
        exec(
            &client,
            &format!(
                "ALTER TABLE {t} ADD COLUMN tier text DEFAULT 'basic';
                 INSERT INTO {t} VALUES (90002, 'later', 8, NULL, 'gold');"
            ),
        )
        .await;
        assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    }
    p.sigterm_and_wait(Duration::from_secs(60)).await;
}

/// Issue 20, `cdcd resync` through a REST catalog: the swap is one ordinary commit on the live
/// table's head (the server checks that its sequence number and first row id go on rising). A
/// damaged replica (rows the source lost while the table was out of the publication) is copied
/// again online while cdcd streams; then `int4 → text`, which cdcd stops on, is copied again at
/// start. Read through the catalog by pyiceberg and DuckDB after each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_resync_swaps_through_the_catalog() {
    let env = ground_or_skip!(test_env("rest_resync_swaps_through_the_catalog"));
    let Bed {
        mut p,
        server,
        dir: _,
        client,
        t,
    } = Bed::orders(&env, "catrestrs").await;
    let settings = Settings {
        sink_extra: catalog_section(&server.uri, &format!("token = {KEY:?}")),
        ..Settings::default()
    };
    p.write_config(&settings);
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    exec(&client, &changes(&t, 1)).await;
    assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert!(st.success(), "{st}");
    crate::postgres::resync::damage(&client, &p, &t).await;

    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    let (ok, out) = run_cdcd(&["resync", "--table", &format!("public.{t}")], &p.config);
    assert!(ok && out.contains("requested"), "{out}");
    exec(&client, &changes(&t, 2)).await;
    crate::support::wait_for(&mut p, "the online resync", Duration::from_secs(180), |o| {
        o.contains("resync finished")
    })
    .await;
    exec(&client, &changes(&t, 3)).await;
    assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;

    exec(
        &client,
        &format!(
            "ALTER TABLE {t} ALTER COLUMN n TYPE text USING 'n' || n::text;
             UPDATE {t} SET n = n || '!' WHERE id % 5 = 0;"
        ),
    )
    .await;
    p.assert_stops(Duration::from_secs(60), "cdcd must stop on int4 -> text")
        .await;
    let (ok, out) = run_cdcd(&["resync", "--table", &format!("public.{t}")], &p.config);
    assert!(ok && out.contains("requested"), "{out}");
    p.start();
    crate::support::wait_for(
        &mut p,
        "the resync at start",
        Duration::from_secs(180),
        |o| crate::support::start_output(o, 3).contains("resync finished"),
    )
    .await;
    exec(
        &client,
        &format!("UPDATE {t} SET n = 'late' WHERE id % 3 = 0; DELETE FROM {t} WHERE id % 13 = 0;"),
    )
    .await;
    assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert!(st.success(), "{st}");
}

/// The resync's swap is one REST commit; here the catalog applies it and the answer is lost
/// (503). cdcd loads the table, finds its swap landed, and streams on without swapping again: the
/// replica ends equal through the catalog, the swap is in the table's history once, and a restart
/// neither swaps nor copies again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_resync_swap_whose_answer_is_lost_lands_once() {
    let env = ground_or_skip!(test_env("rest_resync_swap_whose_answer_is_lost_lands_once"));
    let Bed {
        mut p,
        server,
        dir,
        client,
        t,
    } = Bed::orders(&env, "catrestrsl").await;
    let direct = Settings {
        sink_extra: format!(
            "maintenance_interval_ms = 0\n{}",
            catalog_section(&server.uri, &format!("token = {KEY:?}"))
        ),
        ..Settings::default()
    };
    p.write_config(&direct);
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    exec(&client, &changes(&t, 1)).await;
    assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert!(st.success(), "{st}");
    crate::postgres::resync::damage(&client, &p, &t).await;
    let (ok, out) = run_cdcd(&["resync", "--table", &format!("public.{t}")], &p.config);
    assert!(ok && out.contains("requested"), "{out}");

    // The lineage is kept through the filesystem catalog: the first commit the proxy sees for
    // this start is the swap.
    let proxy = Proxy::start(&env, &server, &dir, &["--lose-answer", "1"]);
    p.write_config(&Settings {
        sink_extra: format!(
            "maintenance_interval_ms = 0\n{}",
            catalog_section(&proxy.uri, "token = \"ignored-by-the-proxy\"")
        ),
        ..Settings::default()
    });
    p.start();
    crate::support::wait_for(
        &mut p,
        "the resync at start",
        Duration::from_secs(180),
        |o| crate::support::start_output(o, 2).contains("resync finished"),
    )
    .await;
    exec(&client, &changes(&t, 2)).await;
    assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    let log = proxy.log();
    assert_eq!(
        log.matches("lost POST").count(),
        1,
        "the proxy did not lose the swap's answer:\n{log}"
    );
    let out = crate::support::start_output(&p.output(), 2);
    assert!(
        out.contains("commit landed on an earlier attempt")
            && out
                .matches("the new lineage replaced the live table")
                .count()
                == 1,
        "cdcd did not find its landed swap, or swapped twice:\n{out}"
    );

    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert!(st.success(), "{st}");
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    exec(&client, &changes(&t, 3)).await;
    assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    let third = crate::support::start_output(&p.output(), 3);
    assert!(
        !third.contains("resync") && !third.contains("initial copy"),
        "the restart resynced or copied again:\n{third}"
    );
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert!(st.success(), "{st}");
}

/// An online resync while transactions over two tables stream through the catalog's
/// `transactions/commit` (issue 34): every transaction updates both tables, so every flush of the
/// resync's catch-up holds both, one of them under resync. The resynced table's commits go to its
/// lineage and its swap is one commit of the live table, as table by table; the other table
/// streams on through the copy and the catch-up, and both go on being committed together after
/// the swap. No commit is refused and the daemon never stops; the damage the resync repairs is
/// gone, and both tables end equal to the source through the catalog (pyiceberg and DuckDB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_online_resync_under_multi_table_commits_swaps_while_the_other_table_streams() {
    let (env, name) = ground_or_skip!(test_env_and_name("catrestrstx"));
    let (a, b) = (format!("{name}_a"), format!("{name}_b"));
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&a)).await;
    // Large enough that the resync's copy outlasts a few flushes of the live table: the lineage
    // then ends behind it and catches up through flushes that hold both tables, rather than
    // swapping as the pipeline restarts.
    exec(
        &client,
        &format!("INSERT INTO {a} SELECT g, repeat(md5(g::text), 4), g FROM generate_series(301, 200000) g"),
    )
    .await;
    exec(&client, &create_table(&b)).await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&a, &b], &Settings::default());
    let dir = p.dir.as_ref().unwrap().path().to_owned();
    let server = Rustberg::start(&dir, &p.warehouse);
    let proxy = Proxy::start(&env, &server, &dir, &[]);
    p.write_config(&Settings {
        sink_extra: format!(
            "maintenance_interval_ms = 0\n{}",
            catalog_section(&proxy.uri, "token = \"ignored-by-the-proxy\"")
        ),
        ..Settings::default()
    });
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    assert_equal_through_catalog(&mut p, &server.uri, &a, 60).await;
    assert_equal_through_catalog(&mut p, &server.uri, &b, 60).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert!(st.success(), "{st}");
    crate::postgres::resync::damage(&client, &p, &a).await;
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    let t = format!("{NAMESPACE}.{a}");
    let catalog = [
        "--rest-catalog",
        &server.uri,
        "--catalog-token",
        KEY,
        "--catalog-table",
        &t,
        "--reader",
        "duckdb",
    ];
    let (code, out) = p.lakecheck(&a, 2, &catalog).await;
    assert_ne!(
        code,
        Some(0),
        "the damage did not reach the replica; the test proves nothing:\n{out}"
    );

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let client = connect(&env.pg_url).await;
        let (a, b, stop) = (a.clone(), b.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0i64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                let (id, ka, kb) = (1_000_000 + n, n * 7919 % 300 + 1, n * 104_729 % 300 + 1);
                client
                    .batch_execute(&format!(
                        "BEGIN; INSERT INTO {a} VALUES ({id}, 'tx {n}', {n}); INSERT INTO {b} VALUES ({id}, 'tx {n}', {n});
                         UPDATE {a} SET v = 'u{n}', n = n + 1 WHERE id = {ka}; UPDATE {b} SET v = 'u{n}', n = n + 1 WHERE id = {kb};
                         DELETE FROM {b} WHERE id = {id} - 3; COMMIT;"
                    ))
                    .await
                    .unwrap_or_else(|e| panic!("writer: {e:?}"));
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            n
        })
    };
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let (ok, out) = run_cdcd(&["resync", "--table", &format!("public.{a}")], &p.config);
    assert!(ok && out.contains("requested"), "{out}");
    crate::support::wait_for(&mut p, "the online resync", Duration::from_secs(240), |o| {
        crate::support::start_output(o, 2).contains("resync finished")
    })
    .await;
    let together = |log: &str| {
        log.lines()
            .filter(|l| l.starts_with('2') && l.ends_with(" POST /v1/transactions/commit"))
            .count()
    };
    let at_swap = together(&proxy.log());
    // Both tables are committed together again after the swap.
    let deadline = Instant::now() + Duration::from_secs(60);
    while together(&proxy.log()) < at_swap + 3 {
        assert!(
            Instant::now() < deadline,
            "no transaction over both tables after the swap:\n{}",
            proxy.log()
        );
        p.assert_running();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let txs = writer.await.expect("writer failed");
    eprintln!("writer: {txs} transactions over both tables");
    assert_equal_through_catalog(&mut p, &server.uri, &a, 120).await;
    assert_equal_through_catalog(&mut p, &server.uri, &b, 120).await;
    p.assert_running();

    let out = crate::support::start_output(&p.output(), 2);
    assert!(
        out.contains("while the pipeline streams on")
            && out.contains("a resync's copy is complete")
            && out
                .matches("the new lineage replaced the live table")
                .count()
                == 1,
        "the table was not copied online and swapped once:\n{out}"
    );
    // The swap came with a commit of the catch-up (a flush of both tables), not as the pipeline
    // restarted.
    let requested = out
        .find("a resync was requested")
        .expect("no request in the log");
    let copied = out.find("a resync's copy is complete").unwrap_or(0);
    let restarted = copied + out[copied..].find("starting pipeline").unwrap_or(0);
    let swapped = out
        .find("the new lineage replaced the live table")
        .unwrap_or(0);
    assert!(
        copied > requested && restarted > copied && swapped > restarted,
        "the lineage did not catch up through the restarted pipeline's commits:\n{out}"
    );
    // The other table streamed on through the copy job and through the catch-up (its commit of
    // the swapping flush is logged before the resync's end).
    let finished = out.find("resync finished").expect("no finish in the log");
    let commits_of_b = |part: &str| {
        part.lines()
            .filter(|l| l.contains(" committed ") && l.contains(&format!("table=public.{b} ")))
            .count()
    };
    let (copying, catching_up) = (
        commits_of_b(&out[requested..copied]),
        commits_of_b(&out[copied..finished]),
    );
    assert!(
        copying >= 1 && catching_up >= 1,
        "{b} took {copying} commits during the copy and {catching_up} during the catch-up:\n{out}"
    );
    // (A 409 on creating the namespace only says it exists.)
    let log = proxy.log();
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with("409") && !l.ends_with(" POST /v1/namespaces"))
        .collect();
    assert!(
        refused.is_empty() && !out.contains("planning the transaction again"),
        "a commit was refused during the resync: {refused:?}\n{out}"
    );
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert!(st.success(), "{st}");
}

/// Another engine drops the table and creates it again under the same name while cdcd streams:
/// the catalog refuses cdcd's next commit (its base is the old table: `assert-table-uuid`), and
/// cdcd stops naming both tables rather than blaming another writer's version or a second cdcd
/// (the message the lineage's transaction showed before issue 34).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_created_again_by_another_engine_stops_naming_both_uuids() {
    let env = ground_or_skip!(test_env(&current_test()));
    let Bed {
        mut p,
        server,
        dir: _,
        client,
        t,
    } = Bed::orders(&env, "catrestuuid").await;
    p.write_config(&Settings {
        sink_extra: format!(
            "maintenance_interval_ms = 0\n{}",
            catalog_section(&server.uri, &format!("token = {KEY:?}"))
        ),
        ..Settings::default()
    });
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    exec(&client, &changes(&t, 1)).await;
    assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    let uuids = p.python(
        &format!(
            "from pyiceberg.catalog import load_catalog\n\
             c = load_catalog('rest', type='rest', uri={uri:?}, token={KEY:?})\n\
             old = c.load_table(({NAMESPACE:?}, {t:?}))\n\
             c.drop_table(({NAMESPACE:?}, {t:?}))\n\
             new = c.create_table(({NAMESPACE:?}, {t:?}), old.schema(), location=old.location() + '/again')\n\
             print(old.metadata.table_uuid, new.metadata.table_uuid)\n",
            uri = server.uri,
        ),
        &[],
    );
    let (old, new) = uuids.trim().split_once(' ').expect("two uuids");
    exec(&client, &changes(&t, 2)).await;
    p.assert_stops(
        Duration::from_secs(60),
        "cdcd committed to a table created again",
    )
    .await;
    let out = crate::support::start_output(&p.output(), 1);
    assert!(
        out.contains("is not the one the commit was built on")
            && out.contains(old)
            && out.contains(new)
            && !out.contains("second cdcd"),
        "the stop does not say the table was created again:\n{out}"
    );
    eprintln!(
        "{}",
        out.lines()
            .find(|l| l.contains("is not the one"))
            .unwrap_or_default()
    );
}

/// `kill -9` at random moments while cdcd streams transactions over two tables through the REST
/// catalog (multi-table commits in flight, answers in flight): after each restart the tables
/// continue from the checkpoints the catalog holds, and both end equal to the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_kill_dash_nine_at_random_moments() {
    let test = "rest_kill_dash_nine_at_random_moments";
    let env = ground_or_skip!(test_env(test));
    let mut rng = crate::support::Rng::from_env_or_clock(test);
    let name = unique("catrestk9");
    let (a, b) = (format!("{name}_a"), format!("{name}_b"));
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&a)).await;
    exec(&client, &create_table(&b)).await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&a, &b], &Settings::default());
    let dir = p.dir.as_ref().unwrap().path().to_owned();
    let server = Rustberg::start(&dir, &p.warehouse);
    let settings = Settings {
        sink_extra: catalog_section(&server.uri, &format!("token = {KEY:?}")),
        ..Settings::default()
    };
    p.write_config(&settings);
    p.start();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let client = connect(&env.pg_url).await;
        let (a, b, stop) = (a.clone(), b.clone(), stop.clone());
        let seed = rng.next();
        tokio::spawn(async move {
            let mut rng = crate::support::Rng::from_seed(seed);
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                let id = 100_000 + n as i64;
                let k = rng.range(1, 400) as i64;
                let sql = format!(
                    "BEGIN; INSERT INTO {a} VALUES ({id}, 'tx {n}', {n}); INSERT INTO {b} VALUES ({id}, 'tx {n}', {n});
                     UPDATE {a} SET v = 'u{n}', n = n + 1 WHERE id = {k}; DELETE FROM {b} WHERE id = {k};
                     COMMIT;"
                );
                if let Err(e) = client.batch_execute(&sql).await {
                    panic!("workload: {e}");
                }
                tokio::time::sleep(Duration::from_millis(rng.range(5, 40))).await;
            }
            n
        })
    };
    for i in 0..5 {
        let up = rng.range(300, 3000);
        tokio::time::sleep(Duration::from_millis(up)).await;
        p.assert_running();
        eprintln!("kill -9 #{} after {up} ms", i + 1);
        p.kill9();
        p.wait_slot_inactive(&client, Duration::from_secs(30)).await;
        p.start();
    }
    tokio::time::sleep(Duration::from_millis(rng.range(500, 2000))).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let txs = load.await.expect("workload failed");
    eprintln!("workload: {txs} transactions");
    assert_equal_through_catalog(&mut p, &server.uri, &a, 240).await;
    assert_equal_through_catalog(&mut p, &server.uri, &b, 240).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "exit status after SIGTERM: {st}");
}

/// A pipeline that ran with the filesystem catalog switches to a REST catalog: its table
/// directory is registered as it is (`POST …/register`), the checkpoint in it holds, and
/// replication continues through the catalog without copying the table again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_from_the_filesystem_catalog_registers_the_table() {
    let env = ground_or_skip!(test_env(
        "switching_from_the_filesystem_catalog_registers_the_table"
    ));
    let Bed {
        mut p,
        server,
        dir: _,
        client,
        t,
    } = Bed::orders(&env, "catrestswitch").await;
    p.write_config(&Settings::default());
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    exec(&client, &changes(&t, 1)).await;
    p.assert_equal(&t, 60).await;
    p.sigterm_and_wait(Duration::from_secs(60)).await;

    exec(&client, &changes(&t, 2)).await;
    let settings = Settings {
        sink_extra: catalog_section(&server.uri, &format!("token = {KEY:?}")),
        ..Settings::default()
    };
    p.write_config(&settings);
    p.start();
    assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    exec(&client, &changes(&t, 3)).await;
    assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    let out = p.output();
    let second = out.split("===== cdcd start #2").nth(1).unwrap_or("");
    assert!(
        second.contains("registering the table's existing metadata in the catalog")
            && !second.contains("initial copy starting"),
        "the table was not registered, or copied again, after the switch:\n{second}"
    );
    p.sigterm_and_wait(Duration::from_secs(60)).await;
}

/// `(metadata location, current snapshot id)` of each of `tables` through the REST catalog.
fn through_catalog(env: &TestEnv, uri: &str, tables: &[&str]) -> Vec<(String, String)> {
    let code = "import sys\n\
                from pyiceberg.catalog import load_catalog\n\
                c = load_catalog('rest', type='rest', uri=sys.argv[1], token=sys.argv[2])\n\
                for name in sys.argv[4:]:\n\
                \x20   t = c.load_table((sys.argv[3], name))\n\
                \x20   s = t.current_snapshot()\n\
                \x20   print(t.metadata_location, s.snapshot_id if s else 0)\n";
    let out = crate::support::output_ok(
        Command::new(&env.python)
            .args(["-c", code, uri, KEY, NAMESPACE])
            .args(tables),
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(m, s)| (m.to_owned(), s.to_owned()))
        .collect()
}

/// Issue 38: through a catalog that offers multi-table commits, a table with `changelog = true`
/// and its changelog commit in one catalog transaction (both or neither visible), and the
/// changelog, found through the catalog, replays onto the copy to the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_and_its_changelog_commit_in_one_transaction() {
    let (env, name) = ground_or_skip!(test_env_and_name("catrestchl"));
    let t = format!("{name}_t");
    let client = fresh_table(&env, &t, |t| {
        format!(
            "CREATE TABLE {t} (id int PRIMARY KEY, v int, t text);
             ALTER TABLE {t} ALTER COLUMN t SET STORAGE EXTERNAL;
             INSERT INTO {t} SELECT g, g, repeat(md5(g::text), 400) FROM generate_series(1, 20) g;"
        )
    })
    .await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &Settings::default());
    let dir = p.dir.as_ref().unwrap().path().to_owned();
    let server = Rustberg::start(&dir, &p.warehouse);
    let proxy = Proxy::start(&env, &server, &dir, &[]);
    let settings = Settings {
        sink_extra: format!(
            "maintenance_interval_ms = 0\n{}\n[sink.tables.\"public.{t}\"]\nchangelog = true\n",
            catalog_section(&proxy.uri, "token = \"ignored-by-the-proxy\"")
        ),
        ..Settings::default()
    };
    p.write_config(&settings);
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    let copy = through_catalog(&env, &server.uri, &[&t]).remove(0).1;
    for sql in crate::postgres::changelog::workload(&t) {
        exec(&client, &sql).await;
    }
    assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    let changelog = format!("{t}_changelog");
    let found = through_catalog(&env, &server.uri, &[&t, &changelog]);
    let out = crate::postgres::changelog::replayed(
        &env.python,
        &env.pg_url,
        &format!("public.{t}"),
        Path::new(&found[0].0),
        Path::new(&found[1].0),
        &copy,
    );
    assert_eq!(out, crate::postgres::changelog::ROWS);
    let log = proxy.log();
    assert!(
        log.contains("POST /v1/transactions/commit"),
        "the table and its changelog were not committed together:\n{log}"
    );
    p.sigterm_and_wait(Duration::from_secs(60)).await;
}

/// Polls a REST catalog for `secs` seconds, loading table, changelog, table again each round
/// (`GET …/tables/<name>`), and prints a line per round where the two were apart, then
/// `polls <n> apart <m>`. Apart: the changelog holds a commit the table read after it lacks (its
/// `cdcd.position` is past the table's), or the table read before it has a commit that changed
/// rows past the changelog's position.
const WATCHER: &str = r#"
import json, sys, time, urllib.error, urllib.request
uri, key, ns, table, changelog, secs = sys.argv[1:7]
def load(name):
    req = urllib.request.Request(f"{uri}/v1/namespaces/{ns}/tables/{name}",
                                 headers={"Authorization": "Bearer " + key})
    try:
        with urllib.request.urlopen(req) as r:
            return json.load(r)["metadata"]
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise
def lsn(p):
    hi, lo = p.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)
def chain(m):
    by = {s["snapshot-id"]: s for s in m.get("snapshots", [])}
    s = by.get(m.get("current-snapshot-id"))
    while s:
        yield s
        s = by.get(s.get("parent-snapshot-id"))
def pos(m):
    return next((lsn(s["summary"]["cdcd.position"]) for s in chain(m) if "cdcd.position" in s.get("summary", {})), 0)
def changed_above(m, floor):
    for s in chain(m):
        sm = s.get("summary", {})
        if "cdcd.position" not in sm:
            continue
        if lsn(sm["cdcd.position"]) <= floor:
            return None
        if any(int(sm.get(k, 0)) for k in ("added-records", "added-delete-files", "deleted-records")):
            return sm["cdcd.position"]
    return None
polls = apart = 0
end = time.time() + float(secs)
while time.time() < end:
    t1, c, t2 = load(table), load(changelog), load(table)
    if not (t1 and c and t2):
        time.sleep(0.05)
        continue
    polls += 1
    pc = pos(c)
    if pc > pos(t2):
        apart += 1
        print("changelog ahead: at", pc, "table read after it at", pos(t2))
    elif (p := changed_above(t1, pc)):
        apart += 1
        print("changelog behind: table changed at", p, "changelog at", pc)
print("polls", polls, "apart", apart)
"#;

/// Issue 38: a reader polling the REST catalog never sees a table and its changelog apart
/// ([`WATCHER`]) while a writer streams changes through cdcd. Each commit also pauses between
/// the changelog's commit and its table's where they are two commits (`CDCD_PAUSEPOINT`), so a
/// catalog without multi-table commits would be caught apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_never_sees_a_table_and_its_changelog_apart() {
    let (env, name) = ground_or_skip!(test_env_and_name("catrestchw"));
    let t = format!("{name}_t");
    let client = fresh_table(&env, &t, |t| {
        format!(
            "CREATE TABLE {t} (id int PRIMARY KEY, v int);
             INSERT INTO {t} SELECT g, g FROM generate_series(1, 20) g;"
        )
    })
    .await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &Settings::default());
    let dir = p.dir.as_ref().unwrap().path().to_owned();
    let server = Rustberg::start(&dir, &p.warehouse);
    let settings = Settings {
        sink_extra: format!(
            "maintenance_interval_ms = 0\n{}\n[sink.tables.\"public.{t}\"]\nchangelog = true\n",
            catalog_section(&server.uri, &format!("token = {KEY:?}"))
        ),
        ..Settings::default()
    };
    p.write_config(&settings);
    p.env_vars = vec![(
        "CDCD_PAUSEPOINT".into(),
        "changelog-before-table:300".into(),
    )];
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    exec(&client, &format!("UPDATE {t} SET v = v + 1 WHERE id = 1")).await;
    assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    let changelog = format!("{t}_changelog");
    let watcher = Command::new(&env.python)
        .args([
            "-c",
            WATCHER,
            &server.uri,
            KEY,
            NAMESPACE,
            &t,
            &changelog,
            "10",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(9);
    let mut k = 100;
    while Instant::now() < deadline {
        exec(
            &client,
            &format!(
                "INSERT INTO {t} VALUES ({k}, {k}); UPDATE {t} SET v = v + 1 WHERE id = {};
                 DELETE FROM {t} WHERE id = {};",
                k % 20 + 1,
                k - 1
            ),
        )
        .await;
        k += 1;
        tokio::time::sleep(Duration::from_millis(70)).await;
    }
    let out = watcher.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "watcher failed:\n{text}");
    let last = text.lines().last().unwrap_or_default();
    let polls: u32 = last
        .split(' ')
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(polls >= 10, "too few polls to prove anything: {text}");
    assert!(last.ends_with("apart 0"), "seen apart:\n{text}");
    assert_equal_through_catalog(&mut p, &server.uri, &t, 60).await;
    p.sigterm_and_wait(Duration::from_secs(60)).await;
    eprintln!("watcher: {last}");
}
