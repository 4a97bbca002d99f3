#!/usr/bin/env python3
"""End-to-end benchmark: MariaDB binlog → cdcd → lake table, beside the source's own limits, in one run.

What it measures (issue 9, the MariaDB half of bench/pg_e2e.py):
  1. generates the workload in a database of its own: N transactions of 600 inserts, 300 updates and 100 deletes
     on a 10-column table (1000 × 1000 = 1,000,000 row changes by default), noting the binlog coordinates
     (file:offset and @@gtid_binlog_pos) before and after, and the GTID of its last transaction;
  2. the source's limits over that binlog range: `mariadb-binlog --read-from-remote-server --raw` (the server
     handing out its binlog, written to a tmpfs directory; --raw ignores --stop-position, so it reads to the end
     of the last file), and `mariadb-binlog -v --base64-output=decode-rows` (MariaDB's own row decoder, text into
     /dev/null); and, when built, examples/mysql_decode_bench.rs on the saved files: cdcd's binlog → Arrow
     decoding alone, no server and no sink, with the planned row path and with mysql_common's rows;
  3. cdcd end to end: started with `snapshot = "never"` and `start_position` = the GTID list before the workload,
     timed from process start until the table's committed `cdcd.position` covers the workload's last GTID (then
     the replica is checked equal to the source with tests/support/lakecheck.py, untimed);
  4. peak RSS of cdcd (VmHWM) while streaming;
  5. freshness at a steady offered load: a transaction of inserts every 50 ms, each commit's wall time and
     @@last_gtid recorded; a poller reads the table's newest committed position every 10 ms; freshness = first
     time the position covers the commit − commit time; p50/p99 are printed beside the commit interval;
  6. optionally (--big-tx N) one transaction of N inserts, and cdcd's peak RSS while it goes through.

Usage (the test bed must be up: scripts/testbed.sh up; eval "$(scripts/testbed.sh env)"):
  cargo build --release
  $CDCD_TEST_PYTHON bench/mysql_e2e.py [--transactions 1000] [--delete-mode deletion-vectors|equality]
      [--sink iceberg|lsm] [--freshness-seconds 20] [--offered-rows 2000] [--big-tx 1000000] [--keep]

The MariaDB server is shared: other clients' transactions in the same binlog range are read by mariadb-binlog
and skipped by cdcd (their tables are not captured), so both sides see the same bytes. Nothing here is asserted:
it prints figures for README.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from urllib.parse import urlparse, unquote

import pymysql

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAKECHECK = os.path.join(ROOT, "tests", "support", "lakecheck.py")


def gtid_list(text):
    """A MariaDB GTID list `0-1-42,1-2-7` as {domain: seq}."""
    out = {}
    for part in (text or "").split(","):
        part = part.strip()
        if part:
            domain, _server, seq = part.split("-")
            out[int(domain)] = int(seq)
    return out


def covers(position, target):
    """Whether GTID list `position` ({domain: seq}) includes every transaction of `target`."""
    return position is not None and all(position.get(d, -1) >= s for d, s in target.items())


class Bench:
    def __init__(self, args):
        self.args = args
        url = os.environ.get("CDCD_TEST_MYSQL")
        if not url:
            sys.exit("CDCD_TEST_MYSQL is unset: scripts/testbed.sh up && eval \"$(scripts/testbed.sh env)\"")
        u = urlparse(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 3306
        self.user, self.password = unquote(u.username or "root"), unquote(u.password or "")
        self.tag = "bench_%d" % os.getpid()
        self.db = self.tag
        self.table = "changes"
        self.url = "mysql://%s:%s@%s:%d/%s" % (self.user, self.password, self.host, self.port, self.db)
        self.server_id = 70000 + os.getpid() % 100000
        self.workdir = tempfile.mkdtemp(prefix="cdcd-mybench-")
        self.warehouse = os.path.join(self.workdir, "warehouse")
        self.cdcd = None
        self.conn = pymysql.connect(host=self.host, port=self.port, user=self.user, password=self.password,
                                    autocommit=True, init_command="SET time_zone = '+00:00'")

    def sql(self, text, *params):
        with self.conn.cursor() as cur:
            cur.execute(text, params or None)
            return cur.fetchall()

    def binlog_coordinates(self):
        (file, pos, *_), = self.sql("SHOW MASTER STATUS")
        (gtid,), = self.sql("SELECT @@gtid_binlog_pos")
        return file, int(pos), gtid

    def table_dir(self):
        if self.args.sink == "lsm":
            return os.path.join(self.warehouse, "bench.db", self.table)
        return os.path.join(self.warehouse, "bench", self.table)

    def lake_position(self):
        d = self.table_dir()
        text = common.paimon_position(d) if self.args.sink == "lsm" else common.iceberg_position(d)
        return gtid_list(text) if text else None

    def setup(self):
        self.sql("DROP DATABASE IF EXISTS `%s`" % self.db)
        self.sql("CREATE DATABASE `%s`" % self.db)
        self.sql(
            """CREATE TABLE `%s`.`%s` (id BIGINT PRIMARY KEY, a INT NOT NULL, b BIGINT, c VARCHAR(64),
               d DECIMAL(12,2), e DOUBLE, f TIMESTAMP(6) NULL, g BOOLEAN, h DATE, i VARCHAR(32))"""
            % (self.db, self.table)
        )
        self.sql("USE `%s`" % self.db)

    def insert_sql(self, lo, hi, fresh=False):
        if fresh:
            return ("INSERT INTO `%s` SELECT seq, 1, 2, 'fresh', 1.5, 2.5, NOW(6), TRUE, DATE '2024-01-01', 'x' "
                    "FROM seq_%d_to_%d" % (self.table, lo, hi))
        return ("""INSERT INTO `%s` SELECT seq, seq %% 1000, seq * 7, CONCAT('row ', seq), (seq %% 100000) / 100.0,
                   seq / 3.0, NOW(6), seq %% 2 = 0, DATE '2024-01-01' + INTERVAL (seq %% 365) DAY, MD5(seq)
                   FROM seq_%d_to_%d""" % (self.table, lo, hi))

    def workload(self, transactions):
        """Each transaction: 600 inserts, 300 updates and 100 deletes of rows inserted before (server-side SQL,
        so the driver is not the bottleneck). Returns the GTID of the last transaction."""
        cur = self.conn.cursor()
        started = time.time()
        next_id = 1
        for t in range(transactions):
            cur.execute("BEGIN")
            cur.execute(self.insert_sql(next_id, next_id + 599))
            lo = next_id - 600 if t > 0 else next_id
            extra = ", c = CONCAT(c, 'u'), e = e * 2" if t > 0 else ""
            cur.execute("UPDATE `%s` SET a = a + 1%s WHERE id BETWEEN %d AND %d" % (self.table, extra, lo, lo + 299))
            # The first transaction deletes ids 401-500, so the second (which works on the same rows) still finds
            # 301-400 to delete: every transaction has exactly 1000 changes.
            gone = lo + 400 if t == 0 else lo + 300
            cur.execute("DELETE FROM `%s` WHERE id BETWEEN %d AND %d" % (self.table, gone, gone + 99))
            cur.execute("COMMIT")
            next_id += 600
        (last,), = self.sql("SELECT @@last_gtid")
        return gtid_list(last), time.time() - started

    def binlog_files(self, first, last):
        names = [row[0] for row in self.sql("SHOW BINARY LOGS")]
        return names[names.index(first): names.index(last) + 1]

    def mariadb_binlog(self, start, end, decode):
        """Times mariadb-binlog reading [start, end) of the binlog from the server; returns seconds."""
        files = self.binlog_files(start[0], end[0])
        cmd = ["mariadb-binlog", "--read-from-remote-server", "--host", self.host, "--port", str(self.port),
               "--user", self.user, "--password=" + self.password, "--start-position=%d" % start[1],
               "--stop-position=%d" % end[1]]
        out_dir = None
        if decode:
            cmd += ["-v", "--base64-output=decode-rows"]
        else:
            # --raw writes the binlog files as the server sends them; tmpfs keeps the disk out of the figure.
            out_dir = tempfile.mkdtemp(prefix="cdcd-rawbinlog-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
            cmd += ["--raw", "--result-file=" + out_dir + "/"]
        started = time.time()
        with open(os.devnull, "w") as null:
            subprocess.run(cmd + files, check=True, stdout=null, stderr=subprocess.DEVNULL)
        took = time.time() - started
        if out_dir:
            self.decode_bench([os.path.join(out_dir, f) for f in files])
            shutil.rmtree(out_dir, ignore_errors=True)
        return took

    def decode_bench(self, paths):
        """cdcd's own decoder on the saved binlog files, without server or sink (both row paths), when
        examples/mysql_decode_bench.rs is built."""
        exe = os.path.join(ROOT, "target", "release", "examples", "mysql_decode_bench")
        if not os.access(exe, os.X_OK):
            print("(cargo build --release --example mysql_decode_bench to also time cdcd's decoder alone)")
            return
        out = subprocess.run([exe, self.db] + paths, capture_output=True, text=True)
        for line in (out.stdout + out.stderr).strip().splitlines():
            print("cdcd decoder alone (examples/mysql_decode_bench), " + line.strip())

    def write_config(self, start_gtid):
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
kind = "mysql"
url = "%s"
tables = ["%s.%s"]
server_id = %d
snapshot = "never"
start_position = "%s"

[sink]
%swarehouse = "%s"
namespace = "bench"
"""
                % (self.tag, self.args.commit_interval_ms, self.args.commit_max_rows, self.url, self.db, self.table,
                   self.server_id, start_gtid, sink, self.warehouse)
                + common.table_section(self.args, "%s.%s" % (self.db, self.table))
            )
        return path

    def start_cdcd(self, start_gtid):
        config = self.write_config(start_gtid)
        log = open(os.path.join(self.workdir, "cdcd.log"), "w")
        env = dict(os.environ, CDCD_LOG=os.environ.get("CDCD_LOG", "warn"))
        self.cdcd = subprocess.Popen([self.args.bin, "--config", config], stdout=log, stderr=log, env=env)
        return time.time()

    def wait_position(self, target, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if covers(self.lake_position(), target):
                return time.time()
            if self.cdcd.poll() is not None:
                sys.exit("cdcd exited with %s; log: %s" % (self.cdcd.returncode, os.path.join(self.workdir, "cdcd.log")))
            time.sleep(0.01)
        sys.exit("cdcd did not reach %s within %ss" % (target, timeout))

    def freshness(self, seconds, rows_per_second):
        """Offered load: a transaction of rows_per_second/20 inserts every 50 ms; the poller notes when each
        commit's GTID is covered by the table's committed position."""
        per_tx = max(1, rows_per_second // 20)
        commits = []  # (wall time after commit, {domain: seq})
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
            cur.execute(self.insert_sql(base + n * per_tx, base + (n + 1) * per_tx - 1, fresh=True))
            at = time.time()
            cur.execute("SELECT @@last_gtid")
            commits.append((at, gtid_list(cur.fetchone()[0])))
            n += 1
            time.sleep(max(0.0, 0.05 - (time.time() - tick)))
        self.wait_position(commits[-1][1], 60)
        time.sleep(0.05)
        done.set()
        poller.join()
        lags = []
        for at, gtid in commits:
            covered = next((t for t, p in seen if t >= at and covers(p, gtid)), None)
            if covered is not None:
                lags.append(covered - at)
        lags.sort()
        return n * per_tx / seconds, common.percentile_ms(lags, 0.5), common.percentile_ms(lags, 0.99), len(lags)

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
            [py, LAKECHECK, "--source", self.url, "--source-table", "%s.%s" % (self.db, self.table)] + target,
            capture_output=True, text=True,
        )
        lines = (out.stdout.strip() or out.stderr.strip()).splitlines()
        return out.returncode == 0, lines[-1] if lines else "(no output)"

    def cleanup(self):
        self.stop_cdcd()
        try:
            self.sql("DROP DATABASE IF EXISTS `%s`" % self.db)
        except pymysql.MySQLError as e:
            print("could not drop database %s: %s" % (self.db, e), file=sys.stderr)
        if not self.args.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)
        else:
            print("kept", self.workdir)


