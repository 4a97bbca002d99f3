"""Runs one Iceberg maintenance procedure with Spark (Iceberg-Java) on a table of an Iceberg REST catalog,
for tests/catalog/rest.rs (`spark_maintenance_beside_cdcd`; scripts/testbed.sh, component spark, installs Spark).

Usage: spark_maintain.py JARS_DIR URI TOKEN NAMESPACE.TABLE PROCEDURE
  PROCEDURE: rewrite_data_files | rewrite_position_delete_files | expire_snapshots | count
             | partition (ADD PARTITION FIELD bucket(4, id), WRITE ORDERED BY n)
             | specs (the spec ids of the live data files: `specs: [..]`)
JARS_DIR (CDCD_TEST_SPARK_JARS) holds iceberg-shaded-jackson.jar and iceberg-shaded-hc5.jar; the
Iceberg runtime and extensions jars come from the snowpark-connect-deps-iceberg wheel. Prints the procedure's
result row as `result: ...` (count: `rows: N`).
"""
import glob, os, sys
import snowpark_connect_deps_iceberg as dep
from pyspark.sql import SparkSession

jars_dir, uri, token, table, procedure = sys.argv[1:6]
wheel = os.path.join(os.path.dirname(dep.__file__), "jars")
jars = [glob.glob(f"{wheel}/iceberg-spark-runtime-3.5_2.12-*.jar")[0], glob.glob(f"{wheel}/iceberg-spark-extensions-3.5_2.12-*.jar")[0],
        f"{jars_dir}/iceberg-shaded-jackson.jar", f"{jars_dir}/iceberg-shaded-hc5.jar"]
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
spark = (SparkSession.builder.master("local[2]").appName("spark_maintain")
         .config("spark.jars", ",".join(jars))
         .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
         .config("spark.sql.catalog.rest", "org.apache.iceberg.spark.SparkCatalog")
         .config("spark.sql.catalog.rest.type", "rest")
         .config("spark.sql.catalog.rest.uri", uri)
         .config("spark.sql.catalog.rest.token", token)
         .config("spark.sql.session.timeZone", "UTC").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").config("spark.driver.memory", "1g").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
t = f"rest.{table}"
if procedure == "rewrite_data_files":
    rows = spark.sql(f"CALL rest.system.rewrite_data_files(table => '{table}', options => map('min-input-files', '2', 'rewrite-all', 'true'))").collect()
elif procedure == "rewrite_position_delete_files":
    rows = spark.sql(f"CALL rest.system.rewrite_position_delete_files(table => '{table}', options => map('rewrite-all', 'true'))").collect()
elif procedure == "expire_snapshots":
    import datetime
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    rows = spark.sql(f"CALL rest.system.expire_snapshots(table => '{table}', older_than => TIMESTAMP '{now}', retain_last => 1)").collect()
elif procedure == "partition":
    spark.sql(f"ALTER TABLE {t} ADD PARTITION FIELD bucket(4, id)").collect()
    rows = spark.sql(f"ALTER TABLE {t} WRITE ORDERED BY n").collect()
elif procedure == "specs":
    specs = sorted(r[0] for r in spark.sql(f"SELECT DISTINCT spec_id FROM {t}.data_files").collect())
    print("specs:", specs, flush=True)
    sys.exit(0)
elif procedure == "count":
    print("rows:", spark.sql(f"SELECT count(*) FROM {t}").collect()[0][0], flush=True)
    sys.exit(0)
else:
    sys.exit(f"unknown procedure {procedure}")
print("result:", [r.asDict() for r in rows], flush=True)
