#!/usr/bin/env python3
"""Partitioned tables (issue 36): the same orders table copied unpartitioned and partitioned by day(created_at),
what a one-week query costs on each, and streaming updates that move rows between partitions.

What it does and prints:
  1. creates (or reuses) `cdcd_bench_orders_<rows>`: id bigint key, customer_id, created_at spread over --days
     days in id order (orders arrive in time order, with up to an hour of jitter; `--arrival random`:
     `cdcd_bench_orders_<rows>_random`, created_at unrelated to the id), amount numeric(12,2), note text;
  2. the source's limit for the copy: `COPY (SELECT …) TO STDOUT (FORMAT binary)` drained by psql into `wc -c`;
  3. per layout (unpartitioned, then `partition_by = ["day(created_at)"]`): the release binary with a fresh
     slot and local warehouse, from start until the copy is committed: seconds, rows/s, cdcd's CPU seconds and
     peak RSS, data files written;
  4. a one-week query (count and sum of amount) on each table, by DuckDB's `iceberg_scan` and by pyiceberg's
     row filter: seconds (best of --repeat) and bytes the reader read (its process's `rchar` over the query,
     page cache included; pyiceberg also prints the bytes of the data files its plan kept);
  4b. cdcd stopped, `cdcd maintain` on each table until a cycle rewrites nothing (what the daemon's own
     maintenance does over its first minutes): cycles, seconds, live data files and manifests; then the
     same queries again (a table cdcd maintains is read in this state; --no-maintain skips it);
  5. on the partitioned table, cdcd running: pgbench at --rate tps of updates that move one row to another
     day (`created_at` += 1 to 30 days) for --seconds, beside pgbench unthrottled with the same script first
     (the source's limit); a marker update every 200 ms records its commit LSN and wall time, and the lag is
     the time until the table's committed `cdcd.position` covers it (p50/p99);
  6. checks each table equal to the source (tests/support/lakecheck.py with pyiceberg, untimed): the
     unpartitioned one after its copy, the partitioned one after the moves.

Usage (the test bed must be up: eval "$(scripts/testbed.sh env)"):
  cargo build --release --bins
  $CDCD_TEST_PYTHON bench/partitioned.py [--rows 10000000] [--days 730] [--rate 1000] [--seconds 60] [--keep]

The table is kept for the next run (`--drop` drops it). Nothing is asserted: it prints figures for
docs/performance.md, with the load average beside them (run it on a quiet machine).
"""
import argparse
import datetime
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import psycopg2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import iceberg_position_fast, iceberg_summary, lsn_int  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAKECHECK = os.path.join(ROOT, "tests", "support", "lakecheck.py")
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
COLUMNS = "id, customer_id, created_at, amount, note"
START = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
LAYOUTS = [("unpartitioned", None), ("day(created_at)", '["day(created_at)"]')]


