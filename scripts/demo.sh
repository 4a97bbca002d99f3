#!/usr/bin/env bash
# The quick start: a local Postgres with sample data, cdcd replicating it into Iceberg tables in a
# local warehouse directory (the embedded default), and DuckDB reading those tables back.
#
# On a fresh Debian 12 machine, as root. Installs what is missing: a Rust toolchain (rustup) and,
# through scripts/testbed.sh, Postgres 15 and a Python venv with DuckDB and its Iceberg extension.
# Idempotent: every run starts the demo over (its database, slot, publication and warehouse).
#
#   scripts/demo.sh            run it: copy the sample tables, stream live changes, query, stop
#   scripts/demo.sh clean      drop the demo's database, slot and publication, delete target/demo
#
# What it leaves: target/demo/ (pipeline.toml, warehouse/, cdcd.log, query.sh). cdcd is stopped and
# its replication slot dropped at the end, because an unused slot makes Postgres keep WAL forever.
# Env: DEMO_DIR (default target/demo), DEMO_TIMEOUT (seconds to wait for cdcd, default 300), and
# testbed.sh's CDCD_TB and PG_PORT.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DIR=${DEMO_DIR:-$ROOT/target/demo}
TIMEOUT=${DEMO_TIMEOUT:-300}
# The demo's own names, apart from the tests': pipeline "demo" means slot and publication cdcd_demo.
PIPELINE=demo
SLOT=cdcd_demo
DB=cdcd_demo

