"""``contract.id_key``'s fast path for str and int ids gives exactly the text ``json.dumps`` gives (the key
both sides use to match an answer to its request: a difference would break the stream or pair the wrong ones)."""

from __future__ import annotations

import enum
import json
import random
import sys
from typing import Any

from toolcage.policies.contract import id_key


def reference(req_id: Any) -> str:
    return json.dumps(req_id, sort_keys=True, separators=(",", ":"))


class StrSub(str):
    pass


class IntSub(int):
    def __repr__(self) -> str:
        return "not-json"


class Color(enum.IntEnum):
    RED = 1


def ids() -> list[Any]:
    rng = random.Random(40)
    fixed: list[Any] = [
        "", "0", "1", "0123456789abcdef", "a\"b", "a\\b", "\n\r\t\b\f", "\x00\x01\x1f\x7f", "é", "日本語", "😀",
        "\ud800", "\udfff", "\u2028\u2029", "</script>", " " * 3,
        0, 1, -1, 2**31, -(2**63), 2**64 + 1, 10**300,
        True, False, None, 0.0, -0.0, 1.5, 1e300, 1e-300, float("inf"), float("-inf"), float("nan"),
        [], {}, [1, "1"], {"b": 1, "a": [True, None]}, {"é": "😀"},
        StrSub("abc"), IntSub(7), Color.RED,
    ]  # fmt: skip
    rand: list[Any] = []
    for _ in range(5000):
        n = rng.randrange(0, 24)
        # mostly ASCII, then Latin-1, the BMP (lone surrogates included) and beyond it
        top = rng.choice((0x80, 0x100, 0x10000, sys.maxunicode + 1))
        rand.append("".join(chr(rng.randrange(0, top)) for _ in range(n)))
        rand.append(rng.randrange(-(2**70), 2**70))
        rand.append(rng.randrange(-1000, 1000))
        rand.append(rng.uniform(-1e6, 1e6))
        rand.append(rng.getrandbits(64).to_bytes(8, "big").hex())
    return fixed + rand


def test_id_key_is_json_dumps_for_every_id() -> None:
    for req_id in ids():
        assert id_key(req_id) == reference(req_id), repr(req_id)


def test_one_and_the_string_one_stay_apart() -> None:
    assert id_key(1) != id_key("1") and id_key(True) != id_key(1) and id_key(1.0) != id_key(1)
    assert (id_key(True), id_key(1), id_key("1"), id_key(1.0)) == ("true", "1", '"1"', "1.0")


def test_a_subclass_takes_json_dumps() -> None:
    """An int subclass with its own __repr__ (a hostile id cannot make one, but a caller could) keys as JSON does."""
    assert id_key(IntSub(7)) == "7" and id_key(Color.RED) == "1" and id_key(StrSub("x")) == '"x"'