def rchar():
    """Bytes this process has read through read(2) and friends so far (page cache hits included)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


def copy_complete(props):
    pos = (props or {}).get("cdcd.position")
    return bool(pos) and pos != "0/0" and "cdcd.snapshot" not in props


class Bench:
    def __init__(self, args):
        self.args = args
        self.url = os.environ.get("CDCD_TEST_PG")
        if not self.url:
            sys.exit("CDCD_TEST_PG is unset: eval \"$(scripts/testbed.sh env)\"")
        self.pg_bin = os.environ.get("CDCD_TEST_PG_BIN", "/usr/lib/postgresql/15/bin")
        self.table = "cdcd_bench_orders_%d%s" % (args.rows, "_random" if args.arrival == "random" else "")
        self.tag = "part_%d" % os.getpid()
        self.workdir = tempfile.mkdtemp(prefix="cdcd-partitioned-")
        self.cdcd = None
        self.slots = []
        self.conn = psycopg2.connect(self.url)
        self.conn.autocommit = True

    def sql(self, text, *params):
        with self.conn.cursor() as cur:
            cur.execute(text, params or None)   # without parameters, a "%" in the text is just a "%"
            return cur.fetchall() if cur.description else None

    def ensure_table(self):
        a = self.args
        try:
            have = self.sql("select count(*) from %s" % self.table)[0][0]
        except psycopg2.Error:
            have = -1
        if have == a.rows:
            return
        print("creating %s (%d rows over %d days)" % (self.table, a.rows, a.days), flush=True)
        seconds = a.days * 86400
        self.sql("drop table if exists %s" % self.table)
        self.sql("create table %s (id bigint primary key, customer_id int not null, created_at timestamptz not null,"
                 " amount numeric(12,2) not null, note text)" % self.table)
        if a.arrival == "time":   # ids in time order, with up to an hour of jitter
            secs = "(g::float8 * %d / %d) + (g * 2654435761 %% 3600)" % (seconds, a.rows)
        else:                     # no relation between id and time (a multiplicative hash of the id)
            secs = "(g * 2654435761) %% %d" % seconds
        self.sql("insert into %s select g, (g * 7919) %% 100000, timestamptz '%s' + make_interval(secs => %s),"
                 " ((g %% 100000) / 100.0)::numeric(12,2), md5(g::text) from generate_series(1::bigint, %d) g"
                 % (self.table, START.isoformat(), secs, a.rows))
        self.sql("vacuum analyze %s" % self.table)

    def source_copy_limit(self):
        started = time.time()
        out = subprocess.run("%s '%s' -Atc \"copy (select %s from %s) to stdout (format binary)\" | wc -c"
                             % (os.path.join(self.pg_bin, "psql"), self.url, COLUMNS, self.table),
                             shell=True, capture_output=True, text=True, check=True)
        return time.time() - started, int(out.stdout.strip())

    def table_dir(self, layout):
        return os.path.join(self.workdir, layout.replace("(", "_").replace(")", ""), "bench", self.table)

    def start_cdcd(self, layout, partition_by):
        slot = "%s_%d" % (self.tag, len(self.slots))
        self.slots.append(slot)
        self.sql("drop publication if exists %s" % slot)
        self.sql("create publication %s for table %s" % (slot, self.table))
        warehouse = os.path.dirname(os.path.dirname(self.table_dir(layout)))
        section = ""
        if partition_by:
            section = '\n[sink.tables."public.%s"]\npartition_by = %s\n' % (self.table, partition_by)
        config = os.path.join(self.workdir, slot + ".toml")
        with open(config, "w") as f:
            f.write("""[pipeline]
name = "%s"
commit_interval_ms = %d

[source]
kind = "postgres"
url = "%s"
tables = ["public.%s"]
slot = "%s"
publication = "%s"
snapshot = "initial"

