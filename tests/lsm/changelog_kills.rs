//! Issue 38, Jepsen-style on the Paimon changelog: a writer runs random inserts, updates and
//! deletes on MariaDB while cdcd is killed with `kill -9` at random moments
//! (`writes_through_kills`); pypaimon's stream read of the changelog, replayed key by key
//! (`+I` only onto no row, `-U`/`-D` only of the row as it is: a gap or a duplicate breaks one),
//! gives the source table.

use std::collections::BTreeMap;
use std::time::Duration;

use mysql_async::prelude::Queryable;

use super::changelog::{per_key, read_changelog_in, replay};
use crate::support::mysql::{my_connect, my_env, writes_through_kills, MyPipeline};
use crate::support::{append_table_settings, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_at_random_moments_leaves_each_change_once_in_the_paimon_changelog() {
    let test = "kill9_at_random_moments_leaves_each_change_once_in_the_paimon_changelog";
    let env = ground_or_skip!(my_env(test));
    let name = unique("mylchk");
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    p.use_lsm(2, "initial", "");
    append_table_settings(&p.config, &format!("{name}.acct"), "changelog = true\n");
    let mut c = my_connect(&env.url_for(&p.db)).await;
    writes_through_kills(&mut p, &mut c, test, 60).await;
    p.start();
    p.assert_equal("acct", 120).await;
    p.stop(Duration::from_secs(60)).await;
    let entries = read_changelog_in(&env.python, &p.warehouse, "acct", "stream");
    assert!(
        entries.len() > 100,
        "too few changes to prove anything: {}",
        entries.len()
    );
    let replayed = replay(&per_key(&entries, "id"), true);
    let source: Vec<(i64, i64, Option<String>)> =
        c.query("SELECT id, n, note FROM acct").await.unwrap();
    let source: BTreeMap<String, BTreeMap<String, String>> = source
        .into_iter()
        .map(|(id, n, note)| {
            let row = BTreeMap::from([
                ("id".to_owned(), id.to_string()),
                ("n".to_owned(), n.to_string()),
                ("note".to_owned(), note.unwrap_or_else(|| "null".into())),
            ]);
            (id.to_string(), row)
        })
        .collect();
    assert_eq!(replayed, source, "the changelog replayed is not the source");
    eprintln!("paimon changelog after kill -9s: {} rows", entries.len());
}
