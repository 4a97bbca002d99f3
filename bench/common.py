"""Helpers shared by the end-to-end benchmarks (pg_e2e.py, mysql_e2e.py): reading a table's newest committed
`cdcd.position` straight from its files (no engine in the timed loop), cdcd's peak RSS, percentiles.

Positions are returned as the checkpoint's text; each benchmark parses its own kind (a Postgres LSN, a MariaDB
GTID list)."""
import argparse
import json
import os
import re


def _status_kib(pid, field):
    """A `VmXxx:` line of a live process's /proc status, in KiB (None once it is gone)."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_kib(pid):
    """VmRSS of a live process, in KiB (None once it is gone)."""
    return _status_kib(pid, "VmRSS")


def rss_peak_kib(pid):
    """VmHWM of a live process, in KiB (None once it is gone)."""
    return _status_kib(pid, "VmHWM")


def object_store_requests(port):
    """cdcd_object_store_requests_total by op (put, get, head, list, delete, copy) from cdcd's /metrics on
    `port`; {} when it does not answer."""
    import urllib.request
    try:
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=2).read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        m = re.match(r'cdcd_object_store_requests_total\{.*op="([a-z]+)".*\} ([0-9.e+]+)$', line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0) + float(m.group(2))
    return out


def iceberg_summary(table_dir):
    """The summary of the current snapshot of an Iceberg table written by cdcd, or None."""
    meta = os.path.join(table_dir, "metadata")
    try:
        with open(os.path.join(meta, "version-hint.text")) as f:
            version = int(f.read().strip())
    except (OSError, ValueError):
        return None
    # The hint is written after the metadata: look one or two versions further.
    while os.path.exists(os.path.join(meta, "v%d.metadata.json" % (version + 1))):
        version += 1
    try:
        with open(os.path.join(meta, "v%d.metadata.json" % version)) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    current = doc.get("current-snapshot-id")
    return next((s.get("summary", {}) for s in doc.get("snapshots", []) if s.get("snapshot-id") == current), None)


def lsn_int(text):
    """A Postgres LSN as written (`16/B374D848`) as an integer."""
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def lsn_text(value):
    """An integer LSN as Postgres writes it."""
    return "%X/%X" % (value >> 32, value & 0xFFFFFFFF)


def iceberg_position(table_dir):
    """The newest committed cdcd.position (text) of an Iceberg table written by cdcd, or None."""
    return (iceberg_summary(table_dir) or {}).get("cdcd.position") or None


POSITION = re.compile(rb'"cdcd\.position"\s*:\s*"([0-9A-Fa-f]+/[0-9A-Fa-f]+)"')


def iceberg_position_fast(table_dir):
    """The newest committed position of an Iceberg table: the highest `cdcd.position` in its newest metadata file,
    found by a regex instead of a JSON parse (positions only grow; hundreds of tables are polled)."""
    meta = os.path.join(table_dir, "metadata")
    try:
        with open(os.path.join(meta, "version-hint.text")) as f:
            version = int(f.read().strip())
    except (OSError, ValueError):
        return None
    while os.path.exists(os.path.join(meta, "v%d.metadata.json" % (version + 1))):
        version += 1
    try:
        with open(os.path.join(meta, "v%d.metadata.json" % version), "rb") as f:
            found = POSITION.findall(f.read())
    except OSError:
        return None
    return max((lsn_int(p.decode()) for p in found), default=None)


def paimon_properties(table_dir):
    """The properties of the newest Paimon snapshot that carries a checkpoint (plus its
    totalRecordCount), or None."""
    snap_dir = os.path.join(table_dir, "snapshot")
    try:
        with open(os.path.join(snap_dir, "LATEST")) as f:
            n = int(f.read().strip())
    except (OSError, ValueError):
        return None
    while os.path.exists(os.path.join(snap_dir, "snapshot-%d" % (n + 1))):
        n += 1
    # A COMPACT snapshot may carry no properties: walk back to the newest that has the position.
    while n > 0:
        try:
            with open(os.path.join(snap_dir, "snapshot-%d" % n)) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            return None
        props = doc.get("properties") or {}
        if props.get("cdcd.position"):
            return dict(props, totalRecordCount=doc.get("totalRecordCount"))
        n -= 1
    return None


def paimon_position(table_dir):
    """The newest cdcd.position (text) of a Paimon table written by cdcd, or None."""
    return (paimon_properties(table_dir) or {}).get("cdcd.position")


def percentile_ms(sorted_seconds, q):
    if not sorted_seconds:
        return float("nan")
    return sorted_seconds[min(len(sorted_seconds) - 1, int(q * len(sorted_seconds)))] * 1000


def cpu_seconds(pid):
    """User + system CPU time a live process has used, in seconds (None once it is gone): on a busy
    machine this is steadier than the wall clock."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # Fields 14 and 15 of stat(5) (utime, stime), counted after the command name's ")".
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def streaming_bench_args(doc, root):
    """The options pg_e2e.py and mysql_e2e.py share: the same workload, sinks and freshness phase."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(root, "target", "release", "cdcd"))
    ap.add_argument("--transactions", type=int, default=1000)
    ap.add_argument("--sink", choices=["iceberg", "lsm"], default="iceberg")
    ap.add_argument("--delete-mode", default="deletion-vectors")
    ap.add_argument("--buckets", type=int, default=4)
    ap.add_argument("--commit-interval-ms", type=int, default=1000)
    ap.add_argument("--commit-max-rows", type=int, default=100000)
    ap.add_argument("--freshness-seconds", type=int, default=20)
    ap.add_argument("--offered-rows", type=int, default=2000, help="rows/s offered in the freshness phase")
    ap.add_argument("--big-tx", type=int, default=0, help="also replicate one transaction of this many inserts")
    ap.add_argument("--keep", action="store_true", help="keep the warehouse and log")
    ap.add_argument("--changelog", action="store_true",
                    help="the table keeps its change stream too (changelog = true; issue 38's goal: "
                         "run with and without it and compare each against the source's limit)")
    return ap


def table_section(args, table):
    """The `[sink.tables."…"]` section of the benchmark's table: its changelog, when asked."""
    return '\n[sink.tables."%s"]\nchangelog = true\n' % table if args.changelog else ""


