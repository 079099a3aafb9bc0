#!/usr/bin/env bash
# Runs a bench scenario through the fake server directly, Sturdy, nginx and
# HAProxy side by side in one run, and prints one table.
#   bench/peers/run.sh overhead [-duration 20s ...]
#   bench/peers/run.sh all
# Installs nginx and HAProxy from Debian packages if they are missing
# (needs root), starts them on loopback (ports 18081, 18082, in front of the
# fake server on 18000) and stops them afterwards.
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
if pgrep -x nginx >/dev/null || pgrep -x haproxy >/dev/null; then
  echo "another nginx or haproxy is running: stop it first, its CPU would be counted" >&2
  exit 1
fi

dir=$(mktemp -d)
cleanup() {
  [ -f "$dir/nginx.pid" ] && kill "$(cat "$dir/nginx.pid")" 2>/dev/null || true
  [ -f "$dir/haproxy.pid" ] && kill "$(cat "$dir/haproxy.pid")" 2>/dev/null || true
  sleep 0.5
  rm -rf "$dir"
}
trap cleanup EXIT
mkdir -p "$dir/tmp"
chmod 755 "$dir"
sed "s#@DIR@#$dir#g" bench/peers/nginx.conf > "$dir/nginx.conf"
nginx -p "$dir" -c "$dir/nginx.conf"
haproxy -f bench/peers/haproxy.cfg -D -p "$dir/haproxy.pid"

go run ./bench -scenario "$scenario" \
  -peer nginx=http://127.0.0.1:18081@nginx \
  -peer haproxy=http://127.0.0.1:18082@haproxy "$@"
