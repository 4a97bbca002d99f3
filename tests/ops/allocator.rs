//! The allocator's options (src/main.rs, `malloc_conf`): the binary runs jemalloc with freed pages
//! returned within about a second by a background thread, what keeps a 100M-row table's RSS near
//! its live heap. jemalloc prints the options it runs with when asked through its environment
//! variable, which adds `stats_print` and leaves the built-in ones in force.

use std::process::Command;

use crate::support::cdcd_bin;

#[test]
fn the_binary_returns_freed_pages_within_a_second() {
    let out = Command::new(cdcd_bin())
        .arg("--version")
        .env("_RJEM_MALLOC_CONF", "stats_print:true")
        .output()
        .unwrap();
    assert!(out.status.success(), "cdcd --version failed: {out:?}");
    let stats = String::from_utf8_lossy(&out.stderr);
    for option in ["opt.background_thread: true", "opt.dirty_decay_ms: 1000"] {
        assert!(
            stats.lines().any(|l| l.trim_start().starts_with(option)),
            "jemalloc does not run with `{option}`; its statistics:\n{stats}"
        );
    }
}
