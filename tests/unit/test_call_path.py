"""The call path's parts in rpc/session.py: ``_Signal``, the one-shot event a call's slot waits on (Event's
behaviour, made of one lock), and ``_new_id``, request ids read from the CSPRNG in bulk."""

from __future__ import annotations

import os
import threading
import time

from toolcage.rpc.session import _Ids, _new_id, _Signal


def test_wait_times_out_and_then_passes_once_set() -> None:
    s = _Signal()
    assert not s.is_set()
    t0 = time.monotonic()
    assert s.wait(0.05) is False
    assert time.monotonic() - t0 >= 0.04
    assert s.wait(0) is False and s.wait(-1) is False  # a deadline already past: no wait, no error
    s.set()
    assert s.is_set() and s.wait(0) and s.wait(5) and s.wait(0)  # every later wait passes


def test_set_twice_and_from_many_threads() -> None:
    s = _Signal()
    s.set()
    s.set()
    assert s.wait(0)
    for _ in range(200):
        s = _Signal()
        setters = [threading.Thread(target=s.set) for _ in range(3)]
        for th in setters:
            th.start()
        assert s.wait(5)
        for th in setters:
            th.join()
        assert s.is_set() and s.wait(0)


def test_a_waiter_is_woken_by_another_thread() -> None:
    s = _Signal()
    threading.Timer(0.05, s.set).start()
    t0 = time.monotonic()
    assert s.wait(10)
    assert time.monotonic() - t0 < 5


def test_a_huge_timeout_is_not_an_error() -> None:
    s = _Signal()
    s.set()
    assert s.wait(1e300)


def test_ids_are_64_random_bits_each_and_never_repeat() -> None:
    ids = [_new_id() for _ in range(3 * _Ids.BULK + 7)]
    assert all(len(i) == 16 and int(i, 16) >= 0 for i in ids)
    assert len(set(ids)) == len(ids)


def test_ids_from_many_threads_are_unique() -> None:
    got: list[list[str]] = [[] for _ in range(4)]

    def take(k: int) -> None:
        got[k] = [_new_id() for _ in range(2000)]

    threads = [threading.Thread(target=take, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    every = [i for ids in got for i in ids]
    assert len(set(every)) == len(every) == 8000


def test_a_forked_child_reads_its_own_ids() -> None:
    _new_id()  # the parent holds a bulk read
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.close(r)
        os.write(w, "".join(_new_id() for _ in range(4)).encode())
        os._exit(0)
    os.close(w)
    child = os.read(r, 1024).decode()
    os.close(r)
    os.waitpid(pid, 0)
    parent = "".join(_new_id() for _ in range(4))
    assert len(child) == 64 and child != parent