def free_port():
    """A TCP port on 127.0.0.1 nothing listens on (for cdcd's /metrics)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_average():
    return " ".join("%.2f" % x for x in os.getloadavg())


class PostgresBench:
    """What the Postgres benchmarks that run pgbench share (many_tables.py, large_table.py): the test bed's server
    (CDCD_TEST_PG), a tag naming this run's slots and publication, a work directory holding the warehouse, a port for
    cdcd's /metrics, and pgbench with the source's own decoding limit beside it."""

    def __init__(self, args, tag, workdir_prefix):
        import tempfile
        import psycopg2
        self.args = args
        self.url = os.environ.get("CDCD_TEST_PG")
        if not self.url:
            raise SystemExit("CDCD_TEST_PG is unset: eval \"$(scripts/testbed.sh env)\"")
        self.pg_bin = os.environ.get("CDCD_TEST_PG_BIN", "/usr/lib/postgresql/15/bin")
        self.tag = "%s_%d" % (tag, os.getpid())
        self.slot = self.tag + "_cdcd"
        self.recv_slot = self.tag + "_recv"
        self.publication = self.tag
        self.workdir = tempfile.mkdtemp(prefix=workdir_prefix)
        self.warehouse = os.path.join(self.workdir, "warehouse")
        self.port = free_port()
        self.cdcd = None
        self.conn = psycopg2.connect(self.url)
        self.conn.autocommit = True

    def sql(self, text, *params):
        if self.conn.closed:
            # The server restarted (a crash, a full disk): cleanup still drops the slots.
            self.conn = psycopg2.connect(self.url)
            self.conn.autocommit = True
        with self.conn.cursor() as cur:
            cur.execute(text, params)
            return cur.fetchall() if cur.description else None

    def run_pgbench(self, workload, seconds, rate=None):
        """pgbench with `workload` (extra arguments: a script, or none for TPC-B) and --clients for `seconds`, at `rate`
        tps when given; its tps."""
        import subprocess
        clients = self.args.clients
        cmd = [os.path.join(self.pg_bin, "pgbench"), "-n"] + (["-R", str(rate)] if rate else []) + workload + [
            "-c", str(clients), "-j", str(min(clients, 2)), "-T", str(seconds), self.url]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit("pgbench failed: %s" % out.stderr)
        m = re.search(r"tps = ([0-9.]+)", out.stdout)
        return float(m.group(1)) if m else float("nan")

    def decoding_limit(self, workload):
        """Runs `workload()` (pgbench with no cdcd) with a pgoutput slot of its own on self.publication, then
        pg_recvlogical decodes the WAL it wrote into /dev/null: (workload's result, transactions/s decoded)."""
        import subprocess
        import time
        self.sql("select pg_create_logical_replication_slot(%s, 'pgoutput')", self.recv_slot)
        commits = "select xact_commit from pg_stat_database where datname = current_database()"
        xacts0 = self.sql(commits)[0][0]
        result = workload()
        xacts = self.sql(commits)[0][0] - xacts0
        end = lsn_int(self.sql("select pg_current_wal_lsn()::text")[0][0])
        started = time.time()
        subprocess.run([os.path.join(self.pg_bin, "pg_recvlogical"), "-d", self.url, "--slot", self.recv_slot,
                        "--start", "-o", "proto_version=1", "-o", "publication_names=" + self.publication,
                        "--endpos", lsn_text(end), "--no-loop", "-f", "/dev/null"], check=True)
        decode_s = time.time() - started
        self.sql("select pg_drop_replication_slot(%s)", self.recv_slot)
        return result, xacts / decode_s
