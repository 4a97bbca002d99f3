//! End to end, systemd notification (issue 8): run as systemd would (`NOTIFY_SOCKET`,
//! `WATCHDOG_USEC`), cdcd sends `READY=1` once replicating, `WATCHDOG=1` at half the period, and
//! `STOPPING=1` on SIGTERM, to a datagram socket the test binds.

mod common;

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{cdcd_bin, connect, exec, sigterm, test_env, unique, Pipeline, Settings};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifies_ready_watchdog_and_stopping() {
    let Some(env) = test_env("notifies_ready_watchdog_and_stopping") else {
        return;
    };
    let name = unique("opsn");
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(
        &client,
        &format!("DROP TABLE IF EXISTS {t}; CREATE TABLE {t} (id int8 PRIMARY KEY);"),
    )
    .await;
    let mut p = Pipeline::new(&env, &name, &[&t], &Settings::default());
    p.on_cleanup(format!("DROP TABLE IF EXISTS {t}"));
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
