//! `cdcd_source_lag_seconds`: how old the oldest change is that cdcd received and has not made
//! durable yet; 0 when everything the source sent is committed, however long the source has been
//! quiet.
//!
//! Why not "now − the newest committed change's source time": that grows by a second per second
//! as soon as the source goes quiet (a heartbeat only resets it to the heartbeat's arrival), so
//! an alert on it fires every idle night (issue 34). What an operator needs is how far behind
//! the tables are: a change waits between its commit on the source and the commit that makes it
//! durable in cdcd, and nothing waits when nothing is buffered.

use crate::metrics as m;

/// The pipeline's book for the lag gauge, fed from the loop (`pipeline/mod.rs`) and the
/// acknowledgement (`pipeline/commit.rs`).
#[derive(Debug, Default)]
pub(super) struct Lag {
    /// Source commit time (µs since the epoch) of the oldest transaction received since
    /// everything received was last durable; `None`: nothing waits.
    oldest_waiting: Option<i64>,
    /// Something was received from the stream (a transaction or a heartbeat): until then the lag
    /// is unknown (an initial copy runs, or the stream has not started) and the gauge stays unset.
    heard: bool,
}

impl Lag {
    /// A transaction committed on the source at `commit_time_micros` is buffered.
    pub fn waiting(&mut self, commit_time_micros: i64) {
        self.heard = true;
        self.oldest_waiting = Some(
            self.oldest_waiting
                .map_or(commit_time_micros, |t| t.min(commit_time_micros)),
        );
    }

    /// The stream said something that leaves nothing to commit (a heartbeat, a transaction the
    /// tables already hold).
    pub fn heard(&mut self) {
        self.heard = true;
    }

    /// Everything received is durable (the acknowledgement).
    pub fn durable(&mut self) {
        self.oldest_waiting = None;
    }

    /// The gauge's value at `now_micros`; `None` before the stream said anything.
    pub fn seconds(&self, now_micros: i64) -> Option<f64> {
        match self.oldest_waiting {
            Some(t) => Some(m::lag_seconds(now_micros, t)),
            None if self.heard => Some(0.0),
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    #[test]
    fn the_lag_is_the_age_of_the_oldest_change_not_yet_durable() {
        let mut lag = Lag::default();
        assert_eq!(lag.seconds(100 * S), None, "nothing heard yet");
        lag.waiting(90 * S);
        lag.waiting(95 * S);
        assert_eq!(lag.seconds(100 * S), Some(10.0));
        lag.durable();
        // Quiet afterwards: 0 at any later time.
        assert_eq!(lag.seconds(100 * S), Some(0.0));
        assert_eq!(lag.seconds(1000 * S), Some(0.0));
        lag.waiting(999 * S);
        assert_eq!(lag.seconds(1001 * S), Some(2.0));
    }
}