[sink]
kind = "iceberg"
warehouse = "%s"
namespace = "bench"
%s""" % (slot, self.args.commit_interval_ms, self.url, self.table, slot, slot, warehouse, section))
        log = open(os.path.join(self.workdir, slot + ".log"), "w")
        env = dict(os.environ, CDCD_LOG=os.environ.get("CDCD_LOG", "warn"))
        self.cdcd = subprocess.Popen([self.args.bin, "--config", config], stdout=log, stderr=log, env=env)

    def copy(self, layout, partition_by):
        """cdcd from start until the copy is committed; leaves it running."""
        started = time.time()
        self.start_cdcd(layout, partition_by)
        rss = cpu = 0
        while True:
            if self.cdcd.poll() is not None:
                sys.exit("cdcd exited with %s; logs in %s" % (self.cdcd.returncode, self.workdir))
            rss = common.rss_peak_kib(self.cdcd.pid) or rss
            cpu = common.cpu_seconds(self.cdcd.pid) or cpu
            if copy_complete(iceberg_summary(self.table_dir(layout))):
                break
            time.sleep(0.2)
        seconds = time.time() - started
        files, data_bytes = 0, 0
        for root, _, names in os.walk(os.path.join(self.table_dir(layout), "data")):
            for n in names:
                if n.endswith(".parquet"):
                    files += 1
                    data_bytes += os.path.getsize(os.path.join(root, n))
        return {"seconds": seconds, "rows_s": self.args.rows / seconds, "cpu": cpu, "rss_mib": rss / 1024,
                "files": files, "data_mib": data_bytes / 2**20}

    def maintain(self, index, layout):
        """`cdcd maintain` on the table of the `index`-th pipeline until a cycle rewrites nothing."""
        config = os.path.join(self.workdir, self.slots[index] + ".toml")
        started, cycles = time.time(), 0
        while cycles < 100:
            out = subprocess.run([self.args.bin, "maintain", "--config", config], capture_output=True, text=True,
                                 env=dict(os.environ, CDCD_LOG="warn"))
            if out.returncode != 0:
                sys.exit("cdcd maintain failed:\n%s%s" % (out.stdout, out.stderr))
            cycles += 1
            rewrote = re.search(r"rewrote (\d+) data files", out.stdout)
            if not rewrote or rewrote.group(1) == "0":
                break
        import lakecheck
        from pyiceberg.table import StaticTable
        table = StaticTable.from_metadata(lakecheck.locate_iceberg(self.table_dir(layout), []))
        snapshot = table.current_snapshot()
        return {"cycles": cycles, "seconds": time.time() - started,
                "files": sum(1 for _ in table.scan().plan_files()), "manifests": len(snapshot.manifests(table.io))}

    def stop_cdcd(self):
        if self.cdcd and self.cdcd.poll() is None:
            self.cdcd.send_signal(signal.SIGTERM)
            try:
                self.cdcd.wait(60)
            except subprocess.TimeoutExpired:
                self.cdcd.kill()
        self.cdcd = None

    def week(self):
        """The queried week: the middle of the table's time range."""
        lo = START + datetime.timedelta(days=self.args.days // 2)
        return lo, lo + datetime.timedelta(days=7)

    def query_duckdb(self, layout):
        import lakecheck
        con = lakecheck.duck()
        meta = lakecheck.locate_iceberg(self.table_dir(layout), [])
        lo, hi = self.week()
        q = ("select count(*), sum(amount) from iceberg_scan('%s') where created_at >= timestamptz '%s'"
             " and created_at < timestamptz '%s'" % (meta, lo.isoformat(), hi.isoformat()))
        return self.timed(lambda: con.execute(q).fetchone())

    def query_pyiceberg(self, layout):
        import lakecheck
        from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan
        from pyiceberg.table import StaticTable
        meta = lakecheck.locate_iceberg(self.table_dir(layout), [])
        lo, hi = self.week()
        row_filter = And(GreaterThanOrEqual("created_at", lo.isoformat()), LessThan("created_at", hi.isoformat()))

        def run():
            scan = StaticTable.from_metadata(meta).scan(row_filter=row_filter)
            planned = sum(t.file.file_size_in_bytes for t in scan.plan_files())
            rows = scan.to_arrow()
            return (rows.num_rows, float(sum(v.as_py() for v in rows.column("amount")))), planned
        result = self.timed(run)
        result["answer"], result["planned_mib"] = result["answer"][0], result["answer"][1] / 2**20
        return result

    def timed(self, query):
        best, read, answer = None, None, None
        for _ in range(self.args.repeat):
            r0, t0 = rchar(), time.time()
            answer = query()
            seconds, bytes_read = time.time() - t0, rchar() - r0
            if best is None or seconds < best:
                best, read = seconds, bytes_read
        return {"seconds": best, "read_mib": read / 2**20, "answer": answer}

    def moves(self, layout):
        """Updates moving rows across partitions at --rate tps, cdcd running; the source's limit first."""
        a = self.args
        script = os.path.join(self.workdir, "move.sql")
        with open(script, "w") as f:
            f.write("\\set k random(1, %d)\n\\set d random(1, 30)\n"
                    "update %s set created_at = created_at + make_interval(days => :d) where id = :k;\n"
                    % (a.rows, self.table))

        def pgbench(seconds, rate=None):
            cmd = [os.path.join(self.pg_bin, "pgbench"), "-n", "-f", script, "-c", "4", "-j", "2", "-T",
                   str(seconds), self.url]
            if rate:
                cmd[1:1] = ["-R", str(rate)]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit("pgbench failed: %s" % out.stderr)
            tps = [l for l in out.stdout.splitlines() if l.startswith("tps = ")]
            return float(tps[0].split()[2]) if tps else float("nan")

        done = threading.Event()
        markers = []  # [commit wall time, lsn, covered wall time or None]

        def mark():
            conn = psycopg2.connect(self.url)
            conn.autocommit = True
            cur = conn.cursor()
            rng = random.Random(11)
            while not done.is_set():
                cur.execute("update %s set created_at = created_at + interval '1 day' where id = %%s" % self.table,
                            (rng.randrange(1, a.rows + 1),))
                cur.execute("select pg_current_wal_lsn()::text")
                markers.append([time.time(), lsn_int(cur.fetchone()[0]), None])
                time.sleep(0.2)
            conn.close()

        def poll():
            table_dir = self.table_dir(layout)
            deadline = None
            while any(m[2] is None for m in markers) or not done.is_set():
                if done.is_set():
                    deadline = deadline or time.time() + 120
                    if time.time() > deadline:
                        return
                pos = iceberg_position_fast(table_dir) or 0
                now = time.time()
                for m in markers:
                    if m[2] is None and pos >= m[1]:
                        m[2] = now
                time.sleep(0.05)

        threads = [threading.Thread(target=mark), threading.Thread(target=poll)]
        cpu0 = common.cpu_seconds(self.cdcd.pid)
        started = time.time()
        for t in threads:
            t.start()
        tps = pgbench(a.seconds, a.rate)
        elapsed = time.time() - started
        cpu1 = common.cpu_seconds(self.cdcd.pid)
        rss = common.rss_peak_kib(self.cdcd.pid)
        done.set()
        for t in threads:
            t.join()
        lags = sorted(m[2] - m[0] for m in markers if m[2] is not None)
        return {"tps": tps, "lag_p50": common.percentile_ms(lags, 0.5), "lag_p99": common.percentile_ms(lags, 0.99),
                "markers": len(lags), "cpu": ((cpu1 or 0) - (cpu0 or 0)) / elapsed, "rss_mib": (rss or 0) / 1024}

    def source_move_limit(self):
        """pgbench unthrottled with the moving update for a few seconds, no cdcd running."""
        script = os.path.join(self.workdir, "move_limit.sql")
        with open(script, "w") as f:
            f.write("\\set k random(1, %d)\n\\set d random(1, 30)\n"
                    "update %s set created_at = created_at + make_interval(days => :d) where id = :k;\n"
                    % (self.args.rows, self.table))
        out = subprocess.run([os.path.join(self.pg_bin, "pgbench"), "-n", "-f", script, "-c", "4", "-j", "2", "-T",
                              "10", self.url], capture_output=True, text=True)
        tps = [l for l in out.stdout.splitlines() if l.startswith("tps = ")]
        return float(tps[0].split()[2]) if tps else float("nan")

    def check_equal(self, layout):
        py = os.environ.get("CDCD_TEST_PYTHON", sys.executable)
        out = subprocess.run([py, LAKECHECK, "--source", self.url, "--source-table", "public." + self.table,
                              "--wait", "120", "--iceberg", self.table_dir(layout), "--reader", "pyiceberg"],
                             capture_output=True, text=True)
        return out.returncode == 0, (out.stdout + out.stderr).strip().splitlines()[-1:]

    def cleanup(self):
        self.stop_cdcd()
        for slot in self.slots:
            try:
                self.sql("select pg_drop_replication_slot(slot_name) from pg_replication_slots"
                         " where slot_name = %s", slot)
                self.sql("drop publication if exists %s" % slot)
            except psycopg2.Error as e:
                print("could not drop slot %s: %s" % (slot, e), file=sys.stderr)
        if self.args.drop:
            self.sql("drop table if exists %s" % self.table)
        if self.args.keep:
            print("kept", self.workdir)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)


