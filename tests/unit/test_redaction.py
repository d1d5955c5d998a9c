"""Redaction (worker.redaction): every recognised form of a value, a cut that never leaves part of one,
and no answer at a cut that depends on whether the text there starts a secret."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from urllib.parse import quote, quote_plus

import pytest

from toolcage.policies import validate_policy
from toolcage.policies.decide import Target
from toolcage.worker.redaction import Redactor
from toolcage.worker.secrets import SecretStore

VALUE = "tc/secret+0123456789&abcdef=?"  # characters that every encoding writes differently
MARK = "[secret T]"
R = Redactor({"T": VALUE})


FORMS = {
    "raw": VALUE,
    "json": json.dumps(VALUE)[1:-1].replace("/", "\\/"),
    "html": "tc/secret+0123456789&amp;abcdef=?",
    "quote": quote(VALUE, safe=""),
    "quote_slash": quote(VALUE),
    "quote_plus": quote_plus(VALUE),
    "hex": VALUE.encode().hex(),
    "HEX": VALUE.encode().hex().upper(),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_text_form_is_redacted(form: str) -> None:
    """The value written in each recognised text form, inside other text, becomes the mark."""
    assert R.text(f"a {FORMS[form]} b") == f"a {MARK} b"
    assert R.data(f"a {FORMS[form]} b".encode()) == f"a {MARK} b".encode()


@pytest.mark.parametrize("codec", ["utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"])
def test_wide_encodings_are_redacted_in_their_own_encoding(codec: str) -> None:
    """In bytes, the value in UTF-16/32 becomes the mark in the same encoding: the rest still decodes."""
    out = R.data(f"a {VALUE} b".encode(codec))
    assert out.decode(codec) == f"a {MARK} b"


@pytest.mark.parametrize("encode", [base64.b64encode, base64.urlsafe_b64encode], ids=["std", "urlsafe"])
@pytest.mark.parametrize("prefix", ["", "a", "ab", "abc", "Bearer ", "user:"])
@pytest.mark.parametrize("suffix", ["", "x", "xy", "}"])
def test_base64_at_any_alignment_keeps_no_bit_of_the_value(
    encode: Callable[[bytes], bytes], prefix: str, suffix: str
) -> None:
    """base64 of the value inside a longer text, at each alignment: what is left before and after the mark
    encodes only bits of the text around it, never one of the value's."""
    enc = encode((prefix + VALUE + suffix).encode()).decode().rstrip("=")
    out = R.text(enc)
    assert out.count(MARK) == 1, out
    before, after = out.split(MARK)
    after = after.rstrip("=")
    assert len(before) * 6 <= 8 * len(prefix), (before, prefix)  # only the prefix's bits
    assert (len(enc) - len(after)) * 6 >= 8 * (len(prefix) + len(VALUE)), (after, suffix)  # only the suffix's


def test_a_basic_credential_is_redacted_decoded_too() -> None:
    """A value that is base64 of user:password is recognised as the text it decodes to."""
    cred = base64.b64encode(b"alice:s3cret-pass").decode()
    assert Redactor({"B": cred}).text("user alice:s3cret-pass in a log") == "user [secret B] in a log"


def echo(pad: int) -> bytes:
    return ("x" * pad + "|Bearer " + VALUE + "|end").encode()


@pytest.mark.parametrize("limit", range(990, 1060))
def test_a_cut_anywhere_removes_a_straddling_value_whole(limit: int) -> None:
    """The cut falling before, inside or after the value: nothing of it is left, and nothing before it is lost."""
    data = echo(1000)
    out = R.cut(data[: limit + R.lookahead + 1], limit)
    start = data.index(VALUE.encode())
    if limit <= start:
        assert out == data[:limit]
    else:
        assert out == data[:start] + MARK.encode() + data[start + len(VALUE) : limit]
    for k in range(3, len(VALUE)):  # no piece of the value (from three characters on) anywhere
        assert VALUE.encode()[:k] not in out[-k:] and VALUE.encode()[-k:] not in out[:k]


@pytest.mark.parametrize("before_cut", [1, 5, 10, len(VALUE) - 1])
def test_text_at_the_cut_is_treated_the_same_whether_or_not_it_starts_a_secret(before_cut: int) -> None:
    """A handler's own text placed across the cut comes back the same way whether it is the start of the value or
    not (a cut that hid a prefix would confirm guesses one character at a time); the whole value is hidden."""
    limit = 1000

    def shown(text: str) -> bytes:
        data = ("x" * (limit - before_cut) + text + "|").encode()
        return R.cut(data, limit)[limit - before_cut :]

    other = "zz/secret+9876543210&fedcba=?"
    assert shown(VALUE[:-1] + "!") == (VALUE[:-1] + "!")[:before_cut].encode()
    assert shown(other) == other[:before_cut].encode()
    assert shown(VALUE) == MARK.encode()


def test_without_values_nothing_changes_and_the_cut_is_plain() -> None:
    """No secrets: text as it is, a cut at the limit, no lookahead."""
    empty = Redactor({})
    assert not empty and empty.lookahead == 0
    assert empty.text("abc") == "abc" and empty.cut(b"abcdef", 3) == b"abc"


def test_the_store_knows_which_origins_are_bound() -> None:
    """binds(): the secret's own origin (scheme, host, port) only; lookahead covers the value's widest form."""
    pol = validate_policy(
        {
            "name": "b",
            "network": {"mode": "proxy", "allow": [{"host": "api.example.test"}]},
            "secrets": {"T": {"send_to": {"host": "api.example.test"}}},
        }
    )
    s = SecretStore()
    s.load({"T": VALUE}, dict(pol.secrets))
    assert s.binds(Target("https", "api.example.test", 443, False))
    assert not s.binds(Target("http", "api.example.test", 80, False))
    assert not s.binds(Target("https", "x.test", 443, False))
    assert s.lookahead >= 4 * len(VALUE)
    assert s.cut_bytes(echo(10), 15) == b"x" * 10 + b"|Bear"
