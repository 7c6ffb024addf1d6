#!/usr/bin/env bash
# The main job: set up, start a local podnet cluster of 3 nodes (each a network namespace
# running a real `podnet node`), run 2 pods per node wired by the real CNI plugin, and
# print the connectivity matrix (every pod to every pod: ping and TCP echo, ✓/✗ and
# latency), then reach a Service by its name from every node (the node's cluster DNS
# through the pod's resolv.conf, then the service proxy). With the router (default;
# PODNET_ROUTER=0 leaves it out) it then creates one Route of each kind (http, edge,
# reencrypt, passthrough) in project "demo" and reaches each from the external host by
# name (*.apps.podnet.test) with curl and openssl s_client. The cluster stays up
# afterwards. Safe to run again: what exists is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
PODNET=.venv/bin/podnet
export PODNET_STATE_DIR="${PODNET_STATE_DIR:-/var/lib/podnet/cluster}"
NODES="${PODNET_NODES:-3}"
TUNNEL="${PODNET_TUNNEL:-${PODNET_BACKEND:-vxlan}}"  # PODNET_BACKEND: its older name
PLUGIN="${PODNET_PLUGIN:-subnet}"
DATAPLANE="${PODNET_DATAPLANE:-linux}"  # linux (bridge + nftables) or ovs (Open vSwitch)
ROUTER="${PODNET_ROUTER:-1}"  # 1: cluster up --router, and show a route of each kind
ROUTER_FLAG=()
if [ "$ROUTER" = 1 ]; then ROUTER_FLAG=(--router); fi

echo "== podnet cluster up --nodes $NODES --tunnel $TUNNEL --plugin $PLUGIN --dataplane $DATAPLANE ${ROUTER_FLAG[*]}"
"$PODNET" cluster up --nodes "$NODES" --tunnel "$TUNNEL" --plugin "$PLUGIN" --dataplane "$DATAPLANE" \
  "${ROUTER_FLAG[@]}"

echo "== podnet pod run (2 pods per node)"
for node in $(seq 1 "$NODES"); do
  for pod in a b; do
    name="pod-$node$pod"
    if "$PODNET" pod exec "$name" -- true 2>/dev/null; then
      echo "pod/$name already running"
    else
      "$PODNET" pod run "$name" --node "node$node" --label app=echo
    fi
  done
done

export KUBECONFIG="$PODNET_STATE_DIR/master/admin.kubeconfig"
echo "== podnet apply: Service echo (selector app=echo, port 80 -> 8080)"
"$PODNET" apply -f - <<'YAML'
apiVersion: v1
kind: Service
metadata:
  name: echo
  namespace: default
spec:
  selector:
    app: echo
  ports:
    - name: http
      port: 80
      targetPort: 8080
YAML
"$PODNET" get svc echo -o wide

echo "== podnet cluster status"
"$PODNET" cluster status

echo "== podnet cluster matrix -n default"
"$PODNET" cluster matrix -n default

if [ "$ROUTER" = 1 ]; then
  scripts/routes-demo.sh
fi

echo
echo "The cluster is still up. Use it with:"
echo "  export KUBECONFIG=$PODNET_STATE_DIR/master/admin.kubeconfig"
echo "  $PODNET get nodes; $PODNET get hostsubnets; $PODNET pod exec pod-1a -- ip addr"
echo "  $PODNET get svc,ep; $PODNET pod exec pod-1a -- getent hosts echo"
echo "Tear it down with:  $PODNET cluster down --state-dir $PODNET_STATE_DIR"
