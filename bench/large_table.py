#!/usr/bin/env python3
"""One large table (issue 37's second goal): pgbench's tables at a scale (1000: 100M accounts, ~13 GB) copied by
cdcd beside the source's own COPY, then pgbench's TPC-B streamed through cdcd at full rate, in one run.

What it does and prints:
  1. creates (or reuses) pgbench's four tables at --scale (`pgbench -i -I dtGvp`: generated server side, with
     primary keys; pgbench_history has none and is captured as a keyless table);
  2. the source's limits: `COPY pgbench_accounts TO STDOUT (FORMAT binary)` into `wc -c` (the copy's limit), and
     pgbench's TPC-B unthrottled for --limit-seconds with no cdcd (tps) with pg_recvlogical decoding the WAL it
     wrote through pgoutput into /dev/null (transactions/s: the streaming limit);
  3. cdcd from start until every table's checkpoint says its copy is complete: seconds, rows/s of the accounts
     table, the ratio to COPY, peak RSS (VmHWM) and CPU over the copy;
  4. the primary-key index on disk (`_cdcd/<pipeline>/index` in the warehouse), and its open time: cdcd
     restarted, the time until its first commit of a change made after the restart;
  5. pgbench TPC-B unthrottled (--clients) for --seconds while a marker transaction every 200 ms updates one
     account and records its commit LSN and wall time, and a poller notes when the accounts table's committed
     `cdcd.position` covers it: tps, lag p50/p99 (and per minute, with cdcd's highest RSS in that minute),
     cdcd's CPU (cores), peak RSS over the whole run, and object-store requests per minute by kind
     (`cdcd_object_store_requests_total`);
  6. with --check, pgbench_branches and pgbench_tellers equal to the source (tests/support/lakecheck.py);
     --check-accounts adds the large table (minutes at scale 1000).

Usage (the test bed must be up: eval "$(scripts/testbed.sh env)"; ~16 GB free on the Postgres disk at scale 1000
and ~5 GB where the temporary warehouse goes):
  cargo build --release --bins
  $CDCD_TEST_PYTHON bench/large_table.py --scale 1000 [--seconds 120] [--clients 8] [--check] [--drop]

The tables are kept for the next run unless --drop (pgbench -i at scale 1000 takes minutes). Nothing is asserted:
it prints figures for docs/performance.md.
"""
import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import psycopg2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import iceberg_position_fast, iceberg_summary, lsn_int  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAKECHECK = os.path.join(ROOT, "tests", "support", "lakecheck.py")
TABLES = ["pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history"]


def du(path):
    total = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


