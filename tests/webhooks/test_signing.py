"""The Standard Webhooks scheme of ``protocol._webhooks``, held against the ``standardwebhooks`` package (an
independent implementation), and the kinds and retry schedule's rules."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks import Webhook

from codesdk.protocol import (
    WEBHOOK_ALL_KINDS,
    WebhookKind,
    WebhookSignatureError,
    make_secret,
    parse_kinds,
    retry_delay,
    signed_headers,
    verify_webhook,
    webhook_wants,
)

keys = st.binary(min_size=24, max_size=64)
ids = st.from_regex(r"msg_[0-9a-z]{1,40}", fullmatch=True)
bodies = st.dictionaries(st.text(max_size=20), st.text(max_size=50) | st.integers()).map(
    lambda d: json.dumps(d).encode())  # a JSON object, as sent (the reference decodes it)


@given(keys, ids, bodies)
def test_a_signature_verifies_with_the_reference_implementation(key: bytes, webhook_id: str, body: bytes) -> None:
    secret = make_secret(key)
    now = int(time.time())
    headers = signed_headers([secret], webhook_id, now, body)
    Webhook(secret).verify(body, headers)  # raises if not
    verify_webhook(secret, headers, body, now)
    reference = Webhook(secret).sign(webhook_id, datetime.fromtimestamp(now, UTC), body.decode())
    assert headers["webhook-signature"] == reference


@given(keys, keys, ids, bodies)
def test_during_an_overlap_either_secret_verifies(new: bytes, old: bytes, webhook_id: str, body: bytes) -> None:
    now = int(time.time())
    headers = signed_headers([make_secret(new), make_secret(old)], webhook_id, now, body)
    for key in (new, old):
        Webhook(make_secret(key)).verify(body, headers)
        verify_webhook(make_secret(key), headers, body, now)


@given(keys, keys, ids, bodies)
def test_another_secret_or_body_does_not_verify(key: bytes, other: bytes, webhook_id: str, body: bytes) -> None:
    now = int(time.time())
    headers = signed_headers([make_secret(key)], webhook_id, now, body)
    if other != key:
        with pytest.raises(WebhookSignatureError):
            verify_webhook(make_secret(other), headers, body, now)
    with pytest.raises(WebhookSignatureError):
        verify_webhook(make_secret(key), headers, body + b"x", now)
    with pytest.raises(WebhookSignatureError):
        verify_webhook(make_secret(key), {**headers, "webhook-id": webhook_id + "0"}, body, now)


def test_a_stale_timestamp_is_refused() -> None:
    secret = make_secret(b"k" * 32)
    headers = signed_headers([secret], "msg_1", 1_000_000, b"{}")
    with pytest.raises(WebhookSignatureError, match="too far"):
        verify_webhook(secret, headers, b"{}", 1_000_000 + 301)
    verify_webhook(secret, headers, b"{}", 1_000_000 + 300)


def test_the_spec_example_vector() -> None:
    """The example of the Standard Webhooks specification (its reference libraries test the same)."""
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    headers = signed_headers([secret], "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
    assert headers["webhook-signature"] == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


@given(st.lists(st.sampled_from([*WebhookKind, WEBHOOK_ALL_KINDS]), min_size=1))
def test_kinds_parse_to_a_sorted_set(kinds: list[str]) -> None:
    parsed = parse_kinds(kinds)
    assert list(parsed) == sorted(set(kinds))
    for kind in WebhookKind:
        assert webhook_wants(parsed, kind) == (kind in parsed or WEBHOOK_ALL_KINDS in parsed
                                               or kind == WebhookKind.WEBHOOK_TEST)


@given(st.text(max_size=20).filter(lambda k: k not in {*WebhookKind, WEBHOOK_ALL_KINDS}))
def test_an_unknown_kind_is_named(kind: str) -> None:
    with pytest.raises(ValueError, match="unknown kind"):
        parse_kinds([kind])


def test_no_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        parse_kinds([])


@given(st.integers(1, 200), st.floats(0, 1, exclude_max=True), st.floats(0.01, 100), st.floats(1, 10_000))
def test_the_retry_delay_grows_and_is_capped(failed: int, draw: float, base: float, cap: float) -> None:
    delay = retry_delay(failed, draw, base, cap)
    step = min(cap, base * 2.0 ** (failed - 1))
    assert step / 2 <= delay <= step
    assert retry_delay(failed + 1, draw, base, cap) >= delay or step == cap


def test_the_retry_delay_refuses_what_is_not_a_retry() -> None:
    with pytest.raises(ValueError):
        retry_delay(0, 0.5)
    with pytest.raises(ValueError):
        retry_delay(1, 1.0)
