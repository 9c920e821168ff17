#!/usr/bin/env python3
"""Prints bench/gpu/run.sh's results (lines `<row> <metric> <value>`) as
markdown tables: per-call microseconds for the launch rows, GB/s for the
bandwidth rows (bytes read + written per call, as Kiln counts them)."""
import collections
import sys

rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    parts = line.split()
    if len(parts) == 3:
        rows.setdefault(parts[0], {})[parts[1]] = float(parts[2])

launch = [r for r in rows if r.startswith("launch")]
if launch:
    print("| graph | Kiln µs/call | eager µs/call | Inductor µs/call | Kiln compile ms |")
    print("|---|---|---|---|---|")
    for r in launch:
        m = rows[r]
        print("| %s | %.2f | %.2f | %.2f | %.1f |" % (
            r, m.get("kiln_us", 0), m.get("eager_us", 0),
            m.get("inductor_us", 0), m.get("compile_ms", 0)))
    print()
# A Kiln variant row (NAME_fastmath) is compared with NAME's PyTorch runs.
for r in rows:
    if r.endswith("_fastmath") and r[:-len("_fastmath")] in rows:
        base = rows[r[:-len("_fastmath")]]
        for k in ("eager_us", "inductor_us", "inductor_err"):
            if k in base:
                rows[r].setdefault(k, base[k])
bw = [r for r in rows if not r.startswith("launch")]
if bw:
    print("| graph | Kiln µs | Kiln GB/s | copy GB/s | Kiln/copy | eager GB/s | Inductor µs | Inductor GB/s | Kiln/Inductor speed | Kiln max err | Inductor max err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in bw:
        m = rows[r]
        b = m.get("bytes", 0)
        gbs = lambda us: b / (us * 1e3) if us else 0
        print("| %s | %.1f | %.0f | %.0f | %.0f%% | %.0f | %.1f | %.0f | %.2fx | %.2g | %.2g |" % (
            r, m.get("kiln_us", 0), m.get("kiln_gbs", 0), m.get("copy_gbs", 0),
            100 * m.get("kiln_gbs", 0) / max(m.get("copy_gbs", 1), 1),
            gbs(m.get("eager_us", 0)), m.get("inductor_us", 0),
            gbs(m.get("inductor_us", 0)),
            m.get("inductor_us", 0) / max(m.get("kiln_us", 1e-9), 1e-9),
            m.get("kiln_err", float("nan")), m.get("inductor_err", float("nan"))))
