//! Issue 38, Jepsen-style: a writer runs random inserts, updates and deletes while cdcd is killed
//! with `kill -9` at random moments (`writes_through_kills`); the Iceberg changelog then holds
//! every source change exactly once: replayed in `_cdc_seq` order (DuckDB) it gives the source,
//! no change is there twice, and no `_cdc_seq` is given twice. Each commit pauses
//! between the changelog's commit and its table's (`CDCD_PAUSEPOINT`), so kills land there too.

use std::time::Duration;

use crate::postgres::changelog::replayed;
use crate::support::mysql::{my_connect, my_env, writes_through_kills, MyPipeline};
use crate::support::{append_table_settings, unique};

#[tokio::test]
async fn kill9_at_random_moments_leaves_each_change_once_in_the_changelog() {
    let test = "kill9_at_random_moments_leaves_each_change_once_in_the_changelog";
    let env = ground_or_skip!(my_env(test));
    let name = unique("mychk");
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    append_table_settings(&p.config, &format!("{name}.acct"), "changelog = true\n");
    // Each commit waits between the changelog's commit and its table's, where a kill leaves the
    // changelog ahead (the restart must not write those changes again).
    p.env_vars = vec![(
        "CDCD_PAUSEPOINT".into(),
        "changelog-before-table:300".into(),
    )];
    let mut c = my_connect(&env.url_for(&p.db)).await;
    writes_through_kills(&mut p, &mut c, test, 60).await;
    let paused = p.output().matches("pause point").count();
    assert!(
        paused > 0,
        "no commit paused between the changelog and its table"
    );
    p.env_vars.clear();
    p.start();
    p.assert_equal("acct", 120).await;
    p.stop(Duration::from_secs(60)).await;
    let out = replayed(
        &env.python,
        &env.url_for(&p.db),
        &format!("{name}.acct"),
        &p.table_dir("acct"),
        &p.table_dir("acct_changelog"),
        "copied",
    );
    let mut lines = out.lines();
    let counts = lines.next().unwrap_or_default();
    let field = |k: &str| {
        counts
            .split(' ')
            .find_map(|f| f.strip_prefix(k))
            .and_then(|v| v.parse::<u64>().ok())
    };
    let (rows, seqs) = (field("rows="), field("seqs="));
    assert!(
        rows.is_some_and(|r| r > 100),
        "too few changes to prove anything: {out}"
    );
    assert_eq!(rows, seqs, "a _cdc_seq twice: {out}");
    let rest: Vec<&str> = lines.filter(|l| !l.is_empty()).collect();
    assert!(
        rest.is_empty(),
        "the replay differs from the source:\n{out}"
    );
    eprintln!("changelog after kill -9s: {counts}");
}
