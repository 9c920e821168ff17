#!/usr/bin/env python3
"""A/B of kilnd's cache-hit path: two (or more) builds, interleaved.

Each variant is a kilnd and a kilnctl binary (plus optional extra flags and
environment). Every variant gets its own daemon on 127.0.0.1:0 with its own
temporary data dir, for the whole run; then, for `--rounds` rounds, each
configuration (1 and 16 clients, with and without the SHA-256 check) runs
`kilnctl bench --mode=raw` against each variant in turn (the order rotates
every round), so that load from elsewhere on the machine hits every variant
alike. Each bench runs under `perf stat` (client) while `perf stat -p` watches
the daemon, so the CPU time and context switches per hit are reported next
to the latency: they are far less sensitive to a busy machine than the
latency is. Prints the median over the rounds of each figure.

  bench/hit_ab.py --variant base:/tmp/base/kilnd:/tmp/base/kilnctl \\
                  --variant new:build/server/kilnd:build/client/kilnctl

A variant is NAME:KILND:KILNCTL[:KILND_FLAGS[:KILNCTL_FLAGS[:ENV]]], flags
space-separated (KILND_FLAGS --listen=unix@PATH serves on a Unix socket), ENV as K=V,K=V (given to both processes; S!K=V: to kilnd
only, C!K=V: to kilnctl only).
"""
import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_variant(text):
    parts = text.split(":")
    if len(parts) < 3:
        sys.exit(f"bad --variant {text!r}: NAME:KILND:KILNCTL[:...]")
    env, server_env, client_env = {}, {}, {}
    if len(parts) > 5 and parts[5]:
        for kv in parts[5].split(","):
            k, _, v = kv.partition("=")
            if k.startswith("S!"):
                server_env[k[2:]] = v
            elif k.startswith("C!"):
                client_env[k[2:]] = v
            else:
                server_env[k] = client_env[k] = v
    return {
        "name": parts[0],
        "kilnd": os.path.abspath(parts[1]),
        "kilnctl": os.path.abspath(parts[2]),
        "kilnd_flags": [f.replace("--listen=unix@", "--listen=unix:")
                        for f in parts[3].split()] if len(parts) > 3 else [],
        "kilnctl_flags": parts[4].split() if len(parts) > 4 else [],
        "server_env": server_env,
        "client_env": client_env,
    }


