//! End to end, the process contract (DESIGN "User contract"): SIGTERM commits what is buffered and exits 0;
//! a restart with nothing new writes no snapshot and never moves the slot backwards; `cdcd check` finds a
//! pattern matching no table and shows a table without a primary key as keyless; a password never
//! reaches the logs.

use std::process::Command;
use std::time::Duration;

use crate::support::{
    cdcd_bin, connect, exec, parse_lsn, status_row, test_env_and_name, Pipeline, Settings,
};
use tokio_postgres::Client;

/// Waits until the walsender of `slot` has sent everything written so far (cdcd then has the changes in
/// hand, though it need not have committed them), plus a grace period to decode them.
async fn wait_sent(client: &Client, slot: &str) {
    let target: String = client
        .query_one("SELECT pg_current_wal_flush_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    let target = parse_lsn(&target);
    for _ in 0..300 {
        let row = client
            .query_opt(
                "SELECT r.sent_lsn::text FROM pg_stat_replication r
                 JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1",
                &[&slot],
            )
            .await
            .unwrap();
        if let Some(sent) = row.and_then(|r| r.get::<_, Option<String>>(0)) {
            if parse_lsn(&sent) >= target {
                tokio::time::sleep(Duration::from_secs(2)).await;
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("walsender of {slot} did not send up to the current WAL position in 30 s");
}

fn create_table(t: &str) -> String {
    format!(
        "DROP TABLE IF EXISTS {t};
         CREATE TABLE {t} (id int8 PRIMARY KEY, v text, n numeric(8,2));
         INSERT INTO {t} SELECT g, 'v' || g, g / 2.0 FROM generate_series(1, 1000) g;"
    )
}

fn some_changes(t: &str) -> String {
    format!(
        "INSERT INTO {t} SELECT g, 'new' || g, NULL FROM generate_series(1001, 1500) g;
         UPDATE {t} SET v = 'upd' WHERE id % 10 = 0;
         DELETE FROM {t} WHERE id % 13 = 0;
         UPDATE {t} SET id = 5000 WHERE id = 1;"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_commits_and_exits_zero() {
    let (env, name) = ground_or_skip!(test_env_and_name("term"));
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t)).await;
    // Nothing is committed by time or size: only the shutdown can have written what the lake holds.
    let settings = Settings {
        commit_interval_ms: 3_600_000,
        commit_max_rows: 10_000_000,
        ..Settings::default()
    };
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &settings);
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    exec(&client, &some_changes(&t)).await;
    wait_sent(&client, &p.slot).await;

    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "exit status after SIGTERM: {st}");
    // cdcd is gone: no waiting, the lake must already be equal.
    p.assert_equal(&t, 0).await;

    let status = Command::new(cdcd_bin())
        .args(["status", "--config"])
        .arg(&p.config)
        .arg("--json")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success() && out.contains(&t),
        "cdcd status --json: {}\n{out}{}",
        status.status,
        String::from_utf8_lossy(&status.stderr)
    );
    // Issue 34: BYTES read 0 for every Iceberg table. The live files' bytes are at most what
    // the data directory holds (a deletion vector counts its blob, not its whole Puffin file).
    let row = status_row(&out, &t);
    let live_bytes = row["live_bytes"].as_u64().unwrap_or(0);
    let on_disk: u64 = std::fs::read_dir(p.table_dir(&t).join("data"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(
        live_bytes > 0 && live_bytes <= on_disk,
        "live_bytes {live_bytes}, {on_disk} bytes under data/:\n{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_with_nothing_new_writes_no_snapshot() {
    let (env, name) = ground_or_skip!(test_env_and_name("idle"));
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t)).await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &Settings::default());
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    exec(&client, &some_changes(&t)).await;
    p.assert_equal(&t, 120).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "exit status after SIGTERM: {st}");

    let versions = p.metadata_versions(&t);
    let flushed = p.confirmed_flush_lsn(&client).await;
    assert!(versions > 0, "no v<N>.metadata.json after a commit");
    assert!(flushed.is_some(), "slot {} is gone", p.slot);

    // Other WAL (other tests, other tables, checkpoints) keeps flowing; none of it is ours.
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    tokio::time::sleep(Duration::from_secs(5)).await; // 25 commit intervals
    p.assert_running();
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "exit status after SIGTERM: {st}");

    assert_eq!(
        p.metadata_versions(&t),
        versions,
        "a restart with no new changes wrote a snapshot"
    );
    let after = p.confirmed_flush_lsn(&client).await;
    assert!(
        after >= flushed,
        "confirmed_flush_lsn moved backwards: {flushed:?} -> {after:?}"
    );
    p.assert_equal(&t, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_problems() {
    let (env, name) = ground_or_skip!(test_env_and_name("chk"));
    let (good, nopk) = (format!("{name}_pk"), format!("{name}_nopk"));
    let secret = format!("sekrit-{}", std::process::id());
    let url_secret = format!("urlsekrit-{}", std::process::id());
    let client = connect(&env.pg_url).await;
    exec(
        &client,
        &format!(
            "DROP TABLE IF EXISTS {good}, {nopk};
             CREATE TABLE {good} (id int4 PRIMARY KEY, v text);
             CREATE TABLE {nopk} (id int4, v text);
             INSERT INTO {good} VALUES (1, 'a');"
        ),
    )
    .await;

    // Good: a primary key; a password in its own key (trust auth on the test bed ignores it).
    let settings = Settings {
        password: Some(secret.clone()),
        ..Settings::default()
    };
    let mut p = Pipeline::new(&env, &name, &[&good], &settings);
    p.on_cleanup(format!("DROP TABLE IF EXISTS {good}, {nopk}"));
    let (ok, out) = check(&p);
    assert!(ok, "cdcd check on a good config failed:\n{out}");
    assert!(
        !out.contains(&secret),
        "cdcd check printed the password:\n{out}"
    );

    // The daemon with that config: runs, replicates, and never logs the password.
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    exec(&client, &format!("INSERT INTO {good} VALUES (2, 'b')")).await;
    p.assert_equal(&good, 60).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "exit status after SIGTERM: {st}");
    assert!(
        !p.output().contains(&secret),
        "cdcd's stderr contains the password"
    );

    // Bad: a pattern matching no table, and a password inside the URL. A table without a
    // primary key is fine since issue 23 stage 2 (an insert-only append table): shown, not refused.
    let mut url = url::Url::parse(&env.pg_url).unwrap();
    url.set_password(Some(&url_secret)).unwrap();
    p.tables.push(format!("public.{nopk}"));
    p.tables.push(format!("public.{nopk}_missing"));
    p.write_config(&Settings {
        url: Some(url.to_string()),
        ..Settings::default()
    });
    let (ok, out) = check(&p);
    assert!(!ok, "cdcd check passed a pattern matching no table:\n{out}");
    assert!(
        out.lines().any(|l| l.contains(&format!("{nopk}_missing"))),
        "no line of cdcd check names {nopk}_missing:\n{out}"
    );
    assert!(
        out.contains(&format!("table public.{nopk}: no key")),
        "cdcd check does not show {nopk} as keyless:\n{out}"
    );
    assert!(
        !out.contains(&url_secret),
        "cdcd check printed the URL's password:\n{out}"
    );
}

/// `cdcd check --config <file>`: (exit 0, stdout + stderr).
fn check(p: &Pipeline) -> (bool, String) {
    crate::support::run_cdcd(&["check"], &p.config)
}