class Bench(common.PostgresBench):
    def __init__(self, args):
        super().__init__(args, "large", "cdcd-large-")
        self.config = os.path.join(self.workdir, "pipeline.toml")

    def table_dir(self, table):
        return os.path.join(self.warehouse, "bench", table)

    def ensure_tables(self):
        scale = self.args.scale
        try:
            have = self.sql("select count(*) from pgbench_branches")[0][0]
            self.sql("select 1 from pgbench_accounts limit 1")
        except psycopg2.Error:
            have = -1
        if have == scale:
            return False
        print("creating pgbench's tables at scale %d (pgbench -i)…" % scale, file=sys.stderr, flush=True)
        started = time.time()
        subprocess.run([os.path.join(self.pg_bin, "pgbench"), "-i", "-q", "-I", "dtGvp", "-s", str(scale), self.url],
                       check=True)
        print("created in %.0f s" % (time.time() - started), file=sys.stderr, flush=True)
        return True

    def copy_binary(self):
        """Seconds and bytes of one binary COPY of the accounts table drained into `wc -c`."""
        query = "COPY pgbench_accounts TO STDOUT (FORMAT binary)"
        started = time.time()
        psql = subprocess.Popen([os.path.join(self.pg_bin, "psql"), "-X", "-q", "-d", self.url, "-c", query],
                                stdout=subprocess.PIPE)
        count = subprocess.run(["wc", "-c"], stdin=psql.stdout, capture_output=True, text=True, check=True)
        psql.stdout.close()
        if psql.wait() != 0:
            sys.exit("psql COPY failed")
        return time.time() - started, int(count.stdout.split()[0])

    def pgbench(self, seconds):
        return self.run_pgbench([], seconds)

    def streaming_limit(self):
        """pgbench unthrottled with no cdcd, then pg_recvlogical over the WAL it wrote (transactions/s)."""
        self.sql("create publication %s for table %s" % (self.publication, ", ".join(TABLES)))
        return self.decoding_limit(lambda: self.pgbench(self.args.limit_seconds))

    def write_config(self):
        a = self.args
        with open(self.config, "w") as f:
            f.write("""[pipeline]
name = "%s"
commit_interval_ms = %d

[source]
kind = "postgres"
url = "%s"
tables = [%s]
slot = "%s"
publication = "%s"
snapshot = "initial"
snapshot_parallelism = %d

[sink]
kind = "iceberg"
warehouse = "%s"
namespace = "bench"

[metrics]
listen = "127.0.0.1:%d"
""" % (self.tag, a.commit_interval_ms, self.url, ", ".join('"public.%s"' % t for t in TABLES), self.slot,
                self.publication, a.parallelism, self.warehouse, self.port))

    def start(self):
        log = open(os.path.join(self.workdir, "cdcd.log"), "a")
        env = dict(os.environ, CDCD_LOG=os.environ.get("CDCD_LOG", "info"))
        self.cdcd = subprocess.Popen([self.args.bin, "--config", self.config], stdout=log, stderr=log, env=env)

    def alive(self):
        if self.cdcd.poll() is not None:
            sys.exit("cdcd exited with %s; log: %s" % (self.cdcd.returncode, os.path.join(self.workdir, "cdcd.log")))

    def copy(self):
        """cdcd from start until every table's checkpoint says its copy is complete."""
        self.write_config()
        started = time.time()
        self.start()
        deadline = started + self.args.timeout
        while time.time() < deadline:
            self.alive()
            summaries = [iceberg_summary(self.table_dir(t)) for t in TABLES]
            if all(s and s.get("cdcd.position") not in (None, "", "0/0") and "cdcd.snapshot" not in s
                   for s in summaries):
                return time.time() - started, common.rss_peak_kib(self.cdcd.pid), common.cpu_seconds(self.cdcd.pid)
            time.sleep(0.1)
        sys.exit("the copy did not finish within %d s" % self.args.timeout)

    def marker(self, cur, rng):
        """One account updated in a transaction of its own; its commit LSN."""
        cur.execute("update pgbench_accounts set abalance = abalance + 1 where aid = %s",
                    (rng.randrange(1, self.args.scale * 100000 + 1),))
        cur.execute("select pg_current_wal_lsn()::text")
        return lsn_int(cur.fetchone()[0])

    def restart(self):
        """cdcd stopped and started again: seconds until a change made after the restart is committed."""
        self.stop()
        conn = psycopg2.connect(self.url)
        conn.autocommit = True
        lsn = self.marker(conn.cursor(), random.Random(11))
        conn.close()
        started = time.time()
        self.start()
        while (iceberg_position_fast(self.table_dir("pgbench_accounts")) or 0) < lsn:
            self.alive()
            if time.time() > started + self.args.timeout:
                sys.exit("cdcd did not commit after its restart within %d s" % self.args.timeout)
            time.sleep(0.02)
        return time.time() - started

    def gauges(self):
        """The lag gauge and the index memory by part (MiB), from one scrape of /metrics."""
        try:
            text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.port, timeout=2).read().decode()
        except OSError:
            return None, {}
        lag, index = None, {}
        for line in text.splitlines():
            if line.startswith("cdcd_source_lag_seconds"):
                lag = float(line.rsplit(" ", 1)[1])
            elif line.startswith("cdcd_index_memory_bytes{"):
                part = line.split('part="', 1)[1].split('"', 1)[0]
                index[part] = float(line.rsplit(" ", 1)[1]) / 2**20
        return lag, index

    def streaming(self):
        """pgbench TPC-B unthrottled with markers for the lag."""
        a = self.args
        done = threading.Event()
        markers = []  # [commit wall time, lsn, covered time or None]
        gauge = []
        rss = []  # [time, VmRSS KiB], once a second
        index = []  # [time, {part: MiB}], once a second

        def mark():
            conn = psycopg2.connect(self.url)
            conn.autocommit = True
            cur = conn.cursor()
            rng = random.Random(7)
            while not done.is_set():
                lsn = self.marker(cur, rng)
                markers.append([time.time(), lsn, None])
                time.sleep(0.2)
            conn.close()

        def poll():
            next_scrape = 0.0
            while not done.is_set() or any(m[2] is None for m in markers):
                if done.is_set() and time.time() > stop_at + 120:
                    return
                position = iceberg_position_fast(self.table_dir("pgbench_accounts")) or 0
                now = time.time()
                for m in markers:
                    if m[2] is None and position >= m[1]:
                        m[2] = now
                if now >= next_scrape:
                    next_scrape = now + 1.0
                    lag, parts = self.gauges()
                    if lag is not None:
                        gauge.append(lag)
                    if parts:
                        index.append((now, parts))
                    kib = common.rss_kib(self.cdcd.pid)
                    if kib is not None and not done.is_set():
                        rss.append((now, kib))
                time.sleep(0.05)

        threads = [threading.Thread(target=mark), threading.Thread(target=poll)]
        cpu0 = common.cpu_seconds(self.cdcd.pid)
        requests0 = common.object_store_requests(self.port)
        started = time.time()
        stop_at = started + a.seconds
        for t in threads:
            t.start()
        tps = self.pgbench(a.seconds)
        elapsed = time.time() - started
        cpu1 = common.cpu_seconds(self.cdcd.pid)
        requests1 = common.object_store_requests(self.port)
        done.set()
        for t in threads:
            t.join()
        lags = sorted(m[2] - m[0] for m in markers if m[2] is not None)
        gauge.sort()
        # Per minute of the run, by the marker's commit time: a backlog built early (a cold cache
        # after the restart, the copy's files being merged) shows apart from the steady state.
        minutes = []
        for minute in range(int(elapsed // 60) + 1):
            lo = started + 60 * minute
            window = sorted(m[2] - m[0] for m in markers if m[2] is not None and lo <= m[0] < lo + 60)
            held = [kib for t, kib in rss if lo <= t < lo + 60]
            # The index's parts at the last scrape of the minute.
            parts = next((p for t, p in reversed(index) if lo <= t < lo + 60), {})
            if window:
                minutes.append((minute, common.percentile_ms(window, 0.5), common.percentile_ms(window, 0.99),
                                max(held, default=0) / 1024, parts.get("memtables", 0),
                                parts.get("run_metas", 0), parts.get("block_cache", 0)))
        return {
            "minutes": minutes,
            "tps": tps,
            "lag_p50": common.percentile_ms(lags, 0.5),
            "lag_p99": common.percentile_ms(lags, 0.99),
            "markers": len(lags),
            "uncovered": sum(1 for m in markers if m[2] is None),
            "gauge_p99": common.percentile_ms(gauge, 0.99),
            "cpu": ((cpu1 or 0) - (cpu0 or 0)) / elapsed,
            "requests_min": {op: (n - requests0.get(op, 0)) / elapsed * 60 for op, n in requests1.items()},
        }

    def check_equal(self, tables):
        py = os.environ.get("CDCD_TEST_PYTHON", sys.executable)
        results = []
        for t in tables:
            out = subprocess.run([py, LAKECHECK, "--source", self.url, "--source-table", "public." + t,
                                  "--wait", "120", "--iceberg", self.table_dir(t)], capture_output=True, text=True)
            results.append((t, out.returncode == 0, (out.stdout + out.stderr).strip()[-300:]))
        return results

    def stop(self):
        if self.cdcd and self.cdcd.poll() is None:
            self.cdcd.send_signal(signal.SIGTERM)
            try:
                self.cdcd.wait(120)
            except subprocess.TimeoutExpired:
                self.cdcd.kill()
                self.cdcd.wait()

    def cleanup(self):
        self.stop()
        for slot in (self.slot, self.recv_slot):
            try:
                self.sql("select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name = %s",
                         slot)
            except psycopg2.Error as e:
                print("could not drop slot %s: %s" % (slot, e), file=sys.stderr)
        self.sql("drop publication if exists %s, %s_inserts" % (self.publication, self.publication))
        if self.args.drop:
            self.sql("drop table if exists %s" % ", ".join(TABLES))
        if self.args.keep:
            print("kept", self.workdir)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "cdcd"))
    ap.add_argument("--scale", type=int, default=1000, help="pgbench scale (100,000 accounts each)")
    ap.add_argument("--seconds", type=int, default=120, help="pgbench TPC-B through cdcd")
    ap.add_argument("--limit-seconds", type=int, default=15, help="pgbench TPC-B without cdcd (the source's limit)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--parallelism", type=int, default=4, help="source.snapshot_parallelism")
    ap.add_argument("--commit-interval-ms", type=int, default=1000)
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--check", action="store_true", help="branches and tellers equal to the source at the end")
    ap.add_argument("--check-accounts", action="store_true", help="the accounts table too (slow)")
    ap.add_argument("--keep", action="store_true", help="keep the warehouse and log")
    ap.add_argument("--drop", action="store_true", help="drop pgbench's tables at the end")
    args = ap.parse_args()
    if not os.access(args.bin, os.X_OK):
        sys.exit("%s is not built: cargo build --release --bins" % args.bin)

    b = Bench(args)
    try:
        b.ensure_tables()
        rows = args.scale * 100000
        heap = b.sql("select pg_table_size('pgbench_accounts')")[0][0]
        copy_s, size = b.copy_binary()
        print("table: pgbench_accounts, %d rows, %.1f GiB of heap, %.0f MB of binary COPY data; load average %s"
              % (rows, heap / 2**30, size / 1e6, common.load_average()), flush=True)
        print("source limit, copy: COPY (FORMAT binary) → wc %.1f s, %.0f rows/s, %.0f MB/s"
              % (copy_s, rows / copy_s, size / 1e6 / copy_s), flush=True)
        limit_tps, decode_tps = b.streaming_limit()
        print("source limit, streaming: pgbench TPC-B unthrottled %.0f tps (%d clients, no cdcd); pg_recvlogical "
              "decodes %.0f tx/s" % (limit_tps, args.clients, decode_tps), flush=True)
        # cdcd creates its own publications (a keyless table's goes through one of inserts only).
        b.sql("drop publication %s" % b.publication)
        elapsed, peak, cpu = b.copy()
        print("cdcd copy: %.1f s, %.0f rows/s of accounts, %.2f× COPY; peak RSS %.0f MiB, CPU %.1f s; load %s"
              % (elapsed, rows / elapsed, copy_s / elapsed, (peak or 0) / 1024, cpu or 0, common.load_average()), flush=True)
        index = du(os.path.join(b.warehouse, "_cdcd", b.tag, "index"))
        data = du(b.warehouse) - index
        print("on disk: primary-key index %.0f MiB, the rest of the warehouse %.0f MiB" % (index / 2**20, data / 2**20),
              flush=True)
        reopen_s = b.restart()
        print("restart: a change made after the restart committed %.2f s after cdcd started (index opened)" % reopen_s,
              flush=True)
        r = b.streaming()
        print("streaming: pgbench TPC-B %.0f tps unthrottled through cdcd (limit %.0f tps, decode %.0f tx/s), "
              "commit_interval_ms=%d" % (r["tps"], limit_tps, decode_tps, args.commit_interval_ms))
        print("lag: p50 %.0f ms, p99 %.0f ms (%d markers, %d not committed within 120 s of the end); "
              "cdcd_source_lag_seconds p99 %.0f ms" % (r["lag_p50"], r["lag_p99"], r["markers"], r["uncovered"],
                                                       r["gauge_p99"]))
        print("by minute of the run, lag p50/p99 ms, cdcd's highest RSS MiB, and the index memory at its end "
              "(memtables/run metas/block cache MiB): "
              + ", ".join("%d: %.0f/%.0f, %.0f MiB (%.0f/%.0f/%.0f)" % m for m in r["minutes"]))
        print("object-store requests per minute while streaming: " + (", ".join(
            "%s %.0f" % (op.upper(), n) for op, n in sorted(r["requests_min"].items(), key=lambda kv: -kv[1]))
            or "none counted"))
        print("cdcd: CPU %.2f cores while streaming; peak RSS over the run %.0f MiB (after the restart)"
              % (r["cpu"], (common.rss_peak_kib(b.cdcd.pid) or 0) / 1024), flush=True)
        ok = True
        if args.check or args.check_accounts:
            tables = ["pgbench_branches", "pgbench_tellers"] + (["pgbench_accounts"] if args.check_accounts else [])
            for t, equal, detail in b.check_equal(tables):
                ok &= equal
                print("replica: %s %s%s" % (t, "equal" if equal else "NOT EQUAL", "" if equal else ": " + detail))
        b.stop()
        return 0 if ok else 1
    finally:
        b.cleanup()


if __name__ == "__main__":
    sys.exit(main())
