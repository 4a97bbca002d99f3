//! The `cdcd` command line: parse, load the config, dispatch to the daemon (`src/daemon/mod.rs`)
//! or a command (`src/commands/`), which does its work and prints its output. Everything else lives
//! in the library.

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

/// jemalloc instead of glibc's malloc: with 1,000 tables glibc's allocator was 35-40 % of cdcd's
/// CPU (arena lock waits, `unlink_chunk` and `malloc_consolidate` over long free lists) and its
/// fragmentation kept RSS climbing; with jemalloc the same run commits ~65 a second instead of ~20
/// from the fourth minute on, at ~400 MiB instead of ~650 (docs/performance.md, issue 37).
/// jemalloc's default options are kept: freed pages returned within a second by a background
/// thread left the RSS of the 100M-row run where it was and its lag p99 1.5 s worse
/// (docs/performance.md, "A 100M-row table", seventh pass).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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
    use cdcd::commands;
    let path = cli
        .config
        .context("missing --config FILE (see config/pipeline.example.toml)")?;
    let config = cdcd::config::Config::load(&path)?;
    let code = match cli.command {
        None => {
            let shutdown = CancellationToken::new();
            tokio::spawn(stop_on_signal(shutdown.clone()));
            cdcd::daemon::run(&config, shutdown).await?;
            info!("stopped");
            ExitCode::SUCCESS
        }
        Some(Command::Check) => commands::check::run(&config).await,
        Some(Command::Status { json }) => {
            commands::status::run(&config, json).await?;
            ExitCode::SUCCESS
        }
        Some(Command::Cleanup {
            grace_secs,
            dry_run,
            json,
        }) => {
            commands::cleanup::run(&config, grace_secs, dry_run, json).await?;
            ExitCode::SUCCESS
        }
        Some(Command::Maintain { table, json }) => {
            commands::maintain::run(&config, table.as_deref(), json).await?
        }
        Some(Command::Resync { table }) => {
            commands::resync::run(&config, &table).await?;
            ExitCode::SUCCESS
        }
    };
    Ok(code)
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
