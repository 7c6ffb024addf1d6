"""The endpoints controller's label indexes agree with a plain scan, through any sequence
of puts, relabels and deletions."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from podnet.controllers.endpointsdesired import selects
from podnet.controllers.endpointsindex import PodIndex, ServiceIndex, follow

Obj = dict[str, Any]
labels = st.dictionaries(st.sampled_from("abc"), st.sampled_from("xy"), max_size=3)
# (pod index, namespace, labels, delete?)
events = st.lists(
    st.tuples(st.integers(0, 6), st.sampled_from(["n1", "n2"]), labels, st.booleans()),
    max_size=40,
)


def obj(kind: str, i: int, namespace: str, revision: int, **rest: Any) -> Obj:
    meta = {"name": f"{kind}{i}", "namespace": namespace, "resourceVersion": str(revision)}
    return {"kind": kind, "metadata": meta, **rest}


@settings(max_examples=80, deadline=None)
@given(pod_events=events, selectors=st.lists(st.tuples(st.sampled_from(["n1", "n2"]), labels)))
def test_indexes_agree_with_a_scan(
    pod_events: list[tuple[int, str, dict[str, str], bool]],
    selectors: list[tuple[str, dict[str, str]]],
) -> None:
    pods, live = PodIndex(), {}
    for revision, (i, namespace, pod_labels, delete) in enumerate(pod_events, start=1):
        namespace = live.get(i, {}).get("metadata", {}).get("namespace", namespace)
        pod = obj("Pod", i, namespace, revision)
        pod["metadata"]["labels"] = pod_labels
        follow(pods, "DELETED" if delete else "MODIFIED", pod)
        if delete:
            live.pop(i, None)
        else:
            live[i] = pod
    services = ServiceIndex()
    for j, (namespace, selector) in enumerate(selectors):
        services.put(obj("Service", j, namespace, j + 1, spec={"selector": selector}))
    for j, (namespace, selector) in enumerate(selectors):
        service = obj("Service", j, namespace, j + 1, spec={"selector": selector})
        scanned = sorted(
            (p["metadata"]["namespace"], p["metadata"]["name"])
            for p in live.values()
            if selects(service, p)
        )
        found = pods.matching(namespace, selector)
        assert sorted((p["metadata"]["namespace"], p["metadata"]["name"]) for p in found) == scanned
        for pod in live.values():
            if selects(service, pod):
                assert f"{namespace}/Service{j}" in services.candidates(pod)
    assert len(pods) == len(live)
