"""Graceful Pod deletion (issue 19, finding 1's lifecycle half): the plan, and the
registry applying it over a memory store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from podnet.api.noderestriction import node_restriction
from podnet.api.params import DeleteOptions
from podnet.api.poddeletion import deletion_deadline, plan_pod_deletion
from podnet.api.registry import Registry
from podnet.model.errors import ApiError
from podnet.model.kinds import NAMESPACE, NODE, POD

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def pod(name: str = "p", node: str | None = "n1", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": [{"name": "c"}], **spec}
    if node:
        body["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "default"}, "spec": body}


def test_a_bound_pod_is_marked_with_the_spec_grace_or_30() -> None:
    marked = plan_pod_deletion(pod(), None, True, NOW).marked
    assert marked is not None and deletion_deadline(marked) == NOW + timedelta(seconds=30)
    assert marked["metadata"]["deletionGracePeriodSeconds"] == 30
    spec = pod(terminationGracePeriodSeconds=5)
    marked = plan_pod_deletion(spec, None, True, NOW).marked
    assert marked is not None and marked["metadata"]["deletionGracePeriodSeconds"] == 5
    marked = plan_pod_deletion(spec, 7, True, NOW).marked  # the DeleteOptions' grace wins
    assert marked is not None and deletion_deadline(marked) == NOW + timedelta(seconds=7)


@pytest.mark.parametrize(
    ("obj", "grace", "node_exists"),
    [
        (pod(), 0, True),
        (pod(node=None), None, True),
        (pod(), None, False),
        ({**pod(), "status": {"phase": "Succeeded"}}, None, True),
        (
            {
                **pod(),
                "metadata": {"name": "m", "annotations": {"kubernetes.io/config.mirror": "x"}},
            },
            None,
            True,
        ),
    ],
)
def test_removed_at_once(obj: dict[str, Any], grace: int | None, node_exists: bool) -> None:
    assert plan_pod_deletion(obj, grace, node_exists, NOW).remove


def test_a_second_delete_shortens_never_lengthens_and_ends_a_run_out_grace() -> None:
    first = plan_pod_deletion(pod(), 60, True, NOW).marked
    assert first is not None
    longer = plan_pod_deletion(first, 120, True, NOW + timedelta(seconds=1))
    assert not longer.remove and longer.marked is None
    shorter = plan_pod_deletion(first, 10, True, NOW).marked
    assert shorter is not None and deletion_deadline(shorter) == NOW + timedelta(seconds=10)
    assert plan_pod_deletion(first, None, True, NOW + timedelta(seconds=61)).remove
    assert plan_pod_deletion(first, 0, True, NOW).remove
    huge = plan_pod_deletion(pod(), 2**63 - 1, True, NOW).marked  # no overflow
    assert huge is not None and deletion_deadline(huge) is not None


async def test_registry_keeps_a_terminating_pod_until_grace_zero(registry: Registry) -> None:
    await registry.create(NAMESPACE, {"metadata": {"name": "default"}})
    await registry.create(NODE, {"metadata": {"name": "n1"}})
    await registry.create(POD, pod("web"), "default")
    kept = await registry.delete(POD, "default", "web")
    assert kept["metadata"]["deletionGracePeriodSeconds"] == 30
    stored = await registry.get(POD, "default", "web")
    assert stored["metadata"]["deletionTimestamp"] == kept["metadata"]["deletionTimestamp"]
    wrong = DeleteOptions(uid="not-its-uid", grace_period_seconds=0)
    with pytest.raises(ApiError) as err:
        await registry.delete(POD, "default", "web", options=wrong)
    assert err.value.code == 409 and "UID in precondition" in err.value.message
    uid = stored["metadata"]["uid"]
    await registry.delete(
        POD, "default", "web", options=DeleteOptions(uid=uid, grace_period_seconds=0)
    )
    with pytest.raises(ApiError) as err:
        await registry.get(POD, "default", "web")
    assert err.value.code == 404


def test_a_node_deletes_only_mirror_and_terminating_pods() -> None:
    def verdict(obj: dict[str, Any]) -> str | None:
        return node_restriction("n1", "delete", POD, None, "default", None, obj)

    assert verdict(pod()) is not None and "being deleted" in str(verdict(pod()))
    terminating = plan_pod_deletion(pod(), None, True, NOW).marked
    assert verdict(terminating) is None
    mirror = pod()
    mirror["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "cid"}
    assert verdict(mirror) is None
    assert verdict(plan_pod_deletion(pod(node="n2"), None, True, NOW).marked) is not None


async def test_a_patched_uid_is_a_precondition(registry: Registry) -> None:
    await registry.create(NAMESPACE, {"metadata": {"name": "default"}})
    made = await registry.create(POD, pod("web"), "default")
    stale = {"metadata": {"uid": "another"}, "status": {"podIP": "10.128.0.5"}}
    with pytest.raises(ApiError) as err:
        await registry.patch(POD, "default", "web", stale, "status")
    assert err.value.code == 409 and "UID in precondition" in err.value.message
    assert "status" not in await registry.get(POD, "default", "web")
    good = {"metadata": {"uid": made["metadata"]["uid"]}, "status": {"phase": "Running"}}
    assert (await registry.patch(POD, "default", "web", good, "status"))["status"] == {
        "phase": "Running"
    }
