"""Make the stored ClusterNetwork ``default`` agree with the master's configuration.

On first start the master creates it. Later starts compare: an equal object is kept; a
permitted change (the network grows to a superset; plugin or MTU change) is written
through the API, whose validation enforces the same rules; a refused change raises
``ClusterNetworkError`` and the master exits with its message. A network that was grown
through the API beyond the configured one is kept (a restart with the old flags must not
try to shrink it).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from podnet.client.errors import ClientError, has_reason
from podnet.controllers.calls import ControllerApi, call, get_or_none
from podnet.controllers.config import (
    CLUSTER_NETWORK_NAME,
    NetworkConfig,
    change_errors,
    covers,
)
from podnet.model.kinds import CLUSTER_NETWORK

Obj = dict[str, Any]
log = logging.getLogger("podnet.controllers.clusternetwork")
MAX_ATTEMPTS = 8


class ClusterNetworkError(Exception):
    """The configured network cannot be applied to the stored one; the master must stop."""


async def ensure_cluster_network(api: ControllerApi, config: NetworkConfig) -> Obj:
    """Create or update ClusterNetwork ``default`` from ``config``; return the effective one."""
    for _ in range(MAX_ATTEMPTS):
        current = await get_or_none(api, CLUSTER_NETWORK, None, CLUSTER_NETWORK_NAME)
        if current is None:
            result = await _create(api, config)
        else:
            result = await _reconcile(api, current, config)
        if result is not None:
            return result
    raise ClusterNetworkError(f"ClusterNetwork {CLUSTER_NETWORK_NAME} keeps changing; giving up")


async def _create(api: ControllerApi, config: NetworkConfig) -> Obj | None:
    try:
        created = await call(
            lambda: api.create(CLUSTER_NETWORK, config.to_object()),
            "create ClusterNetwork default",
        )
    except ClientError as exc:
        if has_reason(exc, "AlreadyExists"):
            return None  # another master was first: compare with its object
        if exc.code in (400, 422):
            raise ClusterNetworkError(f"invalid network configuration: {exc}") from exc
        raise
    log.info("created ClusterNetwork default: %s", config.describe())
    return created


async def _reconcile(api: ControllerApi, current: Obj, config: NetworkConfig) -> Obj | None:
    try:
        stored = NetworkConfig.from_object(current)
    except (KeyError, TypeError, ValueError) as exc:
        why = f"the stored ClusterNetwork default is unreadable: {exc}"
        raise ClusterNetworkError(why) from exc
    desired = _keep_api_growth(stored, config)
    if desired == stored:
        log.info("ClusterNetwork default is up to date: %s", stored.describe())
        return current
    problems = change_errors(stored, desired)
    if problems:
        raise ClusterNetworkError(_refusal(stored, desired, "; ".join(problems)))
    return await _update(api, current, stored, desired)


def _keep_api_growth(stored: NetworkConfig, config: NetworkConfig) -> NetworkConfig:
    """``config``, but with the stored networks when they were grown beyond it."""
    grown = covers(stored.cluster_networks, config.cluster_networks) and not covers(
        config.cluster_networks, stored.cluster_networks
    )
    if not grown:
        return config
    log.warning(
        "ClusterNetwork default has grown beyond the configured %s; keeping %s",
        ",".join(str(e) for e in config.cluster_networks),
        ",".join(str(e) for e in stored.cluster_networks),
    )
    return dataclasses.replace(config, cluster_networks=list(stored.cluster_networks))


async def _update(
    api: ControllerApi, current: Obj, stored: NetworkConfig, desired: NetworkConfig
) -> Obj | None:
    body = {**current, **{k: v for k, v in desired.to_object().items() if k != "metadata"}}
    first = desired.cluster_networks[0]
    if "network" in body:  # legacy single-network fields must repeat the first entry
        body["network"] = str(first.cidr)
    if "hostsubnetlength" in body:
        body["hostsubnetlength"] = first.host_subnet_length
    try:
        updated = await call(
            lambda: api.update(CLUSTER_NETWORK, body), "update ClusterNetwork default"
        )
    except ClientError as exc:
        if has_reason(exc, "Conflict"):
            return None  # changed meanwhile: compare again
        if exc.code in (400, 422):
            raise ClusterNetworkError(_refusal(stored, desired, str(exc))) from exc
        raise
    log.info("updated ClusterNetwork default: %s -> %s", stored.describe(), desired.describe())
    return updated


def _refusal(stored: NetworkConfig, desired: NetworkConfig, why: str) -> str:
    return (
        f"cannot change ClusterNetwork default from [{stored.describe()}] "
        f"to [{desired.describe()}]: {why}"
    )
