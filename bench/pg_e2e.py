#!/usr/bin/env python3
"""End-to-end benchmark: Postgres → cdcd → lake table, beside the source's own limit, in one run.

What it measures (issue 9):
  1. generates the workload: N transactions of 600 inserts, 300 updates and 100 deletes on a 10-column table
     (1000 × 1000 = 1,000,000 changes by default), while two slots (one for cdcd, one for pg_recvlogical) hold it;
  2. the source's limit: pg_recvlogical draining that WAL range through pgoutput into /dev/null (--endpos);
  3. cdcd end to end: from process start until the table's committed `cdcd.position` reaches the end of the
     workload (then the replica is checked equal to the source with tests/support/lakecheck.py, untimed);
  4. peak RSS of cdcd (VmHWM);
  5. freshness at a steady offered load: each source commit's wall time and LSN is recorded, a poller reads the
     table's newest committed position every 10 ms, and freshness = first time the position covers the commit
     − commit time; p50/p99 are printed beside the commit interval;
  6. optionally (--big-tx N) one transaction of N inserts, and cdcd's peak RSS while it goes through.

Usage (the test bed must be up: scripts/testbed.sh up; eval "$(scripts/testbed.sh env)"):
  cargo build --release
  $CDCD_TEST_PYTHON bench/pg_e2e.py [--transactions 1000] [--delete-mode deletion-vectors|equality]
      [--sink iceberg|lsm] [--freshness-seconds 20] [--offered-rows 2000] [--big-tx 1000000] [--keep]

Why a Python driver: generating the load and polling the table are I/O that Python does well enough, and it keeps
the benchmark out of the measured process. Nothing here is asserted: it prints figures for README.
"""
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import psycopg2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import lsn_int, lsn_text  # noqa: E402
from common import rss_peak_kib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAKECHECK = os.path.join(ROOT, "tests", "support", "lakecheck.py")


def iceberg_position(table_dir):
    pos = common.iceberg_position(table_dir)
    return lsn_int(pos) if pos else None


def paimon_position(table_dir):
    pos = common.paimon_position(table_dir)
    return lsn_int(pos) if pos else None


