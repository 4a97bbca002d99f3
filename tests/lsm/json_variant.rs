//! Issue 39: `json = "variant"` on the LSM (Paimon) sink. MariaDB JSON columns of a table that
//! opts in become Paimon `VARIANT` columns (the unannotated `value`/`metadata` group pypaimon
//! 2.1 writes), and pypaimon reads every value back equal to the source as parsed JSON (decoded
//! by its `GenericVariant`), through the initial copy, the binlog stream (a MINIMAL image leaves
//! the unchanged JSON out: completed from the row's current value, read back from a variant
//! file), deletes and a kill -9.

use std::time::Duration;

use crate::support::mysql::{my_connect, my_env_and_name, my_exec, MyPipeline};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_json_as_paimon_variant_reads_back_equal() {
    let (env, name) = ground_or_skip!(my_env_and_name("lsmjvar"));
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    p.use_lsm(2, "initial", "");
    p.set_for_all_tables("json", "variant");
    let mut c = my_connect(&env.url_for(&p.db)).await;
    my_exec(&mut c, crate::mysql::json_variant::CREATE).await;
    p.start();
    p.assert_equal("t", 120).await;
    let schema = std::fs::read_to_string(p.table_dir("t").join("schema/schema-0")).unwrap();
    let schema: serde_json::Value = serde_json::from_str(&schema).unwrap();
    let types: Vec<String> = crate::support::schema_fields(&schema)
        .into_iter()
        .map(|(name, _, ty)| format!("{name} {ty}"))
        .collect();
    assert_eq!(types, ["id BIGINT NOT NULL", "n INT", "j VARIANT"]);
    crate::mysql::json_variant::stream_and_kill(&mut p, &mut c).await;
    p.stop(Duration::from_secs(60)).await;
}
