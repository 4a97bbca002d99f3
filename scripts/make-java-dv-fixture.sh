#!/usr/bin/env bash
# Makes tests/fixtures/iceberg-java-dv/: an Iceberg format-v3 table written by Iceberg-Java 1.10 (Spark 3.5),
# with one data file of 20 rows and two successive Puffin deletion vectors on it (the second one merges the
# first: Iceberg v3 keeps at most one vector per data file). cdcd's deletion-vector and Puffin codecs
# are tested against it (src/sinks/iceberg/deletes/deletion_vector/mod.rs, puffin.rs), so that what cdcd writes is
# byte-compatible with the reference implementation.
#
# Needs the test bed with its spark component (`scripts/testbed.sh up`: pyspark 3.5.8, iceberg-spark-runtime
# 1.10.2, OpenJDK 17; DuckDB 1.5.5 and pyiceberg 0.12 read the table back as well). CDCD_TB names its
# directory (default /tmp/cdcd-tb); OUT may name another output directory (to compare without replacing).
#
# The table lives at a fixed path (WH below) because Iceberg metadata stores absolute locations: the
# fixture's manifest and Puffin footer name `file:$WH/db/events/data/...`. The tests only compare those names
# with each other and read the files by their base names from the fixture directory.
#
# Output: tests/fixtures/iceberg-java-dv/table/{metadata,data}/... (hadoop .crc side files dropped) and
# tests/fixtures/iceberg-java-dv/many-deletes.puffin (the vector of a second, 200,000-row table; see MANY_RULE);
# tests/fixtures/iceberg-java-dv/expected.json: what Spark, DuckDB and pyiceberg saw.
set -euo pipefail

TB=${CDCD_TB:-/tmp/cdcd-tb}
PY=$TB/venv/bin/python
JARS=$TB/spark-jars
WH=/tmp/cdcd-java-dv-fixture/warehouse
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/tests/fixtures/iceberg-java-dv}

[ -x "$PY" ] || { echo "no venv at $TB: scripts/testbed.sh up" >&2; exit 2; }
[ -s "$JARS/iceberg-shaded-jackson.jar" ] || { echo "no Spark in $TB: scripts/testbed.sh up (component spark)" >&2; exit 2; }

rm -rf "$WH"
mkdir -p "$WH"

TB="$TB" JARS="$JARS" WH="$WH" OUT="$OUT" SPARK_LOCAL_IP=127.0.0.1 TZ=UTC "$PY" - <<'EOF'
import glob, json, os, shutil, sys

import snowpark_connect_deps_iceberg as dep
from pyspark.sql import SparkSession

