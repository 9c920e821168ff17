#!/usr/bin/env bash
# A fleet of kilnd replicas on one Redis (issue 19): N replicas x M client
# processes storm over K graphs. Reports the compiles fleet-wide (goal: K)
# and the storm's wall time, against the same storm on one kilnd alone and
# on N replicas without Redis; then the Compile latency of an artifact
# fetched from the shared tier against a local hit, as kilnd measures it
# (server ms of kilnctl compile).
#   bench/fleet_storm.sh [build-dir]
#   N=3 M=48 K=8 CHAIN=400 bench/fleet_storm.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
N=${N:-3}
M=${M:-48}
K=${K:-8}
CHAIN=${CHAIN:-400}  # statements per graph: ~0.1-0.3 s compiles
cmake --build "$BUILD" -j2 --target kilnd kilnctl >/dev/null
KILND=$BUILD/server/kilnd
KILNCTL=$BUILD/client/kilnctl
tmp=$(mktemp -d)
pids=()
redis_pid=
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
cleanup() {
  stop_all
  [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

start_redis() {
  redis-server --port 0 --unixsocket "$tmp/redis.sock" --save "" \
    --appendonly no --logfile "$tmp/redis.log" &
  redis_pid=$!
  for _ in $(seq 200); do [ -S "$tmp/redis.sock" ] && break; sleep 0.05; done
}
SERVERS=()
start_replicas() {  # start_replicas COUNT NAME [kilnd flags...]: sets SERVERS
  local count=$1 name=$2
  shift 2
  SERVERS=()
  for i in $(seq "$count"); do
    rm -f "$tmp/port.$name.$i"
    "$KILND" --listen=127.0.0.1:0 --metrics_listen= --hit_listen=off \
      --data_dir="$tmp/data.$name.$i" --port_file="$tmp/port.$name.$i" \
      --compile_threads=2 "$@" >"$tmp/kilnd.$name.$i.log" 2>&1 &
    pids+=($!)
  done
  for i in $(seq "$count"); do
    for _ in $(seq 300); do [ -s "$tmp/port.$name.$i" ] && break; sleep 0.05; done
    SERVERS+=("127.0.0.1:$(head -1 "$tmp/port.$name.$i")")
  done
}
now_ms() { date +%s%3N; }
stat_sum() {  # stat_sum FIELD: summed over SERVERS (kilnctl stats --json)
  local total=0 v
  for s in "${SERVERS[@]}"; do
    v=$("$KILNCTL" --server="$s" stats --json | python3 -c \
      "import json,sys; print(json.load(sys.stdin)['$1'])")
    total=$((total + v))
  done
  echo "$total"
}
storm() {  # M client processes over K graphs, spread over SERVERS
  local t0 t1 failed=0
  t0=$(now_ms)
  local cpids=()
  for j in $(seq 0 $((M - 1))); do
    "$KILNCTL" --server="${SERVERS[$((j % ${#SERVERS[@]}))]}" \
      compile "$tmp/g$((j % K)).json" >/dev/null 2>>"$tmp/storm.err" &
    cpids+=($!)
  done
  for p in "${cpids[@]}"; do wait "$p" || failed=$((failed + 1)); done
  t1=$(now_ms)
  echo "$((t1 - t0)) $failed"
}

for k in $(seq 0 $((K - 1))); do
  /usr/bin/python3 examples/graphs/gen_chain.py $((CHAIN + k)) >"$tmp/g$k.json"
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
echo "storm: $M kilnctl compile processes over $K chain-$CHAIN..$((CHAIN + K - 1)) graphs"

start_replicas 1 single
read -r ms failed < <(storm)
echo "1 kilnd alone:            compiles $(stat_sum compiles), wall ${ms} ms, failed $failed"
stop_all

start_replicas "$N" local
read -r ms failed < <(storm)
echo "$N kilnd, no Redis:        compiles $(stat_sum compiles), wall ${ms} ms, failed $failed"
stop_all

start_redis
start_replicas "$N" fleet --shared_cache="unix:$tmp/redis.sock"
read -r ms failed < <(storm)
echo "$N kilnd on one Redis:     compiles $(stat_sum compiles), wall ${ms} ms, failed $failed," \
  "shared hits $(stat_sum shared_hits), lease waits $(stat_sum shared_lease_waits)"

# Hit latency: a graph compiled on replica 1, then asked of replica 2 (a
# shared-tier fetch, then stored locally) and again (a local hit).
server_ms() { "$KILNCTL" --server="$1" compile "$2" | sed -n 's/.*(server \([0-9.]*\) ms.*/\1/p'; }
shared=()
local_hit=()
for k in $(seq 0 9); do
  /usr/bin/python3 examples/graphs/gen_chain.py $((CHAIN + 100 + k)) >"$tmp/h$k.json"
  "$KILNCTL" --server="${SERVERS[0]}" compile "$tmp/h$k.json" >/dev/null
  shared+=("$(server_ms "${SERVERS[1]}" "$tmp/h$k.json")")
  local_hit+=("$(server_ms "${SERVERS[1]}" "$tmp/h$k.json")")
done
bytes=$("$KILNCTL" --server="${SERVERS[1]}" compile "$tmp/h0.json" | sed -n 's/^artifact \([^,]*\),.*/\1/p')
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "Compile of a key another replica compiled (artifact $bytes), server ms over 10 keys:"
echo "  shared-tier fetch: median $(median "${shared[@]}") ms (min $(median "$(printf '%s\n' "${shared[@]}" | sort -g | head -1)"))"
echo "  local hit:         median $(median "${local_hit[@]}") ms (min $(median "$(printf '%s\n' "${local_hit[@]}" | sort -g | head -1)"))"
[ -s "$tmp/storm.err" ] && { echo "client errors:"; sort "$tmp/storm.err" | uniq -c | head; }
exit 0
