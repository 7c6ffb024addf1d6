"""Pod uids: chosen round-robin from the reserved range, never one a process has or a live
claim holds; claims of processes that are gone are stale."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from podnet.cluster import poduids
from podnet.cluster.poduids import POD_UIDS, PodUidError, choose, claim, claimed, live_claims


def test_choose_goes_round_robin_and_skips_busy_ids() -> None:
    uids = range(10, 15)
    assert choose(set(), None, uids) == 10
    assert choose(set(), 11, uids) == 12
    assert choose({12, 13}, 11, uids) == 14
    assert choose({10, 12, 13}, 14, uids) == 11, "wraps around"
    with pytest.raises(PodUidError, match="in use"):
        choose(set(uids), 12, uids)


def test_the_range_is_reserved_and_fits_ping_group_range() -> None:
    assert POD_UIDS[0] > 65535 and POD_UIDS[-1] < 2**31 - 1
    names = Path("/etc/passwd").read_text().splitlines()
    assert not [n for n in names if int(n.split(":")[2]) in POD_UIDS]


def test_ids_in_use_sees_every_process_id() -> None:
    found = poduids.ids_in_use()
    assert os.getuid() in found and os.getgid() in found


def test_a_claim_holds_a_uid_until_released(tmp_path: Path) -> None:
    with claimed(tmp_path) as first:
        assert first in POD_UIDS
        assert live_claims(tmp_path) == {first}
        second = claim(tmp_path)
        assert second != first
        poduids.release_claim(second, tmp_path)
    assert live_claims(tmp_path) == set()
    assert not (tmp_path / str(first)).exists()


def test_a_claim_of_a_process_that_is_gone_is_stale(tmp_path: Path) -> None:
    done = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True)
    gone = int(done.stdout)
    (tmp_path / str(POD_UIDS[0])).write_text(f"{gone} 12345\n")
    (tmp_path / str(POD_UIDS[1])).write_text("garbage")
    assert live_claims(tmp_path) == set()


def test_a_uid_a_process_has_is_never_chosen(tmp_path: Path) -> None:
    uid = POD_UIDS[3]
    (tmp_path / ".last").write_text(str(POD_UIDS[2]))
    as_uid = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    sleeper = subprocess.Popen([*as_uid, "sleep", "30"])
    try:
        for _ in range(100):  # until setpriv has switched (bounded)
            if uid in poduids.ids_in_use():
                break
            time.sleep(0.05)
        assert claim(tmp_path) == POD_UIDS[4], "the live process's uid is skipped"
    finally:
        sleeper.kill()
        sleeper.wait()
