#!/usr/bin/env python3
"""Initial-copy benchmark: cdcd copying a Postgres table into a lake table, beside a plain binary COPY, in one run.

What it measures (issue 7):
  1. creates (or reuses) a table of N rows (default 5,000,000; the shape of examples/snapshot_bench.rs:
     int8 key, int4, date, numeric(12,2), md5 text, timestamptz);
  2. the source's limit: `COPY (SELECT …) TO STDOUT (FORMAT binary)` on one connection, drained by psql into
     `wc -c` (which also gives the stream's size: the bytes behind every MB/s figure);
  3. cdcd end to end, per target (Iceberg with deletion vectors, Iceberg with equality deletes, the LSM sink):
     the release binary with a fresh slot and a fresh local warehouse, from process start until the table's
     newest checkpoint says the copy is complete (`cdcd.position` set past 0/0, no `cdcd.snapshot` left);
  4. cdcd's peak RSS (VmHWM) and CPU time (user + system, all threads) over the run, and the row count the lake
     table reports (a sanity check, untimed). CPU seconds are the figure to compare on a busy machine: wall time
     there measures the neighbours.

Usage (the test bed must be up: scripts/testbed.sh up; eval "$(scripts/testbed.sh env)"):
  cargo build --release
  $CDCD_TEST_PYTHON bench/pg_snapshot.py [--rows 5000000] [--targets dv,equality,lsm] [--parallelism 4] [--repeat 3] [--keep]

Each round runs the baseline, then every target; with several rounds (default 3) the median ratio per
target is printed last: on a shared VM one run's ratio moves by ±0.1 with the neighbours.

The table `cdcd_bench_snapshot` is kept for the next run (the same one examples/snapshot_bench.rs uses);
`--drop` drops it at the end. Slots, publications and warehouses are the run's own and are removed.
Nothing is asserted: it prints figures for README. Run it on a quiet machine: both cdcd and Postgres need the
CPU, so the load average is printed beside the figures.
"""
import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import psycopg2

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)
from common import cpu_seconds, iceberg_summary, paimon_properties, rss_peak_kib  # noqa: E402

TABLE = "cdcd_bench_snapshot"
COLUMNS = "id, v, d, n, t, ts"
TARGETS = {
    "dv": ('kind = "iceberg"\ndelete_mode = "deletion-vectors"\n', "Iceberg, deletion vectors"),
    "equality": ('kind = "iceberg"\ndelete_mode = "equality"\n', "Iceberg, equality deletes"),
    "lsm": ('kind = "lsm"\nbuckets = 4\n', "LSM (Paimon, 4 buckets)"),
}


def copy_complete(props):
    """The checkpoint says the copy is done: a real position and no copy progress left."""
    if not props:
        return False
    pos = props.get("cdcd.position")
    return bool(pos) and pos != "0/0" and "cdcd.snapshot" not in props