tb, wh, out = os.environ["TB"], os.environ["WH"], os.environ["OUT"]
runtime = glob.glob(os.path.join(os.path.dirname(dep.__file__), "jars", "iceberg-spark-runtime-3.5_2.12-*.jar"))[0]
spark = (SparkSession.builder.master("local[1]").appName("cdcd-java-dv-fixture")
         .config("spark.jars", runtime + "," + os.environ["JARS"] + "/iceberg-shaded-jackson.jar")
         .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
         .config("spark.sql.catalog.local", "org.apache.iceberg.spark.SparkCatalog")
         .config("spark.sql.catalog.local.type", "hadoop")
         .config("spark.sql.catalog.local.warehouse", wh)
         .config("spark.sql.session.timeZone", "UTC").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
print("Spark", spark.version, "runtime", os.path.basename(runtime))

spark.sql("""CREATE TABLE local.db.events (id BIGINT NOT NULL, name STRING) USING iceberg
             TBLPROPERTIES ('format-version'='3', 'write.delete.mode'='merge-on-read',
                            'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read')""")
# One partition, so one data file whose row positions are the ids' order.
(spark.range(20).coalesce(1).selectExpr("id", "concat('row-', CAST(id AS STRING)) AS name")
      .sortWithinPartitions("id").writeTo("local.db.events").append())

# Spark's own view of the positions before the delete: the _pos metadata column.
before = {r["id"]: (r["_file"], r["_pos"]) for r in spark.sql("SELECT id, _file, _pos FROM local.db.events").collect()}
files = sorted({f for f, _ in before.values()})
assert len(files) == 1, files

def delete_files():
    rows = spark.sql("SELECT file_path, file_format, record_count, referenced_data_file, content_offset, "
                     "content_size_in_bytes FROM local.db.events.delete_files").collect()
    assert len(rows) == 1 and rows[0]["file_format"] == "PUFFIN", rows
    return rows[0].asDict()

# Two deletes. The first leaves 5 scattered positions (an array container); the second adds the run 12..19,
# so Iceberg-Java merges the old vector into a new Puffin file, and run-length encoding turns the container
# into a run container (3 runs = 14 bytes < 12 positions x 2 bytes).
steps = []
for ids in ([3, 7, 8, 9, 15], list(range(12, 20))):
    spark.sql("DELETE FROM local.db.events WHERE id IN (%s)" % ", ".join(map(str, ids)))
    d = delete_files()
    d["deleted_ids"] = ids
    d["deleted_positions"] = sorted(before[i][1] for i in ids)
    d["ids_after"] = sorted(r["id"] for r in spark.sql("SELECT id FROM local.db.events").collect())
    print("delete file:", d)
    steps.append(d)
after = steps[-1]["ids_after"]

# A second table, kept only for its Puffin file: 200,000 rows in one file and a delete whose vector
# has four 16-bit containers (bitmap, run from a bitmap, run, array), so the standard format's
# offset header and every container kind are compared with Java's bytes.
MANY_RULE = "(id < 70000 AND id % 3 = 0) OR (id >= 100000 AND id < 150000) OR id IN (190001, 190003, 199999)"
spark.sql("""CREATE TABLE local.db.many (id BIGINT NOT NULL) USING iceberg
             TBLPROPERTIES ('format-version'='3', 'write.delete.mode'='merge-on-read')""")
spark.range(200000).coalesce(1).sortWithinPartitions("id").writeTo("local.db.many").append()
misplaced = spark.sql("SELECT count(*) AS n FROM local.db.many WHERE _pos != id").collect()[0]["n"]
assert misplaced == 0, misplaced   # so the deleted positions are the ids the rule picks
spark.sql("DELETE FROM local.db.many WHERE " + MANY_RULE)
many = spark.sql("SELECT file_path, file_format, record_count, referenced_data_file, content_offset, "
                 "content_size_in_bytes FROM local.db.many.delete_files").collect()
assert len(many) == 1 and many[0]["file_format"] == "PUFFIN", many
many = many[0].asDict()
many["rule"] = MANY_RULE
many["spark_rows_after"] = spark.sql("SELECT count(*) AS n FROM local.db.many").collect()[0]["n"]
spark.stop()

table = os.path.join(wh, "db", "events")
metas = sorted(glob.glob(table + "/metadata/v*.metadata.json"), key=lambda p: int(os.path.basename(p)[1:].split(".")[0]))
newest = metas[-1]

# Independent readers of the same table: DuckDB 1.5.5 (iceberg extension) and pyiceberg 0.12.
sys.path.insert(0, tb)
from duck_load import connect
duck = connect().sql("SELECT count(*), list(id ORDER BY id) FROM iceberg_scan('%s')" % newest).fetchone()
from pyiceberg.table import StaticTable
py = StaticTable.from_metadata(newest).scan().to_arrow()
py_ids = sorted(py.column("id").to_pylist())

expected = {
    "made_by": "scripts/make-java-dv-fixture.sh",
    "spark": "3.5.8", "iceberg_java_runtime": os.path.basename(runtime),
    "table_location": "file:" + table,
    "metadata": os.path.basename(newest),
    "data_file": files[0],
    "rows_before": len(before),
    "deletes": steps,
    "spark_rows_after": len(after), "spark_ids_after": after,
    "duckdb_rows_after": duck[0], "duckdb_ids_after": duck[1],
    "pyiceberg_rows_after": py.num_rows, "pyiceberg_ids_after": py_ids,
}
assert after == duck[1] == py_ids, expected

many_table = os.path.join(wh, "db", "many")
many_meta = sorted(glob.glob(many_table + "/metadata/v*.metadata.json"), key=lambda p: int(os.path.basename(p)[1:].split(".")[0]))[-1]
many["duckdb_rows_after"] = connect().sql("SELECT count(*) FROM iceberg_scan('%s')" % many_meta).fetchone()[0]
many["pyiceberg_rows_after"] = StaticTable.from_metadata(many_meta).scan().to_arrow().num_rows
assert many["spark_rows_after"] == many["duckdb_rows_after"] == many["pyiceberg_rows_after"] == 200000 - many["record_count"], many
expected["many"] = many

shutil.rmtree(out, ignore_errors=True)
shutil.copytree(table, os.path.join(out, "table"), ignore=shutil.ignore_patterns(".*.crc"))
shutil.copy(many["file_path"], os.path.join(out, "many-deletes.puffin"))
with open(os.path.join(out, "expected.json"), "w") as f:
    json.dump(expected, f, indent=2)
    f.write("\n")
print(json.dumps(expected, indent=2))
EOF
find "$OUT" -type f | sort
