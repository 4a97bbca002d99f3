//! The MariaDB source's own decoding limit, without a server or a sink: reads a binlog file as
//! `mariadb-binlog --raw` saves it (bench/mysql_e2e.py --save-binlog), feeds every event through
//! the assembler (`src/sources/mysql/stream.rs`) exactly as the live source does, and prints rows/s
//! for the planned path (`image.rs`) and for `mysql_common`'s rows (the path before it). Prints;
//! asserts nothing. Deterministic input, so `valgrind --tool=callgrind` counts compare runs.
//!
//! `cargo run --release --example mysql_decode_bench -- DB BINLOG_FILE… [--only planned|general]`
//!
//! The captured table is bench/mysql_e2e.py's `DB.changes` (10 columns); other tables' events
//! in the files are skipped, as the live source skips them.

use std::time::Instant;

use cdcd::changelog::{GtidList, Position};
use cdcd::config::ZeroDate;
use cdcd::sources::mysql::assembler::{Assembler, Step};
use cdcd::sources::mysql::schema::build_entry;
use cdcd::sources::mysql::types::ColumnInfo;
use mysql_common::binlog::consts::BinlogVersion;
use mysql_common::binlog::events::EventData;
use mysql_common::binlog::EventStreamReader;

/// bench/mysql_e2e.py's table, as `information_schema.columns` describes it.
fn columns() -> Vec<ColumnInfo> {
    let col = |name: &str, dt: &str, ct: &str, p: Option<u64>, s: Option<u64>, cs: Option<&str>| {
        ColumnInfo {
            name: name.into(),
            data_type: dt.into(),
            column_type: ct.into(),
            numeric_precision: p,
            numeric_scale: s,
            charset: cs.map(Into::into),
            nullable: name != "id" && name != "a",
            ..Default::default()
        }
    };
    vec![
        col("id", "bigint", "bigint(20)", Some(19), Some(0), None),
        col("a", "int", "int(11)", Some(10), Some(0), None),
        col("b", "bigint", "bigint(20)", Some(19), Some(0), None),
        col("c", "varchar", "varchar(64)", None, None, Some("utf8mb4")),
        col("d", "decimal", "decimal(12,2)", Some(12), Some(2), None),
        col("e", "double", "double", Some(22), None, None),
        col("f", "timestamp", "timestamp(6)", None, None, None),
        col("g", "tinyint", "tinyint(1)", Some(3), Some(0), None),
        col("h", "date", "date", None, None, None),
        col("i", "varchar", "varchar(32)", None, None, Some("utf8mb4")),
    ]
}

/// Feeds the whole file; returns (changes, transactions, seconds).
fn run(db: &str, files: &[Vec<u8>], planned: bool) -> Result<(usize, usize, f64), String> {
    let start = Position::MariaDbGtid(GtidList::default());
    let mut assembler = Assembler::new(vec![format!("{db}.changes")], ZeroDate::Null, start);
    if !planned {
        assembler = assembler.general_rows_only();
    }
    let (mut changes, mut transactions) = (0, 0);
    let started = Instant::now();
    for bytes in files {
        let (c, t) = run_file(&mut assembler, bytes)?;
        changes += c;
        transactions += t;
    }
    Ok((changes, transactions, started.elapsed().as_secs_f64()))
}

fn run_file(assembler: &mut Assembler, bytes: &[u8]) -> Result<(usize, usize), String> {
    let mut esr = EventStreamReader::new(BinlogVersion::Version4);
    let (mut changes, mut transactions) = (0, 0);
    // A binlog file: 4 magic bytes, then events, each with its length at header bytes 9..13.
    let mut at = 4;
    while let Some(header) = bytes.get(at..at + 19) {
        let len = u32::from_le_bytes([header[9], header[10], header[11], header[12]]) as usize;
        let Some(raw) = bytes.get(at..at + len) else {
            break;
        };
        at += len;
        let event = match esr.read(raw) {
            Ok(Some(e)) => e,
            Ok(None) => continue,
            Err(e) => return Err(format!("event at {at}: {e}")),
        };
        let tme = match event.read_data() {
            Ok(Some(EventData::RowsEvent(r))) => esr.get_tme(r.table_id()),
            _ => None,
        };
        loop {
            match assembler.on_event(&event, tme).map_err(|e| e.to_string())? {
                Step::Transaction(t) => {
                    transactions += 1;
                    changes += t.changes.iter().map(|c| c.len()).sum::<usize>();
                }
                Step::NeedTable(id) => {
                    let entry = build_entry(id, &columns(), &["id".to_owned()])
                        .map_err(|e| e.to_string())?;
                    assembler.set_table(entry);
                    continue;
                }
                Step::Nothing | Step::Idle(_) => {}
            }
            break;
        }
    }
    Ok((changes, transactions))
}

fn main() -> Result<(), String> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut only = None;
    if let Some(i) = args.iter().position(|a| a == "--only") {
        only = args.get(i + 1).cloned();
        args.drain(i..(i + 2).min(args.len()));
    }
    let (Some(db), true) = (args.first(), args.len() > 1) else {
        return Err("usage: mysql_decode_bench DB BINLOG_FILE… [--only planned|general]".into());
    };
    let mut files = Vec::new();
    for path in &args[1..] {
        files.push(std::fs::read(path).map_err(|e| format!("{path}: {e}"))?);
    }
    let mib = files.iter().map(Vec::len).sum::<usize>() as f64 / (1 << 20) as f64;
    for (name, planned) in [("planned", true), ("general", false)] {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let (changes, transactions, secs) = run(db, &files, planned)?;
        println!(
            "{name:>8} path: {changes} changes in {transactions} transactions ({mib:.1} MiB of binlog read), {secs:.2} s, {:.0} rows/s",
            changes as f64 / secs
        );
    }
    Ok(())
}
