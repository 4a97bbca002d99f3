#!/usr/bin/env python3
"""Many tables (issue 37): N captured tables, B of them busy with pgbench-style small transactions at a target
rate, beside the source's own limit for the same load.

What it does and prints:
  1. creates N tables of --rows rows each and a PL/pgSQL function that makes one small transaction over three
     random busy tables (two updates and an insert, as pgbench's TPC-B touches accounts, tellers and history);
  2. the source's limit: pgbench runs that transaction unthrottled for --limit-seconds with no cdcd (tps), and
     pg_recvlogical decodes the WAL it wrote through pgoutput into /dev/null (transactions/s);
  3. starts cdcd (initial copy of the N tables; the time until every table is committed is printed);
  4. pgbench at --rate tps for --seconds, while a marker transaction every 200 ms records its commit LSN and wall
     time, and a poller notes when each of its three tables' committed `cdcd.position` covers it: lag p50/p99;
  5. over the loaded window: commits/s (cdcd_commits_total), files written (files under the warehouse modified
     during the window) per minute, object-store requests per minute by kind (cdcd_object_store_requests_total),
     cdcd's peak and current RSS and CPU (cores), and cdcd's own lag gauge p99;
  6. checks a few busy tables and one idle table equal to the source (tests/support/lakecheck.py, untimed).
With --window-seconds W (for the 30-minute run of issue 37's goal), every W seconds of the load one line: the
lag p50/p99 of the markers committed in that window, commits/s, the files on disk under the warehouse (all, and
the tables' metadata: metadata.json, Avro manifests and lists, Puffin) with their bytes, and cdcd's RSS, so that
whether files and metadata stay flat after the first minutes can be read off.

Usage (the test bed must be up: eval "$(scripts/testbed.sh env)"):
  cargo build --release --bins
  $CDCD_TEST_PYTHON bench/many_tables.py --tables 1000 --busy 200 --rate 2000 --seconds 120
      [--commit-interval-ms 1000] [--commit-concurrency 16] [--sink iceberg|lsm] [--keep] [--window-seconds 60]
      [--table-property cdcd.compaction.trigger-small-files=16 ...]

Nothing here is asserted: it prints figures for docs/performance.md.
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
from common import iceberg_position_fast, lsn_int  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAKECHECK = os.path.join(ROOT, "tests", "support", "lakecheck.py")
class Bench(common.PostgresBench):
    def __init__(self, args):
        super().__init__(args, "mt", "cdcd-many-")

    def table(self, i):
        return "%s_%d" % (self.tag, i)

    def table_dir(self, i):
        if self.args.sink == "lsm":
            return os.path.join(self.warehouse, "bench.db", self.table(i))
        return os.path.join(self.warehouse, "bench", self.table(i))

    def position(self, i):
        if self.args.sink == "lsm":
            pos = common.paimon_position(self.table_dir(i))
            return lsn_int(pos) if pos else None
        return iceberg_position_fast(self.table_dir(i))

    def setup(self):
        a = self.args
        with self.conn.cursor() as cur:
            for i in range(a.tables):
                cur.execute(
                    "create table %s (id bigint primary key, v int not null, s text);"
                    "insert into %s select g, g, 'seed' from generate_series(1, %d) g" % (self.table(i), self.table(i), a.rows)
                )
            cur.execute("create sequence %s_ids start 1000000000" % self.tag)
            # One small transaction over three busy tables: two updates and an insert (pgbench's TPC-B shape).
            cur.execute(
                """create function %(tag)s_tx(a int, b int, c int, k int) returns void language plpgsql as $f$
                   begin
                     execute format('update %%I set v = v + 1 where id = $1', '%(tag)s_' || a) using k;
                     execute format('update %%I set v = v - 1 where id = $1', '%(tag)s_' || b) using k;
                     execute format('insert into %%I values (nextval(''%(tag)s_ids''), 0, ''h'')', '%(tag)s_' || c);
                   end $f$""" % {"tag": self.tag}
            )
            cur.execute("create publication %s for table %s"
                        % (self.publication, ", ".join(self.table(i) for i in range(a.tables))))
        self.script = os.path.join(self.workdir, "tx.sql")
        with open(self.script, "w") as f:
            f.write("\\set a random(0, %d)\n\\set b random(0, %d)\n\\set c random(0, %d)\n\\set k random(1, %d)\n"
                    "select %s_tx(:a, :b, :c, :k);\n" % (a.busy - 1, a.busy - 1, a.busy - 1, a.rows, self.tag))

    def pgbench(self, seconds, rate=None):
        return self.run_pgbench(["-f", self.script], seconds, rate)

    def source_limit(self):
        """pgbench unthrottled with no cdcd, then pg_recvlogical over the WAL it wrote."""
        return self.decoding_limit(lambda: self.pgbench(self.args.limit_seconds))

    def start_cdcd(self):
        a = self.args
        sink = 'kind = "lsm"\nbuckets = 1\n' if a.sink == "lsm" else 'kind = "iceberg"\n'
        config = os.path.join(self.workdir, "pipeline.toml")
        with open(config, "w") as f:
            f.write("""[pipeline]
