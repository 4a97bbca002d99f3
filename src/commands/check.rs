//! `cdcd check`: the preflight. Prints the source's settings, the sink's lines, each captured
//! table's key and layout (partition spec and sort order, `[sink.tables.*]`), then
//! `ok: <pipeline> is ready` or one line per problem with how to fix it.

use std::process::ExitCode;

use super::build::{build_sink, open_warehouse};
use crate::changelog::KeyOrigin;
use crate::config::Config;
use crate::pipeline::PipelineError;
use crate::sources::Source;

/// Runs every check and prints its lines; fails when a problem was found.
pub async fn run(config: &Config) -> ExitCode {
    for line in settings_lines(config) {
        println!("{line}");
    }
    let mut problems = problems(config).await;
    let sink_ok = match sink_lines(config).await {
        Ok(lines) => {
            lines.iter().for_each(|line| println!("{line}"));
            true
        }
        Err(problem) => {
            problems.push(problem);
            false
        }
    };
    for line in key_lines(config).await {
        println!("{line}");
    }
    for line in table_lines(config, sink_ok).await {
        match line {
            Ok(line) => println!("{line}"),
            Err(problem) => problems.push(problem),
        }
    }
    if problems.is_empty() {
        println!("ok: {} is ready", config.pipeline);
        ExitCode::SUCCESS
    } else {
        for p in &problems {
            println!("{p}");
        }
        ExitCode::FAILURE
    }
}

/// Every problem found with the source, the warehouse and the tables' keys, one line each with
/// how to fix it; empty when ready.
async fn problems(config: &Config) -> Vec<String> {
    let source = crate::sources::build(&config.source);
    let mut problems: Vec<String> = source
        .check()
        .await
        .into_iter()
        .map(|p| p.to_string())
        .collect();
    if let Err(e) = probe_warehouse(config).await {
        problems.push(e);
    }
    problems.extend(multiset_problems(config, source.as_ref()).await);
    problems
}

/// The Postgres keyless REPLICA IDENTITY FULL tables (multisets) a sink that cannot store them
/// would refuse at start, as the start refuses them. MySQL keyless tables are left out: they
/// replicate insert-only on such a sink until an update arrives (`Prepared::multiset`).
async fn multiset_problems(config: &Config, source: &dyn Source) -> Vec<String> {
    let crate::config::SourceConfig::Postgres(_) = &config.source else {
        return Vec::new();
    };
    let Some(why) = build_sink(config, None)
        .ok()
        .and_then(|sink| sink.multiset_refusal())
    else {
        return Vec::new();
    };
    source
        .check_keys()
        .await
        .into_iter()
        .filter(|k| k.origin == KeyOrigin::FullRow)
        .map(|k| {
            PipelineError::MultisetUnsupported {
                table: k.table,
                why,
            }
            .to_string()
        })
        .collect()
}

/// The lines about the sink beyond the warehouse (`catalog sql <uri>: ok`), or the problem found
/// there.
async fn sink_lines(config: &Config) -> Result<Vec<String>, String> {
    let sink = build_sink(config, None).map_err(|e| e.to_string())?;
    sink.check().await
}

/// The settings shown before the verdict (the source's TLS, and where it came from).
fn settings_lines(config: &Config) -> Vec<String> {
    crate::sources::build(&config.source).settings()
}

/// A line per captured table with a usable key: the key and where it came from.
async fn key_lines(config: &Config) -> Vec<String> {
    crate::sources::build(&config.source)
        .check_keys()
        .await
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// A line per captured table on its `[sink.tables.*]` settings as the sink applies them (its
/// partition spec and sort order, and what the next start changes), or the problem the start
/// would refuse; then a problem per section that names a table not captured. The tables are
/// read through the sink only when its own check passed (`sink_ok`): a catalog that refused cdcd
/// is reported once, not again per table.
async fn table_lines(config: &Config, sink_ok: bool) -> Vec<Result<String, String>> {
    let Ok(tables) = crate::sources::build(&config.source).tables().await else {
        return Vec::new();
    };
    let tables: Vec<_> = tables.into_iter().map(|k| k.table).collect();
    let mut lines = Vec::new();
    if sink_ok {
        if let Ok(sink) = build_sink(config, None) {
            lines = sink.check_tables(&tables).await;
        }
    }
    let sections = match &config.sink {
        crate::config::SinkConfig::Iceberg(c) => &c.tables,
        crate::config::SinkConfig::Lsm(c) => &c.tables,
    };
    for key in sections.keys() {
        if !key.contains('*') && !sections.key_matches_any(key, &tables) {
            lines.push(Err(format!(
                "{}: key `sink.tables.{key:?}`: {key} is not a captured table: add it to \
                 source.tables or remove the section",
                config.file
            )));
        }
    }
    lines
}

/// Writes and removes a small object under `<warehouse>/_cdcd/<pipeline>/` to prove the warehouse
/// is reachable and writable.
async fn probe_warehouse(config: &Config) -> Result<(), String> {
    use object_store::ObjectStoreExt;
    let warehouse = open_warehouse(config).map_err(|e| e.to_string())?;
    let location = warehouse.location(&["_cdcd", &config.pipeline, "check-probe"]);
    let path = warehouse.path(&location).map_err(|e| e.to_string())?;
    let unwritable = |e: object_store::Error| {
        format!(
            "warehouse {} is not writable ({e}): check the path and its permissions (sink.warehouse)",
            warehouse.url()
        )
    };
    warehouse
        .store()
        .put(&path, bytes::Bytes::from_static(b"cdcd check").into())
        .await
        .map_err(unwritable)?;
    warehouse.store().delete(&path).await.map_err(unwritable)?;
    Ok(())
}
