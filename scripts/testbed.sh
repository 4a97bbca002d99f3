#!/usr/bin/env bash
# cdcd's test bed: the servers and independent lake readers its integration tests need, on one fresh
# Debian 12 machine, as root. Idempotent: re-running does only what is not done or not running.
#
#   scripts/testbed.sh [up]   install what is missing, start what is not running (first run ~5 min with Spark)
#   scripts/testbed.sh env    print `export CDCD_TEST_…=…` lines for the tests:  eval "$(scripts/testbed.sh env)"
#   scripts/testbed.sh stop   stop the servers this script started
#
# Env: CDCD_TB (default /tmp/cdcd-tb: data, logs, venv), PG_PORT (default 55440), PG_TLS_PORT (default 55441),
# MY_PORT (default 53316), MY_TLS_PORT (default 53317), MOTO_PORT (default 59010), MOTO_SERIAL_PORT (default
# 59011), MOTO_TLS_PORT (default 59012), CDCD_TB_COMPONENTS (default all: "postgres python mariadb moto pgtls
# mytls mototls rustberg spark"; scripts/demo.sh asks for "postgres python" only).
#
# Components are functions named <name>_apt / <name>_up / <name>_stop / <name>_env, listed in COMPONENTS.
set -euo pipefail

CDCD_TB=${CDCD_TB:-/tmp/cdcd-tb}
PG_PORT=${PG_PORT:-55440}
PG_TLS_PORT=${PG_TLS_PORT:-55441}
MOTO_PORT=${MOTO_PORT:-59010}
MOTO_SERIAL_PORT=${MOTO_SERIAL_PORT:-59011}
MOTO_TLS_PORT=${MOTO_TLS_PORT:-59012}
MY_PORT=${MY_PORT:-53316}
MY_TLS_PORT=${MY_TLS_PORT:-53317}
PG_DB=cdcd_test
PGBIN=/usr/lib/postgresql/15/bin
VENV=$CDCD_TB/venv
PY=$VENV/bin/python
RUN=$CDCD_TB/run
LOGS=$CDCD_TB/logs
read -ra COMPONENTS <<< "${CDCD_TB_COMPONENTS:-postgres python mariadb moto pgtls mytls mototls rustberg spark}"

