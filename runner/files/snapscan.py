"""The snapshot's secret scan: a run's secret values, in the forms cheap to write and cheap to find, in a
snapshot's file contents, names, link targets and mtimes.

Threat: code or a connector that may read a secret (``unsafe_expose_to_handler``) writes it into a file
so that it leaves the sandbox in the snapshot, the one door whose bytes the worker's redaction does not
see as text. Plain search misses the value disguised, so the scan looks for (per value of 4 characters
or more):

- every form the worker's redaction recognises (toolcage.worker.redaction: as it is, hex, base64 at any
  alignment, JSON, HTML and percent escapes, UTF-16 and UTF-32);
- in any letter case: the value, reversed, rot13, and base32 at any alignment;
- a part of it: for a value of 16 bytes or more, any run of ``fragment`` bytes of it (about half,
  at least 15), plain or reversed, in any case; so a value split in two across files, names or a
  name and a file is found in the part that holds the larger half;
- inside a gzip or zlib stream that starts a file (its members one after another), decompressed up to
  64 MiB per file and 256 MiB per snapshot;
- in mtimes: the entries' mtimes in the order the snapshot holds them, as 4-byte words (either byte
  order), 2-byte words and single bytes, read as one text.

Not seen (docs/security.md says so too): any other transformation (an encryption, a hash, a cipher of
the attacker's own, base64 of a disguised form, a compression other than gzip/zlib or one that does not
start its file, a zip or tar inside a file), a value cut into three parts or more, a shorter value
split anywhere, and the structure of the tree (which files exist, their sizes and modes, their order).
"""

from __future__ import annotations

import base64
import codecs
import zlib
from collections.abc import Iterator

from toolcage.files.safetar import show
from toolcage.worker.redaction import Redactor, text_forms

_WIDE = ("utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be")
_MIN_VALUE = 4  # shorter values are not scanned for (they would be found everywhere)
_MIN_SPLIT = 16  # values this long or longer are looked for in parts too
_MIN_ANCHOR = 8
_MAX_PIECES = 64  # anchors of one value found in one buffer before it counts as a hit (a flood costs nothing)
INFLATE_FILE = 64 << 20  # decompressed bytes scanned per file
INFLATE_TOTAL = 256 << 20  # and per snapshot


