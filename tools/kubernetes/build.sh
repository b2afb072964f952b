#!/usr/bin/env bash
# Build a real Kubernetes control plane (kube-apiserver + kube-scheduler v1.20.2) once per machine,
# from Debian 12's own `kubernetes` source package (the upstream tree with vendor/), with Debian's
# Go 1.19; etcd 3.4 and kubectl come unpacked from Debian's .debs (no service is started).
# Output: $GPULOOM_K8S_CACHE/bin/{kube-apiserver,kube-scheduler,etcd,kubectl}, a cache outside
# the clone, so CI's fresh clones and later sessions reuse it. Needs root (apt) and ~2.5 GB of disk
# while building; ~6 min of one core. The recipe and why each odd step is there:
# shared/notes/kubernetes-here.md §3.
set -euo pipefail
OUT=${GPULOOM_K8S_CACHE:-$HOME/.cache/gpuloom/k8s-1.20.2}
if [ -x "$OUT/bin/kube-apiserver" ] && [ -x "$OUT/bin/kube-scheduler" ] && [ -x "$OUT/bin/etcd" ]; then
  echo "control plane already built in $OUT/bin"; exit 0
fi
mkdir -p "$OUT"/{src,debs,bin,gopath/src/k8s.io}
export DEBIAN_FRONTEND=noninteractive
if ! ls /etc/apt/sources.list.d/*src* >/dev/null 2>&1 && ! grep -rqs '^deb-src' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  # enable Debian's source packages: the same entries, as deb-src (no new host)
  sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > /etc/apt/sources.list.d/debian-src.sources
fi
apt-get update -qq
command -v go >/dev/null || apt-get install -y -qq golang-go >/dev/null
command -v patch >/dev/null || apt-get install -y -qq patch >/dev/null
cd "$OUT/src"
[ -d kubernetes-1.20.2 ] || {
  apt-get source --download-only -qq kubernetes
  tar xzf kubernetes_*.orig.tar.gz
  tar xJf kubernetes_*.debian.tar.xz -C kubernetes-1.20.2
  (cd kubernetes-1.20.2 && for p in $(cat debian/patches/series); do patch -p1 -s < "debian/patches/$p"; done)
}
cd "$OUT/debs"
ls ./*.deb >/dev/null 2>&1 || apt-get download -qq etcd-server kubernetes-client golang-github-modern-go-reflect2-dev
for f in ./*.deb; do dpkg-deb -x "$f" root; done
cp root/usr/bin/etcd root/usr/bin/kubectl "$OUT/bin/"
K="$OUT/src/kubernetes-1.20.2"
# reflect2 v1.0.1 (vendored) crashes under Go >= 1.18; Debian's v1.0.2 replaces it
R="$K/vendor/github.com/modern-go/reflect2"
rm -rf "$R" && mkdir -p "$R" && cp root/usr/share/gocode/src/github.com/modern-go/reflect2/*.{go,s} "$R/" && rm -f "$R"/*_test.go
ln -sfn "$K" "$OUT/gopath/src/k8s.io/kubernetes"
export GOPATH="$OUT/gopath" GO111MODULE=off GOCACHE="$OUT/gocache" GOFLAGS= GOPROXY=off CGO_ENABLED=0
export GOMAXPROCS=${GOMAXPROCS:-$(nproc)}
cd "$GOPATH/src/k8s.io/kubernetes"
if [ ! -f pkg/generated/openapi/zz_generated.openapi.go ]; then
  nice -n 19 go build -o "$OUT/bin/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
  DIRS=$(find -H . \( -not \( \( -path './_*' -o -path './.*' -o -path ./vendor \) -prune \) \) -type f -name '*.go' \
    | sed 's|^./staging/src|vendor|; s|^\./||' | xargs grep -l '^// *+k8s:' | xargs grep -l '+k8s:openapi-gen=' \
    | grep -v -E '^vendor/k8s.io/(code-generator|sample-apiserver)/' | xargs -n1 dirname | LC_ALL=C sort -u \
    | sed 's|^|k8s.io/kubernetes/|' | paste -sd, -)
  nice -n 19 "$OUT/bin/openapi-gen" --logtostderr -i "$DIRS" -p k8s.io/kubernetes/pkg/generated/openapi \
    -O zz_generated.openapi -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt -r "$OUT/openapi-violations.report"
fi
V=k8s.io/kubernetes/vendor/k8s.io/component-base/version
nice -n 19 go build -ldflags "-s -w -X $V.gitVersion=v1.20.2 -X $V.gitMajor=1 -X $V.gitMinor=20 -X $V.gitTreeState=clean" \
  -o "$OUT/bin/" ./cmd/kube-apiserver ./cmd/kube-scheduler
"$OUT/bin/kube-apiserver" --version && "$OUT/bin/kube-scheduler" --version
# keep the binaries (~300 MB), drop the build cache and the source tree (~1.5 GB)
rm -rf "$OUT/gocache" "$OUT/src" "$OUT/gopath" "$OUT/debs"
echo "control plane built in $OUT/bin"
