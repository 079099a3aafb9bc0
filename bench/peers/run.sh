#!/usr/bin/env bash
# Runs a bench scenario through the fake server directly, Sturdy, nginx,
# HAProxy and the floor (a bare fasthttp forwarder, bench/peers/floor, built
# from this module's fasthttp) side by side in one run, and prints one table.
#   bench/peers/run.sh overhead [-duration 20s ...]
#   bench/peers/run.sh all
# Installs nginx and HAProxy from Debian packages if they are missing
# (needs root), starts them on loopback (ports 18081, 18082 and the floor's
# 18085, in front of the fake server on 18000; for the replicas scenario
# 18083, 18084, in front of its four fake servers on 18001-18004; for the
# chaos scenario 18086, 18087, in front of its servers on 18011-18013) and
# stops them afterwards.
set -euo pipefail
scenario=${1:-overhead}
shift || true
cd "$(dirname "$0")/../.."

install() {
  command -v "$1" >/dev/null 2>&1 && return
  echo "installing $2 ..." >&2
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}
install nginx nginx-light
install haproxy haproxy
if pgrep -x nginx >/dev/null || pgrep -x haproxy >/dev/null || pgrep -x sturdy-floor >/dev/null; then
  echo "another nginx, haproxy or sturdy-floor is running: stop it first, its CPU would be counted" >&2
  exit 1
fi

dir=$(mktemp -d)
cleanup() {
  [ -f "$dir/nginx.pid" ] && kill "$(cat "$dir/nginx.pid")" 2>/dev/null || true
  [ -f "$dir/haproxy.pid" ] && kill "$(cat "$dir/haproxy.pid")" 2>/dev/null || true
  [ -n "${floor_pid:-}" ] && kill "$floor_pid" 2>/dev/null || true
  # Wait (up to 5 s) for every worker to exit, so a run right after this
  # one does not find them.
  for _ in $(seq 50); do
    pgrep -x nginx >/dev/null || pgrep -x haproxy >/dev/null || pgrep -x sturdy-floor >/dev/null || break
    sleep 0.1
  done
  rm -rf "$dir"
}
trap cleanup EXIT
mkdir -p "$dir/tmp"
chmod 755 "$dir"
sed "s#@DIR@#$dir#g" bench/peers/nginx.conf > "$dir/nginx.conf"
nginx -p "$dir" -c "$dir/nginx.conf"
haproxy -f bench/peers/haproxy.cfg -D -p "$dir/haproxy.pid"
# Built as Sturdy is (bench/main.go buildSturdy): static, without symbols.
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$dir/sturdy-floor" ./bench/peers/floor
"$dir/sturdy-floor" -listen 127.0.0.1:18085 -upstream 127.0.0.1:18000 &
floor_pid=$!

go run ./bench -scenario "$scenario" \
  -peer nginx=http://127.0.0.1:18081@nginx -peer nginx/replicas=http://127.0.0.1:18083 \
  -peer nginx/chaos=http://127.0.0.1:18086 \
  -peer haproxy=http://127.0.0.1:18082@haproxy -peer haproxy/replicas=http://127.0.0.1:18084 \
  -peer haproxy/chaos=http://127.0.0.1:18087 \
  -peer floor=http://127.0.0.1:18085@sturdy-floor "$@"
