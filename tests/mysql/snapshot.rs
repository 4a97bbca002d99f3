//! End to end, the MariaDB initial copy (issue 7): a table copied in primary-key chunks while it
//! is written to, and a kill -9 in the middle of the copy that resumes from the committed chunks
//! (not from zero) at a new consistent snapshot, the stream replayed from the original position
//! as upserts up to it (`src/sources/mysql/copy.rs` argues why that converges).
//!
//! The writes hit every kind of change the argument covers: inserts, updates in MINIMAL images
//! (the unchanged columns arrive absent), deletes (also of rows a MINIMAL update touched just
//! before, the "gap" case inside the upsert window), and primary-key changes that move a row to
//! another chunk (in FULL images: a MINIMAL key change of a row that is in no chunk is the
//! documented limit). The replica is read back with lakecheck (DuckDB against pymysql).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::mysql::wait_for;
use crate::support::mysql::{my_connect, my_env_and_name, my_exec, MyPipeline};
use crate::support::tune_copy;

/// `rows` rows; `b` is a BLOB (NOBLOB/MINIMAL images leave it out when unchanged).
fn create_table(t: &str, rows: u64) -> String {
    format!(
        "CREATE TABLE {t} (id BIGINT PRIMARY KEY, v INT, s VARCHAR(40), n DECIMAL(12,2), b BLOB);
         INSERT INTO {t} SELECT seq, seq % 1000, CONCAT('row ', seq), seq / 7, REPEAT('b', seq % 50)
           FROM seq_1_to_{rows}"
    )
}

/// One round of assorted changes spread over the key space. Key changes go through the FULL
/// session; the rest through the MINIMAL one.
fn writes(t: &str, round: u64, rows: u64) -> (String, String) {
    let at = |k: u64| (round * 7919 + k * 104_729) % rows + 1;
    let mut minimal = String::from("BEGIN;\n");
    minimal += &format!(
        "INSERT INTO {t} SELECT {base} + seq, seq, 'new', 1.5, 'nb' FROM seq_1_to_20;\n",
        base = 10_000_000 + round * 100
    );
    for k in 0..8 {
        let id = at(k);
        match k % 4 {
            0 => minimal += &format!("UPDATE {t} SET v = v + 1 WHERE id = {id};\n"),
            // A partial update, then the row is gone: inside an upsert window the update finds
            // no row to complete (the copy at the new snapshot does not hold it).
            1 => {
                minimal += &format!("UPDATE {t} SET n = n + 1 WHERE id = {id};\n");
                minimal += &format!("DELETE FROM {t} WHERE id = {id};\n");
            }
            2 => minimal += &format!("UPDATE {t} SET s = 'upd', b = 'nb2' WHERE id = {id};\n"),
            _ => minimal += &format!("DELETE FROM {t} WHERE id = {id};\n"),
        }
    }
    minimal += "COMMIT;";
    // A key change to the far end of the key space (the last chunk), in a FULL image.
    let id = at(9);
    let full = format!("UPDATE {t} SET id = id + 20000000 WHERE id = {id} AND id < 20000000",);
    (minimal, full)
}

