"""Make ``/opt/toolcage/rt``: the worker's runtime as a tree of its own, for images that are not toolcage's.

Run once, in the worker image's build (``python3 -I -S rt.py /opt/toolcage/rt``), never at run time.
The runner mounts this tree (and ``/opt/toolcage/lib``) read-only into a user's image and starts
``/opt/toolcage/rt/bin/python3 -S -m toolcage.worker`` there (``toolcage.engine.runtime``): the
image's own files are then data to the worker, never code it runs or maps.

What it holds: the worker image's CPython (its standard library under ``lib/python3.11``, so
``getpath`` finds ``sys.prefix = /opt/toolcage/rt`` from the executable's place), the glibc loader,
GNU tar (``bin/tar``, which the worker runs to extract the workspace copy), and every shared library
the interpreter, its extension modules, tar and the worker's packages need, copied by what ``ldd`` says
they resolve to here. Four byte edits, each of the same length or shorter
(a C string padded with NULs where its length is not stored elsewhere), so no ELF tool is needed:

- ``bin/python3``'s and ``bin/tar``'s program interpreter (PT_INTERP) names ``rt/lib/ld.so``, not the
  image's ``/lib64/ld-linux-x86-64.so.2``: the worker's own children (``sys.executable``, tar) start
  through it.
- ``lib/ld.so``: ``/etc/ld.so.preload`` and ``/etc/ld.so.cache`` name ``/dev/null`` (the loader reads the
  image's preload file even when it is invoked by path, and ``--preload ''`` does not stop it); its four
  default library directories (``/lib/x86_64-linux-gnu/`` ...) name ``rt/lib`` or ``/dev/`` padded with
  slashes (the loader keeps their lengths in a table of its own): a library missing from rt is an error,
  never a file of the image, and an extension module's own ``dlopen`` (``_ctypes`` -> libffi) finds rt's.
- ``lib/libc.so.6``: ``/etc/nsswitch.conf`` names ``rt/n``, rt's own (``files`` only): a ``pwd`` or
  ``socket`` lookup in the worker never loads an image's ``libnss_*.so``.

The runner sets ``LD_PRELOAD= LD_LIBRARY_PATH= LD_AUDIT= GLIBC_TUNABLES=`` and ``LC_ALL=C`` over the
image's values (Docker can override an image's variable, not unset it), and ``-S`` with the image's
``PYTHON*`` variables blanked keeps its ``sitecustomize`` and startup files out.
``check`` (``--check``) proves it: every library of every ELF file in rt resolves inside rt.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

RT = "/opt/toolcage/rt"
LIB = f"{RT}/lib"
INTERP = b"/lib64/ld-linux-x86-64.so.2"
NEW_INTERP = f"{LIB}/ld.so".encode()
# the loader's C strings (path: replacement, NUL-padded) and its default directories (same length)
LOADER_PATHS = {b"/etc/ld.so.preload": b"/dev/null", b"/etc/ld.so.cache": b"/dev/null"}
LOADER_DIRS = {
    b"/lib/x86_64-linux-gnu/": (LIB + "/").encode(),
    b"/usr/lib/x86_64-linux-gnu/": (LIB + "/").encode(),
    b"/lib/": b"/dev/",
    b"/usr/lib/": b"/dev/",
}
LIBC_PATHS = {b"/etc/nsswitch.conf": f"{RT}/n".encode()}
NSSWITCH = "passwd: files\ngroup: files\nshadow: files\nhosts: files\nnetworks: files\nservices: files\n"
PYVER = f"python{sys.version_info.major}.{sys.version_info.minor}"
# glibc dlopens libgcc_s for unwinding (thread exit, pthread_cancel): ldd never names it
ALWAYS = ("libgcc_s.so.1",)
# programs the worker runs itself, from rt (never the image's): GNU tar extracts the workspace copy
# (worker.tools.untar), 3x faster than Python's tarfile on a tree of small files
PROGRAMS = {"/usr/bin/tar": "tar"}


def padded(new: bytes, old: bytes, slashes: bool) -> bytes:
    """``new`` made exactly as long as ``old``: with slashes (a directory, same meaning) or NULs (a C string)."""
    if len(new) > len(old):
        raise SystemExit(f"rt: {new!r} is longer than {old!r}")
    if slashes:
        return new.rstrip(b"/") + b"/" * (len(old) - len(new.rstrip(b"/")))
    return new + b"\0" * (len(old) - len(new))


def swap(path: str, table: dict[bytes, bytes], slashes: bool = False, count: int | None = None) -> None:
    """Replace each key, as a whole NUL-ended C string, everywhere in the file; each must be found."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    for old, new in table.items():
        key = b"\0" + old + b"\0"
        n = data.count(key)
        if n == 0 or (count is not None and n != count):
            raise SystemExit(f"rt: {old!r} found {n} times in {path}")
        data = bytearray(bytes(data).replace(key, b"\0" + padded(new, old, slashes) + b"\0"))
    with open(path, "wb") as f:
        f.write(data)


