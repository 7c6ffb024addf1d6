"""The controller manager's supervision: a failed controller restarts alone, with backoff,
while the others keep their tasks; only a permanent failure, or too many failures in a
row, ends the leadership term. Over the in-memory store with the real controllers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest

from podnet.api.registry import Registry
from podnet.client.backoff import Backoff
from podnet.controllers import manager as manager_module
from podnet.controllers.base import Controller
from podnet.controllers.calls import ControllerApi
from podnet.controllers.clusternetwork import ClusterNetworkError
from podnet.controllers.config import MULTITENANT, NetworkConfig
from podnet.controllers.inprocess import InProcessApi
from podnet.controllers.manager import ControllerManager
from podnet.controllers.nodelifecycle import NodeLifecycleController
from podnet.controllers.supervisor import Supervisor
from podnet.model.kinds import HOST_SUBNET, NODE
from podnet.testing.e2e import eventually

FAST = Backoff(0.001, 0.01)


@dataclass
class Plan:
    """What the flaky node-lifecycle controllers do: once ``trigger`` is set, each new
    instance's extra task raises the next of ``failures`` (none left: it runs on)."""

    failures: list[BaseException]
    trigger: asyncio.Event = field(default_factory=asyncio.Event)
    built: list[NodeLifecycleController] = field(default_factory=list)


class FlakyLifecycle(NodeLifecycleController):
    def __init__(self, api: ControllerApi, plan: Plan) -> None:
        super().__init__(api)
        self.plan = plan
        plan.built.append(self)

    def background(self) -> list[tuple[Coroutine[Any, Any, Any], str]]:
        return [*super().background(), (self._fail_when_told(), "flaky")]

    async def _fail_when_told(self) -> None:
        await self.plan.trigger.wait()
        if self.plan.failures:
            raise self.plan.failures.pop(0)
        await asyncio.Event().wait()


class Leader:
    """An elector that always wins and counts its terms."""

    def __init__(self) -> None:
        self.identity = "test"
        self.lost = asyncio.Event()
        self.terms = 0

    async def acquire(self) -> None:
        self.terms += 1

    async def release(self) -> None:
        return None


@dataclass
class Run:
    manager: ControllerManager
    plan: Plan
    leader: Leader
    failed: list[str]
    task: asyncio.Task[None]


async def start(
    api: InProcessApi,
    monkeypatch: pytest.MonkeyPatch,
    failures: list[BaseException],
    max_restarts: int = 5,
    healthy_after: float = 60.0,
) -> Run:
    plan = Plan(failures)
    monkeypatch.setattr(
        manager_module, "NodeLifecycleController", lambda a: FlakyLifecycle(a, plan)
    )
    failed: list[str] = []
    supervisor = Supervisor(
        backoff=FAST,
        max_restarts=max_restarts,
        healthy_after=healthy_after,
        on_failure=failed.append,
    )
    leader = Leader()
    manager = ControllerManager(
        api,
        NetworkConfig.default(MULTITENANT),  # every controller, NetNamespaces too
        leader,
        resync_period=None,
        retry_backoff=FAST,
        supervisor=supervisor,
    )
    task = asyncio.create_task(manager.run())
    await eventually(lambda: _ready(manager))
    return Run(manager, plan, leader, failed, task)


@pytest.fixture
async def runs() -> AsyncIterator[list[Run]]:
    started: list[Run] = []
    yield started
    for run in started:
        await run.manager.stop()
        await asyncio.gather(run.task, return_exceptions=True)


async def _ready(manager: ControllerManager) -> bool:
    return manager.ready


def others(manager: ControllerManager) -> dict[Controller, list[asyncio.Task[Any]]]:
    return {c: c.tasks for c in manager.supervisor.controllers if not isinstance(c, FlakyLifecycle)}


