"""Relocates a Java package into Iceberg's shaded namespace, as Maven's shade plugin does for Iceberg's
own runtime jar: PyPI's iceberg-spark-runtime jar (snowpark-connect-deps-iceberg) calls
org.apache.iceberg.shaded.<package> but leaves those classes out. scripts/testbed.sh (component `spark`)
builds jackson from pyspark's jars and httpclient5/httpcore5 from the Debian packages in debs/.

Usage: relocate_jar.py OUT.jar PACKAGE JAR...     e.g. PACKAGE = org.apache.hc or com.fasterxml.jackson
Class names are rewritten in each class file's constant pool (its CONSTANT_Utf8 entries: class names,
descriptors and string constants), and in entry names and META-INF/services; the rest of META-INF
(signatures, manifests, module info) is left out.
"""
import struct
import sys
import zipfile

out, package, jars = sys.argv[1], sys.argv[2], sys.argv[3:]
SRC = [package.replace(".", "/").encode() + b"/", package.encode() + b"."]
DST = [b"org/apache/iceberg/shaded/" + s for s in SRC[:1]] + [b"org.apache.iceberg.shaded." + SRC[1]]


def rw(b):
    for s, d in zip(SRC, DST):
        b = b.replace(s, d)
    return b


# Bytes after the tag of each constant-pool entry kind other than CONSTANT_Utf8 (JVM spec 4.4).
SIZES = {3: 4, 4: 4, 5: 8, 6: 8, 7: 2, 8: 2, 16: 2, 19: 2, 20: 2, 9: 4, 10: 4, 11: 4, 12: 4, 17: 4, 18: 4, 15: 3}


def reloc_class(data):
    out = bytearray(data[:10])
    n = struct.unpack(">H", data[8:10])[0]
    i, k = 10, 1
    while k < n:
        tag = data[i]
        if tag == 1:
            ln = struct.unpack(">H", data[i + 1:i + 3])[0]
            s = rw(data[i + 3:i + 3 + ln])
            out += bytes([1]) + struct.pack(">H", len(s)) + s
            i += 3 + ln
        else:
            size = SIZES[tag]
            out += data[i:i + 1 + size]
            i += 1 + size
            if tag in (5, 6):  # long and double take two pool slots
                k += 1
        k += 1
    return bytes(out + data[i:])


with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
    seen = set()
    for j in jars:
        zj = zipfile.ZipFile(j)
        for info in zj.infolist():
            if info.is_dir() or info.filename.startswith("META-INF/versions/") or info.filename.endswith("module-info.class"):
                continue
            data, name = zj.read(info.filename), info.filename
            if name.endswith(".class"):
                data = reloc_class(data)
            elif name.startswith("META-INF/services/"):
                data = rw(data)
            elif name.startswith("META-INF/"):
                continue
            name = rw(name.encode()).decode()
            if name not in seen:
                seen.add(name)
                z.writestr(name, data)
print("wrote", out, len(seen), "entries")