def _base32_cores(raw: bytes) -> set[bytes]:
    """The characters of base32(prefix + raw + suffix) that depend on ``raw`` alone, at each alignment."""
    out = set()
    for shift in range(5):
        enc = base64.b32encode(b"\0" * shift + raw + b"\0" * 5)
        start, end = 8 * shift, 8 * (shift + len(raw))
        core = enc[-(-start // 5) : end // 5]
        if len(core) >= _MIN_VALUE:
            out.add(core)
    return out


class _Parts:
    """Any run of ``m`` bytes of ``value`` (lower-cased), found through aligned anchors of ``s`` bytes: every
    run of ``m >= 2s - 1`` bytes holds a whole anchor, and a hit on one is checked around it."""

    def __init__(self, value: bytes) -> None:
        n = len(value)
        half = (n + 1) // 2
        self.s = max(_MIN_ANCHOR, (half + 1) // 2)
        self.m = max(half, 2 * self.s - 1)
        self.value = value
        self.anchors = [(value[k : k + self.s], k) for k in range(0, n - self.s + 1, self.s)]

    def hit(self, low: bytes) -> bool:
        v, m, s, n = self.value, self.m, self.s, len(self.value)
        seen = 0
        for anchor, k in self.anchors:
            at = low.find(anchor)
            while at != -1:
                for p in range(max(0, k + s - m), min(k, n - m) + 1):
                    q = at - (k - p)
                    if q >= 0 and low[q : q + m] == v[p : p + m]:
                        return True
                seen += 1
                if seen > _MAX_PIECES:
                    return True
                at = low.find(anchor, at + 1)
        return False


class SecretScan:
    """The run's values in the forms of the module doc; ``hit`` tells whether a buffer holds one."""

    def __init__(self, values: list[str]) -> None:
        exact: set[bytes] = set()
        folded: set[bytes] = set()
        self.parts: list[_Parts] = []
        self.redactors = []
        for v in values:
            raw = v.encode("utf-8", "surrogatepass")
            if len(v) < _MIN_VALUE:
                continue
            exact |= {n.literal.encode("utf-8", "surrogatepass") for n in text_forms(v) if n.literal}
            exact |= {v.encode(codec, "surrogatepass") for codec in _WIDE}
            rot = codecs.encode(v, "rot13").encode("utf-8", "surrogatepass")
            folded |= {raw.lower(), raw[::-1].lower(), rot.lower(), rot[::-1].lower()}
            folded |= {c.lower() for c in _base32_cores(raw)}
            if len(raw) >= _MIN_SPLIT:
                self.parts += [_Parts(raw.lower()), _Parts(raw[::-1].lower())]
            self.redactors.append(Redactor({"value": v}))
        self.exact = sorted(exact, key=len)
        self.folded = sorted(folded, key=len)
        longest = max([len(n) for n in exact | folded] + [p.m for p in self.parts] + [1])
        self.tail = longest - 1  # bytes kept from one piece to the next: a value across the seam is found
        self.inflated = 0
        self._stamps: list[bytearray] = [bytearray() for _ in range(5)]

    def __bool__(self) -> bool:
        return bool(self.exact)

    def hit(self, data: bytes) -> bool:
        if not self.exact or not data:
            return False
        if any(n in data for n in self.exact):
            return True
        low = data.lower()
        return any(n in low for n in self.folded) or any(p.hit(low) for p in self.parts)

    def shown(self, name: str) -> str:
        """``name`` as a message may show it: each value replaced by ``[secret value]``, and a name that
        still holds a form of one cut before the first component that does."""
        out = show(name)
        for r in self.redactors:
            out = r.text(out)
        if not self.hit(out.encode("utf-8", "surrogateescape")):
            return out
        keep: list[str] = []
        for part in out.split("/"):
            if self.hit("/".join([*keep, part]).encode("utf-8", "surrogateescape")):
                break
            keep.append(part)
        return "/".join([*keep, "[a name that holds a secret value]"])

    def found(self, pieces: Iterator[bytes]) -> Iterator[tuple[bytes, bool]]:
        """Each piece of a file, and whether a value is in it (or across the seam with the one before, or in
        what it decompresses to)."""
        carry = b""
        inflate: _Inflate | None = None
        for i, piece in enumerate(pieces):
            if i == 0 and _compressed(piece):
                inflate = _Inflate(self)
            window = carry + piece
            hit = self.hit(window) or (inflate is not None and inflate.hit(piece))
            yield piece, hit
            carry = window[-self.tail :] if self.tail else b""

    def stamp(self, mtime: int) -> None:
        """Keep an entry's mtime for ``stamped`` (a few bytes per entry)."""
        t = mtime & 0xFFFFFFFF
        for buf, b in zip(
            self._stamps,
            (t.to_bytes(4, "big"), t.to_bytes(4, "little"), (t & 0xFFFF).to_bytes(2, "big"),
             (t & 0xFFFF).to_bytes(2, "little"), bytes([t & 0xFF])),
            strict=True,
        ):  # fmt: skip
            buf += b

    def stamped(self) -> bool:
        """Whether the mtimes kept so far spell a value (read as text in any of the stamp's widths)."""
        return any(self.hit(bytes(buf)) for buf in self._stamps)


def _compressed(head: bytes) -> bool:
    """Does a file start as gzip or zlib does (a zlib header is two bytes whose big-endian value is a multiple
    of 31, deflate as the method)?"""
    if head[:2] == b"\x1f\x8b":
        return True
    return len(head) >= 2 and head[0] & 0x0F == 8 and head[0] >> 4 <= 7 and (head[0] << 8 | head[1]) % 31 == 0


class _Inflate:
    """A file's gzip or zlib stream, decompressed as its pieces come, within the scan's budgets."""

    def __init__(self, scan: SecretScan) -> None:
        self.scan, self.d, self.out, self.carry, self.done = scan, zlib.decompressobj(47), 0, b"", False

    def hit(self, data: bytes) -> bool:
        while data and not self.done:
            budget = min(INFLATE_FILE - self.out, INFLATE_TOTAL - self.scan.inflated)
            if budget <= 0:
                self.done = True
                break
            try:
                plain = self.d.decompress(data, min(budget, 1 << 20))
            except zlib.error:
                self.done = True  # not (or no longer) a stream: the raw bytes were scanned anyway
                break
            self.out += len(plain)
            self.scan.inflated += len(plain)
            window = self.carry + plain
            if self.scan.hit(window):
                return True
            self.carry = window[-self.scan.tail :] if self.scan.tail else b""
            data = self.d.unconsumed_tail
            if self.d.eof:  # gzip members one after another: the next one is read too
                rest = self.d.unused_data
                if rest[:2] != b"\x1f\x8b":
                    self.done = True
                    break
                self.d, data = zlib.decompressobj(47), rest
        return False


__all__ = ["INFLATE_FILE", "INFLATE_TOTAL", "SecretScan"]
