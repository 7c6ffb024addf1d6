"""Route validation (podnet.model.schemas_route): OpenShift's defaults, and a 422 naming
the field and saying why for each bad input; a key never appears in a message."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podnet.model.errors import ApiError
from podnet.model.kinds import ROUTE
from podnet.model.validation import validate
from podnet.testing.routecerts import (
    RouteCa,
    encrypted_key_pem,
    other_key_pem,
    rsa_key_pem,
)

Obj = dict[str, Any]
HOST = "www.example.com"
CA = RouteCa.new()
LEAF = CA.issue(HOST)


def route(spec: Obj, status: Obj | None = None) -> Obj:
    obj: Obj = {
        "apiVersion": "route.openshift.io/v1",
        "kind": "Route",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": spec,
    }
    if status is not None:
        obj["status"] = status
    return obj


def ok(spec: Obj, status: Obj | None = None, old: Obj | None = None) -> Obj:
    return validate(ROUTE, route(spec, status), old)


def causes(spec: Obj, status: Obj | None = None, old: Obj | None = None) -> dict[str, str]:
    """field -> message of every cause of the 422."""
    with pytest.raises(ApiError) as caught:
        validate(ROUTE, route(spec, status), old)
    assert caught.value.code == 422, caught.value
    return {c.field: c.message for c in caught.value.causes}


def to(name: str = "web", **extra: Any) -> Obj:
    return {"name": name, **extra}


def test_a_plain_route_gets_openshifts_defaults() -> None:
    stored = ok({"host": HOST, "to": to()})
    assert stored["spec"] == {
        "host": HOST,
        "to": {"kind": "Service", "name": "web", "weight": 100},
        "wildcardPolicy": "None",
    }
    assert stored["status"] == {}


def test_a_full_route_is_kept_as_given() -> None:
    backends = [to("b", weight=1), to("c", weight=0), to("d", weight=256)]
    spec = {
        "host": HOST,
        "path": "/api/v1",
        "to": to(kind="Service", weight=3),
        "alternateBackends": backends,
        "port": {"targetPort": "http"},
        "wildcardPolicy": "None",
        "tls": {
            "termination": "reencrypt",
            "certificate": LEAF.certificate,
            "key": LEAF.key,
            "caCertificate": CA.pem,
            "destinationCACertificate": CA.pem,
            "insecureEdgeTerminationPolicy": "Redirect",
        },
    }
    stored = ok(spec)["spec"]
    assert stored == spec | {"alternateBackends": [{"kind": "Service", **b} for b in backends]}
    assert ok({**spec, "port": {"targetPort": 8443}})["spec"]["port"] == {"targetPort": 8443}


@pytest.mark.parametrize(
    ("given", "stored"),
    [(None, "edge"), ("Edge", "edge"), ("Passthrough", "passthrough"), ("Reencrypt", "reencrypt")],
)
def test_termination_defaults_to_edge_and_openshifts_spellings_are_lowered(
    given: str | None, stored: str
) -> None:
    tls = {} if given is None else {"termination": given}
    assert ok({"host": HOST, "to": to(), "tls": tls})["spec"]["tls"] == {"termination": stored}


def test_edge_with_an_rsa_key_in_either_form() -> None:
    for traditional in (True, False):
        key = rsa_key_pem(traditional)
        tls = {"termination": "edge", "certificate": LEAF.certificate, "key": key}
        assert "does not match" in causes({"host": HOST, "to": to(), "tls": tls})["spec.tls.key"]


def test_an_empty_host_is_allowed_for_the_master_to_fill() -> None:
    assert ok({"to": to()})["spec"]["host"] == ""
    assert ok({"host": "", "to": to()})["spec"]["host"] == ""


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("WWW.example.com", "lower case"),
        ("-a.example.com", "start and end with an alphanumeric"),
        ("a..b", "DNS-1123 subdomain"),
        ("*.example.com", "DNS-1123 subdomain"),
        ("a b", "DNS-1123 subdomain"),
        ("x" * 64 + ".example.com", "no more than 63 characters"),
        ("a." * 127 + "bc", "no more than 253 characters"),
    ],
)
def test_a_host_that_is_not_a_dns_subdomain_is_refused(host: str, why: str) -> None:
    message = causes({"host": host, "to": to()})["spec.host"]
    assert "is not a valid host" in message and why in message


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("api", "must start with /"),
        ("/a b", "not a valid URL path"),
        ("/a#b", "not a valid URL path"),
        ("/a?b=1", "not a valid URL path"),
        ("/a\nb", "not a valid URL path"),
        ("/%zz", "not a valid URL path"),
        ("/" + "a" * 1024, "no more than 1024 characters"),
    ],
)
def test_a_bad_path_is_refused(path: str, why: str) -> None:
    assert why in causes({"host": HOST, "path": path, "to": to()})["spec.path"]


def test_good_paths() -> None:
    for path in ("/", "/a/b/", "/%41b", "/a-b_c.d~e:f@g!$&'()*+,;="):
        assert ok({"host": HOST, "path": path, "to": to()})["spec"]["path"] == path


def test_passthrough_refuses_certificates_and_allow() -> None:
    tls = {
        "termination": "passthrough",
        "certificate": LEAF.certificate,
        "key": LEAF.key,
        "caCertificate": CA.pem,
        "destinationCACertificate": CA.pem,
        "insecureEdgeTerminationPolicy": "Allow",
    }
    found = causes({"host": HOST, "to": to(), "tls": tls})
    for field in ("certificate", "key", "caCertificate", "destinationCACertificate"):
        assert "passthrough termination does not support" in found[f"spec.tls.{field}"]
    assert "may only use None or Redirect" in found["spec.tls.insecureEdgeTerminationPolicy"]
    assert LEAF.key not in str(found)


def test_passthrough_refuses_a_path() -> None:
    spec = {"host": HOST, "path": "/a", "to": to(), "tls": {"termination": "passthrough"}}
    assert causes(spec) == {"spec.path": '"/a": passthrough termination does not support paths'}
    assert ok({**spec, "path": ""})["spec"]["path"] == ""


@pytest.mark.parametrize("policy", ["None", "Redirect"])
def test_passthrough_takes_none_and_redirect(policy: str) -> None:
    tls = {"termination": "passthrough", "insecureEdgeTerminationPolicy": policy}
    assert ok({"host": HOST, "to": to(), "tls": tls})["spec"]["tls"] == tls


def test_a_destination_ca_only_on_reencrypt() -> None:
    tls = {"termination": "edge", "destinationCACertificate": CA.pem}
    why = causes({"host": HOST, "to": to(), "tls": tls})["spec.tls.destinationCACertificate"]
    assert why == "edge termination does not support destination certificates"
    alone = {"destinationCACertificate": CA.pem}  # no termination: not defaulted to edge
    assert (
        "Required value" in causes({"host": HOST, "to": to(), "tls": alone})["spec.tls.termination"]
    )


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("termination", "bogus", 'Unsupported value: "bogus"'),
        ("insecureEdgeTerminationPolicy", "Never", 'Unsupported value: "Never"'),
        ("insecureEdgeTerminationPolicy", "redirect", 'Unsupported value: "redirect"'),
    ],
)
def test_unknown_termination_or_policy(field: str, value: str, why: str) -> None:
    tls = {"termination": "edge", field: value}
    assert why in causes({"host": HOST, "to": to(), "tls": tls})[f"spec.tls.{field}"]


NOT_PEM = "hello"
BROKEN_CERT = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("certificate", NOT_PEM, "no PEM block found"),
        ("certificate", BROKEN_CERT, "does not parse"),
        ("certificate", LEAF.certificate + LEAF.key, "found PRIVATE KEY"),
        ("caCertificate", BROKEN_CERT, "does not parse"),
        ("destinationCACertificate", NOT_PEM, "no PEM block found"),
    ],
)
def test_a_certificate_that_is_not_pem_x509_is_refused(field: str, value: str, why: str) -> None:
    tls = {"termination": "reencrypt", "certificate": LEAF.certificate, "key": LEAF.key}
    found = causes({"host": HOST, "to": to(), "tls": {**tls, field: value}})
    assert why in found[f"spec.tls.{field}"]
    assert LEAF.key not in str(found)


SECRET_LOOKING = (
    "-----BEGIN PRIVATE KEY-----\nVGhpcyBpcyBhIHNlY3JldA==\n-----END PRIVATE KEY-----\n"
)


@pytest.mark.parametrize(
    ("key", "why"),
    [
        (other_key_pem(), "does not match the certificate"),
        (SECRET_LOOKING, "does not parse"),
        ("not a key at all, secret words", "exactly one PEM private key block"),
        (LEAF.certificate, "exactly one PEM private key block"),
        (LEAF.key + LEAF.key, "exactly one PEM private key block"),
        (encrypted_key_pem(), "the key is encrypted"),
    ],
)
def test_a_bad_key_is_refused_and_never_echoed(key: str, why: str) -> None:
    tls = {"termination": "edge", "certificate": LEAF.certificate, "key": key}
    with pytest.raises(ApiError) as caught:
        validate(ROUTE, route({"host": HOST, "to": to(), "tls": tls}))
    error = caught.value
    assert why in {c.field: c.message for c in error.causes}["spec.tls.key"]
    shown = str(error.status())
    for secret in ("VGhpcyBpcyBhIHNlY3JldA", "secret words", *key.splitlines()[1:2]):
        assert secret not in shown


def test_a_certificate_needs_its_key_and_the_reverse() -> None:
    alone = {"termination": "edge", "certificate": LEAF.certificate}
    assert (
        "needs its private key" in causes({"host": HOST, "to": to(), "tls": alone})["spec.tls.key"]
    )
    key_only = {"termination": "edge", "key": LEAF.key}
    found = causes({"host": HOST, "to": to(), "tls": key_only})
    assert "a key needs its certificate" in found["spec.tls.certificate"]
    ca_only = {"termination": "edge", "caCertificate": CA.pem}
    assert (
        "goes with a certificate"
        in causes({"host": HOST, "to": to(), "tls": ca_only})["spec.tls.certificate"]
    )


@pytest.mark.parametrize(
    ("spec", "field", "why"),
    [
        ({"to": to(weight=257)}, "spec.to.weight", "257 must be between 0 and 256"),
        ({"to": to(weight=-1)}, "spec.to.weight", "-1 must be between 0 and 256"),
        (
            {"to": to(), "alternateBackends": [to("b", weight=300)]},
            "spec.alternateBackends[0].weight",
            "300 must be between 0 and 256",
        ),
        (
            {"to": to(), "alternateBackends": [to("b"), to("c"), to("d"), to("e")]},
            "spec.alternateBackends",
            "must have at most 3 items, got 4",
        ),
        ({"to": to(kind="Pod")}, "spec.to.kind", "must reference a Service"),
        (
            {"to": to(), "alternateBackends": [to("b", kind="Deployment")]},
            "spec.alternateBackends[0].kind",
            "must reference a Service",
        ),
        ({"to": to("")}, "spec.to.name", "Required value"),
        ({"to": to("Web")}, "spec.to.name", "not a valid Service name"),
        ({"to": {"kind": "Service"}}, "spec.to.name", "Required value"),
        ({}, "spec.to", "Required value"),
        ({"to": to(), "wildcardPolicy": "Subdomain"}, "spec.wildcardPolicy", "serves no wildcard"),
        ({"to": to(), "port": {"targetPort": 0}}, "spec.port.targetPort", "between 1 and 65535"),
        ({"to": to(), "port": {"targetPort": ""}}, "spec.port.targetPort", "must not be empty"),
        ({"to": to(), "port": {"targetPort": "HTTP"}}, "spec.port.targetPort", "port name"),
        ({"to": to(), "port": {"targetPort": 1.5}}, "spec.port.targetPort", "got number"),
        ({"to": to(), "subdomain": "x"}, "spec.subdomain", "unknown field"),
        ({"to": to(), "tls": {"termination": "edge", "extra": 1}}, "spec.tls.extra", "unknown"),
    ],
)
def test_backends_port_and_policy_rules(spec: Obj, field: str, why: str) -> None:
    assert why in causes({"host": HOST, **spec})[field]


def test_the_status_is_dropped_on_create_and_kept_on_update() -> None:
    condition = {"type": "Admitted", "status": "True", "lastTransitionTime": "2024-01-02T03:04:05Z"}
    status = {"ingress": [{"host": HOST, "routerName": "default", "conditions": [condition]}]}
    assert ok({"host": HOST, "to": to()}, status)["status"] == {}
    junk = {"ingress": "forged"}  # not even looked at on create
    assert ok({"host": HOST, "to": to()}, junk)["status"] == {}
    old = route({"host": HOST, "to": to()})
    assert ok({"host": HOST, "to": to()}, status, old)["status"] == status


@pytest.mark.parametrize(
    ("entry", "field", "why"),
    [
        ({}, "status.ingress[0].routerName", "Required value"),
        ({"routerName": "Bad Name"}, "status.ingress[0].routerName", "not a valid router name"),
        ({"routerName": "r", "host": "A"}, "status.ingress[0].host", "not a valid host"),
        (
            {"routerName": "r", "wildcardPolicy": "Subdomain"},
            "status.ingress[0].wildcardPolicy",
            "serves no wildcard",
        ),
        (
            {"routerName": "r", "conditions": [{"type": "Ready", "status": "True"}]},
            "status.ingress[0].conditions[0].type",
            'Unsupported value: "Ready"',
        ),
        (
            {"routerName": "r", "conditions": [{"type": "Admitted", "status": "yes"}]},
            "status.ingress[0].conditions[0].status",
            'Unsupported value: "yes"',
        ),
        (
            {
                "routerName": "r",
                "conditions": [
                    {"type": "Admitted", "status": "True", "lastTransitionTime": "yesterday"}
                ],
            },
            "status.ingress[0].conditions[0].lastTransitionTime",
            "not an RFC 3339 time",
        ),
    ],
)
def test_bad_status_on_update(entry: Obj, field: str, why: str) -> None:
    old = route({"host": HOST, "to": to()})
    assert why in causes({"host": HOST, "to": to()}, {"ingress": [entry]}, old)[field]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
TLS_VALUES = {
    "termination": st.sampled_from(["edge", "Edge", "passthrough", "reencrypt", "x"]) | JSON,
    "certificate": st.sampled_from([LEAF.certificate, BROKEN_CERT, CA.pem, ""]) | JSON,
    "key": st.sampled_from([LEAF.key, SECRET_LOOKING, other_key_pem(), ""]) | JSON,
    "caCertificate": st.sampled_from([CA.pem, NOT_PEM]) | JSON,
    "destinationCACertificate": st.sampled_from([CA.pem, NOT_PEM]) | JSON,
    "insecureEdgeTerminationPolicy": st.sampled_from(["None", "Allow", "Redirect"]) | JSON,
}
SPEC_VALUES = {
    "host": st.sampled_from([HOST, "", "A"]) | JSON,
    "path": st.sampled_from(["/", "/a", "a", ""]) | JSON,
    "to": st.fixed_dictionaries({"name": st.sampled_from(["web", ""]) | JSON}) | JSON,
    "alternateBackends": st.lists(st.fixed_dictionaries({"name": st.just("b")}), max_size=5) | JSON,
    "port": st.fixed_dictionaries({"targetPort": st.integers() | st.text(max_size=5)}) | JSON,
    "wildcardPolicy": st.sampled_from(["None", "Subdomain"]) | JSON,
    "tls": st.fixed_dictionaries({}, optional=TLS_VALUES) | JSON,
}


@settings(max_examples=200, deadline=None)
@given(st.fixed_dictionaries({}, optional=SPEC_VALUES), JSON)
def test_any_input_is_stored_or_refused_with_422(spec: Obj, status: Any) -> None:
    """Whatever the spec holds, validation answers with a route or a 422 (never a crash),
    and a refusal never shows the route's key."""
    old = route({"host": HOST, "to": to()})
    for previous in (None, old):
        try:
            validate(ROUTE, route(spec, {"ingress": status}), previous)
        except ApiError as error:
            assert error.code == 422
            key = (spec.get("tls") or {}).get("key") if isinstance(spec.get("tls"), dict) else None
            if isinstance(key, str) and "PRIVATE KEY" in key:
                assert key.splitlines()[1] not in str(error.status())
