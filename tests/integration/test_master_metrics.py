"""A real ``podnet master`` process's /metrics (read with the admin's credentials, as a
scraper in ``system:monitoring`` reads it): process_*, podnet_build_info, the leader
gauge, and its etcd calls timed by operation; no key in any label."""

from __future__ import annotations

from podnet.testing.api import client_for
from podnet.testing.e2e import wait_for
from podnet.testing.metricstext import sample
from podnet.testing.processes import MasterProcess


def scrape(master: MasterProcess) -> str:
    with client_for(master.kubeconfig) as api:
        answer = api.get("/metrics")
        assert answer.status_code == 200
        return answer.text


def test_master_metrics_after_real_etcd_calls(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        for i in range(3):
            body = {"metadata": {"name": f"metrics-ns-{i}"}}
            created = api.post("/api/v1/namespaces", json=body)
            assert created.status_code == 201, created.text
    wait_for(lambda: sample(scrape(master), "podnet_master_leader") == 1.0, 30, "leadership")
    text = scrape(master)
    assert (sample(text, "process_resident_memory_bytes") or 0) > 0
    assert (sample(text, "process_open_fds") or 0) > 0
    assert (sample(text, "process_cpu_seconds_total") or 0) > 0
    assert sample(text, "podnet_build_info") == 1.0
    count = "podnet_etcd_request_duration_seconds_count"
    assert (sample(text, count, operation="Range") or 0) > 0
    assert (sample(text, count, operation="Txn") or 0) >= 3  # the namespaces at least
    assert (sample(text, count, operation="watch") or 0) > 0  # the watch cache's
    assert "metrics-ns-" not in text  # no key or object name in a label