class Bench:
    def __init__(self, args):
        self.args = args
        self.url = os.environ.get("CDCD_TEST_PG")
        if not self.url:
            sys.exit("CDCD_TEST_PG is unset: scripts/testbed.sh up && eval \"$(scripts/testbed.sh env)\"")
        self.psql = os.path.join(os.environ.get("CDCD_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"), "psql")
        self.conn = psycopg2.connect(self.url)
        self.conn.autocommit = True

    def sql(self, text, *params):
        with self.conn.cursor() as cur:
            cur.execute(text, params)
            return cur.fetchall() if cur.description else None

    def ensure_table(self, rows):
        try:
            have = self.sql("select count(*) from %s" % TABLE)[0][0]
        except psycopg2.Error:
            have = -1
        if have == rows:
            return
        print("creating %s with %d rows…" % (TABLE, rows), file=sys.stderr)
        self.sql("drop table if exists %s" % TABLE)
        self.sql(
            """create table %s (id int8 primary key, v int4, d date, n numeric(12,2), t text, ts timestamptz)"""
            % TABLE
        )
        self.sql(
            """insert into %s select g, g %% 100000, date '2020-01-01' + (g %% 2000)::int, (g %% 1000000) / 100.0,
               md5(g::text), timestamptz '2024-01-01' + g * interval '1 second' from generate_series(1, %%s) g"""
            % TABLE,
            rows,
        )
        self.sql("vacuum analyze %s" % TABLE)

    def copy_binary(self):
        """Seconds and bytes of one binary COPY drained into `wc -c`."""
        query = "COPY (SELECT %s FROM %s) TO STDOUT (FORMAT binary)" % (COLUMNS, TABLE)
        started = time.time()
        psql = subprocess.Popen([self.psql, "-X", "-q", "-d", self.url, "-c", query], stdout=subprocess.PIPE)
        count = subprocess.run(["wc", "-c"], stdin=psql.stdout, capture_output=True, text=True, check=True)
        psql.stdout.close()
        if psql.wait() != 0:
            sys.exit("psql COPY failed")
        return time.time() - started, int(count.stdout.split()[0])

    def run_cdcd(self, target):
        sink, _ = TARGETS[target]
        tag = "snapbench_%d_%s" % (os.getpid(), target)
        workdir = tempfile.mkdtemp(prefix="cdcd-snapbench-")
        warehouse = os.path.join(workdir, "warehouse")
        config = os.path.join(workdir, "pipeline.toml")
        with open(config, "w") as f:
            f.write(
                """[pipeline]
name = "%s"

[source]
kind = "postgres"
url = "%s"
tables = ["public.%s"]
slot = "%s"
publication = "%s"
snapshot = "initial"
snapshot_parallelism = %d

[sink]
%swarehouse = "%s"
namespace = "bench"
"""
                % (tag, self.url, TABLE, tag, tag, self.args.parallelism, sink, warehouse)
            )
        if target == "lsm":
            table_dir = os.path.join(warehouse, "bench.db", TABLE)
            read = paimon_properties
        else:
            table_dir = os.path.join(warehouse, "bench", TABLE)
            read = iceberg_summary
        log_path = os.path.join(workdir, "cdcd.log")
        env = dict(os.environ, CDCD_LOG=os.environ.get("CDCD_LOG", "warn"))
        started = time.time()
        with open(log_path, "w") as log:
            proc = subprocess.Popen([self.args.bin, "--config", config], stdout=log, stderr=log, env=env)
        try:
            deadline = started + self.args.timeout
            props = None
            while time.time() < deadline:
                props = read(table_dir)
                if copy_complete(props):
                    break
                if proc.poll() is not None:
                    sys.exit("cdcd exited with %s; log: %s" % (proc.returncode, log_path))
                time.sleep(0.02)
            else:
                sys.exit("cdcd did not finish the copy within %ss; log: %s" % (self.args.timeout, log_path))
            elapsed = time.time() - started
            peak = rss_peak_kib(proc.pid)
            cpu = cpu_seconds(proc.pid)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            try:
                self.sql(
                    "select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name = %s", tag
                )
            except psycopg2.Error as e:
                print("could not drop slot %s: %s" % (tag, e), file=sys.stderr)
            self.sql("drop publication if exists %s" % tag)
        if self.args.keep:
            print("kept", workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
        records = props.get("total-records") or props.get("totalRecordCount")
        return elapsed, peak, cpu, records


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(ROOT), "target", "release", "cdcd"))
    ap.add_argument("--skip-copy", action="store_true", help="skip the COPY baseline (comparing cdcd builds)")
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--targets", default="dv", help="comma-separated: dv, equality, lsm")
    ap.add_argument("--parallelism", type=int, default=4, help="source.snapshot_parallelism")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--keep", action="store_true", help="keep the warehouses and logs")
    ap.add_argument("--drop", action="store_true", help="drop the source table at the end")
    ap.add_argument("--repeat", type=int, default=3, help="rounds of baseline + targets (median ratio printed)")
    args = ap.parse_args()
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        sys.exit("unknown target(s) %s; choose from %s" % (unknown, ", ".join(TARGETS)))

    b = Bench(args)
    b.ensure_table(args.rows)
    # Rounds alternate the baseline and every target, so a neighbour's burst on a shared machine
    # hits one round, not one side; the summary takes the median ratio over the rounds.
    ratios = {t: [] for t in targets}
    for round_no in range(1, args.repeat + 1):
        base_s, size = (1.0, 0) if args.skip_copy else b.copy_binary()
        mb = size / 1e6
        if round_no == 1:
            print("table: %d rows, %.0f MB of binary COPY data; load average %s" % (args.rows, mb, load()))
        if args.repeat > 1:
            print("round %d of %d" % (round_no, args.repeat))
        print(
            "%-28s %7.2f s %10.0f rows/s %7.1f MB/s"
            % ("COPY (FORMAT binary) → wc", base_s, args.rows / base_s, mb / base_s)
        )
        for target in targets:
            elapsed, peak, cpu, records = b.run_cdcd(target)
            ratios[target].append(base_s / elapsed)
            print(
                "%-28s %7.2f s %10.0f rows/s %7.1f MB/s  ratio %.2f×  peak RSS %s MiB  cdcd CPU %s s"
                "  (%s rows in the table; load %s)"
                % (
                    "cdcd → " + TARGETS[target][1],
                    elapsed,
                    args.rows / elapsed,
                    mb / elapsed,
                    base_s / elapsed,
                    "?" if peak is None else "%.0f" % (peak / 1024),
                    "?" if cpu is None else "%.1f" % cpu,
                    records,
                    load(),
                )
            )
    if args.repeat > 1 and not args.skip_copy:
        for target in targets:
            r = sorted(ratios[target])
            print(
                "median ratio %-28s %.2f× over %d rounds (min %.2f×, max %.2f×)"
                % (TARGETS[target][1], statistics.median(r), len(r), r[0], r[-1])
            )
    if args.drop:
        b.sql("drop table %s" % TABLE)


def load():
    return " ".join("%.2f" % x for x in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