def libraries(files: list[str]) -> set[str]:
    """What the loader resolves the files' libraries to here (``ldd``), the loader itself left out."""
    found: set[str] = set()
    for i in range(0, len(files), 200):
        out = subprocess.run(["ldd", *files[i : i + 200]], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if "not found" in line:
                raise SystemExit(f"rt: a library is missing here: {line.strip()}")
            parts = line.split("=>")
            if len(parts) == 2 and parts[1].strip().startswith("/"):
                found.add(parts[1].split("(")[0].strip())
    return found


def _magic(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(4)


def elf_files(*roots: str) -> list[str]:
    out = []
    for root in roots:
        for d, _dirs, names in os.walk(root):
            for n in names:
                p = os.path.join(d, n)
                if ".so" in n and not os.path.islink(p) and _magic(p) == b"\x7fELF":
                    out.append(p)
    return out


def make(rt: str = RT, worker_lib: str = "/opt/toolcage/lib") -> None:
    exe = os.path.realpath(sys.executable)
    stdlib = os.path.dirname(os.__file__)
    os.makedirs(f"{rt}/bin")
    os.makedirs(f"{rt}/lib")
    shutil.copytree(stdlib, f"{rt}/lib/{PYVER}", symlinks=True, ignore=shutil.ignore_patterns("test", "idlelib"))
    libs = libraries([exe, *PROGRAMS, *elf_files(stdlib, worker_lib)])
    for name in ALWAYS:
        libs |= {p for p in (f"/lib/x86_64-linux-gnu/{name}", f"/usr/lib/x86_64-linux-gnu/{name}") if os.path.exists(p)}
    for path in sorted(libs):
        shutil.copy2(path, f"{rt}/lib/{os.path.basename(path)}", follow_symlinks=True)
    shutil.copy2(os.path.realpath(INTERP.decode()), f"{rt}/lib/ld.so")
    shutil.copy2(exe, f"{rt}/bin/python3")
    swap(f"{rt}/bin/python3", {INTERP: NEW_INTERP}, count=1)
    for path, name in PROGRAMS.items():
        shutil.copy2(path, f"{rt}/bin/{name}")
        swap(f"{rt}/bin/{name}", {INTERP: NEW_INTERP}, count=1)
    swap(f"{rt}/lib/ld.so", LOADER_PATHS)
    swap(f"{rt}/lib/ld.so", LOADER_DIRS, slashes=True)
    swap(f"{rt}/lib/libc.so.6", LIBC_PATHS, count=1)
    with open(f"{rt}/n", "w") as f:
        f.write(NSSWITCH)
    for d, dirs, names in os.walk(rt):
        for n in dirs + names:
            p = os.path.join(d, n)
            if not os.path.islink(p):
                os.chmod(p, 0o755 if os.path.isdir(p) or os.access(p, os.X_OK) or ".so" in n else 0o644)


def check(rt: str = RT, worker_lib: str = "/opt/toolcage/lib") -> None:
    """Every library of rt's interpreter, extension modules and the worker's packages resolves inside rt,
    through rt's own loader (whose default directories are rt's)."""
    files = [
        f"{rt}/bin/python3",
        *(f"{rt}/bin/{n}" for n in PROGRAMS.values()),
        *elf_files(f"{rt}/lib/{PYVER}", worker_lib),
    ]
    env = {"PATH": "/usr/bin:/bin"}
    for f in files:
        out = subprocess.run(
            [f"{rt}/lib/ld.so", "--list", f], capture_output=True, text=True, check=False, env=env
        ).stdout
        for line in out.splitlines():
            target = line.split("=>")[-1].split("(")[0].strip()
            if "not found" in line or (target.startswith("/") and not target.startswith(rt + "/")):
                raise SystemExit(f"rt: {f}: {line.strip()} (outside {rt})")
    probe = "import ctypes, ssl, sqlite3, lzma, bz2, zlib, pwd, json, pydantic_core, decimal; print(pwd.getpwuid(0)[0])"
    r = subprocess.run(
        [f"{rt}/bin/python3", "-S", "-c", probe], capture_output=True, text=True, check=False,
        env={**env, "PYTHONPATH": worker_lib, "LC_ALL": "C"},
    )  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(f"rt: its python3 does not run: {r.stderr.strip()[-400:]}")
    for name in PROGRAMS.values():
        r = subprocess.run([f"{rt}/bin/{name}", "--version"], capture_output=True, text=True, check=False, env={})
        if r.returncode != 0:
            raise SystemExit(f"rt: its {name} does not run: {r.stderr.strip()[-400:]}")


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else RT
    if "--check" not in sys.argv:
        make(target)
    check(target)