def main():
    ap = common.streaming_bench_args(__doc__, ROOT)
    ap.add_argument("--no-check", action="store_true", help="skip the (untimed) lakecheck comparison")
    args = ap.parse_args()
    if not os.access(args.bin, os.X_OK):
        sys.exit("%s is not built: cargo build --release" % args.bin)

    b = Bench(args)
    try:
        b.setup()
        changes = args.transactions * 1000
        start = b.binlog_coordinates()
        last_gtid, gen_s = b.workload(args.transactions)
        end = b.binlog_coordinates()
        print("workload: %d transactions, %d changes, generated in %.1f s; binlog %s:%d → %s:%d, GTID %s → %s"
              % (args.transactions, changes, gen_s, start[0], start[1], end[0], end[1], start[2], end[2]))
        raw_s = b.mariadb_binlog(start, end, decode=False)
        dec_s = b.mariadb_binlog(start, end, decode=True)
        raw_rate, dec_rate = changes / raw_s, changes / dec_s
        print("mariadb-binlog --raw: %.2f s, %.0f rows/s" % (raw_s, raw_rate))
        print("mariadb-binlog -v --base64-output=decode-rows → /dev/null: %.2f s, %.0f rows/s" % (dec_s, dec_rate))
        started = b.start_cdcd(start[2])
        reached = b.wait_position(last_gtid, 1800)
        cdcd_s = reached - started
        rate = changes / cdcd_s
        rss_stream = common.rss_peak_kib(b.cdcd.pid)
        cpu = common.cpu_seconds(b.cdcd.pid) or 0.0
        print("cdcd → %s%s%s: %.2f s, %.0f rows/s = %.2f× mariadb-binlog decode-rows, %.2f× --raw; peak RSS %.0f MiB; "
              "CPU %.2f s (%.0f rows per CPU-second)"
              % (args.sink, " (%s)" % args.delete_mode if args.sink == "iceberg" else "",
                 " with its changelog" if args.changelog else "", cdcd_s, rate,
                 rate / dec_rate, rate / raw_rate, (rss_stream or 0) / 1024, cpu, changes / cpu if cpu else 0))
        if args.freshness_seconds > 0:
            offered, p50, p99, n = b.freshness(args.freshness_seconds, args.offered_rows)
            print("freshness at %.0f rows/s offered (commit_interval_ms=%d): p50 %.0f ms, p99 %.0f ms (%d commits)"
                  % (offered, args.commit_interval_ms, p50, p99, n))
        if args.big_tx > 0:
            cur = b.conn.cursor()
            cur.execute("BEGIN")
            cur.execute(b.insert_sql(20_000_000_000, 20_000_000_000 + args.big_tx - 1, fresh=True))
            cur.execute("COMMIT")
            (big,), = b.sql("SELECT @@last_gtid")
            t0 = time.time()
            b.wait_position(gtid_list(big), 1800)
            print("one transaction of %d inserts: %.2f s, peak RSS so far %.0f MiB"
                  % (args.big_tx, time.time() - t0, (common.rss_peak_kib(b.cdcd.pid) or 0) / 1024))
        if args.no_check:
            b.stop_cdcd()
            return 0
        ok, summary = b.check_equal()
        print("replica %s: %s" % ("equal" if ok else "NOT EQUAL", summary))
        b.stop_cdcd()
        return 0 if ok else 1
    finally:
        b.cleanup()


if __name__ == "__main__":
    sys.exit(main())
