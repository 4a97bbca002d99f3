#!/usr/bin/env bash
# The test command: starts the test bed (Postgres + lake readers, scripts/testbed.sh), builds, and runs
# every test (unit tests, and the end-to-end tests in tests/ against the real servers). Exit 0 only if
# all passed. CI runs it through .ci/run; it needs no stdin and runs as root on Debian 12.
#
#   scripts/test.sh                 everything
#   scripts/test.sh <filter>        extra arguments go to the test binaries (e.g. a test name)
# Env: CDCD_TB, PG_PORT (see testbed.sh); CDCD_TEST_THREADS (default 2); CDCD_NO_TESTBED=1 does not start
# the test bed (the tests use the servers the CDCD_TEST_* variables already name).
# A test whose server, reader or tool is missing fails here (CDCD_TEST_REQUIRE=1, tests/support/ground.rs):
# a run cannot pass by skipping. CDCD_TEST_ALLOW_SKIP=1, typed by a developer, lets such tests skip.
set -euo pipefail
cd "$(dirname "$0")/.."
export CDCD_TEST_REQUIRE=1

THREADS=${CDCD_TEST_THREADS:-2}
LOG_DIR=${CDCD_TEST_LOGS:-target/test-logs}
mkdir -p "$LOG_DIR"
start=$(date +%s)
# One Spark session answers the tests' Spark reads (tests/support/lakecheck.py, "one Spark session
# for many reads"): a JVM started once instead of per read. Stopped when the run ends.
spark_dir_made=""
if [ -z "${LAKECHECK_SPARK_SERVER:-}" ]; then
  LAKECHECK_SPARK_SERVER=$(mktemp -d /tmp/cdcd-spark.XXXXXX)
  spark_dir_made=1
fi
export LAKECHECK_SPARK_SERVER
stop_spark() {
  if [ -f "$LAKECHECK_SPARK_SERVER/spark.pid" ]; then kill "$(cat "$LAKECHECK_SPARK_SERVER/spark.pid")" 2>/dev/null || true; fi
  if [ -n "$spark_dir_made" ]; then rm -rf "$LAKECHECK_SPARK_SERVER"; fi
}
trap stop_spark EXIT
step() { printf '\n=== [%(%H:%M:%S)T] %s\n' -1 "$*"; }
elapsed() { echo "$(( $(date +%s) - start ))s"; }

if [ "${CDCD_NO_TESTBED:-0}" != 1 ]; then
  step "test bed"
  scripts/testbed.sh up
  eval "$(scripts/testbed.sh env)"
  # A test run that was killed (timeout, ^C) never ran its drop guards: drop the slots and publications
  # of test processes that are gone (names end in _<pid>, see tests/support), as an idle slot holds WAL.
  "$CDCD_TEST_PG_BIN/psql" "$CDCD_TEST_PG" -qAtX -c "select slot_name from pg_replication_slots where not active
      union select pubname from pg_publication" | while read -r name; do
    pid=${name##*_}
    case $pid in ''|*[!0-9]*) continue;; esac
    [ -d "/proc/$pid" ] && continue
    echo "dropping leftover $name of a test run that is gone"
    "$CDCD_TEST_PG_BIN/psql" "$CDCD_TEST_PG" -qAtX -c "select pg_drop_replication_slot(slot_name) from pg_replication_slots
        where slot_name = '$name' and not active" -c "drop publication if exists \"$name\"" >/dev/null || true
  done
else
  echo "CDCD_NO_TESTBED=1: the tests use the servers the CDCD_TEST_* variables name"
fi

step "build"
scripts/toolchain.sh                      # Rust at Cargo.toml's rust-version, via rustup when missing
export PATH="$HOME/.cargo/bin:$PATH"
locked=()
[ -f Cargo.lock ] && locked=(--locked)
cargo build "${locked[@]}" --all-targets

step "test (--test-threads=$THREADS)"
# The end-to-end tests in one binary run in parallel (each has its own slot, publication, tables and
# warehouse); the binaries run one after another. The timeout stops a hung test from holding CI.
set +e
timeout --kill-after=30 "${CDCD_TEST_TIMEOUT:-2700}" \
  cargo test "${locked[@]}" --all-targets --no-fail-fast -- --test-threads="$THREADS" "$@" 2>&1 | tee "$LOG_DIR/test.log"
rc=${PIPESTATUS[0]}
if [ "$rc" = 0 ] && [ "${CDCD_NO_TESTBED:-0}" != 1 ] && [ $# = 0 ]; then
  # The end-to-end tests once more with Iceberg equality deletes (format v2) instead of the
  # default deletion vectors, so both delete modes are proven against the real server and DuckDB.
  step "end-to-end tests with delete_mode = equality"
  CDCD_TEST_DELETE_MODE=equality timeout --kill-after=30 "${CDCD_TEST_TIMEOUT:-2700}" \
    cargo test "${locked[@]}" --test e2e --no-fail-fast -- --test-threads="$THREADS" \
    postgres::replication:: postgres::crash::kill_dash_nine_at_random_moments_iceberg postgres::lifecycle:: postgres::ddl:: \
    postgres::keyless:: postgres::schema_evolution::add_column_with_a_constant_default \
    postgres::schema_evolution::rename_column_with_the_ddl_trigger_iceberg \
    postgres::resync::a_resync_replaces_a_damaged_table_while_the_others_stream \
    postgres::resync::crashes_around_an_online_resyncs_end_recover_equal catalog::rest:: \
    postgres::maintenance::a_paused_compaction_lets_commits_through_and_carries_their_deletes \
    postgres::maintenance::kill_dash_nine_at_random_moments_of_compaction 2>&1 | tee -a "$LOG_DIR/test.log"
  rc=${PIPESTATUS[0]}
fi
set -e

step "summary ($(elapsed))"
awk '/^ *Running /{bin=$0; sub(/^ *Running /, "", bin); sub(/ \(.*$/, "", bin)} /^test result:/{sub(/^test result: /, ""); print "  " bin ": " $0}' "$LOG_DIR/test.log"
failed=$(sed -nE 's/^test (.*) \.\.\. FAILED$/\1/p' "$LOG_DIR/test.log")
if [ "$rc" != 0 ]; then
  [ "$rc" = 124 ] && echo "  timed out after ${CDCD_TEST_TIMEOUT:-2700}s"
  if [ -n "$failed" ]; then echo "  FAILED:"; printf '    %s\n' $failed; fi
  echo "FAIL (cargo test exit $rc; full log $LOG_DIR/test.log)"
  exit "$rc"
fi
echo "PASS ($(elapsed))"
