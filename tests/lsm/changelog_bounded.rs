//! Issue 38's goal "the changelog's files bounded by maintenance over the long run", Paimon: a
//! table with the changelog on streams one commit per transaction for many commits; the sink's
//! snapshot expiry (10 snapshots kept, the test bed's config) takes each expired snapshot's
//! changelog files with it. The changelog files on disk, the manifests and the snapshot files
//! stop growing after a warm-up, and what the retained snapshots list still reads (pypaimon's
//! stream read) and replays onto the source's rows.

use std::path::Path;
use std::time::Duration;

use super::changelog::{
    per_key, read_changelog, replay, source_rows, transaction, workload_pipeline,
};
use crate::postgres::resync::files_under;
use crate::support::test_env_and_name;

/// Rounds streamed, each its own transaction and commit; the warm-up is the first [`WARM_UP`].
const ROUNDS: i64 = 80;
const WARM_UP: i64 = 20;

/// The table's changelog files on disk (`bucket-*/changelog-*`), its manifest files and its
/// snapshot files.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Files {
    changelog: usize,
    manifests: usize,
    snapshots: usize,
}

impl Files {
    fn of(dir: &Path) -> Files {
        let names = |d: &Path| -> Vec<String> {
            std::fs::read_dir(d).map_or(Vec::new(), |rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
        };
        let changelog = names(dir)
            .iter()
            .filter(|b| b.starts_with("bucket-"))
            .flat_map(|b| names(&dir.join(b)))
            .filter(|f| f.starts_with("changelog-"))
            .count();
        Files {
            changelog,
            manifests: files_under(&dir.join("manifest")),
            snapshots: files_under(&dir.join("snapshot")),
        }
    }

    fn max(self, other: Files) -> Files {
        Files {
            changelog: self.changelog.max(other.changelog),
            manifests: self.manifests.max(other.manifests),
            snapshots: self.snapshots.max(other.snapshots),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_bounds_the_paimon_changelog_files() {
    let (env, name) = ground_or_skip!(test_env_and_name("lchlb"));
    let t = format!("{name}_t");
    let (mut p, client) = workload_pipeline(&env, &name, &t, 50).await;
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    p.assert_equal(&t, 60).await;
    let dir = p.table_dir(&t);
    let (mut warm, mut late) = (Files::default(), Files::default());
    for k in 0..ROUNDS {
        crate::support::exec(&client, &transaction(&t, k)).await;
        tokio::time::sleep(Duration::from_millis(150)).await;
        let now = Files::of(&dir);
        if k < WARM_UP {
            warm = warm.max(now);
        } else if k >= ROUNDS - WARM_UP {
            late = late.max(now);
        }
    }
    p.assert_equal(&t, 60).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    eprintln!("changelog files: warm-up {warm:?}, last rounds {late:?}");
    // Without expiry each round adds changelog files, manifests and a snapshot: four times the
    // warm-up's by the end.
    assert!(warm.changelog > 0, "no changelog file: {warm:?}");
    assert!(
        late.changelog <= 2 * warm.changelog
            && late.manifests <= 2 * warm.manifests
            && late.snapshots <= 2 * warm.snapshots,
        "the changelog's files grow with its commits: warm-up {warm:?}, last rounds {late:?}"
    );
    let source = source_rows(&client, &t).await;
    let streamed = per_key(&read_changelog(&p, &t, "stream"), "id");
    for (key, r) in &replay(&streamed, false) {
        assert_eq!(source.get(key), Some(r), "key {key}");
    }
}