log() { printf '\n[demo %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { printf '[demo] ERROR: %s\n' "$*" >&2; exit 1; }

# ------------------------------------------------------------------ Postgres and the readers
testbed_up() {
  export CDCD_TB_COMPONENTS="postgres python"
  scripts/testbed.sh up
  eval "$(scripts/testbed.sh env)"
  PSQL=("$CDCD_TEST_PG_BIN/psql" -qAtX -v ON_ERROR_STOP=1)
  SERVER=${CDCD_TEST_PG%/*}          # postgres://postgres@127.0.0.1:55440
  DEMO_URL=$SERVER/$DB
}

# Stops a cdcd an interrupted demo left running, then drops the demo's slot (a slot lives in its
# database, which cannot be dropped while the slot exists). Publications go with the database.
stop_cdcd() {
  local pid
  pid=$(cat "$DIR/cdcd.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && grep -q cdcd "/proc/$pid/cmdline" 2>/dev/null; then
    log "stopping cdcd (pid $pid): SIGTERM commits what is buffered"
    kill -TERM "$pid"
    local i; for i in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && die "cdcd (pid $pid) did not stop within 60 s; see $DIR/cdcd.log"
  fi
  rm -f "$DIR/cdcd.pid"
}
drop_slot() {
  local i
  for i in $(seq 50); do
    "${PSQL[@]}" "$SERVER/postgres" -c "select pg_drop_replication_slot(slot_name) from pg_replication_slots
        where slot_name = '$SLOT' and not active" >/dev/null
    [ -z "$("${PSQL[@]}" "$SERVER/postgres" -c "select 1 from pg_replication_slots where slot_name = '$SLOT'")" ] && return 0
    sleep 0.2   # the walsender of a process that just exited may still hold it for a moment
  done
  die "replication slot $SLOT is still in use; drop it with: select pg_drop_replication_slot('$SLOT')"
}
reset() {
  stop_cdcd
  drop_slot
  "${PSQL[@]}" "$SERVER/postgres" -c "drop database if exists $DB with (force)"
  rm -rf "$DIR"
}

sample_data() {
  "${PSQL[@]}" "$SERVER/postgres" -c "create database $DB"
  "${PSQL[@]}" "$DEMO_URL" <<'EOF'
create schema shop;
create table shop.customers (
  id int primary key, name text not null, email text, country char(2), signed_up timestamptz not null);
create table shop.orders (
  id bigint primary key, customer_id int not null, amount numeric(10,2) not null,
  status text not null, items jsonb, placed_at timestamptz not null);
insert into shop.customers
  select i, 'customer ' || i, 'c' || i || '@example.com', (array['DE','FR','US','JP','BR'])[1 + i % 5],
         timestamptz '2024-01-01 00:00:00+00' + i * interval '1 hour'
  from generate_series(1, 1000) i;
insert into shop.orders
  select i, 1 + (i * 7) % 1000, round((5 + (i * 37) % 500 + (i % 100) / 100.0)::numeric, 2),
         (array['placed','paid','shipped','delivered'])[1 + i % 4],
         jsonb_build_object('sku', 'SKU-' || (i % 97), 'qty', 1 + i % 3),
         timestamptz '2024-06-01 00:00:00+00' + i * interval '5 minutes'
  from generate_series(1, 10000) i;
EOF
}

# Changes made while cdcd streams: an insert, updates, a key change and deletes in one transaction.
live_changes() {
  "${PSQL[@]}" "$DEMO_URL" <<'EOF'
begin;
insert into shop.orders
  select i, 1 + i % 1000, 19.99, 'placed', '{"sku": "SKU-NEW", "qty": 1}', now() from generate_series(10001, 10500) i;
update shop.orders set status = 'refunded', amount = 0 where id % 100 = 0;
update shop.customers set email = null where id <= 10;
update shop.customers set id = 5000 where id = 1000;
delete from shop.orders where id between 20 and 29;
commit;
EOF
}

# The position Postgres has confirmed cdcd durably holds (the slot's confirmed_flush_lsn).
confirmed_past() {
  [ "$("${PSQL[@]}" "$SERVER/postgres" -c "select confirmed_flush_lsn >= '$1'::pg_lsn
      from pg_replication_slots where slot_name = '$SLOT'")" = t ]
}

# Every captured table has a complete checkpoint: its initial copy is committed.
copied() {
  local status
  status=$("$BIN" status --config "$DIR/pipeline.toml" --json 2>/dev/null) || return 1
  "$CDCD_TEST_PYTHON" -c 'import json, sys
rows = json.loads(sys.stdin.read())
sys.exit(0 if len(rows) == 2 and all(r["position"] not in (None, "0/0") for r in rows) else 1)' <<<"$status"
}

wait_for() {   # wait_for <what> <command…>
  local what=$1 start=$SECONDS; shift
  until "$@"; do
    kill -0 "$(cat "$DIR/cdcd.pid")" 2>/dev/null || { tail -20 "$DIR/cdcd.log" >&2; die "cdcd stopped (above; $DIR/cdcd.log)"; }
    [ $((SECONDS - start)) -lt "$TIMEOUT" ] || { tail -20 "$DIR/cdcd.log" >&2; die "no $what after ${TIMEOUT}s"; }
    sleep 0.5
  done
}

write_query_script() {
  cat > "$DIR/query.py" <<EOF
"""Reads the demo's Iceberg tables with DuckDB, without cdcd: query.sh ["SQL over customers, orders"]"""
import os, sys
sys.path.insert(0, "$CDCD_TB")
from duck_load import connect
warehouse = "$DIR/warehouse/shop"
con = connect()
for table in sorted(os.listdir(warehouse)):
    metadata = os.path.join(warehouse, table, "metadata")
    with open(os.path.join(metadata, "version-hint.text")) as f:
        newest = os.path.join(metadata, "v%s.metadata.json" % f.read().strip())
    con.sql("create view %s as select * from iceberg_scan('%s')" % (table, newest))
sql = sys.argv[1] if len(sys.argv) > 1 else \
    "select status, count(*) as orders, sum(amount) as amount from orders group by status order by status"
con.sql(sql).show(max_rows=40)
EOF
  printf '#!/bin/sh\nexec "%s" "%s" "$@"\n' "$CDCD_TEST_PYTHON" "$DIR/query.py" > "$DIR/query.sh"
  chmod +x "$DIR/query.sh"
}


# ------------------------------------------------------------------ main
case "${1:-run}" in
  clean)
    testbed_up
    reset
    log "demo removed: database $DB, slot $SLOT, $DIR"
    exit 0;;
  run) ;;
  *) echo "usage: $0 [run|clean]" >&2; exit 2;;
esac

[ "$(id -u)" = 0 ] || die "run as root (apt-get, and su to postgres to start the server)"
log "toolchain and test bed (first run: a few minutes)"
scripts/toolchain.sh
export PATH="$HOME/.cargo/bin:$PATH"
testbed_up
reset
mkdir -p "$DIR"

log "sample data: database $DB, tables shop.customers (1,000 rows) and shop.orders (10,000 rows)"
sample_data

log "building cdcd (cargo build --bin cdcd; the first build takes several minutes)"
cargo build --locked --bin cdcd
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/debug/cdcd

cat > "$DIR/pipeline.toml" <<EOF
# The demo's pipeline (scripts/demo.sh). Slot and publication: cdcd_$PIPELINE.
[pipeline]
name = "$PIPELINE"
commit_interval_ms = 500

[source]
kind = "postgres"
url = "$DEMO_URL"
tables = ["shop.*"]
heartbeat_interval_ms = 1000     # so the slot's confirmed position catches up quickly

[sink]
kind = "iceberg"
warehouse = "$DIR/warehouse"
EOF

log "cdcd check --config $DIR/pipeline.toml"
"$BIN" check --config "$DIR/pipeline.toml" || die "cdcd check found problems (above)"

log "starting cdcd: initial copy, then streaming (log: $DIR/cdcd.log)"
trap 'stop_cdcd; drop_slot' EXIT
trap 'exit 130' INT TERM   # so an interrupted demo, too, stops cdcd and drops the slot
"$BIN" --config "$DIR/pipeline.toml" >"$DIR/cdcd.log" 2>&1 &
echo $! > "$DIR/cdcd.pid"
wait_for "completed initial copy" copied

log "live changes while cdcd streams: 500 inserts, 100 updates, a key change, 10 deletes"
live_changes
target=$("${PSQL[@]}" "$DEMO_URL" -c "select pg_current_wal_lsn()")
wait_for "confirmation of $target" confirmed_past "$target"
"$BIN" status --config "$DIR/pipeline.toml"

stop_cdcd
drop_slot
trap - EXIT

log "the Iceberg tables against the source, row for row (tests/support/lakecheck.py reads them with DuckDB)"
for t in customers orders; do
  "$CDCD_TEST_PYTHON" tests/support/lakecheck.py --source "$DEMO_URL" --source-table "shop.$t" \
    --iceberg "$DIR/warehouse/shop/$t" | tail -1 || die "shop.$t differs from its Iceberg table (above)"
done

write_query_script
log "a query over the Iceberg tables (DuckDB, without cdcd): $DIR/query.sh"
"$DIR/query.sh"

cat <<EOF

Done. The tables are Iceberg tables in $DIR/warehouse:
  $DIR/warehouse/shop/customers/metadata/v<N>.metadata.json   (+ data/)
  $DIR/warehouse/shop/orders/metadata/v<N>.metadata.json
Query them again (DuckDB):   $DIR/query.sh "select * from orders order by id desc limit 5"
The pipeline's config:       $DIR/pipeline.toml   (run it: $BIN --config $DIR/pipeline.toml)
cdcd was stopped and its slot $SLOT dropped; running it again copies the tables afresh.
Remove everything:           scripts/demo.sh clean
EOF