async def test_a_failed_controller_restarts_alone_and_the_others_keep_running(
    api: InProcessApi,
    registry: Registry,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    runs: list[Run],
) -> None:
    caplog.set_level(logging.INFO, "podnet.controllers.manager")
    run = await start(api, monkeypatch, [TimeoutError(f"etcd timed out {i}") for i in range(3)])
    runs.append(run)
    before = others(run.manager)
    assert len(before) == 4 and all(tasks for tasks in before.values())
    run.plan.trigger.set()
    await eventually(lambda: _built(run.plan, 4))
    await eventually(lambda: _ready(run.manager))
    assert run.plan.failures == []
    assert run.failed == ["node-lifecycle"] * 3
    assert run.leader.terms == 1
    assert others(run.manager) == before  # the same controllers with the same tasks
    assert not any(task.done() for tasks in before.values() for task in tasks)
    assert not any(old.ready for old in run.plan.built[:3])
    assert run.manager.supervisor.controllers[-2] is run.plan.built[3]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 3
    assert all("node-lifecycle failed: etcd timed out" in r.getMessage() for r in errors)
    assert "restarting it alone" in errors[0].getMessage()
    await registry.create(NODE, _node("after-restarts", "192.0.2.7"))
    await eventually(lambda: _hostsubnet(registry, "after-restarts"))


async def test_a_controller_failing_beyond_the_bound_ends_the_term(
    api: InProcessApi,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    runs: list[Run],
) -> None:
    caplog.set_level(logging.ERROR, "podnet.controllers.manager")
    failures: list[BaseException] = [TimeoutError(f"timeout {i}") for i in range(3)]
    run = await start(api, monkeypatch, failures, max_restarts=2)
    runs.append(run)
    first_term = others(run.manager)
    run.plan.trigger.set()
    await eventually(lambda: _terms(run.leader, 2))
    await eventually(lambda: _ready(run.manager))
    assert run.failed == ["node-lifecycle"] * 3
    assert "node-lifecycle failed 3 times in a row, last: timeout 2" in caplog.text
    assert "ending the leadership term" in caplog.text
    assert not set(others(run.manager)) & set(first_term)  # every controller is new
    assert all(task.done() for tasks in first_term.values() for task in tasks)


async def test_failures_apart_by_a_healthy_run_never_end_the_term(
    api: InProcessApi, monkeypatch: pytest.MonkeyPatch, runs: list[Run]
) -> None:
    failures: list[BaseException] = [RuntimeError(f"bug {i}") for i in range(4)]
    run = await start(api, monkeypatch, failures, max_restarts=1, healthy_after=0.0)
    runs.append(run)
    run.plan.trigger.set()
    await eventually(lambda: _built(run.plan, 5))
    await eventually(lambda: _ready(run.manager))
    assert run.leader.terms == 1 and run.failed == ["node-lifecycle"] * 4


async def test_a_permanent_failure_ends_the_run(
    api: InProcessApi, monkeypatch: pytest.MonkeyPatch, runs: list[Run]
) -> None:
    refusal = ClusterNetworkError("ClusterNetwork default keeps changing; giving up")
    run = await start(api, monkeypatch, [refusal])
    runs.append(run)
    run.plan.trigger.set()
    with pytest.raises(ClusterNetworkError, match="keeps changing"):
        await asyncio.wait_for(run.task, 10)
    assert run.failed == ["node-lifecycle"] and run.leader.terms == 1
    assert len(run.plan.built) == 1
    assert not run.manager.ready


async def _built(plan: Plan, count: int) -> bool:
    return len(plan.built) >= count


async def _terms(leader: Leader, count: int) -> bool:
    return leader.terms >= count


async def _hostsubnet(registry: Registry, name: str) -> bool:
    items, _ = await registry.list(HOST_SUBNET)
    return any(h["metadata"]["name"] == name for h in items)


def _node(name: str, ip: str) -> dict[str, Any]:
    status = {"addresses": [{"type": "InternalIP", "address": ip}]}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "status": status}
