//! What a test does when its ground is missing (a test bed server, an independent reader, a
//! tool): it fails naming what is missing, or, where skipping is allowed, prints a note and skips.
//!
//! Why: a test that returns early passes, so a CI machine without the test bed, the readers or
//! Spark would report green having proven nothing. Skipping is therefore allowed only on a
//! developer's machine: `CI` (set by CI services) and `CDCD_TEST_REQUIRE=1` (set by
//! `scripts/test.sh`) make missing ground a failure; `CDCD_TEST_ALLOW_SKIP=1`, typed by a developer,
//! allows skipping again. Without any of them, `cargo test` on a bare machine skips with a note.
//!
//! One file for both kinds of test: the end-to-end suite has it as `support::ground`, the library's
//! unit tests as `crate::test_ground` (`src/lib.rs` includes this file under `cfg(test)`).
#![allow(dead_code)] // not every test crate uses every helper

/// How to get the test bed's servers and readers and the variables that name them.
pub const TESTBED_HINT: &str =
    "scripts/testbed.sh up, then eval \"$(scripts/testbed.sh env)\"; scripts/test.sh does both";

/// True when missing ground must fail the test: under `CI` or `CDCD_TEST_REQUIRE`, unless
/// `CDCD_TEST_ALLOW_SKIP` opts out.
pub fn required() -> bool {
    !flag("CDCD_TEST_ALLOW_SKIP") && (flag("CDCD_TEST_REQUIRE") || flag("CI"))
}

/// `name` set to something other than empty, `0` or `false` (`CI=true`, `CDCD_TEST_REQUIRE=1`).
fn flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"))
}

/// `test` cannot run because `what` is missing: panics naming it when ground is [`required`],
/// else prints a note and returns, and the caller skips.
pub fn missing(test: &str, what: &str) {
    if required() {
        panic!(
            "{test} cannot run: {what}. Missing ground fails a test under CI or CDCD_TEST_REQUIRE=1 \
             (scripts/test.sh sets it); CDCD_TEST_ALLOW_SKIP=1 skips instead"
        );
    }
    eprintln!("skipping {test}: {what} (CI or CDCD_TEST_REQUIRE=1 would fail it)");
}

/// The test bed's variable `name`, or `None` after [`missing`] (which panics when required).
pub fn var(test: &str, name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            missing(test, &format!("{name} is unset ({TESTBED_HINT})"));
            None
        }
    }
}
