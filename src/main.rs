//! The `cdcd` command line: parse, load the config, run. Everything else lives in the library.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

/// Change-data-capture daemon: keeps Iceberg or Paimon tables equal to Postgres or MySQL/MariaDB
/// tables, exactly once.
#[derive(Debug, Parser)]
#[command(name = "cdcd", version, about)]
struct Cli {
    /// The pipeline's TOML file (every key can be overridden by CDCD_<SECTION>__<KEY>).
    #[arg(long, short, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Log lines on stderr: `text` (readable on a terminal) or `json` (one object per line).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "CDCD_LOG_FORMAT"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Preflight: source settings, privileges, sink reachability. One line per problem.
    Check,
    /// Per table: committed position, snapshot id, rows.
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Delete orphan files: files under a table that no metadata version references (left by
    /// crashed or lost commits), older than the grace period.
    Cleanup {
        /// Keep unreferenced files younger than this (seconds): a running cdcd's commit in flight
        /// writes its files before its metadata.
        #[arg(long, default_value_t = 3600)]
        grace_secs: u64,
        /// List what would be deleted without deleting.
        #[arg(long)]
        dry_run: bool,
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Run one maintenance cycle now (snapshot expiry and the metadata log, following each
    /// table's Iceberg properties) and exit. Takes the pipeline's lease: a running daemon
    /// maintains its tables itself.
    Maintain {
        /// Only this table (schema.table or database.table); default: every captured table.
        #[arg(long, value_name = "TABLE")]
        table: Option<String>,
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Copy one table again, online, and swap the copy in with one atomic commit.
    ///
    /// The way out after a schema change cdcd stops on (a narrowing, int -> text, a primary-key
    /// change) or a damaged replica. Stores a request under <warehouse>/_cdcd/<pipeline>/resync/
    /// and exits: the running cdcd picks it up within a few seconds (without one, the next start
    /// does), copies the table into a new lineage while every table streams on (this one into
    /// its live table) and the slot keeps its position, and replaces the table with it once the
    /// copy has caught up. Readers see the old table until then. Iceberg sink with any catalog
    /// (filesystem, SQL, REST: one metadata commit) or Paimon sink (one OVERWRITE snapshot);
    /// after a stop on a schema change, run it, then start cdcd.
    Resync {
        /// The table: schema.table (Postgres) or database.table (MySQL), as source.tables names it.
        #[arg(long, value_name = "TABLE")]
        table: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logs(cli.log_format);
    // Before any worker thread exists (src/malloc.rs says why).
    cdcd::malloc::limit_arenas();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cdcd: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let json = matches!(cli.log_format, LogFormat::Json);
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            error!("{e:#}");
            // JSON logs stay one object per line; on a terminal, also a plain last line.
            if !json {
                eprintln!("cdcd: {e:#}");
            }
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let path = cli
        .config
        .context("missing --config FILE (see config/pipeline.example.toml)")?;
    let config = cdcd::config::Config::load(&path)?;
    match cli.command {
        None => {
            let shutdown = CancellationToken::new();
            tokio::spawn(stop_on_signal(shutdown.clone()));
            cdcd::commands::run(&config, shutdown).await?;
            info!("stopped");
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Check) => {
            for line in cdcd::commands::check_settings(&config) {
                println!("{line}");
            }
            let mut problems = cdcd::commands::check(&config).await;
            match cdcd::commands::check_sink(&config).await {
                Ok(lines) => lines.iter().for_each(|line| println!("{line}")),
                Err(problem) => problems.push(problem),
            }
            for line in cdcd::commands::check_keys(&config).await {
                println!("{line}");
            }
            if problems.is_empty() {
                println!("ok: {} is ready", config.pipeline);
                Ok(ExitCode::SUCCESS)
            } else {
                for p in &problems {
                    println!("{p}");
                }
                Ok(ExitCode::FAILURE)
            }
        }
        Some(Command::Cleanup {
            grace_secs,
            dry_run,
            json,
        }) => {
            let grace = std::time::Duration::from_secs(grace_secs);
            let reports = cdcd::commands::cleanup(&config, grace, dry_run).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&reports)?);
            } else {
                let verb = if dry_run { "would delete" } else { "deleted" };
                for r in &reports {
                    for o in &r.orphans {
                        println!("{verb} {o}");
                    }
                    println!(
                        "{}: {} live files, {verb} {} orphans, kept {} younger than {grace_secs}s",
                        r.table,
                        r.live,
                        r.orphans.len(),
                        r.young
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Maintain { table, json }) => {
            let reports = cdcd::commands::maintain(&config, table.as_deref()).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&reports)?);
            } else {
                for r in &reports {
                    match &r.error {
                        Some(e) => println!("{}: failed: {e}", r.table),
                        None => println!(
                            "{}: rewrote {} data files ({} bytes) into {}; expired {} snapshots, deleted {} files and {} metadata files; {} snapshots, {} live files, {} manifests",
                            r.table,
                            r.files_rewritten,
                            r.bytes_rewritten,
                            r.files_written,
                            r.snapshots_expired,
                            r.files_deleted,
                            r.metadata_files_deleted,
                            r.snapshots,
                            r.live_files,
                            r.manifests
                        ),
                    }
                }
            }
            let failed = reports.iter().any(|r| r.error.is_some());
            Ok(if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        Some(Command::Resync { table }) => {
            match cdcd::commands::resync(&config, &table).await? {
                cdcd::commands::ResyncRequested::Created {
                    table,
                    id,
                    location,
                } => println!(
                    "resync of {table} requested (id {id}, {location}): a running cdcd starts it within a few seconds, otherwise the next start does; readers see the current table until the new copy replaces it"
                ),
                cdcd::commands::ResyncRequested::Pending {
                    table,
                    id,
                    location,
                } => println!(
                    "a resync of {table} is already requested (id {id}, {location}) and not finished; it goes on"
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Status { json }) => {
            let rows = cdcd::commands::status(&config).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                let dash = |v: Option<u64>| v.map(|s| s.to_string()).unwrap_or_else(|| "-".into());
                println!(
                    "{:<40} {:<32} {:<20} {:>20} {:>12} {:>8} {:>14} {:>9}",
                    "TABLE", "KEY", "POSITION", "SNAPSHOT", "ROWS", "FILES", "BYTES", "SNAPSHOTS"
                );
                for r in rows {
                    let key = match (r.key.is_empty(), &r.key_index) {
                        (true, _) if r.key_origin == "full_row" => "full row (multiset)".to_owned(),
                        (true, _) => "-".to_owned(),
                        (false, Some(index)) => format!("({}) {index}", r.key.join(", ")),
                        (false, None) => format!("({}) {}", r.key.join(", "), r.key_origin),
                    };
                    println!(
                        "{:<40} {:<32} {:<20} {:>20} {:>12} {:>8} {:>14} {:>9}",
                        r.table,
                        key,
                        r.position.as_deref().unwrap_or("-"),
                        r.snapshot_id
                            .map(|s| s.to_string())
                            .unwrap_or_else(|| "-".into()),
                        dash(r.rows),
                        dash(r.live_files),
                        dash(r.live_bytes),
                        dash(r.snapshots),
                    );
                    if let Some(resync) = &r.resync {
                        println!("  resync: {resync}");
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Logs go to stderr, filtered by `CDCD_LOG` (default `info`). Secrets never reach them: the
/// config types print passwords as `***` and URLs without their password.
fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CDCD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(false)
            .flatten_event(true)
            .init(),
    }
}

/// SIGTERM or SIGINT: stop reading, commit what is buffered, exit 0.
async fn stop_on_signal(shutdown: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => info!("SIGTERM"),
                    _ = tokio::signal::ctrl_c() => info!("SIGINT"),
                }
            }
            Err(e) => {
                error!("cannot listen for SIGTERM ({e}); only SIGINT stops cdcd cleanly");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    shutdown.cancel();
}