/// Writes rounds numbered from `first` until `stop`; returns the last round.
async fn write_until(url: String, t: String, rows: u64, first: u64, stop: Arc<AtomicBool>) -> u64 {
    let mut minimal = my_connect(&url).await;
    my_exec(&mut minimal, "SET SESSION binlog_row_image = 'MINIMAL'").await;
    let mut full = my_connect(&url).await;
    my_exec(&mut full, "SET SESSION binlog_row_image = 'FULL'").await;
    let mut round = first - 1;
    while !stop.load(Ordering::Relaxed) {
        round += 1;
        let (m, f) = writes(&t, round, rows);
        my_exec(&mut minimal, &m).await;
        my_exec(&mut full, &f).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    round
}

/// A pipeline on a fresh database `name`, with a replica id of its own: the common helper derives
/// it from the pid and the name's length, the same for the tests of this binary.
async fn pipeline(env: &crate::support::mysql::MyEnv, name: &str) -> MyPipeline {
    let mut p = MyPipeline::new(env, name, "initial", "").await;
    let hash = name
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    p.server_id = 100_000 + hash % 1_000_000;
    p.write_config("initial", "");
    p
}

/// Copy tuning: chunks of `chunk_rows`, a commit per chunk (a kill lands between commits of one
/// table's copy).
fn tune(p: &MyPipeline, chunk_rows: u64) {
    tune_copy(&p.config, chunk_rows, None, Some(chunk_rows));
}

/// The output of the `n`-th start (1-based).
fn start_output(p: &MyPipeline, n: u32) -> String {
    crate::support::start_output(&p.output(), n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_during_a_chunked_copy_converge() {
    let (env, name) = ground_or_skip!(my_env_and_name("mysnapw"));
    let rows = 60_000;
    let mut p = pipeline(&env, &name).await;
    let url = env.url_for(&p.db);
    let mut c = my_connect(&url).await;
    my_exec(&mut c, &create_table("t", rows)).await;
    tune(&p, 5_000);

    p.start();
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(write_until(url, "t".into(), rows, 1, stop.clone()));
    wait_for(
        &mut p,
        "the copy to finish",
        Duration::from_secs(240),
        |o| o.contains("initial copy finished"),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let rounds = load.await.unwrap();
    eprintln!("{rounds} write rounds during and after the copy");
    let out = start_output(&p, 1);
    let planned = out
        .lines()
        .find(|l| l.contains("planned initial copy"))
        .expect("a plan line");
    assert!(
        crate::support::log_field(planned, "chunks").unwrap() >= 5,
        "{planned}"
    );
    p.assert_equal("t", 240).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_mid_copy_resumes_from_the_committed_chunks() {
    let (env, name) = ground_or_skip!(my_env_and_name("mysnapk"));
    let rows = 200_000;
    let mut p = pipeline(&env, &name).await;
    let url = env.url_for(&p.db);
    let mut c = my_connect(&url).await;
    // A second table copied after `t` (tables go in name order): at the kill it has no
    // checkpoint, so the restart streams from the position `t`'s plan recorded (chunk 0's
    // `from`) and copies `z_small` whole at the new snapshot, inside the same upsert window.
    my_exec(&mut c, &create_table("z_small", 3_000)).await;
    my_exec(&mut c, &create_table("t", rows)).await;
    tune(&p, 10_000);

    p.start();
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(write_until(url.clone(), "t".into(), rows, 1, stop.clone()));
    let small = tokio::spawn(write_until(
        url.clone(),
        "z_small".into(),
        3_000,
        1,
        stop.clone(),
    ));
    // Two commits of `t`'s copied rows are in (each holds whole chunks): some chunks are done.
    wait_for(
        &mut p,
        "two copy commits of t",
        Duration::from_secs(240),
        |o| {
            o.lines()
                .filter(|l| l.contains("committed") && l.contains("table=") && l.contains(".t "))
                .count()
                >= 2
        },
    )
    .await;
    assert!(
        !p.output().contains("initial copy finished"),
        "the copy ended before the kill; make the table bigger"
    );
    eprintln!("kill -9 in the middle of the copy");
    p.kill9();
    // Changes while cdcd is down land in done and in pending chunks alike.
    tokio::time::sleep(Duration::from_millis(500)).await;
    p.start();
    wait_for(&mut p, "the resumed copy", Duration::from_secs(240), |o| {
        o.matches("initial copy finished").count() >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let rounds = load.await.unwrap();
    small.await.unwrap();
    eprintln!("{rounds} write rounds");

    let out = start_output(&p, 2);
    let planned = out
        .lines()
        .find(|l| l.contains("planned initial copy") && l.contains(".t "))
        .unwrap_or_else(|| panic!("no plan line for t in the second start:\n{out}"));
    let (chunks, to_copy) = (
        crate::support::log_field(planned, "chunks").unwrap(),
        crate::support::log_field(planned, "to_copy").unwrap(),
    );
    eprintln!("resumed: {to_copy} of {chunks} chunks copied again");
    assert!(to_copy < chunks, "restarted from zero: {planned}");
    assert!(
        out.contains("resuming an interrupted initial copy"),
        "second start did not resume:\n{out}"
    );
    // Streaming restarts at the first snapshot (from `t`'s plan), older than the new one.
    let begun = out
        .lines()
        .find(|l| l.contains("initial copy from a consistent snapshot"))
        .expect("a snapshot line");
    let value = |key: &str| {
        let at = begun.find(&format!(" {key}=")).unwrap() + key.len() + 2;
        begun[at..].split(' ').next().unwrap().to_owned()
    };
    assert_ne!(value("snapshot"), value("from"), "{begun}");
    assert_eq!(
        value("from"),
        start_output(&p, 1)
            .lines()
            .find(|l| l.contains("initial copy from a consistent snapshot"))
            .map(|l| {
                let at = l.find(" snapshot=").unwrap() + 10;
                l[at..].split(' ').next().unwrap().to_owned()
            })
            .unwrap(),
        "the restart does not stream from the first copy's position"
    );
    // The rows the second start copied: only the chunks not done.
    let copied = out
        .lines()
        .find(|l| l.contains("table copied") && l.contains(".t "))
        .and_then(|l| crate::support::log_field(l, "rows"))
        .expect("a 'table copied' line for t");
    assert!(
        copied < rows,
        "the resumed copy read {copied} rows of {rows}"
    );
    // A table whose copy finished before the kill is not copied again.
    let small_done = start_output(&p, 1)
        .lines()
        .any(|l| l.contains("table copied") && l.contains("z_small"));
    if small_done {
        assert!(
            !out.lines()
                .any(|l| l.contains("planned initial copy") && l.contains("z_small")),
            "z_small was copied again:\n{out}"
        );
    }
    p.assert_equal("t", 240).await;
    p.assert_equal("z_small", 240).await;
}

/// The upsert-window gap, deterministically: table `b` joins a running pipeline after a MINIMAL
/// update and a delete of the same row, both made after the other table's position. `b` is
/// copied at a new snapshot (without that row), the stream replays from the older position, and
/// the update finds no row inside the window: the sink drops it (it used to stop with "no
/// current row"). Run for Iceberg with deletion vectors and with equality deletes, and for LSM.
async fn added_table_window_gap(sink: &str) {
    let (env, name) = ground_or_skip!(my_env_and_name(&format!("mygap{}", &sink[..2])));
    let mut p = pipeline(&env, &name).await;
    if sink == "lsm" {
        p.use_lsm(2, "initial", "");
    }
    let url = env.url_for(&p.db);
    let mut c = my_connect(&url).await;
    my_exec(&mut c, &create_table("a", 500)).await;
    my_exec(&mut c, &create_table("b", 2_000)).await;
    let only = |p: &MyPipeline, tables: &str| {
        let text = std::fs::read_to_string(&p.config).unwrap();
        let mut text: String = text
            .lines()
            .map(|l| {
                if l.starts_with("tables = ") {
                    tables
                } else {
                    l
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        // One commit per transaction: the update and the delete of a row land in different
        // commits, so the update's commit must complete the row on its own (in one commit the
        // LSM sink only writes a key's last state, the delete).
        if !text.contains("commit_max_rows") {
            text = text.replace("[pipeline]\n", "[pipeline]\ncommit_max_rows = 1\n");
        }
        if sink == "equality" && !text.contains("delete_mode") {
            text = text.replace(
                "kind = \"iceberg\"",
                "kind = \"iceberg\"\ndelete_mode = \"equality\"",
            );
        }
        std::fs::write(&p.config, text).unwrap();
    };
    only(&p, &format!("tables = [\"{0}.a\"]", p.db));
    p.start();
    p.assert_equal("a", 120).await;
    p.kill9();

    let mut minimal = my_connect(&url).await;
    my_exec(&mut minimal, "SET SESSION binlog_row_image = 'MINIMAL'").await;
    my_exec(
        &mut minimal,
        "UPDATE a SET v = v + 1 WHERE id = 3;
         UPDATE b SET n = n + 1 WHERE id = 5;
         DELETE FROM b WHERE id = 5;
         UPDATE b SET v = v + 1 WHERE id = 7;
         BEGIN; UPDATE b SET s = 'x' WHERE id = 9; DELETE FROM b WHERE id = 9; COMMIT;
         UPDATE a SET v = v + 1 WHERE id = 4",
    )
    .await;
    only(&p, &format!("tables = [\"{0}.a\", \"{0}.b\"]", p.db));
    p.start();
    p.assert_equal("b", 120).await;
    p.assert_equal("a", 120).await;
    let out = start_output(&p, 2);
    assert!(
        out.contains("initial copy from a consistent snapshot") && out.contains("from=0-"),
        "b was not copied with an upsert window:\n{out}"
    );
    if sink != "lsm" {
        assert!(
            out.contains("dropped partial updates"),
            "no partial update was dropped:\n{out}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_update_of_a_row_deleted_inside_the_window_is_dropped() {
    for sink in ["deletion-vectors", "equality", "lsm"] {
        eprintln!("sink: {sink}");
        added_table_window_gap(sink).await;
    }
}

/// Commits of `t`'s copied rows in the output of start `n`.
fn copy_commits(p: &MyPipeline, n: u32) -> usize {
    start_output(p, n)
        .lines()
        .filter(|l| {
            l.contains("committed")
                && l.contains(".t ")
                && (l.contains("position=0/0") || l.contains("position=:0"))
        })
        .count()
}

/// Two crashes: the second in the middle of the resumed copy, whose chunks were read at a newer
/// snapshot with its own upsert window. The third start keeps the chunks of both earlier starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_kill_during_the_resumed_copy_converges() {
    let (env, name) = ground_or_skip!(my_env_and_name("mysnap2k"));
    let rows = 200_000;
    let mut p = pipeline(&env, &name).await;
    let url = env.url_for(&p.db);
    let mut c = my_connect(&url).await;
    my_exec(&mut c, &create_table("t", rows)).await;
    tune(&p, 10_000);
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(write_until(url, "t".into(), rows, 1, stop.clone()));
    let mut kills = 0;
    for start in 1..=3u32 {
        p.start();
        let deadline = Instant::now() + Duration::from_secs(240);
        loop {
            assert!(Instant::now() < deadline, "start {start} made no progress");
            assert!(
                p.wait_exit(Duration::from_millis(50)).await.is_none(),
                "cdcd exited in start {start}"
            );
            let out = start_output(&p, start);
            if out.contains("initial copy finished") {
                break;
            }
            if start < 3 && copy_commits(&p, start) >= 1 {
                eprintln!("kill -9 in start {start}");
                p.kill9();
                kills += 1;
                tokio::time::sleep(Duration::from_millis(300)).await;
                break;
            }
        }
        if start_output(&p, start).contains("initial copy finished") {
            break;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    eprintln!("{kills} kills");
    assert!(kills >= 1, "the copy finished before any kill");
    if kills == 2 {
        let out = start_output(&p, 3);
        let planned = out
            .lines()
            .find(|l| l.contains("planned initial copy"))
            .unwrap_or_else(|| panic!("no plan line in the third start:\n{out}"));
        eprintln!("third start: {planned}");
        assert!(
            crate::support::log_field(planned, "to_copy").unwrap()
                < crate::support::log_field(planned, "chunks").unwrap(),
            "{planned}"
        );
    }
    p.assert_equal("t", 240).await;
}

/// A keyless table whose copy must be redone while streaming resumes (a kill -9 in the middle of
/// the initial copy, before the keyless table's copy finished): it is copied again whole at a
/// snapshot of its own and declared complete there, so the replayed inserts from before it are
/// skipped and the later ones applied; duplicates stay duplicates (issue 23).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyless_table_is_copied_again_exactly_after_a_kill_mid_copy() {
    let (env, name) = ground_or_skip!(my_env_and_name("mysnapkl"));
    let mut p = pipeline(&env, &name).await;
    let url = env.url_for(&p.db);
    let mut c = my_connect(&url).await;
    // `t` is copied first (tables go in name order, on one connection); `z_log` has no key and
    // holds duplicates.
    my_exec(&mut c, &create_table("t", 120_000)).await;
    my_exec(
        &mut c,
        "CREATE TABLE z_log (g INT, note VARCHAR(20));
         INSERT INTO z_log SELECT seq % 100, 'seed' FROM seq_1_to_5000",
    )
    .await;
    tune_copy(&p.config, 10_000, Some(1), Some(10_000));
    p.start();
    wait_for(
        &mut p,
        "two copy commits of t",
        Duration::from_secs(240),
        |o| {
            o.lines()
                .filter(|l| l.contains("committed") && l.contains("table=") && l.contains(".t "))
                .count()
                >= 2
        },
    )
    .await;
    assert!(
        !p.output().contains("initial copy finished"),
        "the copy ended before the kill; make the table bigger"
    );
    p.kill9();
    my_exec(&mut c, "INSERT INTO z_log VALUES (1, 'down'), (1, 'down')").await;
    p.start();
    for k in 0..5 {
        my_exec(
            &mut c,
            &format!("INSERT INTO z_log VALUES ({k}, 'during'), ({k}, 'during')"),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    p.assert_equal("z_log", 240).await;
    p.assert_equal("t", 240).await;
    assert!(
        p.output()
            .contains("copying keyless tables whole at a snapshot of their own"),
        "{}",
        p.output()
    );
    my_exec(&mut c, "INSERT INTO z_log VALUES (2, 'after')").await;
    p.assert_equal("z_log", 60).await;
}
