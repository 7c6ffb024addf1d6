#!/usr/bin/env bash
# One Route of each kind through the router of a running local cluster (`podnet cluster
# up --router`), reached from the external host by name, as scripts/run.sh shows them:
#   http        www.apps.podnet.test        -> Service web (pod web, HTTP :8080)
#   edge        edge.apps.podnet.test       -> web; TLS ends at the router; HTTP redirects
#   reencrypt   reencrypt.apps.podnet.test  -> Service secure (pod secure, HTTPS :8443),
#               the pod's certificate checked against its CA (destinationCACertificate)
#   passthrough pass.apps.podnet.test       -> secure; the client sees the pod's certificate
# Edge and reencrypt use the router's default certificate (curl -k). Project "demo".
# Safe to run again: what exists is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PODNET=.venv/bin/podnet
PYTHON="$(pwd)/.venv/bin/python"
export PODNET_STATE_DIR="${PODNET_STATE_DIR:-/var/lib/podnet/cluster}"
export KUBECONFIG="$PODNET_STATE_DIR/master/admin.kubeconfig"
NS=demo
DOMAIN=apps.podnet.test
EXT=$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["external"]["netns"])' \
  "$PODNET_STATE_DIR/state.json")
in_ext() { ip netns exec "$EXT" "$@"; }

echo "== router backends in project $NS: pod web (HTTP), pod secure (HTTPS, its own CA)"
if ! "$PODNET" pod exec -n "$NS" web -- true 2>/dev/null; then
  "$PODNET" pod run -n "$NS" web --label app=web --port http=8080 --ready-tcp 8080 -- \
    "$PYTHON" -m podnet.cluster.httpecho --name web --port 8080
fi
if ! "$PODNET" pod exec -n "$NS" secure -- true 2>/dev/null; then
  "$PODNET" pod run -n "$NS" secure --label app=secure --port https=8443 --ready-tcp 8443 -- \
    "$PYTHON" -m podnet.cluster.httpecho --name secure --tls-port 8443 \
    --self-signed "secure.$NS.svc,pass.$DOMAIN"
fi
# The secure pod printed its CA when it started: the reencrypt route's destination CA.
POD_CA=$(awk '/BEGIN CERTIFICATE/{pem=""} {pem=pem $0 "\n"} /END CERTIFICATE/{last=pem} END{printf "%s", last}' \
  "$PODNET_STATE_DIR/pods/${NS}_secure.log")

echo "== podnet apply: Services web and secure, and four Routes"
"$PYTHON" - "$NS" "$DOMAIN" "$POD_CA" <<'PY' | "$PODNET" apply -f -
import json, sys
ns, domain, pod_ca = sys.argv[1:4]
def service(name, port, target):
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
            "spec": {"selector": {"app": name}, "ports": [{"name": "p", "port": port, "targetPort": target}]}}
def route(name, host, to, tls=None):
    spec = {"host": f"{host}.{domain}", "to": {"kind": "Service", "name": to}}
    if tls:
        spec["tls"] = tls
    return {"apiVersion": "route.openshift.io/v1", "kind": "Route",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}
items = [
    service("web", 80, 8080),
    service("secure", 443, 8443),
    route("www", "www", "web"),
    route("edge", "edge", "web", {"termination": "edge", "insecureEdgeTerminationPolicy": "Redirect"}),
    route("reencrypt", "reencrypt", "secure", {"termination": "reencrypt", "destinationCACertificate": pod_ca}),
    route("pass", "pass", "secure", {"termination": "passthrough"}),
]
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
PY

# Bounded wait until the router serves the last of them (it reloads within a second).
for _ in $(seq 1 60); do
  code=$(in_ext curl -sk -o /dev/null -w '%{http_code}' -m 2 "https://pass.$DOMAIN/" || true)
  [ "$code" = 200 ] && break
  sleep 0.5
done

echo "== podnet get routes -n $NS"
"$PODNET" get routes -n "$NS"

echo "== from the external host ($EXT), by name (*.$DOMAIN -> the router on node1)"
echo "-- http:        curl http://www.$DOMAIN/hello"
in_ext curl -sS -m 5 "http://www.$DOMAIN/hello"
echo "-- edge:        curl -k https://edge.$DOMAIN/  (TLS ends at the router)"
in_ext curl -sSk -m 5 "https://edge.$DOMAIN/"
echo "-- edge:        curl http://edge.$DOMAIN/  (insecureEdgeTerminationPolicy Redirect)"
in_ext curl -sS -m 5 -o /dev/null -w '%{http_code} -> %{redirect_url}\n' "http://edge.$DOMAIN/"
echo "-- reencrypt:   curl -k https://reencrypt.$DOMAIN/  (the router verified the pod's certificate)"
in_ext curl -sSk -m 5 "https://reencrypt.$DOMAIN/"
echo "-- passthrough: openssl s_client -servername pass.$DOMAIN  (the pod's own certificate)"
in_ext openssl s_client -connect "pass.$DOMAIN:443" -servername "pass.$DOMAIN" </dev/null 2>/dev/null \
  | grep -E '^(subject|issuer)='
echo "-- passthrough: curl -k https://pass.$DOMAIN/"
in_ext curl -sSk -m 5 "https://pass.$DOMAIN/"
echo "-- unknown host: curl http://nothing.$DOMAIN/"
in_ext curl -sS -m 5 -o /dev/null -w '%{http_code}\n' "http://nothing.$DOMAIN/"
