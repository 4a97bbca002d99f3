//! End to end, systemd notification (issue 8): run as systemd would (`NOTIFY_SOCKET`,
//! `WATCHDOG_USEC`), cdcd sends `READY=1` once replicating, `WATCHDOG=1` at half the period, and
//! `STOPPING=1` on SIGTERM, to a datagram socket the test binds.

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{cdcd_bin, connect, exec, sigterm, test_env_and_name, Pipeline, Settings};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifies_ready_watchdog_and_stopping() {
    let (env, name) = ground_or_skip!(test_env_and_name("opsn"));
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(
        &client,
        &format!("DROP TABLE IF EXISTS {t}; CREATE TABLE {t} (id int8 PRIMARY KEY);"),
    )
    .await;
    let p = Pipeline::owning_tables(&env, &name, &[&t], &Settings::default());
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();

    let log = std::fs::File::create(&p.stderr_log).unwrap();
    let mut child = Command::new(cdcd_bin())
        .arg("--config")
        .arg(&p.config)
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "1000000")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();

    let mut seen: Vec<String> = Vec::new();
    let mut buf = [0u8; 256];
    let mut receive = |seen: &mut Vec<String>| {
        if let Ok(n) = socket.recv(&mut buf) {
            seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    };
    // READY, then at least three watchdog pets (every 0.5 s).
    let deadline = Instant::now() + Duration::from_secs(120);
    while !(seen.iter().any(|m| m == "READY=1")
        && seen.iter().filter(|m| *m == "WATCHDOG=1").count() >= 3)
    {
        if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            panic!(
                "no READY=1 and 3 WATCHDOG=1 in time: {seen:?}\n{}",
                p.output()
            );
        }
        receive(&mut seen);
    }
    sigterm(child.id());
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        receive(&mut seen);
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("cdcd did not exit after SIGTERM\n{}", p.output());
        }
    };
    receive(&mut seen);
    assert_eq!(status.code(), Some(0), "{}", p.output());
    assert!(
        seen.iter().any(|m| m == "STOPPING=1"),
        "no STOPPING=1: {seen:?}"
    );
    let ready = seen.iter().position(|m| m == "READY=1").unwrap();
    let stopping = seen.iter().position(|m| m == "STOPPING=1").unwrap();
    assert!(ready < stopping, "{seen:?}");
}

/// A second cdcd on the same pipeline waits for the lease as a standby. systemd must see it as
/// started (`READY=1` with a standby status), or `Type=notify` would fail it at
/// `TimeoutStartSec`; when the active one stops, it takes over and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_is_ready_for_systemd_and_reports_the_takeover() {
    let (env, name) = ground_or_skip!(test_env_and_name("opss"));
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(
        &client,
        &format!("DROP TABLE IF EXISTS {t}; CREATE TABLE {t} (id int8 PRIMARY KEY);"),
    )
    .await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &Settings::default());
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;

    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let standby_log = dir.path().join("standby.log");
    let mut standby = Command::new(cdcd_bin())
        .arg("--config")
        .arg(&p.config)
        .env("NOTIFY_SOCKET", &socket_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&standby_log).unwrap()))
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(&standby_log).unwrap_or_default();

    let mut seen: Vec<String> = Vec::new();
    let mut buf = [0u8; 256];
    let mut wait_for = |seen: &mut Vec<String>, standby: &mut std::process::Child, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !seen.iter().any(|m| m.contains(what)) {
            if Instant::now() > deadline || standby.try_wait().unwrap().is_some() {
                let _ = standby.kill();
                panic!("no {what:?} from the standby: {seen:?}\n{}", log());
            }
            if let Ok(n) = socket.recv(&mut buf) {
                seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
    };
    wait_for(&mut seen, &mut standby, "STATUS=standby");
    assert!(
        seen[0].starts_with("READY=1\n"),
        "READY=1 comes with the standby status: {seen:?}"
    );
    // The active one stops and releases the lease; the standby takes over.
    let status = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(0), "{}", p.output());
    wait_for(&mut seen, &mut standby, "STATUS=running");
    sigterm(standby.id());
    let deadline = Instant::now() + Duration::from_secs(60);
    while standby.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = standby.kill();
            panic!("the standby did not exit after SIGTERM\n{}", log());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
