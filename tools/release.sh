#!/usr/bin/env bash
# Builds a release into dist/: the binaries, their SHA-256 list, the chart, and the images.
#   tools/release.sh VERSION        e.g. tools/release.sh v0.2.0 (a leading v is dropped from every name)
# dist/ gets:
#   sturdy_<ver>_<os>_<arch>        static binaries for linux and darwin, amd64 and arm64, stamped with
#                                   the version and commit (sturdy -version prints them)
#   SHA256SUMS                      sha256sum's list of the binaries and the chart (sha256sum -c SHA256SUMS)
#   sturdy-<ver>.tgz                the Helm chart, version and appVersion <ver>, its image $IMAGE:<ver>
# and, when a Docker engine with buildx answers, the image for linux/amd64 and linux/arm64, as <ver> and as
# <ver>-notracing (built with -tags sturdy_notracing: no OTLP exporters, a quarter less memory): pushed to
# $IMAGE with PUSH=1, else written to dist/ as OCI archives. Without an engine it says so and builds the rest.
# Environment: IMAGE (default ghcr.io/sturdy-proxy/sturdy), PUSH (1 pushes), DIST (default dist, from where it runs).
set -euo pipefail

if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: tools/release.sh VERSION (e.g. v0.2.0)" >&2; exit 2
fi
ver=${1#v}
# SemVer without build metadata: the chart needs SemVer, an image tag refuses "+".
if ! [[ $ver =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "release: version $1 is not MAJOR.MINOR.PATCH[-PRERELEASE] (no +build: an image tag refuses it)" >&2; exit 2
fi
image=${IMAGE:-ghcr.io/sturdy-proxy/sturdy}
dist=${DIST:-dist}
case $dist in /*) ;; *) dist="$PWD/$dist" ;; esac # the caller's directory, before the cd below
cd "$(dirname "$0")/.."
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain 2>/dev/null)" ]; then
  echo "release: the working tree has changes; the binaries name commit $commit all the same" >&2
fi
mkdir -p "$dist" && rm -f "$dist"/sturdy_* "$dist"/sturdy-*.tgz "$dist/SHA256SUMS"

# The binaries: the Dockerfile's flags (static, reproducible, stamped).
for target in linux/amd64 linux/arm64 darwin/amd64 darwin/arm64; do
  os=${target%/*} arch=${target#*/}
  echo "== sturdy_${ver}_${os}_${arch}"
  # -buildvcs=false: the commit is the -X stamp alone, so a check for it cannot find the VCS info instead.
  CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -buildvcs=false \
    -ldflags "-s -w -X main.version=$ver -X main.commit=$commit" -o "$dist/sturdy_${ver}_${os}_${arch}" .
done

# The chart: a copy whose image is the one this release pushes.
echo "== chart"
chart=$(mktemp -d)
trap 'rm -rf "$chart"' EXIT
cp -r deploy/helm/sturdy "$chart/"
sed -i.orig "s|^  repository: .*|  repository: $image|" "$chart/sturdy/values.yaml" && rm "$chart/sturdy/values.yaml.orig"
grep -q "^  repository: $image\$" "$chart/sturdy/values.yaml" || { echo "release: could not set the chart's image" >&2; exit 1; }
helm package "$chart/sturdy" --version "$ver" --app-version "$ver" -d "$dist" >/dev/null
echo "$dist/sturdy-$ver.tgz"

(cd "$dist" && sha256sum sturdy_* "sturdy-$ver.tgz" > SHA256SUMS)
echo "== SHA256SUMS"; cat "$dist/SHA256SUMS"

# The images, when there is an engine to build them.
if ! docker buildx version >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then
  echo "== images: not built (no Docker engine with buildx here); the release workflow builds and pushes them"
  exit 0
fi
if docker buildx inspect 2>/dev/null | grep -q '^Driver: *docker$'; then
  echo "== images: not built: buildx's docker driver builds one platform; make a builder (docker buildx create --use)"
  exit 0
fi
for variant in "" -notracing; do
  tags=""; [ "$variant" = -notracing ] && tags=sturdy_notracing
  if [ "${PUSH:-}" = 1 ]; then out=(--push); else out=(--output "type=oci,dest=$dist/sturdy_${ver}${variant}_image.tar"); fi
  echo "== image $image:$ver$variant"
  docker buildx build --platform linux/amd64,linux/arm64 \
    --build-arg "VERSION=$ver" --build-arg "COMMIT=$commit" --build-arg "TAGS=$tags" \
    -t "$image:$ver$variant" "${out[@]}" .
done
