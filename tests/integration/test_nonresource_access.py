"""Issue 19, finding 9: non-resource paths are authorized like everything else, against
a real master. A token with no role reads discovery, OpenAPI, version and health (kube's
system:discovery and system:public-info-viewer) but gets 403 on ``/metrics``; the admin
and a metrics reader (kube's group ``system:monitoring``) read it."""

from __future__ import annotations

from podnet.api.auth import add_token
from podnet.testing.api import client_for
from podnet.testing.processes import MasterProcess


def test_metrics_only_for_the_roles_that_need_them(master: MasterProcess) -> None:
    tokens = master.state_dir / "tokens.csv"
    nobody = add_token(tokens, "nobody", [])
    reader = add_token(tokens, "prometheus", ["system:monitoring"])
    node = add_token(tokens, "system:node:n9", ["system:nodes"])
    for token in (nobody, node):
        with client_for(master.kubeconfig, token=token) as api:
            answer = api.get("/metrics")
            assert answer.status_code == 403, answer.text
            assert "podnet_" not in answer.text
            assert answer.json()["reason"] == "Forbidden"
            for path in ("/api", "/api/v1", "/apis", "/version", "/healthz", "/openapi/v3"):
                assert api.get(path).status_code == 200, path
            assert api.get("/debug/anything").status_code == 403
    for token in (reader, ""):  # "": the admin's, from the kubeconfig
        with client_for(master.kubeconfig, token=token) as api:
            answer = api.get("/metrics")
            assert answer.status_code == 200, answer.text
            assert "podnet_" in answer.text
