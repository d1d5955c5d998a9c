"""The rule of every door out of a sandbox onto the host's disk: what may never be written there.

Threats: git on the host reading a config or running hooks the sandbox wrote (``.git``, any name git or a
case-insensitive host takes for it, a bare repository's ``HEAD``), and a symlink that leads a later write
out of the target directory or into ``.git``. One function, ``door_problem``, for a download
(toolcage.files.safetar), ``changes(download_to=)`` and the diff (toolcage.files.changes), and the adapters.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from toolcage.textsafe import escape


def show(name: str) -> str:
    """A name from the sandbox, safe to print: invalid UTF-8 as ``\\xff``, control characters escaped."""
    return escape(name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"))


GIT_REASON = "is .git or a name git takes for it (git on the host would read its config and run its hooks)"


BARE_REASON = "would make its directory a bare git repository (git would read its config and run its hooks)"


def safe_name(name: str) -> str | None:
    """``name`` as a relative path of plain components, or None (absolute, ``..``, NUL, too long, empty)."""
    if name.startswith("/") or "\x00" in name:
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        return None
    try:
        raw = os.fsencode(name)
    except UnicodeError:
        return None
    if len(raw) > 4096 or any(len(os.fsencode(p)) > 255 for p in parts):
        return None
    return "/".join(parts)


# What git's verify_path takes for .git, and so refuses (``git apply`` then refuses the whole diff), and what
# a case-insensitive host opens as its .git: any case, trailing dots and spaces, an NTFS stream (``:``),
# the NTFS short name, code points HFS+ ignores.
_HFS_IGNORED = dict.fromkeys([0x200C, 0x200D, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF])


def folded(part: str) -> str:
    """``part`` as git and a case-insensitive host compare it (case, trailing dots and spaces, an NTFS stream,
    the code points HFS+ ignores)."""
    return part.translate(_HFS_IGNORED).split(":", 1)[0].rstrip(". ").lower()


def _dot_git(part: str) -> bool:
    return folded(part) in (".git", "git~1")


def clean(rel: str) -> str | None:
    """``rel`` if it is a plain relative path that may be in a diff, else None (``.git`` never is, nor any
    name git takes for it): the rule of the diff (toolcage.files.changes) and of every door out."""
    name = safe_name(rel)
    if name is None or name != rel or any(_dot_git(p) for p in name.split("/")):
        return None
    return name


def git_part(part: str) -> bool:
    """Whether git (or a case-insensitive host) takes the path component ``part`` for .git: the diff's rule
    (:func:`clean`), the one every door applies."""
    return part not in ("", ".", "..") and clean(part) is None


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def door_problem(
    rel: str, link: str | None = None, root: str | os.PathLike[str] | None = None, made: Mapping[str, str] = {}
) -> str | None:
    """Why the entry ``rel`` (a plain relative path under a door's target directory ``root`` on the host; a
    symlink to ``link`` when given) may not be written there, by any door out of a sandbox (download,
    ``changes(download_to=)``, the diff, the adapters); None when it may. ``made``: what the door itself makes
    ("dir", "file" or "link" by relative path), which stands for the host's entry there. Threats: git on the
    host running the sandbox's ``core.fsmonitor`` or hooks; a link that leads a later write out of the target.
    Ask once every name the door makes is known (``made``): a HEAD is judged by what lies beside it."""
    parts = rel.split("/")
    if any(git_part(p) for p in parts):
        return GIT_REASON
    if parts[-1] == "HEAD" and root is not None and bare_head(parts, root, made):
        return BARE_REASON
    if root is not None and bare_mark(parts, root, made):
        return BARE_REASON
    if link is None:
        return None
    if not link:
        return "a symlink that has an empty target"
    if link.startswith("/"):
        return "a symlink that points to an absolute path"
    top = os.path.realpath(root) if root is not None else None
    stack = rel.split("/")[:-1]
    for p in link.split("/"):
        if p in ("", "."):
            continue
        if p != "..":
            if git_part(p):
                return "a symlink that points into .git"
            stack.append(p)
            here = "/".join(stack)
            if top is not None and here not in made and os.path.islink(os.path.join(top, here)):
                real = os.path.realpath(os.path.join(top, here))
                if not _within(real, top) or any(git_part(q) for q in os.path.relpath(real, top).split("/")):
                    return (
                        f"a symlink that goes through the host's symlink '{show(here)}', which leads out or into .git"
                    )
            continue
        if not stack:
            return "a symlink that points out of the target directory"
        here = "/".join(stack)
        host_link = top is not None and here not in made and os.path.islink(os.path.join(top, here))
        if made.get(here) == "link" or host_link:
            return "a symlink that climbs back up ('..') through a symlink"
        stack.pop()
    return None


def bare_head(parts: list[str], root: str | os.PathLike[str], made: Mapping[str, str]) -> bool:
    """Whether a HEAD at ``parts`` would make its directory what git takes for a bare repository (objects/ and
    refs/, or a commondir file, beside it: what the door makes, ``made``, or the host's under ``root``), whose
    config git reads when run in it. The rule of every door out (a download, download_to, the diff)."""

    def kind(name: str) -> str | None:
        return _kind("/".join([*parts[:-1], name]), root, made)

    return (kind("objects") is not None and kind("refs") is not None) or kind("commondir") is not None


def _kind(rel: str, root: str | os.PathLike[str], made: Mapping[str, str]) -> str | None:
    if rel in made:
        return made[rel]
    path = os.path.join(root, rel)
    return (
        "link" if os.path.islink(path) else "dir" if os.path.isdir(path) else "file" if os.path.lexists(path) else None
    )


BARE_MARKS = ("objects", "refs", "commondir")


def bare_mark(parts: list[str], root: str | os.PathLike[str], made: Mapping[str, str]) -> bool:
    """Whether the entry at ``parts`` is (or is beneath) an objects/, refs/ or commondir that, beside a HEAD already
    there (the host's, or one the door makes), makes a bare repository: a HEAD made alone by one download and
    objects/ and refs/ by the next would otherwise pass (the HEAD rule asks only when the HEAD is written)."""
    for i, p in enumerate(parts):
        if p in BARE_MARKS:
            head = [*parts[:i], "HEAD"]
            if _kind("/".join(head), root, made) not in (None, "dir") and bare_head(head, root, made):
                return True
    return False


__all__ = ["BARE_MARKS", "BARE_REASON", "GIT_REASON", "bare_head", "bare_mark", "door_problem", "git_part", "show"]
