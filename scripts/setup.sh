#!/usr/bin/env bash
# Installs everything podnet needs on a fresh Debian machine (as root): apt packages, a
# virtual environment in .venv, and the package itself. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(etcd-server etcd-client nftables iproute2 iperf3 iputils-ping containernetworking-plugins procps gcc libc6-dev podman runc busybox-static iptables
  bind9-dnsutils dnsmasq-base dnsperf conntrack openvswitch-switch ethtool haproxy wrk apache2-utils
  systemd)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "== installing apt packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian's etcd-server package may start a system etcd; podnet runs its own on free ports.

# kubectl >= 1.28 comes with this machine kind's image (Debian's kubernetes-client is 1.20,
# too old for the API's OpenAPI v3 and protobuf paths). The test suite fails without it.
kubectl_minor=$(/usr/bin/kubectl version --client -o json 2>/dev/null \
  | sed -n 's/.*"minor": *"\([0-9]*\).*/\1/p' | head -n 1 || true)
kubectl_where="it comes with this machine kind's image; Debian's kubernetes-client (1.20) is too old"
if [ ! -x /usr/bin/kubectl ]; then
  echo "!! kubectl >= 1.28 is required and /usr/bin/kubectl is missing ($kubectl_where)." >&2
  echo "!! The kubectl tests fail (they never skip) until it is there." >&2
elif [ -z "$kubectl_minor" ]; then
  echo "!! /usr/bin/kubectl does not report its version: the tests need kubectl >= 1.28." >&2
elif [ "$kubectl_minor" -lt 28 ]; then
  echo "!! /usr/bin/kubectl is 1.$kubectl_minor; kubectl >= 1.28 is required ($kubectl_where)." >&2
  echo "!! The kubectl tests fail (they never skip) until it is replaced." >&2
fi

# The real interpreter, not a pyenv shim (a shim costs ~70 ms on every interpreter start).
PYTHON="${PYTHON:-$(python3 -c 'import sys; print(sys.executable)')}"
if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv with $PYTHON"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.podnet-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "== installing podnet into .venv"
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q -e '.[test]'
  touch "$stamp"
fi
