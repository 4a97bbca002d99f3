//! Fencing end to end (serial moto): a second cdcd on the same pipeline and warehouse waits as a
//! standby while the first runs, takes over when the first stops (SIGTERM releases the lease) and
//! again when its successor is killed with SIGKILL (same machine: the dead holder is detected), and
//! the table stays equal to the source with no duplicate keys.

use std::fs::OpenOptions;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::s3::{moto_test_env, wait_until, S3Pipeline};
use crate::support::{exec, fresh_table};

fn spawn(config: &std::path::Path, log: &std::path::Path) -> Child {
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Command::new(crate::support::cdcd_bin())
        .arg("--config")
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_standby_takes_over() {
    let (env, endpoint, n) = ground_or_skip!(moto_test_env(true, "s3standby"));
    let client = fresh_table(&env, &n, |n| {
        format!(
            "CREATE TABLE {n} (id int8 PRIMARY KEY, v int4);
             INSERT INTO {n} SELECT g, g FROM generate_series(1, 1000) g;"
        )
    })
    .await;
    let mut s = S3Pipeline::new(&env, &n, &[&n], &endpoint);
    s.extra_pipeline = "lease_ttl_ms = 3000\n".into();
    s.write_config(&crate::support::Settings::default(), &endpoint);
    s.p.start();
    s.p.wait_slot_active(&client, Duration::from_secs(60)).await;

    let standby_log = s.p.config.with_file_name("standby.log");
    let mut standby = spawn(&s.p.config, &standby_log);
    let log = || std::fs::read_to_string(&standby_log).unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(30), || log().contains("standby")).await,
        "the second cdcd did not wait as a standby:\n{}",
        log()
    );
    exec(
        &client,
        &format!("UPDATE {n} SET v = v + 1 WHERE id % 2 = 0"),
    )
    .await;
    s.assert_equal(&n, 60, "duckdb").await;
    assert!(
        standby.try_wait().unwrap().is_none(),
        "standby exited:\n{}",
        log()
    );
    assert!(!log().contains("lease acquired"), "{}", log());

    // The active one stops cleanly: the standby takes over and replicates what follows.
    let st = s.p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert!(st.success(), "{st}");
    assert!(
        wait_until(Duration::from_secs(30), || log().contains("lease acquired")).await,
        "{}",
        log()
    );
    exec(
        &client,
        &format!("INSERT INTO {n} SELECT g, g FROM generate_series(1001, 1500) g; DELETE FROM {n} WHERE id % 9 = 0"),
    )
    .await;
    s.assert_equal(&n, 90, "duckdb").await;

    // The new active one dies hard; a fresh daemon takes over without waiting the ttl.
    let _ = standby.kill();
    let _ = standby.wait();
    s.p.start();
    exec(&client, &format!("UPDATE {n} SET v = 0 WHERE id % 5 = 0")).await;
    s.assert_equal(&n, 90, "duckdb").await;
    let st = s.p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert!(st.success(), "{st}\n{}", log());
}
