"""When a node rotates its client certificate (``podnet.agent.certdeadline``: kubelet's
70-90 % rule, jittered) and how long the signer makes it live (``podnet.api.pki``, the
``--cluster-signing-duration`` flag): even a one-minute certificate is due for rotation
after it was issued, not before, and its moment of issue (what revocations compare) is
read back exactly."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from podnet.agent.certdeadline import (
    JITTER_HIGH,
    JITTER_LOW,
    RETRY_CAP,
    jittered_fraction,
    retry_delay,
    rotation_deadline,
    seconds_until,
)
from podnet.api.pki import (
    CLIENT_VALIDITY,
    CLOCK_SKEW,
    MIN_CLIENT_VALIDITY,
    client_backdate,
    client_validity,
    ensure_pki,
    issued_at,
    load_ca,
    sign_client_certificate,
)
from podnet.cli.master_cmd import master
from podnet.cli.signing_options import SigningDuration

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
YEAR = dt.timedelta(days=365)


def test_the_rotation_point_lies_70_to_90_percent_into_the_life() -> None:
    end = T0 + dt.timedelta(seconds=1000)
    assert rotation_deadline(T0, end, 0.0) == T0 + dt.timedelta(seconds=700)
    assert rotation_deadline(T0, end, 0.5) == T0 + dt.timedelta(seconds=800)
    assert rotation_deadline(T0, end, 1.0) == T0 + dt.timedelta(seconds=900)
    draws = random.Random(7)
    points = {rotation_deadline(T0, end, draws.random()) for _ in range(500)}
    assert all(
        T0 + dt.timedelta(seconds=700) <= p <= end - dt.timedelta(seconds=100) for p in points
    )
    # jittered: the nodes of a cluster do not all ask at once
    assert len(points) > 400
    spread = max(points) - min(points)
    assert spread > dt.timedelta(seconds=180)
    assert jittered_fraction(-3.0) == JITTER_LOW and jittered_fraction(7.0) == JITTER_HIGH


def test_a_year_long_certificate_is_rotated_between_month_8_and_11() -> None:
    early = rotation_deadline(T0, T0 + YEAR, 0.0)
    late = rotation_deadline(T0, T0 + YEAR, 0.999)
    assert dt.timedelta(days=255) < early - T0 < dt.timedelta(days=256)
    assert dt.timedelta(days=328) < late - T0 < dt.timedelta(days=329)
    assert seconds_until(early, T0) == (early - T0).total_seconds()
    assert seconds_until(T0, early) == 0.0  # past: rotate now


def test_retries_back_off_within_what_is_left_of_the_certificate() -> None:
    delays = [retry_delay(n, 10_000.0, 0.999) for n in range(12)]
    assert delays[0] < delays[1] < delays[2] < delays[5]
    assert max(delays) <= RETRY_CAP
    # 20 s left: a retry waits at most 5 s, so several fit before the end
    assert all(retry_delay(n, 20.0, 0.999) <= 5.0 for n in range(12))
    assert retry_delay(0, 20.0, 0.0) >= 0.5
    # expired: still retried (the clock may have been wrong), at most RETRY_CAP apart
    assert retry_delay(20, -5.0, 0.999) == pytest.approx(RETRY_CAP, rel=0.01)


@pytest.fixture(scope="module")
def ca(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    return load_ca(ensure_pki(tmp_path_factory.mktemp("pki"), ["127.0.0.1"]))


def _signed(
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], validity: dt.timedelta
) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    return sign_client_certificate(
        *ca, "system:node:a", ["system:nodes"], key.public_key(), validity
    )


@pytest.mark.parametrize(
    "validity",
    [dt.timedelta(minutes=1), dt.timedelta(seconds=61), dt.timedelta(minutes=10), YEAR],
)
def test_even_a_short_certificate_is_due_after_it_was_issued(
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], validity: dt.timedelta
) -> None:
    cert = _signed(ca, validity)
    issued = issued_at(cert)
    assert cert.not_valid_after_utc - issued == validity
    assert issued - cert.not_valid_before_utc == client_backdate(validity)
    earliest = rotation_deadline(cert.not_valid_before_utc, cert.not_valid_after_utc, 0.0)
    latest = rotation_deadline(cert.not_valid_before_utc, cert.not_valid_after_utc, 1.0)
    # at least half the life is used, and a tenth of it is left to get the next one
    assert earliest - issued >= validity * 0.55
    assert cert.not_valid_after_utc - latest >= validity * 0.1


def test_the_backdate_is_five_minutes_but_a_fifth_of_a_short_life_at_most() -> None:
    assert client_backdate(YEAR) == CLOCK_SKEW
    assert client_backdate(dt.timedelta(minutes=25)) == CLOCK_SKEW
    assert client_backdate(dt.timedelta(minutes=10)) == dt.timedelta(minutes=2)
    assert client_backdate(dt.timedelta(minutes=1)) == dt.timedelta(seconds=12)


def test_a_certificate_of_the_old_fixed_backdate_reads_as_issued_no_later() -> None:
    """Before: notBefore = issue - 5 min whatever the life; a ten-minute one of those
    comes out issued earlier than it was (revocations then err towards refusing it)."""
    key = ec.generate_private_key(ec.SECP256R1())
    for life in (dt.timedelta(minutes=10), YEAR):
        assert issued_at(_self_signed(key, T0 - CLOCK_SKEW, T0 + life)) <= T0
    assert issued_at(_self_signed(key, T0 - CLOCK_SKEW, T0 + YEAR)) == T0


def _self_signed(
    key: ec.EllipticCurvePrivateKey, not_before: dt.datetime, not_after: dt.datetime
) -> x509.Certificate:
    name = x509.Name([])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .sign(key, hashes.SHA256())
    )


def test_the_signing_duration_caps_what_a_request_may_ask() -> None:
    assert client_validity(None) == CLIENT_VALIDITY
    minute = dt.timedelta(minutes=1)
    assert client_validity(None, minute) == minute
    assert client_validity(3600, minute) == minute  # a request never gets more
    assert client_validity(3600, YEAR) == dt.timedelta(hours=1)
    assert client_validity(60, YEAR) == MIN_CLIENT_VALIDITY


def test_the_cluster_signing_duration_flag_parses_and_refuses(tmp_path: Path) -> None:
    flag = SigningDuration()
    assert flag.convert("8760h", None, None) == YEAR
    assert flag.convert("1m", None, None) == dt.timedelta(minutes=1)
    assert flag.convert("1h30m", None, None) == dt.timedelta(minutes=90)
    for bad, why in (("30s", "shorter than 1m"), ("366d", "at most"), ("soon", "bad duration")):
        answer = CliRunner().invoke(
            master, ["--state-dir", str(tmp_path), "--cluster-signing-duration", bad]
        )
        assert answer.exit_code == 2, answer.output
        assert "--cluster-signing-duration" in answer.output and why in answer.output
    shown = CliRunner().invoke(master, ["--help"])
    assert "--cluster-signing-duration" in shown.output and "8760h" in shown.output
