"""``python3 -I -S ttyinit.py [--env JSON] -- ARGV``: exec ARGV with the terminal on stdin as its controlling one.

Under runc, a background process on a terminal (``worker.children.background``) starts through this, so that
Ctrl-C typed on the terminal is SIGINT to its foreground job and a shell on it gets job control. (Under gVisor
``worker/children/nsinit.py --tty`` does the same inside the namespaces it makes.) It starts with the worker's
environment and execs the program with its own (``--env``): an image's LD_PRELOAD or LD_LIBRARY_PATH never
runs in the worker's interpreter. Stand-alone, standard library only, as nsinit.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import termios


def main(args: list[str]) -> None:
    env = None
    if args[:1] == ["--env"] and len(args) > 1:
        env, args = json.loads(args[1]), args[2:]
    if args[:1] != ["--"] or len(args) < 2:
        os.write(2, b"usage: ttyinit.py [--env JSON] -- ARGV\n")
        os._exit(2)
    try:
        os.setsid()
    except OSError:
        pass  # a session leader already (the worker starts it in a session of its own)
    try:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    except OSError as exc:
        os.write(2, f"toolcage: the terminal could not be made the process's own ({exc.strerror})\n".encode())
        os._exit(126)
    for s in signal.valid_signals():  # as subprocess starts a program: every signal at its default
        if s not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(s, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
    argv = args[1:]
    try:
        if env is None:
            os.execvp(argv[0], argv)  # noqa: S606 - the caller's own program
        else:
            os.execvpe(argv[0], argv, env)  # noqa: S606
    except OSError as exc:
        os.write(2, f"toolcage: cannot run {argv[0]!r}: {exc.strerror}\n".encode())
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)


if __name__ == "__main__":
    main(sys.argv[1:])
