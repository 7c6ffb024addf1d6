"""Admission with a real router (``podnet.testing.routerns``): a younger route for a
claimed host is not admitted (HostAlreadyClaimed in its status) and the older one keeps
serving; a broken certificate is refused by the API (422); a route whose certificate
HAProxy cannot load is left out and marked not admitted while the others serve, and
claims no host; the
router's identity can do no more than read routes and write their status."""

from __future__ import annotations

import time

import pytest

from podnet.testing.api import client_for
from podnet.testing.e2e import wait_for
from podnet.testing.routecerts import RouteCa
from podnet.testing.routerns import (
    CORE,
    ROUTES,
    RouterNamespace,
    admitted,
    edge,
    route,
    service_with_endpoints,
    weak_leaf,
)

pytestmark = [pytest.mark.root]
WWW = "www.example.com"


def test_conflicts_and_certificates_haproxy_refuses_leave_the_others_serving(
    router_lab: RouterNamespace,
) -> None:
    router_lab.start_router()
    with client_for(router_lab.master.kubeconfig) as api:
        service_with_endpoints(api, "web", ["a"])
        service_with_endpoints(api, "other", ["c"])
        first = api.post(ROUTES, json=route("first", WWW)).json()
        wait_for(lambda: router_lab.served_by(WWW) == "a", 30, "first served")
        # make the next route younger by its creation time (whole seconds), not by uid
        created = first["metadata"]["creationTimestamp"]
        now = lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # noqa: E731
        wait_for(lambda: now() > created, 5, "the next second", interval=0.02)
        assert api.post(ROUTES, json=route("second", WWW, "other")).status_code == 201
        refused = wait_for(lambda: admitted(api, "second"), 30, "second's status")
        assert refused["status"] == "False" and refused["reason"] == "HostAlreadyClaimed"
        assert "first" in refused["message"]
        assert (admitted(api, "first") or {}).get("status") == "True"
        assert {router_lab.served_by(WWW) for _ in range(4)} == {"a"}

        # a broken certificate never gets in: 422 from the API, naming the field
        broken = route("broken", "broken.example.com", tls=edge("not a certificate", "no key"))
        answer = api.post(ROUTES, json=broken)
        assert answer.status_code == 422 and "spec.tls.certificate" in answer.text

        # one HAProxy cannot load: left out and marked; the good edge route next to it serves
        ca = RouteCa.new()
        good = ca.issue("good.example.com")
        tls = edge(good.certificate, good.key)
        assert api.post(ROUTES, json=route("good", "good.example.com", tls=tls)).status_code == 201
        weak = route("weak", "weak.example.com", tls=edge(*weak_leaf("weak.example.com")))
        assert api.post(ROUTES, json=weak).status_code == 201
        marked = wait_for(lambda: admitted(api, "weak"), 60, "weak route's status")
        assert marked["status"] == "False" and marked["reason"] == "ExtendedValidationFailed"
        assert "shop:weak" in marked["message"]
        wait_for(
            lambda: router_lab.served_by("good.example.com", https=True) == "a", 30, "good route"
        )
        assert (wait_for(lambda: admitted(api, "good"), 30, "good's status"))["status"] == "True"
        assert router_lab.served_by("weak.example.com", https=True) is None
        assert router_lab.served_by(WWW) == "a"

        # the refused route claims no host: a younger one for it, with a good certificate,
        # is admitted and served
        twin = ca.issue("weak.example.com")
        tls = edge(twin.certificate, twin.key)
        assert (
            api.post(ROUTES, json=route("twin", "weak.example.com", "other", tls=tls)).status_code
            == 201
        )
        wait_for(
            lambda: router_lab.served_by("weak.example.com", https=True) == "c", 30, "twin serves"
        )
        assert (wait_for(lambda: admitted(api, "twin"), 30, "twin's status"))["status"] == "True"
        assert (admitted(api, "weak") or {}).get("reason") == "ExtendedValidationFailed"

        # the router's identity reads routes and writes their status, nothing else
        with client_for(router_lab.kubeconfig) as router_api:
            assert router_api.get(ROUTES).status_code == 200
            mine = route("mine", "mine.example.com")
            assert router_api.post(ROUTES, json=mine).status_code == 403
            assert router_api.delete(f"{ROUTES}/first").status_code == 403
            assert router_api.get(f"{CORE}/pods").status_code == 403
            assert router_api.get("/api/v1/nodes").status_code == 403
