"""Generations on disk: written whole, unchanged files linked, the switch, pruning,
scratch generations kept while checked, rejected ones kept aside."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import MappingProxyType

from podnet.router.haproxy import HAProxySettings
from podnet.router.haproxy.generations import GenerationStore
from podnet.router.haproxy.render import Generation


def generation(**files: str) -> Generation:
    named = {name.replace("__", "/"): text for name, text in files.items()}
    return Generation(MappingProxyType(named))


def store(tmp_path: Path) -> GenerationStore:
    return GenerationStore(HAProxySettings(run_dir=tmp_path / "run", default_certificate=tmp_path))


def test_write_activate_link_and_prune(tmp_path: Path):
    gens = store(tmp_path)
    first = generation(**{"haproxy.cfg": "one", "certs__ns:a.pem": "KEY", "m.map": "x 1\n"})
    one = gens.write(first)
    assert gens.live_dir() is None  # written, not live
    gens.activate(one, first)
    assert gens.live_dir() == one and (tmp_path / "run" / "current").is_symlink()
    assert stat.S_IMODE((one / "certs" / "ns:a.pem").stat().st_mode) == 0o600
    assert stat.S_IMODE((one / "m.map").stat().st_mode) == 0o644

    second = generation(**{"haproxy.cfg": "two", "certs__ns:a.pem": "KEY", "m.map": "y 1\n"})
    two = gens.write(second)
    assert os.path.samefile(one / "certs" / "ns:a.pem", two / "certs" / "ns:a.pem")
    assert not os.path.samefile(one / "m.map", two / "m.map")
    assert (two / "haproxy.cfg").read_text() == "two"
    gens.activate(two, second)
    assert not one.exists() and gens.live_dir() == two


def test_scratch_generations_survive_pruning_until_discarded(tmp_path: Path):
    gens = store(tmp_path)
    live = generation(**{"haproxy.cfg": "live"})
    scratch = gens.write(generation(**{"haproxy.cfg": "probe"}), scratch=True)
    gens.activate(gens.write(live), live)
    assert scratch.exists()  # a check running beside the applier keeps its files
    gens.discard(scratch)
    assert not scratch.exists()
    gens.activate(gens.write(live), live)
    assert sorted(p.name for p in (tmp_path / "run").glob("gen-*")) == [gens.live_dir().name]  # type: ignore[union-attr]


def test_rejected_generation_is_kept_aside_with_the_reason(tmp_path: Path):
    gens = store(tmp_path)
    bad = gens.write(generation(**{"haproxy.cfg": "bad"}))
    gens.reject(bad, "[ALERT] no such file")
    rejected = tmp_path / "run" / "rejected"
    assert (rejected / "haproxy.cfg").read_text() == "bad"
    assert (rejected / "check.txt").read_text() == "[ALERT] no such file\n"
    assert not bad.exists() and gens.live_dir() is None


def test_numbers_continue_after_a_restart(tmp_path: Path):
    gens = store(tmp_path)
    first = generation(**{"haproxy.cfg": "a"})
    gens.activate(gens.write(first), first)
    again = store(tmp_path)
    assert again.write(first).name == "gen-2"


def test_replace_config_rewrites_only_the_live_config(tmp_path: Path):
    gens = store(tmp_path)
    first = generation(**{"haproxy.cfg": "old", "m.map": "x 1\n"})
    live = gens.write(first)
    gens.activate(live, first)
    gens.replace_config("new")
    assert (live / "haproxy.cfg").read_text() == "new"
    # the next generation links the rewritten config when it is unchanged
    nxt = gens.write(generation(**{"haproxy.cfg": "new", "m.map": "x 1\n"}))
    assert os.path.samefile(live / "haproxy.cfg", nxt / "haproxy.cfg")
