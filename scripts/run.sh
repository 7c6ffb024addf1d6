#!/usr/bin/env bash
# The main job: set up, start a local podnet cluster (etcd + master), load the sample
# objects and show what the master allocated. The cluster stays up afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
PODNET=.venv/bin/podnet
STATE_DIR="${PODNET_STATE_DIR:-/var/lib/podnet/cluster}"
echo "== podnet cluster up"
"$PODNET" cluster up --plugin multitenant --state-dir "$STATE_DIR"
export KUBECONFIG="$STATE_DIR/master/admin.kubeconfig"
echo "== podnet apply -f examples/sample.yaml"
"$PODNET" apply -f examples/sample.yaml
for _ in $(seq 1 50); do
  [ "$("$PODNET" get hostsubnets -o name | wc -l)" -ge 3 ] && break
  sleep 0.1
done
echo "== podnet get hostsubnets"
"$PODNET" get hostsubnets
echo "== podnet get netnamespaces"
"$PODNET" get netnamespaces
echo "== podnet adm pod-network join-projects --to=frontend backend"
"$PODNET" adm pod-network join-projects --to=frontend backend
"$PODNET" get netnamespaces
echo
echo "The cluster is still up. Use it with:  export KUBECONFIG=$KUBECONFIG"
echo "Tear it down with:  $PODNET cluster down --state-dir $STATE_DIR"
