"""NetworkPolicy compiled and evaluated, in the style of Kubernetes' e2e netpol suite.

Namespaces x, y, z each hold pods a, b, c (labels ``ns=<ns>`` and ``pod=<pod>``), which
serve ports 80 and 81 over TCP, UDP and SCTP under the names ``serve-<port>-<proto>``.
Every case writes out the full 9 x 9 matrix it expects: one row per source, one column
per destination (x/a x/b x/c, y/a y/b y/c, z/a z/b z/c), 1 allowed, 0 denied. A pod's
traffic to itself stays on its loopback and always passes.
"""

from __future__ import annotations

import copy
import random

import pytest

from podnet.model.network import NETWORKPOLICY
from podnet.policy.compile import compile_rules
from podnet.policy.evaluate import evaluate
from podnet.policy.model import RuleSet
from podnet.testing.netpol import (
    ALLOW_B,
    CASES,
    IPS,
    KEYS,
    NAMESPACES,
    Case,
    Obj,
    allow,
    compile_cluster,
    deny,
    expected,
    grid,
    ingress_to_xa,
    make_namespace,
    make_pod,
    matrix,
    sel,
)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matrix(case: Case) -> None:
    ruleset = compile_cluster(case.policies, case.pod_labels, case.ns_labels)
    assert matrix(ruleset, case.protocol, case.port) == case.want


def test_there_are_at_least_thirty_cases() -> None:
    assert len(CASES) >= 30
    assert len({c.name for c in CASES}) == len(CASES)


def test_expected_matrices_apply_rules_in_order_and_keep_self_traffic() -> None:
    """``grid`` writes the cases' expectations: the last matching rule wins, patterns
    select namespaces (``y/*``) and pod names (``*/b``), and the diagonal always passes."""
    assert grid(deny("*", "*")).split("\n")[4] == "y/b 000 010 000"
    assert grid(deny("*", "x/a"), allow("*/b", "x/a"), deny("y/*", "*")) == expected("""
        x/a 111 111 111
        x/b 111 111 111
        x/c 011 111 111
        y/a 000 100 000
        y/b 000 010 000
        y/c 000 001 000
        z/a 011 111 111
        z/b 111 111 111
        z/c 011 111 111
    """)


# --- changes: recompiling takes them in, and leaves nothing stale --------------------------


def test_pod_label_change_takes_effect() -> None:
    before = compile_cluster([ALLOW_B])
    after = compile_cluster([ALLOW_B], pod_labels={"y/c": {"pod": "b"}})
    assert evaluate(before, IPS["y/c"], IPS["x/a"], "TCP", 80).allowed is False
    assert evaluate(after, IPS["y/c"], IPS["x/a"], "TCP", 80).allowed is True


def test_namespace_label_change_takes_effect() -> None:
    allow_y = ingress_to_xa({"from": [{"namespaceSelector": sel(ns="y")}]})
    after = compile_cluster(allow_y, ns_labels={"z": {"ns": "y"}})
    assert evaluate(after, IPS["z/b"], IPS["x/a"], "TCP", 80).allowed is True


def build(pods: dict[str, Obj], namespaces: dict[str, Obj], policies: dict[str, Obj]) -> RuleSet:
    netns = [{"netname": n, "netid": 10 + i} for i, n in enumerate(NAMESPACES)]
    return compile_rules(
        NETWORKPOLICY, pods.values(), namespaces.values(), netns, policies.values()
    )


def test_incremental_equals_fresh() -> None:
    """Apply a stream of changes, recompiling each time; the end equals a fresh build."""
    pods = {k: make_pod(k) for k in KEYS}
    namespaces = {n: make_namespace(n) for n in NAMESPACES}
    policies: dict[str, Obj] = {}
    seen = [build(pods, namespaces, policies)]
    policies["x/allow-b"] = ALLOW_B
    seen.append(build(pods, namespaces, policies))
    pods["y/c"] = make_pod("y/c", {"pod": "b"})
    seen.append(build(pods, namespaces, policies))
    namespaces["z"] = make_namespace("z", {"ns": "y"})
    policies["x/to-xa"] = ingress_to_xa({"from": [{"namespaceSelector": sel(ns="y")}]})[0]
    seen.append(build(pods, namespaces, policies))
    del pods["z/b"], policies["x/allow-b"]
    seen.append(build(pods, namespaces, policies))
    assert len({r.fingerprint() for r in seen}) == len(seen)
    fresh = fresh_build(pods, namespaces, policies)
    assert fresh == seen[-1]
    assert fresh.fingerprint() == seen[-1].fingerprint()


def fresh_build(
    pods: dict[str, Obj], namespaces: dict[str, Obj], policies: dict[str, Obj]
) -> RuleSet:
    """The same objects, deep-copied and listed in another order."""
    shuffle = random.Random(7)
    lists = [copy.deepcopy(list(d.values())) for d in (pods, namespaces, policies)]
    for items in lists:
        shuffle.shuffle(items)
    return build(*({str(i): o for i, o in enumerate(items)} for items in lists))