def start_daemon(v, tmp):
    port_file = os.path.join(tmp, v["name"] + ".port")
    env = dict(os.environ, **v["server_env"])
    log = open(os.path.join(tmp, v["name"] + ".log"), "w")
    proc = subprocess.Popen(
        [v["kilnd"], "--listen=127.0.0.1:0", "--metrics_listen=",
         "--data_dir=" + os.path.join(tmp, "data." + v["name"]),
         "--port_file=" + port_file] + v["kilnd_flags"],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    for _ in range(600):  # 30 s at most
        if os.path.exists(port_file):
            with open(port_file) as f:
                port = f.readline().strip()
            if port:
                v["log"] = log.name
                # --listen=unix:PATH in the variant's flags: a Unix socket.
                unix = [f[len("--listen="):] for f in v["kilnd_flags"]
                        if f.startswith("--listen=unix:")]
                return proc, unix[-1] if unix else f"127.0.0.1:{port}"
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    sys.exit(f"{v['name']}: kilnd did not start (see {log.name})")


def perf_counts(path):
    counts = {}
    with open(path) as f:
        for line in f:
            fields = line.strip().split(",")
            if len(fields) >= 3 and fields[0] and fields[0][0].isdigit():
                counts[fields[2]] = float(fields[0])
    return counts


def run_bench(v, server, graph, clients, verify, seconds, tmp):
    env = dict(os.environ, **v["client_env"])
    server_perf = os.path.join(tmp, "server.perf")
    client_perf = os.path.join(tmp, "client.perf")
    watcher = subprocess.Popen(
        ["perf", "stat", "-x,", "-e", "task-clock,context-switches", "-o",
         server_perf, "-p", str(v["pid"])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.2)
    out = subprocess.run(
        ["perf", "stat", "-x,", "-e", "task-clock,context-switches", "-o",
         client_perf, v["kilnctl"], "--server=" + server, "bench", graph,
         f"--seconds={seconds}", f"--concurrency={clients}", "--mode=raw",
         f"--verify={'true' if verify else 'false'}"] + v["kilnctl_flags"],
        capture_output=True, text=True, env=env, timeout=seconds * 4 + 120)
    watcher.send_signal(signal.SIGINT)
    watcher.wait(timeout=30)
    if out.returncode != 0:
        alive = "running" if v["proc"].poll() is None else \
            f"exited with {v['proc'].returncode}"
        with open(v["log"]) as f:
            log_tail = "".join(f.readlines()[-5:])
        print(f"{v['name']}: kilnctl bench failed (kilnd {alive}); skipped:\n"
              f"{out.stdout}{out.stderr}kilnd log:\n{log_tail}", flush=True)
        return None
    m = re.search(r"bench +(\d+) Lookups .* ([\d.]+) requests/s", out.stdout)
    lat = re.search(r"latency +median ([\d.]+) us, p99 ([\d.]+) us", out.stdout)
    hits = int(m.group(1))
    c, s = perf_counts(client_perf), perf_counts(server_perf)
    return {
        "median_us": float(lat.group(1)),
        "p99_us": float(lat.group(2)),
        "hits_s": float(m.group(2)),
        # CPU microseconds and context switches per hit, each side. The
        # client's include its start and the one compile (a hit) before the
        # bench; the server's the 0.2 s before the bench (idle).
        "cli_cpu_us": c.get("task-clock", 0) * 1e3 / hits,
        "srv_cpu_us": s.get("task-clock", 0) * 1e3 / hits,
        "cli_cs": c.get("context-switches", 0) / hits,
        "srv_cs": s.get("context-switches", 0) / hits,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", action="append", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=3)
    p.add_argument("--clients", default="1,16")
    p.add_argument("--verify", default="true,false")
    p.add_argument("--chain", type=int, default=4800,
                   help="chain-N graph (4800: a ~100 KB artifact)")
    a = p.parse_args()
    variants = [parse_variant(t) for t in a.variant]
    tmp = tempfile.mkdtemp(prefix="hit_ab.")
    procs = []
    try:
        graph = os.path.join(tmp, "graph.json")
        with open(graph, "w") as f:
            subprocess.run([sys.executable,
                            os.path.join(ROOT, "examples/graphs/gen_chain.py"),
                            str(a.chain)], stdout=f, check=True)
        for v in variants:
            proc, v["server"] = start_daemon(v, tmp)
            v["pid"] = proc.pid
            v["proc"] = proc
            procs.append(proc)
            # Compile once (untimed), so every bench below is all hits.
            subprocess.run([v["kilnctl"], "--server=" + v["server"], "compile",
                            graph], check=True, capture_output=True,
                           env=dict(os.environ, **v["client_env"]))
        configs = [(int(c), vf == "true") for c in a.clients.split(",")
                   for vf in a.verify.split(",")]
        results = {}  # (config, name) -> list of dicts
        with open("/proc/loadavg") as f:
            print("load average before:", " ".join(f.read().split()[:3]))
        for r in range(a.rounds):
            for config in configs:
                order = variants[r % len(variants):] + variants[:r % len(variants)]
                for v in order:
                    got = run_bench(v, v["server"], graph, config[0], config[1],
                                    a.seconds, tmp)
                    if got is None:
                        continue
                    results.setdefault((config, v["name"]), []).append(got)
                    print(f"round {r + 1} clients={config[0]} verify={config[1]} "
                          f"{v['name']}: median {got['median_us']:.0f} us, p99 "
                          f"{got['p99_us']:.0f} us, {got['hits_s']:.0f} hits/s, "
                          f"cpu/hit client {got['cli_cpu_us']:.0f} us server "
                          f"{got['srv_cpu_us']:.0f} us, cs/hit client "
                          f"{got['cli_cs']:.2f} server {got['srv_cs']:.2f}",
                          flush=True)
        with open("/proc/loadavg") as f:
            print("load average after:", " ".join(f.read().split()[:3]))
        print(f"\nmedians over {a.rounds} rounds of {a.seconds:g} s "
              "(kilnctl bench --mode=raw):")
        print("| clients | verify | variant | median us | p99 us | hits/s | "
              "client cpu us/hit | server cpu us/hit | client cs/hit | "
              "server cs/hit |")
        print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for config in configs:
            for v in variants:
                rs = results.get((config, v["name"]))
                if not rs:
                    continue
                med = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
                print(f"| {config[0]} | {'yes' if config[1] else 'no'} | "
                      f"{v['name']} | {med['median_us']:.0f} | "
                      f"{med['p99_us']:.0f} | {med['hits_s']:.0f} | "
                      f"{med['cli_cpu_us']:.0f} | {med['srv_cpu_us']:.0f} | "
                      f"{med['cli_cs']:.2f} | {med['srv_cs']:.2f} |")
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
