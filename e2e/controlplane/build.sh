#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager and kube-scheduler at the release go.mod pins,
# into a cache outside the clone keyed by that release, and prints the directory holding them.
# A warm run only checks the binaries' versions; a cold one compiles (15-35 minutes on 2 cores),
# at the lowest priority and two packages at a time, holding a lock so concurrent runs build once.
# `build.sh --background` starts a cold build detached (log: build.log beside the binaries) and
# returns at once, so the build overlaps other work; a later plain run waits for it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=$(sed -n 's|^require k8s.io/kubernetes \(v[0-9][0-9.]*\)$|\1|p' "$here/go.mod")
[ -n "$version" ] || { echo "e2e/controlplane/go.mod: no 'require k8s.io/kubernetes vX.Y.Z' line" >&2; exit 1; }
cache=${XDG_CACHE_HOME:-$HOME/.cache}/kafka-group-operator/kubernetes-$version
bin=$cache/bin
commands=(kube-apiserver kube-controller-manager kube-scheduler)

built() {
  local c
  for c in "${commands[@]}"; do
    [ -x "$bin/$c" ] && "$bin/$c" --version 2>/dev/null | grep -qx "Kubernetes $version" || return 1
  done
}

if built; then echo "$bin"; exit 0; fi

if [ "${1:-}" = --background ]; then
  mkdir -p "$cache"
  setsid nohup bash "$0" >"$cache/build.log" 2>&1 </dev/null &
  echo "building the Kubernetes $version control plane in the background (log: $cache/build.log)" >&2
  exit 0
fi

command -v go >/dev/null || {
  echo "Go 1.21 or newer is required to build the Kubernetes $version control plane (go is not on PATH)" >&2
  exit 1
}
# Go 1.21 and later switch to the toolchain go.mod asks for (from the module proxy).
go_minor=$(go env GOVERSION | sed -n 's/^go1\.\([0-9]*\).*/\1/p')
[ "${go_minor:-0}" -ge 21 ] || {
  echo "Go 1.21 or newer is required to build the Kubernetes $version control plane (found $(go env GOVERSION))" >&2
  exit 1
}
mkdir -p "$cache"
exec 9>"$cache/.lock"
if ! flock -n 9; then
  echo "waiting for the control plane build under way (log: $cache/build.log)" >&2
  flock 9
fi
if built; then echo "$bin"; exit 0; fi

major=${version#v}; major=${major%%.*}
minor=${version#v"$major".}; minor=${minor%%.*}
stamp=()
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp+=(-X "$pkg.gitVersion=$version" -X "$pkg.gitMajor=$major" -X "$pkg.gitMinor=$minor"
    -X "$pkg.gitTreeState=clean" -X "$pkg.buildDate=1970-01-01T00:00:00Z")
done
tmp=$(mktemp -d "$cache/bin.XXXXXX") && chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT
echo "building Kubernetes $version control plane into $bin (cold: 15-35 minutes)" >&2
start=$SECONDS
(cd "$here" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" GOTOOLCHAIN=${GOTOOLCHAIN:-auto} \
  nice -n 19 go build -p 2 -trimpath -ldflags "-s -w ${stamp[*]}" -o "$tmp/" \
  "${commands[@]/#/k8s.io/kubernetes/cmd/}")
rm -rf "$bin" && mv "$tmp" "$bin"
trap - EXIT
built || { echo "the built binaries do not report Kubernetes $version" >&2; exit 1; }
echo "built Kubernetes $version control plane in $((SECONDS - start)) s" >&2
echo "$bin"