def queries(b, state):
    """The one-week query on both tables by both readers, with the partitioned/unpartitioned ratios."""
    lo, hi = b.week()
    print("one-week query (%s to %s), %s, best of %d:" % (lo.date(), hi.date(), state, b.args.repeat))
    for reader, query in (("duckdb", b.query_duckdb), ("pyiceberg", b.query_pyiceberg)):
        results = {layout: query(layout) for layout, _ in LAYOUTS}
        for layout, r in results.items():
            extra = ", plan kept %.1f MiB of data files" % r["planned_mib"] if "planned_mib" in r else ""
            print("  %-9s %-16s %.3f s, read %.1f MiB%s, answer %s"
                  % (reader, layout, r["seconds"], r["read_mib"], extra, r["answer"]))
        flat, part = results[LAYOUTS[0][0]], results[LAYOUTS[1][0]]
        print("  %-9s partitioned reads %.1fx fewer bytes, runs %.1fx faster"
              % (reader, flat["read_mib"] / max(part["read_mib"], 1e-9), flat["seconds"] / part["seconds"]),
              flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "cdcd"))
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--days", type=int, default=730)
    ap.add_argument("--rate", type=int, default=1000, help="moving updates per second in the streaming phase")
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--commit-interval-ms", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each query (the best is printed)")
    ap.add_argument("--arrival", choices=("time", "random"), default="time",
                    help="time: ids in created_at order (orders arriving), random: created_at unrelated to the id")
    ap.add_argument("--no-maintain", action="store_true", help="skip maintenance and the second queries (step 4b)")
    ap.add_argument("--no-moves", action="store_true", help="skip the streaming phase (step 5)")
    ap.add_argument("--no-check", action="store_true",
                    help="skip the equality checks (step 6: minutes and ~13 GiB of Python at 10M rows)")
    ap.add_argument("--keep", action="store_true", help="keep the warehouses and logs")
    ap.add_argument("--drop", action="store_true", help="drop the source table at the end")
    args = ap.parse_args()
    b = Bench(args)
    try:
        b.ensure_table()
        print("load average: %.2f %.2f %.2f" % os.getloadavg())
        limit_s, limit_bytes = b.source_copy_limit()
        print("source limit: COPY (FORMAT binary) of %d rows to /dev/null: %.1f s (%.0f rows/s, %.0f MiB)"
              % (args.rows, limit_s, args.rows / limit_s, limit_bytes / 2**20), flush=True)
        copies = {}
        for layout, partition_by in LAYOUTS:
            c = b.copy(layout, partition_by)
            copies[layout] = c
            print("copy %-16s %.1f s, %.0f rows/s (%.2fx COPY), cdcd CPU %.1f s, peak RSS %.0f MiB, %d data files"
                  " (%.0f MiB)" % (layout, c["seconds"], c["rows_s"], limit_s / c["seconds"], c["cpu"], c["rss_mib"],
                                   c["files"], c["data_mib"]), flush=True)
            if partition_by is None:
                b.stop_cdcd()
        ratio = copies[LAYOUTS[1][0]]["rows_s"] / copies[LAYOUTS[0][0]]["rows_s"]
        print("partitioned copy rate / unpartitioned: %.2f" % ratio)
        queries(b, "as copied")
        layout = LAYOUTS[1][0]
        b.stop_cdcd()
        if not args.no_maintain:
            for i, (name, _) in enumerate(LAYOUTS):
                m = b.maintain(i, name)
                print("maintenance %-16s %d cycles, %.1f s: %d data files in %d manifests"
                      % (name, m["cycles"], m["seconds"], m["files"], m["manifests"]), flush=True)
            queries(b, "after maintenance")
        if not args.no_check:
            ok, last = b.check_equal(LAYOUTS[0][0])
            print("equal to the source (%s, pyiceberg): %s %s"
                  % (LAYOUTS[0][0], "yes" if ok else "NO", " ".join(last)))
        if args.no_moves:
            return
        limit_tps = b.source_move_limit()
        b.start_cdcd(layout, LAYOUTS[1][1])
        time.sleep(3)
        m = b.moves(layout)
        print("moving updates on %s: %.0f tps offered (source limit %.0f tps unthrottled), lag p50 %.0f ms, p99 %.0f"
              " ms (%d markers), cdcd %.2f cores, peak RSS %.0f MiB"
              % (layout, m["tps"], limit_tps, m["lag_p50"], m["lag_p99"], m["markers"], m["cpu"], m["rss_mib"]))
        if not args.no_check:
            ok, last = b.check_equal(layout)
            print("equal to the source (%s, pyiceberg): %s %s" % (layout, "yes" if ok else "NO", " ".join(last)))
        print("load average: %.2f %.2f %.2f" % os.getloadavg())
    finally:
        b.cleanup()


if __name__ == "__main__":
    main()
