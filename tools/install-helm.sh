#!/usr/bin/env bash
# Installs helm, at the version the chart's test names (helm_external_test.go's helmVersion), from its Go module
# into $(go env GOPATH)/bin, unless that version is on PATH already. Debian has no helm package; a cold module cache
# takes a couple of minutes. Callers put $(go env GOPATH)/bin on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
want=$(sed -n 's/^const helmVersion = "\(.*\)"$/\1/p' helm_external_test.go)
[ -n "$want" ] || { echo "install-helm: no helmVersion in helm_external_test.go" >&2; exit 1; }
export PATH="$(go env GOPATH)/bin:$PATH"
if ! helm version --short 2>/dev/null | grep -q "^${want%.*}"; then
  go install "helm.sh/helm/v4/cmd/helm@${want}"
fi
helm version --short