name = "%s"
commit_interval_ms = %d
commit_concurrency = %d

[source]
kind = "postgres"
url = "%s"
tables = ["public.%s_*"]
slot = "%s"
publication = "%s"
snapshot = "initial"

[sink]
%swarehouse = "%s"
namespace = "bench"

[metrics]
listen = "127.0.0.1:%d"
""" % (self.tag, a.commit_interval_ms, a.commit_concurrency, self.url, self.tag, self.slot, self.publication, sink,
                self.warehouse, self.port))
            if a.table_property:
                f.write("\n[sink.table_properties]\n")
                for kv in a.table_property:
                    key, _, value = kv.partition("=")
                    f.write('"%s" = "%s"\n' % (key, value))
        log = open(os.path.join(self.workdir, "cdcd.log"), "w")
        env = dict(os.environ, CDCD_LOG=os.environ.get("CDCD_LOG", "warn"))
        self.cdcd = subprocess.Popen([a.bin, "--config", config], stdout=log, stderr=log, env=env)
        started = time.time()
        while True:
            if self.cdcd.poll() is not None:
                sys.exit("cdcd exited with %s; log: %s" % (self.cdcd.returncode, os.path.join(self.workdir, "cdcd.log")))
            done = sum(1 for i in range(a.tables) if self.position(i) is not None)
            if done == a.tables:
                return time.time() - started
            time.sleep(0.5)

    def metrics(self):
        """(sum of cdcd_commits_total, cdcd_source_lag_seconds) from cdcd's /metrics."""
        try:
            text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.port, timeout=2).read().decode()
        except OSError:
            return None, None
        commits = sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith("cdcd_commits_total{"))
        lag = next((float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith("cdcd_source_lag_seconds")), None)
        return commits, lag

    def requests(self):
        """cdcd_object_store_requests_total by op (put, get, head, list, delete, copy)."""
        return common.object_store_requests(self.port)

    def files_since(self, since):
        """Files under the warehouse written since `since` (and still there), by kind."""
        kinds = {}
        for root, _, files in os.walk(self.warehouse):
            for name in files:
                try:
                    if os.stat(os.path.join(root, name)).st_mtime < since:
                        continue
                except OSError:
                    continue
                if "/_cdcd/" in root + "/":
                    kind = "index"
                elif name.endswith(".metadata.json"):
                    kind = "metadata.json"
                else:
                    kind = name.rsplit(".", 1)[-1]
                kinds[kind] = kinds.get(kind, 0) + 1
        return kinds

    def on_disk(self):
        """(files, bytes, metadata files, metadata bytes) under the warehouse now; metadata: the tables'
        metadata.json, Avro and Puffin files (not the index, not data files)."""
        files = size = meta_files = meta_size = 0
        for root, _, names in os.walk(self.warehouse):
            for name in names:
                try:
                    n = os.stat(os.path.join(root, name)).st_size
                except OSError:
                    continue
                files += 1
                size += n
                if "/_cdcd/" not in root + "/" and name.endswith((".metadata.json", ".avro", ".puffin")):
                    meta_files += 1
                    meta_size += n
        return files, size, meta_files, meta_size

    def window_report(self, markers, done, started):
        """Every --window-seconds of the load, one line (module doc)."""
        a = self.args
        print("window: t (s), lag p50/p99 (ms, markers committed in the window), commits/s, files on disk (MiB), "
              "metadata files (MiB), RSS (MiB)", flush=True)
        last_t, last_commits = started, self.metrics()[0] or 0
        while not done.wait(a.window_seconds):
            now = time.time()
            lags = sorted(m[3] - m[0] for m in list(markers) if m[3] is not None and last_t <= m[3] < now)
            commits = self.metrics()[0] or 0
            files, size, meta_files, meta_size = self.on_disk()
            rss = common.rss_kib(self.cdcd.pid) or 0
            print("window: %5.0f  %6.0f / %6.0f (%d)  %5.1f  %7d (%.0f)  %7d (%.0f)  %4.0f" % (
                now - started, common.percentile_ms(lags, 0.5), common.percentile_ms(lags, 0.99), len(lags),
                (commits - last_commits) / (now - last_t), files, size / 2**20, meta_files, meta_size / 2**20,
                rss / 1024), flush=True)
            last_t, last_commits = now, commits

    def loaded(self):
        """pgbench at the target rate, with markers for the lag and samplers for the rest."""
        a = self.args
        done = threading.Event()
        markers = []  # (commit wall time, lsn, tables, covered time or None)
        gauge = []
        next_scrape = [0.0]

        def mark():
            conn = psycopg2.connect(self.url)
            conn.autocommit = True
            cur = conn.cursor()
            rng = random.Random(7)
            while not done.is_set():
                tables = [rng.randrange(a.busy) for _ in range(3)]
                cur.execute("select %s_tx(%%s, %%s, %%s, %%s)" % self.tag, tables + [rng.randrange(1, a.rows + 1)])
                cur.execute("select pg_current_wal_lsn()::text")
                markers.append([time.time(), lsn_int(cur.fetchone()[0]), set(tables), None])
                time.sleep(0.2)
            conn.close()

        def poll():
            while not done.is_set() or any(m[3] is None for m in markers):
                open_ = [m for m in markers if m[3] is None]
                if done.is_set() and time.time() > stop_at + 120:
                    return
                positions = {}
                for m in open_:
                    for t in m[2]:
                        if t not in positions:
                            positions[t] = self.position(t) or 0
                    if all(positions[t] >= m[1] for t in m[2]):
                        m[3] = time.time()
                # The gauge once a second, not every pass: rendering /metrics costs cdcd CPU that
                # grows with the tables (~3 ms at 200), and a scrape every 50 ms took 14 % of its
                # CPU in this bench, which a Prometheus scrape every 15 s does not.
                if time.time() >= next_scrape[0]:
                    next_scrape[0] = time.time() + 1.0
                    _, lag = self.metrics()
                    if lag is not None:
                        gauge.append(lag)
                time.sleep(0.05)

        threads = [threading.Thread(target=mark), threading.Thread(target=poll)]
        if a.window_seconds:
            threads.append(threading.Thread(target=self.window_report, args=(markers, done, time.time())))
        commits0, _ = self.metrics()
        requests0 = self.requests()
        cpu0 = common.cpu_seconds(self.cdcd.pid)
        started = time.time()
        stop_at = started + a.seconds
        for t in threads:
            t.start()
        tps = self.pgbench(a.seconds, a.rate)
        elapsed = time.time() - started
        commits1, _ = self.metrics()
        requests1 = self.requests()
        cpu1 = common.cpu_seconds(self.cdcd.pid)
        rss = common.rss_peak_kib(self.cdcd.pid)
        files = self.files_since(started)
        done.set()
        for t in threads:
            t.join()
        lags = sorted(m[3] - m[0] for m in markers if m[3] is not None)
        gauge.sort()
        return {
            "tps": tps,
            "lag_p50": common.percentile_ms(lags, 0.5),
            "lag_p99": common.percentile_ms(lags, 0.99),
            "markers": len(lags),
            "gauge_p99": common.percentile_ms(gauge, 0.99),
            "commits_s": ((commits1 or 0) - (commits0 or 0)) / elapsed,
            "files_min": sum(files.values()) / elapsed * 60,
            "files_by_kind": files,
            "requests_min": {op: (n - requests0.get(op, 0)) / elapsed * 60 for op, n in requests1.items()},
            "cpu": ((cpu1 or 0) - (cpu0 or 0)) / elapsed,
            "rss_peak_mib": (rss or 0) / 1024,
        }

    def check_equal(self, tables, wait_s=60):
        """Each table equal to the source, waiting up to `wait_s` for cdcd to catch up."""
        py = os.environ.get("CDCD_TEST_PYTHON", sys.executable)
        results = []
        for i in tables:
            if self.args.sink == "lsm":
                target = ["--paimon", self.warehouse, "--paimon-table", "bench." + self.table(i)]
            else:
                target = ["--iceberg", self.table_dir(i)]
            out = subprocess.run([py, LAKECHECK, "--source", self.url, "--source-table", "public." + self.table(i),
                                  "--wait", str(int(wait_s))] + target, capture_output=True, text=True)
            results.append((self.table(i), out.returncode == 0))
        return results

    def stop_cdcd(self):
        if self.cdcd and self.cdcd.poll() is None:
            self.cdcd.send_signal(signal.SIGTERM)
            try:
                self.cdcd.wait(60)
            except subprocess.TimeoutExpired:
                self.cdcd.kill()

    def cleanup(self):
        self.stop_cdcd()
        for slot in (self.slot, self.recv_slot):
            try:
                self.sql("select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name = %s", slot)
            except psycopg2.Error as e:
                print("could not drop slot %s: %s" % (slot, e), file=sys.stderr)
        self.sql("drop publication if exists %s" % self.publication)
        with self.conn.cursor() as cur:
            for i in range(self.args.tables):
                cur.execute("drop table if exists %s" % self.table(i))
            cur.execute("drop function if exists %s_tx(int, int, int, int)" % self.tag)
            cur.execute("drop sequence if exists %s_ids" % self.tag)
        if not self.args.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)
        else:
            print("kept", self.workdir)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "cdcd"))
    ap.add_argument("--tables", type=int, default=1000)
    ap.add_argument("--busy", type=int, default=200)
    ap.add_argument("--rows", type=int, default=1000, help="rows per table at the start")
    ap.add_argument("--rate", type=int, default=2000, help="transactions/s offered")
    ap.add_argument("--seconds", type=int, default=120)
    ap.add_argument("--limit-seconds", type=int, default=15, help="the unthrottled run for the source's limit")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--commit-interval-ms", type=int, default=1000)
    ap.add_argument("--commit-concurrency", type=int, default=16)
    ap.add_argument("--sink", choices=["iceberg", "lsm"], default="iceberg")
    ap.add_argument("--keep", action="store_true", help="keep the warehouse and log")
    ap.add_argument("--table-property", action="append", default=[], metavar="KEY=VALUE",
                    help="a [sink.table_properties] entry for every table (repeatable)")
    ap.add_argument("--window-seconds", type=int, default=0, help="print a line of figures every so many seconds")
    args = ap.parse_args()
    if not os.access(args.bin, os.X_OK):
        sys.exit("%s is not built: cargo build --release --bins" % args.bin)
    if not 0 < args.busy <= args.tables:
        sys.exit("--busy must be between 1 and --tables")

    b = Bench(args)
    try:
        b.setup()
        limit_tps, decode_tps = b.source_limit()
        print("source limit: pgbench unthrottled %.0f tps (%d clients, no cdcd); pg_recvlogical decodes %.0f tx/s"
              % (limit_tps, args.clients, decode_tps))
        copy_s = b.start_cdcd()
        print("cdcd: %d tables copied and committed in %.1f s" % (args.tables, copy_s))
        r = b.loaded()
        print("load: %d tables, %d busy, %.0f tps offered %d (%s, commit_interval_ms=%d, commit_concurrency=%d)"
              % (args.tables, args.busy, r["tps"], args.rate, args.sink, args.commit_interval_ms, args.commit_concurrency))
        print("lag: p50 %.0f ms, p99 %.0f ms (%d markers); cdcd_source_lag_seconds p99 %.0f ms"
              % (r["lag_p50"], r["lag_p99"], r["markers"], r["gauge_p99"]))
        print("commits: %.1f/s; files written: %.0f/min; cdcd CPU %.2f cores, peak RSS %.0f MiB"
              % (r["commits_s"], r["files_min"], r["cpu"], r["rss_peak_mib"]))
        commits = max(r["commits_s"] * args.seconds, 1)
        print("files per commit by kind: " + ", ".join(
            "%s %.1f" % (k, n / commits) for k, n in sorted(r["files_by_kind"].items(), key=lambda kv: -kv[1])))
        print("object-store requests per minute: " + (", ".join(
            "%s %.0f" % (op.upper(), n) for op, n in sorted(r["requests_min"].items(), key=lambda kv: -kv[1]))
            or "none counted (cdcd without cdcd_object_store_requests_total)"))
        # A cdcd that fell behind is still catching up: wait for its lag to drain before judging.
        lag_s = r["lag_p99"] / 1000 if r["lag_p99"] == r["lag_p99"] else 0
        checked = b.check_equal([0, 1, args.busy - 1] + ([args.tables - 1] if args.tables > args.busy else []),
                                wait_s=60 + lag_s)
        print("replica: " + ", ".join("%s %s" % (t, "equal" if ok else "NOT EQUAL") for t, ok in checked))
        b.stop_cdcd()
        return 0 if all(ok for _, ok in checked) else 1
    finally:
        b.cleanup()


if __name__ == "__main__":
    sys.exit(main())
