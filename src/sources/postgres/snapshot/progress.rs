//! Progress of an initial copy for the operator at a terminal: a one-line bar redrawn on stderr
//! when stderr is a terminal, and a last line when the copy ends.
//!
//! Where it sits: `parallel.rs` calls [`Meter::report`] every few seconds with the rows copied
//! per table. The progress log lines (rows, bytes, rates, ETA) and the metrics are the
//! pipeline's (`pipeline/copy_meter.rs`), the same for every source. No crate for the bar: it is
//! one line.

use std::io::{IsTerminal, Write};
use std::time::Duration;

/// Width of the bar in characters.
const BAR_WIDTH: usize = 30;

pub struct Meter {
    /// Table name and estimated rows.
    tables: Vec<(String, u64)>,
    tty: bool,
    drawn: bool,
}

impl Meter {
    pub fn new(tables: Vec<(String, u64)>) -> Self {
        Meter {
            tables,
            tty: std::io::stderr().is_terminal(),
            drawn: false,
        }
    }

    /// Redraws the bar with `copied` rows per table after `elapsed` (at a terminal).
    pub fn report(&mut self, copied: &[u64], elapsed: Duration) {
        if self.tty {
            let line = bar_line(&self.tables, copied, elapsed);
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r{line}\x1b[K");
            let _ = err.flush();
            self.drawn = true;
        }
    }

    /// The copy ended: a final line per table.
    pub fn finish(&mut self, copied: &[u64], elapsed: Duration) {
        self.clear();
        let total: u64 = copied.iter().sum();
        tracing::info!(
            rows = total,
            seconds = elapsed.as_secs_f64(),
            rows_per_s = rate(total, elapsed),
            "initial copy finished"
        );
    }

    /// Removes the bar (before logs or on error).
    pub fn clear(&mut self) {
        if self.drawn {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
            self.drawn = false;
        }
    }
}

fn percent(rows: u64, estimated: u64) -> u64 {
    if estimated == 0 {
        return 100;
    }
    (rows.saturating_mul(100) / estimated).min(100)
}

fn rate(rows: u64, elapsed: Duration) -> u64 {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        return 0;
    }
    (rows as f64 / secs) as u64
}

/// `[=========>          ] 45% 1234567/2700000 rows  350000 rows/s  (2/5 tables)`
pub fn bar_line(tables: &[(String, u64)], copied: &[u64], elapsed: Duration) -> String {
    let total: u64 = copied.iter().sum();
    let estimated: u64 = tables.iter().map(|t| t.1).sum::<u64>().max(total);
    let pct = percent(total, estimated);
    let filled = (pct as usize * BAR_WIDTH / 100).min(BAR_WIDTH);
    let done = tables
        .iter()
        .zip(copied)
        .filter(|((_, e), &c)| c >= *e && c > 0)
        .count();
    format!(
        "initial copy [{}{}] {pct:>3}% {total}/{estimated} rows  {} rows/s  ({done}/{} tables)",
        "=".repeat(filled),
        " ".repeat(BAR_WIDTH - filled),
        rate(total, elapsed),
        tables.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_shows_share_rate_and_tables() {
        let tables = vec![("a".to_owned(), 100), ("b".to_owned(), 300)];
        let line = bar_line(&tables, &[100, 100], Duration::from_secs(2));
        assert!(line.contains(" 50% 200/400 rows"), "{line}");
        assert!(line.contains("100 rows/s"), "{line}");
        assert!(line.contains("(1/2 tables)"), "{line}");
        assert!(
            line.contains(&format!("[{}{}]", "=".repeat(15), " ".repeat(15))),
            "{line}"
        );
        // More rows than estimated: 100%, never past the bar.
        let line = bar_line(&tables, &[1000, 0], Duration::ZERO);
        assert!(line.contains("100% 1000/1000"), "{line}");
    }
}