log() { printf '[testbed %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# pid_runs FILE WORD: the process named in FILE is alive and its command line holds WORD. A pid file left in
# /tmp by an earlier boot may name a pid the kernel has since given to another program: alive, but not ours.
pid_runs() { [ -f "$1" ] && tr '\0' ' ' 2>/dev/null <"/proc/$(cat "$1")/cmdline" | grep -q -- "$2"; }

# ------------------------------------------------------------------ Debian packages
# Collects what every component needs, then one apt-get update + install, only when something is missing.
APT_NEED=()
apt_want() { local p; for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || APT_NEED+=("$p"); done; }
apt_install() {
  [ ${#APT_NEED[@]} -eq 0 ] && return 0
  log "apt-get install ${APT_NEED[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${APT_NEED[@]}" >/dev/null
}

# ------------------------------------------------------------------ python: the lake readers lakecheck.py uses
python_apt() { apt_want python3-venv ca-certificates; }
python_up() {
  # Pinned, verified to resolve together (DuckDB must stay at 1.5.5: the offline extension wheels stop there
  # and are version-locked; autoinstall would need the network). pytz: DuckDB's Python client imports it to
  # return timestamptz values, and nothing else here pulls it in. sqlalchemy: pyiceberg's SqlCatalog
  # (the SQL catalog tests read cdcd's tables back through it).
  local req=$CDCD_TB/requirements.txt
  cat > "$req.new" <<'EOF'
duckdb==1.5.5
duckdb-extensions==1.5.5
duckdb-extension-iceberg==1.5.5
duckdb-extension-avro==1.5.5
duckdb-extension-httpfs==1.5.5
pyiceberg[pyarrow]==0.12.0
pyarrow==19.0.1
psycopg2-binary==2.9.13
sqlalchemy==2.0.43
pytz==2026.6
pypaimon==2.1.0
pymysql==1.2.4
moto[server]==5.2.5
boto3==1.44.8
EOF
  # Debian's own python3 (python3-venv belongs to it), not whatever `python3` a PATH shim points at.
  local base=/usr/bin/python3
  [ -x $base ] || base=$(command -v python3)
  if [ ! -x "$PY" ]; then
    log "creating venv $VENV"
    "$base" -m venv "$VENV"
    "$VENV/bin/pip" install -q -U pip
  fi
  if ! cmp -s "$req.new" "$req" || [ ! -f "$VENV/.req-ok" ]; then
    log "pip install -r $req"
    rm -f "$VENV/.req-ok"
    "$VENV/bin/pip" install -q -r "$req.new"
    mv "$req.new" "$req"
    touch "$VENV/.req-ok"
  else
    rm -f "$req.new"
  fi
  # Offline DuckDB with iceberg+avro+httpfs installed from the PyPI extension wheels: iceberg alone fails
  # asking for avro, and INSTALL from the network is not available in CI.
  cat > "$CDCD_TB/duck_load.py" <<'EOF'
import duckdb, os, time
def connect(database=":memory:", extension_directory=None):
    """Offline DuckDB with iceberg+avro+httpfs installed from PyPI wheels (no network). duckdb must be 1.5.5."""
    ext = extension_directory or os.path.join(os.path.dirname(os.path.abspath(__file__)), "duckdb_ext")
    con = duckdb.connect(database, config={"autoinstall_known_extensions": False, "autoload_known_extensions": True,
                                           "extension_directory": ext})
    from duckdb_extensions import import_extension
    for e in ("avro", "httpfs", "iceberg"):
        import_extension(e, con=con)   # = INSTALL '<site-packages>/duckdb_extension_<e>/extensions/v1.5.5/<e>.duckdb_extension'
        con.sql(f"LOAD {e}")
    return con
if __name__ == "__main__":
    t = time.time(); con = connect(); print("loaded in %.2fs" % (time.time() - t))
    print(con.sql("select extension_name, extension_version, install_path from duckdb_extensions() where loaded and install_path like '/%'").fetchall())
EOF
  "$PY" "$CDCD_TB/duck_load.py" >/dev/null || die "DuckDB cannot load the iceberg extension from the wheels (see above)"
  "$PY" -c 'import pyiceberg, pyarrow, psycopg2, pytz, pypaimon, pymysql, boto3, sqlalchemy' || die "python readers do not import (see above)"
}
python_stop() { :; }
python_env() {
  echo "export CDCD_TEST_PYTHON=$PY"
  echo "export CDCD_TEST_DUCK_LOAD=$CDCD_TB/duck_load.py"
}

# ------------------------------------------------------------------ Postgres 15: logical replication source
PGDATA=$CDCD_TB/pg/data
as_pg() { su postgres -s /bin/sh -c "$*"; }
pg_running() { as_pg "$PGBIN/pg_ctl -D $PGDATA status" >/dev/null 2>&1; }
# e2fsprogs: chattr, which tests/postgres/many_tables.rs uses to make one table's commits fail.
# postgresql-15-postgis-3: the PostGIS extension tests/postgres/geometry.rs creates (CREATE EXTENSION postgis).
postgres_apt() { apt_want postgresql-15 postgresql-contrib postgresql-15-postgis-3 e2fsprogs; }
postgres_up() {
  if [ ! -f "$PGDATA/PG_VERSION" ]; then
    log "initdb $PGDATA"
    # initdb refuses to run as root; the postgres user (created by the Debian package) owns the cluster.
    mkdir -p "$CDCD_TB/pg"; chown postgres:postgres "$CDCD_TB/pg"
    as_pg "$PGBIN/initdb -D $PGDATA -U postgres --auth=trust -E UTF8 --locale=C.UTF-8" >"$LOGS/initdb.log" 2>&1 \
      || die "initdb failed: $(tail -3 "$LOGS/initdb.log")"
    # Trust on loopback only: the tests connect as postgres without a password. wal_level=logical is what
    # pgoutput needs; each test holds one slot and one walsender, and tests run in parallel.
    cat > "$PGDATA/pg_hba.conf" <<'EOF'
local   all             all                     trust
host    all             all     127.0.0.1/32    trust
host    replication     all     127.0.0.1/32    trust
EOF
    cat >> "$PGDATA/postgresql.conf" <<EOF
# --- cdcd test bed
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$RUN'
wal_level = logical
max_replication_slots = 40
max_wal_senders = 40
max_wal_size = 2GB
# A slot a killed test leaves behind holds WAL forever; past this it is invalidated instead of
# filling the disk (one leaked slot held 10 GB here). No test or bench retains nearly this much.
max_slot_wal_keep_size = 8GB
fsync = off
EOF
  fi
  if pg_running; then
    local port; port=$(sed -n 4p "$PGDATA/postmaster.pid" 2>/dev/null || true)
    [ "$port" = "$PG_PORT" ] || die "the test bed's postgres is running on port $port, not PG_PORT=$PG_PORT; run '$0 stop' first"
  else
    port_busy "$PG_PORT" && die "port $PG_PORT is in use by another program (another test bed?); set PG_PORT to a free port"
    log "starting postgres on 127.0.0.1:$PG_PORT"
    # -p: PG_PORT may differ from the one written at initdb time.
    as_pg "$PGBIN/pg_ctl -D $PGDATA -l $LOGS/pg.log -o '-p $PG_PORT' -w -t 60 start" >/dev/null \
      || die "postgres did not start: $(tail -5 "$LOGS/pg.log")"
  fi
  local psql="$PGBIN/psql -h 127.0.0.1 -p $PG_PORT -U postgres -qAtX"
  $psql -d postgres -c "select 1 from pg_database where datname='$PG_DB'" | grep -q 1 \
    || $psql -d postgres -c "create database $PG_DB" >/dev/null
  # One role must authenticate with SCRAM-SHA-256 (the startup tests; everything else is trust).
  # Added on every start, so a test bed made before this line gets it too.
  if ! grep -q '^host all cdcd_scram ' "$PGDATA/pg_hba.conf"; then
    { echo 'host all cdcd_scram 127.0.0.1/32 scram-sha-256'
      echo 'host replication cdcd_scram 127.0.0.1/32 scram-sha-256'
      cat "$PGDATA/pg_hba.conf"; } > "$PGDATA/pg_hba.conf.new"
    chown postgres:postgres "$PGDATA/pg_hba.conf.new"
    mv "$PGDATA/pg_hba.conf.new" "$PGDATA/pg_hba.conf"
    $psql -d postgres -c "select pg_reload_conf()" >/dev/null
  fi
}
postgres_stop() {
  if [ -f "$PGDATA/postmaster.pid" ]; then as_pg "$PGBIN/pg_ctl -D $PGDATA -m fast stop" >/dev/null || true; fi
}
postgres_env() {
  echo "export CDCD_TEST_PG=postgres://postgres@127.0.0.1:$PG_PORT/$PG_DB"
  echo "export CDCD_TEST_PG_BIN=$PGBIN"
}

# ------------------------------------------------------------------ moto: S3 stand-in (needs the python venv)
# Two servers: the threaded one (:MOTO_PORT) for ordinary S3 tests, and a serial one (:MOTO_SERIAL_PORT) that
# handles one request at a time. moto's conditional put (If-None-Match: *, If-Match) is check-then-act without
# a lock, so only the serial server makes it atomic: commit-race and fencing tests must use it.
# moto keeps objects in memory; any key/secret, region us-east-1, path-style; tests create their buckets.
moto_alive() { pid_runs "$RUN/$1.pid" moto; }
moto_apt() { apt_want curl; }
moto_up() {
  cat > "$CDCD_TB/moto_serial.py" <<'EOF'
"""moto S3 server handling one request at a time (threaded=False), so that its check-then-put
conditional writes (If-None-Match / If-Match) behave atomically. Usage: moto_serial.py HOST PORT"""
import sys
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
run_simple(sys.argv[1], int(sys.argv[2]), DomainDispatcherApplication(create_backend_app), threaded=False, use_reloader=False)
EOF
  if ! moto_alive moto; then
    port_busy "$MOTO_PORT" && die "port $MOTO_PORT is in use by another program; set MOTO_PORT"
    log "starting moto on 127.0.0.1:$MOTO_PORT"
    nohup "$VENV/bin/moto_server" -H 127.0.0.1 -p "$MOTO_PORT" >"$LOGS/moto.log" 2>&1 &
    echo $! > "$RUN/moto.pid"
  fi
  if ! moto_alive moto_serial; then
    port_busy "$MOTO_SERIAL_PORT" && die "port $MOTO_SERIAL_PORT is in use by another program; set MOTO_SERIAL_PORT"
    log "starting serial moto on 127.0.0.1:$MOTO_SERIAL_PORT"
    nohup "$PY" "$CDCD_TB/moto_serial.py" 127.0.0.1 "$MOTO_SERIAL_PORT" >"$LOGS/moto_serial.log" 2>&1 &
    echo $! > "$RUN/moto_serial.pid"
  fi
  local port
  for port in "$MOTO_PORT" "$MOTO_SERIAL_PORT"; do
    for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
    curl -s -o /dev/null "http://127.0.0.1:$port/" || die "moto on :$port did not start (see $LOGS)"
  done
}
moto_stop() {
  local p
  for p in moto moto_serial; do
    if moto_alive $p; then kill "$(cat "$RUN/$p.pid")" || true; fi
    rm -f "$RUN/$p.pid"
  done
}
moto_env() {
  echo "export CDCD_TEST_S3=http://127.0.0.1:$MOTO_PORT"
  echo "export CDCD_TEST_S3_SERIAL=http://127.0.0.1:$MOTO_SERIAL_PORT"
}
# ------------------------------------------------------------------ MariaDB 10.11: binlog source
MYDIR=$CDCD_TB/mysql
MYCNF=$MYDIR/my.cnf
my_running() { mariadb-admin --defaults-file="$MYCNF" -uroot ping >/dev/null 2>&1; }
mariadb_apt() { apt_want mariadb-server mariadb-client; }
mariadb_up() {
  mkdir -p "$MYDIR/binlog"
  # Row events with FULL images and FULL row metadata (column names in TABLE_MAP) are what cdcd expects by
  # default; tests switch binlog_row_image per session. As root, mariadbd needs user=mysql. With
  # skip-name-resolve, TCP logins match 'user'@'127.0.0.1'.
  cat > "$MYCNF" <<EOF
[mariadbd]
datadir=$MYDIR/data
socket=$RUN/mysqld.sock
pid-file=$RUN/mysqld.pid
bind-address=127.0.0.1
port=$MY_PORT
user=mysql
log_error=$LOGS/mariadb.err
server_id=1
log_bin=$MYDIR/binlog/mariadb-bin
binlog_format=ROW
binlog_row_image=FULL
binlog_row_metadata=FULL
max_binlog_size=256M
innodb_buffer_pool_size=256M
innodb_flush_log_at_trx_commit=2
max_connections=300
skip-name-resolve
character-set-server=utf8mb4
collation-server=utf8mb4_general_ci
[client]
socket=$RUN/mysqld.sock
port=$MY_PORT
EOF
  chown -R mysql:mysql "$MYDIR"
  if [ ! -d "$MYDIR/data/mysql" ]; then
    log "mariadb-install-db $MYDIR/data"
    mariadb-install-db --defaults-file="$MYCNF" --user=mysql --auth-root-authentication-method=normal \
      --skip-test-db >"$LOGS/mariadb-install.log" 2>&1 || die "mariadb-install-db failed: $(tail -3 "$LOGS/mariadb-install.log")"
  fi
  if ! my_running; then
    port_busy "$MY_PORT" && die "port $MY_PORT is in use by another program (another test bed?); set MY_PORT"
    log "starting mariadbd on 127.0.0.1:$MY_PORT"
    nohup mariadbd --defaults-file="$MYCNF" >"$LOGS/mariadbd.out" 2>&1 &
    local i; for i in $(seq 150); do my_running && break; sleep 0.2; done
    my_running || die "mariadbd did not start: $(tail -5 "$LOGS/mariadb.err")"
  fi
  # cdc: what tests use to write and replicate; cdc_ro: the least privileges cdcd needs.
  mariadb --defaults-file="$MYCNF" -uroot <<'EOF'
create database if not exists cdcd_test;
create user if not exists 'cdc'@'127.0.0.1' identified by 'cdcpw';
create user if not exists 'cdc'@'localhost' identified by 'cdcpw';
grant all on *.* to 'cdc'@'127.0.0.1' with grant option;
grant all on *.* to 'cdc'@'localhost' with grant option;
create user if not exists 'cdc_ro'@'127.0.0.1' identified by 'cdcpw';
grant select, replication slave, binlog monitor, replication client on *.* to 'cdc_ro'@'127.0.0.1';
EOF
}
mariadb_stop() {
  if my_running; then mariadb-admin --defaults-file="$MYCNF" -uroot shutdown >/dev/null 2>&1 || true; fi
}
mariadb_env() {
  echo "export CDCD_TEST_MYSQL=mysql://cdc:cdcpw@127.0.0.1:$MY_PORT/cdcd_test"
  echo "export CDCD_TEST_MYSQL_CNF=$MYCNF"
}

# ------------------------------------------------------------------ Postgres 15 with TLS: a second cluster
# ssl = on with a CA and certificates made here by openssl (server: DNS:localhost, IP:127.0.0.1 only, so a
# connection to 127.0.0.2, where it also listens, is a host name mismatch), and one role per way in:
#   cdcd_tls   hostssl only, scram-sha-256, password cdcd-tls-pw (a plain connection finds no pg_hba line)
#   cdcd_md5   host (TLS or not), md5, password cdcd-md5-pw (stored as an md5 hash)
#   cdcd_cert  hostssl only, cert: the client certificate certs/client.crt (CN=cdcd_cert) with certs/client.key
#   postgres   host, trust: what the tests use to set up, clean up and read the source back
# certs/other-ca.crt is a CA that signed nothing here (the wrong-CA test). The roles are superusers: the
# tests' tables belong to postgres and cdcd must publish them.
PGTLS=$CDCD_TB/pgtls
PGTLS_DATA=$PGTLS/data
PGTLS_CERTS=$PGTLS/certs
pgtls_running() { as_pg "$PGBIN/pg_ctl -D $PGTLS_DATA status" >/dev/null 2>&1; }
pgtls_apt() { apt_want postgresql-15 openssl; }
# The test CA and its certificates, shared by pgtls and mytls (under pgtls/certs, where the first test beds
# have them). Owned by root; each server copies or chowns the key it reads.
tb_certs() {
  [ -f "$PGTLS_CERTS/client.crt" ] && return 0
  log "making the TLS test certificates in $PGTLS_CERTS"
  rm -rf "$PGTLS_CERTS"; mkdir -p "$PGTLS_CERTS"
  local c=$PGTLS_CERTS
  openssl req -x509 -new -newkey rsa:2048 -nodes -days 3650 -subj "/CN=cdcd test CA" \
    -keyout "$c/ca.key" -out "$c/ca.crt" 2>/dev/null
  openssl req -x509 -new -newkey rsa:2048 -nodes -days 3650 -subj "/CN=cdcd other CA" \
    -keyout "$c/other-ca.key" -out "$c/other-ca.crt" 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' > "$c/server.ext"
  openssl req -new -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout "$c/server.key" -out "$c/server.csr" 2>/dev/null
  openssl x509 -req -in "$c/server.csr" -CA "$c/ca.crt" -CAkey "$c/ca.key" -CAcreateserial -days 3650 \
    -extfile "$c/server.ext" -out "$c/server.crt" 2>/dev/null
  printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n' > "$c/client.ext"
  openssl req -new -newkey rsa:2048 -nodes -subj "/CN=cdcd_cert" -keyout "$c/client.key" -out "$c/client.csr" 2>/dev/null
  openssl x509 -req -in "$c/client.csr" -CA "$c/ca.crt" -CAkey "$c/ca.key" -CAcreateserial -days 3650 \
    -extfile "$c/client.ext" -out "$c/client.crt" 2>/dev/null
  { [ -s "$c/client.crt" ] && [ -s "$c/server.crt" ]; } || die "openssl did not make the test certificates"
  chmod 600 "$c"/*.key
  chmod 755 "$c"
}
pgtls_certs() {
  tb_certs
  chown postgres:postgres "$PGTLS_CERTS/server.key"   # postgres refuses a key file that others can read or it does not own
}
pgtls_up() {
  mkdir -p "$PGTLS"; chown postgres:postgres "$PGTLS"
  pgtls_certs
  if [ ! -f "$PGTLS_DATA/PG_VERSION" ]; then
    log "initdb $PGTLS_DATA (TLS)"
    as_pg "$PGBIN/initdb -D $PGTLS_DATA -U postgres --auth=trust -E UTF8 --locale=C.UTF-8" >"$LOGS/initdb-tls.log" 2>&1 \
      || die "initdb failed: $(tail -3 "$LOGS/initdb-tls.log")"
    cat >> "$PGTLS_DATA/postgresql.conf" <<EOF
# --- cdcd test bed (TLS)
listen_addresses = '127.0.0.1,127.0.0.2'
port = $PG_TLS_PORT
unix_socket_directories = '$RUN'
wal_level = logical
max_replication_slots = 20
max_wal_senders = 20
max_slot_wal_keep_size = 2GB
fsync = off
ssl = on
ssl_cert_file = '$PGTLS_CERTS/server.crt'
ssl_key_file = '$PGTLS_CERTS/server.key'
ssl_ca_file = '$PGTLS_CERTS/ca.crt'
EOF
  fi
  cat > "$PGTLS_DATA/pg_hba.conf" <<'EOF'
local     all          all                      trust
hostssl   all          cdcd_tls   127.0.0.0/8   scram-sha-256
hostssl   replication  cdcd_tls   127.0.0.0/8   scram-sha-256
host      all          cdcd_md5   127.0.0.0/8   md5
host      replication  cdcd_md5   127.0.0.0/8   md5
hostssl   all          cdcd_cert  127.0.0.0/8   cert
hostssl   replication  cdcd_cert  127.0.0.0/8   cert
host      all          postgres   127.0.0.0/8   trust
host      replication  postgres   127.0.0.0/8   trust
EOF
  chown postgres:postgres "$PGTLS_DATA/pg_hba.conf"
  if pgtls_running; then
    as_pg "$PGBIN/pg_ctl -D $PGTLS_DATA reload" >/dev/null
  else
    port_busy "$PG_TLS_PORT" && die "port $PG_TLS_PORT is in use by another program; set PG_TLS_PORT to a free port"
    log "starting postgres (TLS) on 127.0.0.1:$PG_TLS_PORT"
    as_pg "$PGBIN/pg_ctl -D $PGTLS_DATA -l $LOGS/pg-tls.log -o '-p $PG_TLS_PORT' -w -t 60 start" >/dev/null \
      || die "postgres (TLS) did not start: $(tail -5 "$LOGS/pg-tls.log")"
  fi
  local psql="$PGBIN/psql -h 127.0.0.1 -p $PG_TLS_PORT -U postgres -qAtX"
  $psql -d postgres -c "select 1 from pg_database where datname='$PG_DB'" | grep -q 1 \
    || $psql -d postgres -c "create database $PG_DB" >/dev/null
  # password_encryption decides how CREATE ROLE stores a password: md5 for cdcd_md5, so that md5
  # authentication can check it.
  $psql -d postgres >/dev/null <<'EOF'
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'cdcd_tls') THEN
    SET LOCAL password_encryption = 'scram-sha-256';
    CREATE ROLE cdcd_tls LOGIN SUPERUSER REPLICATION PASSWORD 'cdcd-tls-pw';
  END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'cdcd_md5') THEN
    SET LOCAL password_encryption = 'md5';
    CREATE ROLE cdcd_md5 LOGIN SUPERUSER REPLICATION PASSWORD 'cdcd-md5-pw';
  END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'cdcd_cert') THEN
    CREATE ROLE cdcd_cert LOGIN SUPERUSER REPLICATION;
  END IF;
END $$;
EOF
}
pgtls_stop() {
  if [ -f "$PGTLS_DATA/postmaster.pid" ]; then as_pg "$PGBIN/pg_ctl -D $PGTLS_DATA -m fast stop" >/dev/null || true; fi
}
pgtls_env() {
  echo "export CDCD_TEST_PG_TLS=postgres://postgres@127.0.0.1:$PG_TLS_PORT/$PG_DB"
  echo "export CDCD_TEST_PG_TLS_CA=$PGTLS_CERTS/ca.crt"
  echo "export CDCD_TEST_PG_TLS_DIR=$PGTLS_CERTS"
}

# ------------------------------------------------------------------ MariaDB 10.11 with TLS: a second server
# ssl_cert/ssl_key/ssl_ca from the test CA above (server certificate: DNS:localhost, IP:127.0.0.1 only; the
# server also listens on 127.0.0.2, a name the certificate lacks), binlog as the mariadb component, and
# performance_schema on (status_by_thread shows each connection's Ssl_version). Accounts, all at 127.0.0.%:
#   cdc       password cdcpw, TLS or not: what the tests set up with, and lakecheck reads the source back with
#   cdc_tls   password cdc-tls-pw, REQUIRE SSL (a plain login is refused)
#   cdc_x509  password cdc-x509-pw, REQUIRE X509: also needs a client certificate the CA signed (client.crt)
#   cdc_ed    MariaDB's ed25519 authentication, password cdc-ed-pw, TLS or not
#   root      through the socket only
MYTLS=$CDCD_TB/mytls
MYTLS_CNF=$MYTLS/my.cnf
mytls_running() { mariadb-admin --defaults-file="$MYTLS_CNF" -uroot ping >/dev/null 2>&1; }
mytls_apt() { apt_want mariadb-server mariadb-client openssl; }
mytls_up() {
  tb_certs
  mkdir -p "$MYTLS/binlog" "$MYTLS/certs"
  local f
  for f in ca.crt server.crt server.key; do
    cmp -s "$PGTLS_CERTS/$f" "$MYTLS/certs/$f" || cp "$PGTLS_CERTS/$f" "$MYTLS/certs/$f"
  done
  cat > "$MYTLS_CNF" <<EOF
[mariadbd]
datadir=$MYTLS/data
socket=$RUN/mytls.sock
pid-file=$RUN/mytls.pid
bind-address=127.0.0.1,127.0.0.2
port=$MY_TLS_PORT
user=mysql
log_error=$LOGS/mariadb-tls.err
server_id=1
log_bin=$MYTLS/binlog/mariadb-bin
binlog_format=ROW
binlog_row_image=FULL
binlog_row_metadata=FULL
innodb_buffer_pool_size=64M
innodb_flush_log_at_trx_commit=2
performance_schema=ON
skip-name-resolve
character-set-server=utf8mb4
collation-server=utf8mb4_general_ci
ssl_cert=$MYTLS/certs/server.crt
ssl_key=$MYTLS/certs/server.key
ssl_ca=$MYTLS/certs/ca.crt
plugin_load_add=auth_ed25519
[client]
socket=$RUN/mytls.sock
port=$MY_TLS_PORT
EOF
  chown -R mysql:mysql "$MYTLS"
  chmod 600 "$MYTLS/certs/server.key"
  if [ ! -d "$MYTLS/data/mysql" ]; then
    log "mariadb-install-db $MYTLS/data (TLS)"
    mariadb-install-db --defaults-file="$MYTLS_CNF" --user=mysql --auth-root-authentication-method=normal \
      --skip-test-db >"$LOGS/mariadb-tls-install.log" 2>&1 || die "mariadb-install-db failed: $(tail -3 "$LOGS/mariadb-tls-install.log")"
  fi
  if ! mytls_running; then
    port_busy "$MY_TLS_PORT" && die "port $MY_TLS_PORT is in use by another program; set MY_TLS_PORT"
    log "starting mariadbd (TLS) on 127.0.0.1:$MY_TLS_PORT"
    nohup mariadbd --defaults-file="$MYTLS_CNF" >"$LOGS/mariadbd-tls.out" 2>&1 &
    local i; for i in $(seq 150); do mytls_running && break; sleep 0.2; done
    mytls_running || die "mariadbd (TLS) did not start: $(tail -5 "$LOGS/mariadb-tls.err")"
  fi
  mariadb --defaults-file="$MYTLS_CNF" -uroot <<'EOF'
create database if not exists cdcd_test;
create user if not exists 'cdc'@'127.0.0.%' identified by 'cdcpw';
grant all on *.* to 'cdc'@'127.0.0.%' with grant option;
create user if not exists 'cdc_tls'@'127.0.0.%' identified by 'cdc-tls-pw' require ssl;
grant all on *.* to 'cdc_tls'@'127.0.0.%';
create user if not exists 'cdc_x509'@'127.0.0.%' identified by 'cdc-x509-pw' require x509;
grant all on *.* to 'cdc_x509'@'127.0.0.%';
create user if not exists 'cdc_ed'@'127.0.0.%' identified via ed25519 using password('cdc-ed-pw');
grant all on *.* to 'cdc_ed'@'127.0.0.%';
EOF
}
mytls_stop() {
  if mytls_running; then mariadb-admin --defaults-file="$MYTLS_CNF" -uroot shutdown >/dev/null 2>&1 || true; fi
}
mytls_env() {
  echo "export CDCD_TEST_MY_TLS=mysql://cdc:cdcpw@127.0.0.1:$MY_TLS_PORT/cdcd_test"
  echo "export CDCD_TEST_MY_TLS_CA=$MYTLS/certs/ca.crt"
  echo "export CDCD_TEST_MY_TLS_DIR=$PGTLS_CERTS"
}

# ------------------------------------------------------------------ moto over https: S3 with a private CA
# A third moto (threaded, as :MOTO_PORT) serving https on 127.0.0.1:MOTO_TLS_PORT with the test CA's server
# certificate (tb_certs above: DNS:localhost, IP:127.0.0.1), so the endpoint is https://localhost:PORT and a
# client needs the test CA (sink.s3.ca_file) to trust it. Needs the python venv.
MOTOTLS=$CDCD_TB/mototls
mototls_apt() { apt_want openssl curl; }
mototls_up() {
  tb_certs
  mkdir -p "$MOTOTLS"
  local f
  for f in ca.crt server.crt server.key; do
    cmp -s "$PGTLS_CERTS/$f" "$MOTOTLS/$f" || cp "$PGTLS_CERTS/$f" "$MOTOTLS/$f"
  done
  chmod 600 "$MOTOTLS/server.key"
  if ! moto_alive moto_tls; then
    port_busy "$MOTO_TLS_PORT" && die "port $MOTO_TLS_PORT is in use by another program; set MOTO_TLS_PORT"
    log "starting moto (https) on 127.0.0.1:$MOTO_TLS_PORT"
    nohup "$VENV/bin/moto_server" -H 127.0.0.1 -p "$MOTO_TLS_PORT" -c "$MOTOTLS/server.crt" -k "$MOTOTLS/server.key" \
      >"$LOGS/moto_tls.log" 2>&1 &
    echo $! > "$RUN/moto_tls.pid"
  fi
  for _ in $(seq 100); do curl -s -o /dev/null --cacert "$MOTOTLS/ca.crt" "https://localhost:$MOTO_TLS_PORT/" && break; sleep 0.1; done
  curl -s -o /dev/null --cacert "$MOTOTLS/ca.crt" "https://localhost:$MOTO_TLS_PORT/" \
    || die "moto (https) on :$MOTO_TLS_PORT did not start or its certificate does not verify (see $LOGS/moto_tls.log)"
}
mototls_stop() {
  if moto_alive moto_tls; then kill "$(cat "$RUN/moto_tls.pid")" || true; fi
  rm -f "$RUN/moto_tls.pid"
}
mototls_env() {
  echo "export CDCD_TEST_S3_TLS=https://localhost:$MOTO_TLS_PORT"
  echo "export CDCD_TEST_S3_TLS_CA=$MOTOTLS/ca.crt"
  echo "export CDCD_TEST_S3_TLS_OTHER_CA=$PGTLS_CERTS/other-ca.crt"
}

# ------------------------------------------------------------------ rustberg: an Iceberg REST catalog server
# rustberg 0.3.0 from crates.io (Apache-2.0), built once per machine: `cargo install` in the background, so
# cdcd's own build runs beside it; a debug build without debug info (its release profile is fat LTO with one
# codegen unit, several times slower to build, and the tests need no speed from it). The REST catalog tests
# (tests/catalog/rest.rs) start a server each, with its own catalog file and warehouse, and wait for
# $RUSTBERG_STATUS ("ok" or "failed") when the binary is not there yet.
RUSTBERG_ROOT=$CDCD_TB/rustberg
RUSTBERG=$RUSTBERG_ROOT/bin/rustberg
RUSTBERG_STATUS=$RUSTBERG_ROOT/build.status
rustberg_apt() { :; }
rustberg_up() {
  [ -x "$RUSTBERG" ] && return 0
  if pid_runs "$RUN/rustberg-build.pid" rustberg; then return 0; fi
  local cargo=cargo
  command -v cargo >/dev/null || cargo=$HOME/.cargo/bin/cargo
  mkdir -p "$RUSTBERG_ROOT"; rm -f "$RUSTBERG_STATUS"
  log "building rustberg 0.3.0 in the background (once per machine, ~15 min on 2 cores beside cdcd's build; $LOGS/rustberg-build.log)"
  CARGO_PROFILE_DEV_DEBUG=0 nohup bash -c "nice -n 5 '$cargo' install rustberg --version 0.3.0 --locked --debug \
      --no-default-features --features cli --root '$RUSTBERG_ROOT' && echo ok > '$RUSTBERG_STATUS' \
      || echo failed > '$RUSTBERG_STATUS'" >"$LOGS/rustberg-build.log" 2>&1 &
  echo $! > "$RUN/rustberg-build.pid"
}
rustberg_stop() { :; }
rustberg_env() {
  echo "export CDCD_TEST_RUSTBERG=$RUSTBERG"
  echo "export CDCD_TEST_RUSTBERG_STATUS=$RUSTBERG_STATUS"
}

# ------------------------------------------------------------------ spark: Iceberg-Java, the reference implementation
# pyspark 3.5.8 in the readers' venv, with Iceberg 1.10.2's Spark runtime and SQL extensions jars from the
# snowpark-connect-deps-iceberg wheel (PyPI: the test bed downloads from apt and PyPI only, not from Maven),
# and OpenJDK 17 from Debian. That runtime jar leaves out the relocated libraries Maven's shaded jar bundles
# (org.apache.iceberg.shaded.*): scripts/testbed/relocate_jar.py makes them, jackson from pyspark's own jars,
# and httpclient5 5.6 / httpcore5 5.4 (the REST catalog client) from the Debian packages vendored in
# scripts/testbed/debs: bookworm's 5.2.1 lacks TlsSocketStrategy (5.4+), which Iceberg 1.10's HTTP client
# calls. Used by tests/catalog/rest.rs (Spark's rewrite_data_files, expire_snapshots beside cdcd) and
# lakecheck.py --reader spark. Installed once per machine (~400 MB, ~2 min); a Spark session starts in 5-15 s.
SPARK_JARS=$CDCD_TB/spark-jars
SPARK_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/testbed
spark_apt() { apt_want openjdk-17-jre-headless; }
spark_up() {
  [ -x "$PY" ] || die "the spark component installs into the python component's venv ($VENV): add python to CDCD_TB_COMPONENTS"
  local req=$CDCD_TB/requirements-spark.txt
  printf 'pyspark==3.5.8\nsnowpark-connect-deps-iceberg==1.0.3\n' > "$req.new"
  if ! cmp -s "$req.new" "$req" || [ ! -f "$VENV/.spark-ok" ]; then
    log "pip install pyspark 3.5.8 + Iceberg 1.10.2's Spark runtime (once per machine, ~400 MB)"
    rm -f "$VENV/.spark-ok"
    "$VENV/bin/pip" install -q -r "$req.new"
    mv "$req.new" "$req"
  else
    rm -f "$req.new"
  fi
  if [ ! -s "$SPARK_JARS/iceberg-shaded-jackson.jar" ] || [ ! -s "$SPARK_JARS/iceberg-shaded-hc5.jar" ]; then
    log "relocating jackson and httpclient5 into $SPARK_JARS"
    local tmp; tmp=$(mktemp -d)
    (cd "$SPARK_SRC/debs" && sha256sum -c --quiet SHA256SUMS) || die "the vendored .debs in $SPARK_SRC/debs do not match SHA256SUMS"
    local deb; for deb in "$SPARK_SRC"/debs/*.deb; do dpkg-deb -x "$deb" "$tmp"; done
    mkdir -p "$SPARK_JARS"
    local pyjars; pyjars=$("$PY" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
    "$PY" "$SPARK_SRC/relocate_jar.py" "$SPARK_JARS/iceberg-shaded-jackson.jar.new" com.fasterxml.jackson \
      "$pyjars"/jackson-core-2*.jar "$pyjars"/jackson-databind-2*.jar "$pyjars"/jackson-annotations-2*.jar >/dev/null
    "$PY" "$SPARK_SRC/relocate_jar.py" "$SPARK_JARS/iceberg-shaded-hc5.jar.new" org.apache.hc \
      "$tmp"/usr/share/java/httpclient5-5.*.jar "$tmp"/usr/share/java/httpcore5-5.*.jar "$tmp"/usr/share/java/httpcore5-h2-5.*.jar >/dev/null
    mv "$SPARK_JARS/iceberg-shaded-jackson.jar.new" "$SPARK_JARS/iceberg-shaded-jackson.jar"
    mv "$SPARK_JARS/iceberg-shaded-hc5.jar.new" "$SPARK_JARS/iceberg-shaded-hc5.jar"
    rm -rf "$tmp"
  fi
  if [ ! -f "$VENV/.spark-ok" ]; then
    # Once: Iceberg-Java writes a v3 table with a deletion vector and reads it back, and the REST
    # client's relocated httpclient5 loads, so a broken install fails here and not in a test.
    log "checking Spark with Iceberg (a v3 table, a deletion vector, the REST client's classes)"
    SPARK_LOCAL_IP=127.0.0.1 CDCD_TEST_SPARK_JARS=$SPARK_JARS "$PY" - "$CDCD_TB/spark-check" >"$LOGS/spark-check.log" 2>&1 <<'EOF' \
      || die "Spark with Iceberg does not work: see $LOGS/spark-check.log"
import glob, os, shutil, sys
import snowpark_connect_deps_iceberg as dep
from pyspark.sql import SparkSession
wheel = os.path.join(os.path.dirname(dep.__file__), "jars")
jars = glob.glob(f"{wheel}/iceberg-spark-runtime-3.5_2.12-*.jar") + glob.glob(f"{wheel}/iceberg-spark-extensions-3.5_2.12-*.jar") \
    + glob.glob(os.environ["CDCD_TEST_SPARK_JARS"] + "/*.jar")
wh = sys.argv[1]
shutil.rmtree(wh, True)
spark = (SparkSession.builder.master("local[1]").config("spark.jars", ",".join(jars))
         .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
         .config("spark.sql.catalog.h", "org.apache.iceberg.spark.SparkCatalog").config("spark.sql.catalog.h.type", "hadoop")
         .config("spark.sql.catalog.h.warehouse", "file://" + wh).config("spark.ui.enabled", "false").getOrCreate())
spark.sql("CREATE TABLE h.db.t (id bigint) USING iceberg TBLPROPERTIES ('format-version' = '3', 'write.delete.mode' = 'merge-on-read')")
spark.sql("INSERT INTO h.db.t VALUES (1), (2), (3)")
spark.sql("DELETE FROM h.db.t WHERE id = 2")
assert [r[0] for r in spark.sql("SELECT id FROM h.db.t ORDER BY id").collect()] == [1, 3]
spark._jvm.org.apache.iceberg.rest.HTTPClient.builder(spark._jvm.java.util.HashMap()).uri("http://127.0.0.1:9").build().close()
spark.stop()
shutil.rmtree(wh, True)
print("ok")
EOF
    touch "$VENV/.spark-ok"
  fi
}
spark_stop() { :; }
spark_env() {
  echo "export CDCD_TEST_SPARK_PYTHON=$PY"
  echo "export CDCD_TEST_SPARK_JARS=$SPARK_JARS"
}

# ------------------------------------------------------------------ main
each() { local c; for c in "${COMPONENTS[@]}"; do "${c}_$1"; done; }
case "${1:-up}" in
  up)
    [ "$(id -u)" = 0 ] || die "run as root (apt-get, and su to postgres for the server)"
    start=$(date +%s)
    mkdir -p "$CDCD_TB" "$RUN" "$LOGS"
    chmod 755 "$CDCD_TB"; chmod 1777 "$RUN" "$LOGS"   # the postgres user writes its socket and log here
    # gcc and make: the build's C parts (tikv-jemalloc-sys runs jemalloc's configure and make).
    apt_want gcc make; each apt; apt_install
    each up
    log "test bed up in $(( $(date +%s) - start ))s ($CDCD_TB); for the tests: eval \"\$($0 env)\""
    ;;
  env)
    echo "export CDCD_TB=$CDCD_TB"
    each env
    ;;
  stop)
    each stop
    log "stopped"
    ;;
  *) echo "usage: $0 [up|env|stop]" >&2; exit 2;;
esac
