"""The worker's side of the process made ahead (worker.children.zygote, under gVisor): it never leaves the
channel unread while the zygote makes it, and a reply it has not read yet is taken before anything else."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from toolcage.worker.children import sweep, zygote


@pytest.fixture
def fake() -> Iterator[tuple[zygote.Zygote, socket.socket]]:
    """A Zygote whose process is this test: its socket's other end is ours, its pid exempt as a zygote's."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    z = object.__new__(zygote.Zygote)
    z.sock, z.pid, z.ready, z.ahead, z.pending = theirs, 999_999, True, None, False
    sweep.EXEMPT.add(z.pid)
    try:
        yield z, ours
    finally:
        sweep.EXEMPT.discard(z.pid)
        if z.ahead is not None:
            sweep.EXEMPT.discard(z.ahead[0])
            z.ahead[1].close()
        ours.close()
        theirs.close()


def test_a_request_that_comes_while_the_zygote_makes_the_process_is_read_at_once(
    fake: tuple[zygote.Zygote, socket.socket],
) -> None:
    """make_ahead waits for the zygote's reply and for the channel at once: a request that comes meanwhile
    ends the wait (it waited up to a second for a zygote slowed by background processes, and every request with
    it: a list_files 0.1 s after a call took 364 ms, median, beside 8 busy processes). The reply, when it comes,
    is taken later and the process made ahead is exempt from the sweep from then."""
    z, ours = fake
    wake_r, wake_w = os.pipe()
    try:
        threading.Timer(0.05, os.write, (wake_w, b"x")).start()
        started = time.monotonic()
        assert z.make_ahead(wake_r) is True  # a request waits
        assert time.monotonic() - started < 0.5
        assert ours.recv(16) == b"P" and z.pending and z.ahead is None
        assert z.make_ahead(wake_r) is True  # asked once only, while its reply is awaited
        ours.setblocking(False)
        with pytest.raises(BlockingIOError):
            ours.recv(16)
        ahead_r, ahead_w = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        socket.send_fds(ours, [(424_242).to_bytes(8, "little")], [ahead_w.fileno()])
        ahead_w.close()
        z.collect(0)
        assert not z.pending and z.ahead is not None and z.ahead[0] == 424_242 and 424_242 in sweep.EXEMPT
        ahead_r.close()
    finally:
        os.close(wake_r)
        os.close(wake_w)


def test_a_zygote_that_could_not_fork_ahead_is_kept(fake: tuple[zygote.Zygote, socket.socket]) -> None:
    """b"E": no fork now (the pids limit, held by background processes): no process ahead, the zygote stays."""
    z, ours = fake
    z.pending = True
    ours.send(b"E")
    z.collect(1.0)
    assert not z.pending and z.ahead is None


def test_a_reply_that_never_comes_before_a_fork_discards_the_zygote(fake: tuple[zygote.Zygote, socket.socket]) -> None:
    """A fork asked while a reply is owed would read that reply as its own: collect waits for it, and a zygote
    that does not answer in time is given up (OSError: the caller discards it)."""
    z, _ours = fake
    z.pending = True
    with pytest.raises(OSError, match="in time"):
        z.collect(0.05)
