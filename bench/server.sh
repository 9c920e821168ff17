#!/usr/bin/env bash
# kilnd on loopback: cache-hit latency and throughput for a ~100 KB artifact
# with 1 and 16 concurrent clients (kilnctl bench: Lookup by key, bounded in
# count and time, each request timed phase by phase), and the wall time of a
# 16-process compile storm next to a single compile of the same graph, each
# against a fresh daemon. Bench modes (BENCH_MODES, default all six):
#   proto         generated stub + protobuf parse + SHA-256 check (the old path)
#   raw-grpc      kiln::Client's zero-copy receive + SHA-256 check, over gRPC
#   raw           the same on kilnd's hit socket (what kiln::Client uses)
#   raw-grpc-noverify, raw-noverify   both without the check (repeated hits)
#   client        kiln::Client's whole hit: key, Lookup, verify, load
#   bench/server.sh [build-dir]
#   KILND=/other/build/server/kilnd bench/server.sh   # another daemon binary
#   KILNCTL=/other/kilnctl BENCH_MODES=old bench/server.sh  # an older kilnctl
#                                                     # (no --mode flag)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
cmake --build "$BUILD" -j2 --target kilnd kilnctl >/dev/null
KILND=${KILND:-$BUILD/server/kilnd}
tmp=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
KILNCTL=${KILNCTL:-$BUILD/client/kilnctl}
BENCH_MODES=${BENCH_MODES:-proto raw-grpc raw raw-grpc-noverify raw-noverify client}

start_daemon() {  # a fresh kilnd with its own data dir; sets SERVER
  [ -n "$pid" ] && { kill "$pid"; wait "$pid" 2>/dev/null || true; }
  rm -f "$tmp/port"
  "$KILND" --listen=127.0.0.1:0 --metrics_listen= --data_dir="$tmp/data.$1" \
    --port_file="$tmp/port" >"$tmp/kilnd.$1.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do [ -s "$tmp/port" ] && break; sleep 0.05; done
  SERVER="127.0.0.1:$(head -1 "$tmp/port")"
}
now_ms() { date +%s%3N; }

/usr/bin/python3 examples/graphs/gen_chain.py 4800 >"$tmp/big.json"    # ~100 KB artifact
/usr/bin/python3 examples/graphs/gen_chain.py 1000 >"$tmp/storm.json"  # ~0.2 s compile

echo "== cache hits (Lookup of a ~100 KB artifact) =="
start_daemon hits
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for mode in $BENCH_MODES; do
  case $mode in
    old) flags=(--verify=true) ;;
    raw-noverify) flags=(--mode=raw --verify=false) ;;
    raw-grpc) flags=(--mode=raw --hit_socket=false) ;;
    raw-grpc-noverify) flags=(--mode=raw --verify=false --hit_socket=false) ;;
    *) flags=(--mode=$mode) ;;
  esac
  for c in 1 16; do
    "$KILNCTL" --server="$SERVER" bench "$tmp/big.json" --seconds=5 --concurrency=$c \
      "${flags[@]}" | sed -n '3,$p'
  done
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
"$KILNCTL" --server="$SERVER" stats --json

echo "== storm: 16 processes vs one compile (chain-1000, fresh daemon each) =="
start_daemon single
t0=$(now_ms); "$KILNCTL" --server="$SERVER" compile "$tmp/storm.json" >/dev/null; t1=$(now_ms)
echo "single compile: $((t1 - t0)) ms wall"
start_daemon storm
t0=$(now_ms)
for i in $(seq 16); do "$KILNCTL" --server="$SERVER" compile "$tmp/storm.json" >"$tmp/storm.$i" & done
wait $(jobs -p | grep -v "^$pid$") 2>/dev/null || true
t1=$(now_ms)
echo "16-process storm: $((t1 - t0)) ms wall; outcomes: $(cat "$tmp"/storm.* | grep -oE '^outcome +[a-z]+' | awk '{print $2}' | sort | uniq -c | tr -s ' \n' ' ')"
"$KILNCTL" --server="$SERVER" stats --json