class Bench:
    def __init__(self, args):
        self.args = args
        self.url = os.environ.get("CDCD_TEST_PG")
        if not self.url:
            sys.exit("CDCD_TEST_PG is unset: scripts/testbed.sh up && eval \"$(scripts/testbed.sh env)\"")
        self.pg_bin = os.environ.get("CDCD_TEST_PG_BIN", "/usr/lib/postgresql/15/bin")
        self.tag = "bench_%d" % os.getpid()
        self.table = self.tag
        self.slot = self.tag + "_cdcd"
        self.recv_slot = self.tag + "_recv"
        self.publication = self.tag
        self.workdir = tempfile.mkdtemp(prefix="cdcd-bench-")
        self.warehouse = os.path.join(self.workdir, "warehouse")
        self.cdcd = None
        self.conn = psycopg2.connect(self.url)
        self.conn.autocommit = True

    def sql(self, text, *params):
        with self.conn.cursor() as cur:
            cur.execute(text, params)
            return cur.fetchall() if cur.description else None

    def table_dir(self):
        if self.args.sink == "lsm":
            return os.path.join(self.warehouse, "bench.db", self.table)
        return os.path.join(self.warehouse, "bench", self.table)

    def lake_position(self):
        d = self.table_dir()
        return paimon_position(d) if self.args.sink == "lsm" else iceberg_position(d)

    def setup(self):
        self.sql(
            """create table %s (id bigint primary key, a int not null, b bigint, c text, d numeric(12,2),
               e double precision, f timestamptz, g boolean, h date, i varchar(32))""" % self.table
        )
        self.sql("create publication %s for table %s" % (self.publication, self.table))
        self.sql("select pg_create_logical_replication_slot(%s, 'pgoutput')", self.slot)
        self.sql("select pg_create_logical_replication_slot(%s, 'pgoutput')", self.recv_slot)

    def workload(self, transactions):
        """Each transaction: 600 inserts, 300 updates and 100 deletes of rows inserted before (server-side SQL,
        so the driver is not the bottleneck)."""
        cur = self.conn.cursor()
        started = time.time()
        next_id = 1
        for t in range(transactions):
            cur.execute("begin")
            cur.execute(
                """insert into %s select g, mod(g, 1000), g * 7, 'row ' || g, mod(g, 100000) / 100.0, g / 3.0,
                   now(), mod(g, 2) = 0, date '2024-01-01' + mod(g, 365)::int, md5(g::text)::varchar(32)
                   from generate_series(%%s, %%s) g""" % self.table,
                (next_id, next_id + 599),
            )
            if t > 0:
                lo = next_id - 600
                cur.execute(
                    "update %s set a = a + 1, c = c || 'u', e = e * 2 where id between %%s and %%s" % self.table,
                    (lo, lo + 299),
                )
                cur.execute("delete from %s where id between %%s and %%s" % self.table, (lo + 300, lo + 399))
            else:
                cur.execute(
                    "update %s set a = a + 1 where id between %%s and %%s" % self.table, (next_id, next_id + 299)
                )
                # 401-500, so the second transaction (on the same rows) still finds 301-400: 1000 changes each.
                cur.execute(
                    "delete from %s where id between %%s and %%s" % self.table, (next_id + 400, next_id + 499)
                )
            cur.execute("commit")
            next_id += 600
        end = lsn_int(self.sql("select pg_current_wal_lsn()::text")[0][0])
        return end, time.time() - started

    def recvlogical(self, end):
        cmd = [
            os.path.join(self.pg_bin, "pg_recvlogical"), "-d", self.url, "--slot", self.recv_slot, "--start",
            "-o", "proto_version=1", "-o", "publication_names=" + self.publication,
            "--endpos", lsn_text(end), "--no-loop", "-f", "/dev/null",
        ]
        started = time.time()
        subprocess.run(cmd, check=True)
        return time.time() - started

    def write_config(self, snapshot="never"):
        path = os.path.join(self.workdir, "pipeline.toml")
        sink = 'kind = "lsm"\nbuckets = %d\n' % self.args.buckets if self.args.sink == "lsm" else (
            'kind = "iceberg"\ndelete_mode = "%s"\n' % self.args.delete_mode
        )
        with open(path, "w") as f:
            f.write(
                """[pipeline]
name = "%s"
commit_interval_ms = %d
commit_max_rows = %d

[source]
kind = "postgres"
url = "%s"
tables = ["public.%s"]
slot = "%s"
publication = "%s"
snapshot = "%s"

[sink]
%swarehouse = "%s"
namespace = "bench"
"""
                % (self.tag, self.args.commit_interval_ms, self.args.commit_max_rows, self.url, self.table,
                   self.slot, self.publication, snapshot, sink, self.warehouse)
                + common.table_section(self.args, "public." + self.table)
            )
        return path

    def start_cdcd(self):
        config = self.write_config()
        log = open(os.path.join(self.workdir, "cdcd.log"), "w")
        env = dict(os.environ, CDCD_LOG=os.environ.get("CDCD_LOG", "warn"))
        self.cdcd = subprocess.Popen([self.args.bin, "--config", config], stdout=log, stderr=log, env=env)
        return time.time()

    def wait_position(self, target, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            pos = self.lake_position()
            if pos is not None and pos >= target:
                return time.time()
            if self.cdcd.poll() is not None:
                sys.exit("cdcd exited with %s; log: %s" % (self.cdcd.returncode, os.path.join(self.workdir, "cdcd.log")))
            time.sleep(0.01)
        sys.exit("cdcd did not reach %s within %ss" % (lsn_text(target), timeout))

    def freshness(self, seconds, rows_per_second):
        """Offered load: a transaction of rows_per_second/20 inserts every 50 ms; the poller notes when each
        commit's LSN is covered by the table's committed position."""
        per_tx = max(1, rows_per_second // 20)
        commits = []  # (wall time after commit, lsn)
        done = threading.Event()
        seen = []  # (wall time, position)

        def poll():
            while not done.is_set():
                pos = self.lake_position()
                if pos is not None:
                    seen.append((time.time(), pos))
                time.sleep(0.01)

        poller = threading.Thread(target=poll)
        poller.start()
        cur = self.conn.cursor()
        base = 10_000_000_000
        end = time.time() + seconds
        n = 0
        while time.time() < end:
            tick = time.time()
            cur.execute(
                "insert into %s select g, 1, 2, 'fresh', 1.5, 2.5, now(), true, date '2024-01-01', 'x' "
                "from generate_series(%%s, %%s) g" % self.table,
                (base + n * per_tx, base + (n + 1) * per_tx - 1),
            )
            commits.append((time.time(), lsn_int(self.sql("select pg_current_wal_lsn()::text")[0][0])))
            n += 1
            time.sleep(max(0.0, 0.05 - (time.time() - tick)))
        last = commits[-1][1]
        self.wait_position(last, 60)
        time.sleep(0.05)
        done.set()
        poller.join()
        lags = []
        for at, lsn in commits:
            covered = next((t for t, p in seen if p >= lsn and t >= at), None)
            if covered is not None:
                lags.append(covered - at)
        lags.sort()
        p = lambda q: lags[min(len(lags) - 1, int(q * len(lags)))] * 1000
        return n * per_tx / seconds, p(0.5), p(0.99), len(lags)

    def stop_cdcd(self):
        if self.cdcd and self.cdcd.poll() is None:
            self.cdcd.send_signal(signal.SIGTERM)
            try:
                self.cdcd.wait(30)
            except subprocess.TimeoutExpired:
                self.cdcd.kill()

    def check_equal(self):
        py = os.environ.get("CDCD_TEST_PYTHON", sys.executable)
        if self.args.sink == "lsm":
            target = ["--paimon", self.warehouse, "--paimon-table", "bench." + self.table]
        else:
            target = ["--iceberg", self.table_dir()]
        out = subprocess.run(
            [py, LAKECHECK, "--source", self.url, "--source-table", "public." + self.table] + target,
            capture_output=True, text=True,
        )
        lines = (out.stdout.strip() or out.stderr.strip()).splitlines()
        return out.returncode == 0, lines[-1] if lines else "(no output)"

    def cleanup(self):
        self.stop_cdcd()
        for slot in (self.slot, self.recv_slot):
            try:
                self.sql("select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name = %s", slot)
            except psycopg2.Error as e:
                print("could not drop slot %s: %s" % (slot, e), file=sys.stderr)
        self.sql("drop publication if exists %s" % self.publication)
        self.sql("drop table if exists %s" % self.table)
        if not self.args.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)
        else:
            print("kept", self.workdir)


def main():
    ap = common.streaming_bench_args(__doc__, ROOT)
    args = ap.parse_args()
    if not os.access(args.bin, os.X_OK):
        sys.exit("%s is not built: cargo build --release" % args.bin)

    b = Bench(args)
    try:
        b.setup()
        changes = args.transactions * 1000
        end, gen_s = b.workload(args.transactions)
        print("workload: %d transactions, %d changes, generated in %.1f s" % (args.transactions, changes, gen_s))
        recv_s = b.recvlogical(end)
        recv_rate = changes / recv_s
        print("pg_recvlogical (pgoutput → /dev/null): %.2f s, %.0f rows/s" % (recv_s, recv_rate))
        started = b.start_cdcd()
        reached = b.wait_position(end, 1800)
        cdcd_s = reached - started
        rss_stream = rss_peak_kib(b.cdcd.pid)
        print("cdcd → %s%s%s: %.2f s, %.0f rows/s = %.2f× pg_recvlogical; peak RSS %.0f MiB"
              % (args.sink, " (%s)" % args.delete_mode if args.sink == "iceberg" else "",
                 " with its changelog" if args.changelog else "", cdcd_s, changes / cdcd_s,
                 (changes / cdcd_s) / recv_rate, (rss_stream or 0) / 1024))
        if args.freshness_seconds > 0:
            rate, p50, p99, n = b.freshness(args.freshness_seconds, args.offered_rows)
            print("freshness at %.0f rows/s offered (commit_interval_ms=%d): p50 %.0f ms, p99 %.0f ms (%d commits)"
                  % (rate, args.commit_interval_ms, p50, p99, n))
        if args.big_tx > 0:
            cur = b.conn.cursor()
            cur.execute("begin")
            cur.execute(
                "insert into %s select g, 1, 2, 'big', 1.5, 2.5, now(), true, date '2024-01-01', 'x' "
                "from generate_series(20000000000, %d) g" % (b.table, 20000000000 + args.big_tx - 1)
            )
            cur.execute("commit")
            big_end = lsn_int(b.sql("select pg_current_wal_lsn()::text")[0][0])
            t0 = time.time()
            b.wait_position(big_end, 1800)
            print("one transaction of %d inserts: %.2f s, peak RSS so far %.0f MiB"
                  % (args.big_tx, time.time() - t0, (rss_peak_kib(b.cdcd.pid) or 0) / 1024))
        ok, summary = b.check_equal()
        print("replica %s: %s" % ("equal" if ok else "NOT EQUAL", summary))
        b.stop_cdcd()
        return 0 if ok else 1
    finally:
        b.cleanup()


if __name__ == "__main__":
    sys.exit(main())
