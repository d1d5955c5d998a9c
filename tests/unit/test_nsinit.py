"""The seccomp filter worker/children/nsinit.py stacks on tool code under gVisor, run through a BPF evaluator."""

from __future__ import annotations

import struct
import sys

import pytest

from toolcage.worker.children import namespaces, nsinit

ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050001, 0x00050026


def run_bpf(prog: list[tuple[int, int, int, int]], nr: int, arch: int) -> int:
    """Classic BPF over a seccomp_data {nr, arch, ...}: the opcodes nsinit uses, nothing else."""
    data = struct.pack("<iI", nr, arch) + bytes(56)
    pc = 0
    acc = 0
    for _ in range(len(prog) + 1):
        code, jt, jf, k = prog[pc]
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif code == 0x15:  # jeq #k
            pc += 1 + (jt if acc == k else jf)
        elif code == 0x35:  # jge #k
            pc += 1 + (jt if acc >= k else jf)
        elif code == 0x06:  # ret #k
            return k
        else:
            raise AssertionError(f"opcode {code:#x} at {pc}")
    raise AssertionError("the program does not end")


@pytest.mark.parametrize("machine", sorted(nsinit.ARCHES))
def test_the_stacked_filter_refuses_mount_and_namespace_calls_only(machine: str) -> None:
    """Each listed call answers EPERM, x32 numbers and a foreign architecture too, clone3 ENOSYS; the rest is
    allowed."""
    arch, numbers = nsinit.ARCHES[machine]
    prog = nsinit.filter_program(machine)
    assert {"mount", "umount2", "unshare", "setns", "fsmount", "move_mount", "open_tree"} <= set(numbers)
    for name, nr in numbers.items():
        assert run_bpf(prog, nr, arch) == EPERM, name
    assert run_bpf(prog, nsinit.CLONE3, arch) == ENOSYS  # glibc falls back to clone, whose flags are checked
    refused = set(numbers.values()) | {nsinit.CLONE3}
    for nr in range(0, 460):
        if nr not in refused:
            assert run_bpf(prog, nr, arch) == ALLOW, nr
    assert run_bpf(prog, 0x40000000 | 165, arch) == EPERM  # x32's mount
    assert run_bpf(prog, 0, 0x40000003) == EPERM  # i386: not this filter's architecture


def test_wrap_only_where_the_runner_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without TOOLCAGE_TOOL_NAMESPACES argv is started as it is; with it, through nsinit run isolated (-I)."""
    monkeypatch.delenv(namespaces.ENV, raising=False)
    assert namespaces.wrap(["python3", "-c", "pass"]) == ["python3", "-c", "pass"]
    monkeypatch.setenv(namespaces.ENV, "1")
    wrapped = namespaces.wrap(["python3", "-c", "pass"])
    # the worker's own interpreter by absolute path: in a user's own image "python3" on PATH is the image's
    assert wrapped[:3] == [sys.executable, "-I", "-S"] and wrapped[3].endswith("/worker/children/nsinit.py")
    assert wrapped[4:] == ["--", "python3", "-c", "pass"]
    # a user's own image: the program's environment travels to nsinit as an argument, not in its own env
    wrapped = namespaces.wrap(["prog"], env={"LD_PRELOAD": "/evil.so"})
    assert wrapped[4:7] == ["--env", '{"LD_PRELOAD": "/evil.so"}', "--"] and wrapped[7:] == ["prog"]
