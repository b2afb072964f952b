#!/usr/bin/env bash
# Build a real kubelet v1.20.2 once per machine, from Debian 12's own `kubernetes` source package,
# exactly as tools/kubernetes/build.sh builds kube-apiserver (GOPATH mode, Debian's Go 1.19,
# reflect2 1.0.2 swapped in, openapi generated when kubelet needs it, CGO_ENABLED=0), and install
# what a real pod needs from Debian: containerd, runc and busybox-static (the image's only file;
# tests/integration/test_kubelet_pod.py builds the OCI image from it, no registry).
# Output: $GPULOOM_K8S_CACHE/bin/kubelet (default ~/.cache/gpuloom/k8s-1.20.2/bin), next to the
# control plane's binaries. Idempotent: does nothing when all are there. Needs root (apt) and
# ~2 GB of disk while building (the source tree is fetched again and removed afterwards).
set -euo pipefail
OUT=${GPULOOM_K8S_CACHE:-$HOME/.cache/gpuloom/k8s-1.20.2}
export DEBIAN_FRONTEND=noninteractive
need=()
command -v containerd >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  # --no-install-recommends: no service is started here (there is no systemd anyway)
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if [ -x "$OUT/bin/kubelet" ]; then
  echo "kubelet already built in $OUT/bin"; exit 0
fi
WORK="$OUT/kubelet-build"
mkdir -p "$WORK"/{src,debs,gopath/src/k8s.io} "$OUT/bin"
if ! ls /etc/apt/sources.list.d/*src* >/dev/null 2>&1 && ! grep -rqs '^deb-src' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > /etc/apt/sources.list.d/debian-src.sources
fi
command -v go >/dev/null && command -v patch >/dev/null || {
  apt-get update -qq; apt-get install -y -qq golang-go patch >/dev/null; }
cd "$WORK/src"
[ -d kubernetes-1.20.2 ] || {
  ls kubernetes_*.orig.tar.gz >/dev/null 2>&1 || apt-get source --download-only -qq kubernetes
  tar xzf kubernetes_*.orig.tar.gz
  tar xJf kubernetes_*.debian.tar.xz -C kubernetes-1.20.2
  (cd kubernetes-1.20.2 && for p in $(cat debian/patches/series); do patch -p1 -s < "debian/patches/$p"; done)
}
cd "$WORK/debs"
ls ./*.deb >/dev/null 2>&1 || apt-get download -qq golang-github-modern-go-reflect2-dev
for f in ./*.deb; do dpkg-deb -x "$f" root; done
K="$WORK/src/kubernetes-1.20.2"
# reflect2 v1.0.1 (vendored) crashes under Go >= 1.18; Debian's v1.0.2 replaces it
R="$K/vendor/github.com/modern-go/reflect2"
rm -rf "$R" && mkdir -p "$R" && cp root/usr/share/gocode/src/github.com/modern-go/reflect2/*.{go,s} "$R/" && rm -f "$R"/*_test.go
ln -sfn "$K" "$WORK/gopath/src/k8s.io/kubernetes"
export GOPATH="$WORK/gopath" GO111MODULE=off GOCACHE="$WORK/gocache" GOFLAGS= GOPROXY=off CGO_ENABLED=0
export GOMAXPROCS=${GOMAXPROCS:-$(nproc)}
cd "$GOPATH/src/k8s.io/kubernetes"
if [ ! -f pkg/generated/openapi/zz_generated.openapi.go ] \
   && go list -deps ./cmd/kubelet 2>/dev/null | grep -qx 'k8s.io/kubernetes/pkg/generated/openapi'; then
  nice -n 19 go build -o "$WORK/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
  DIRS=$(find -H . \( -not \( \( -path './_*' -o -path './.*' -o -path ./vendor \) -prune \) \) -type f -name '*.go' \
    | sed 's|^./staging/src|vendor|; s|^\./||' | xargs grep -l '^// *+k8s:' | xargs grep -l '+k8s:openapi-gen=' \
    | grep -v -E '^vendor/k8s.io/(code-generator|sample-apiserver)/' | xargs -n1 dirname | LC_ALL=C sort -u \
    | sed 's|^|k8s.io/kubernetes/|' | paste -sd, -)
  nice -n 19 "$WORK/openapi-gen" --logtostderr -i "$DIRS" -p k8s.io/kubernetes/pkg/generated/openapi \
    -O zz_generated.openapi -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt -r "$WORK/openapi-violations.report"
fi
V=k8s.io/kubernetes/vendor/k8s.io/component-base/version
nice -n 19 go build -p "${GOBUILD_P:-$(nproc)}" \
  -ldflags "-s -w -X $V.gitVersion=v1.20.2 -X $V.gitMajor=1 -X $V.gitMinor=20 -X $V.gitTreeState=clean" \
  -o "$OUT/bin/kubelet" ./cmd/kubelet
"$OUT/bin/kubelet" --version
# keep the binary, drop the build cache and the source tree (~1.5 GB)
cd "$OUT" && rm -rf "$WORK"
echo "kubelet built in $OUT/bin"
