"""What the sandbox user could read of a host tree through its read-only bind mount.

The writable copy follows this rule (toolcage.files.upload), so it never gives the sandbox more than the
mount would. Threat: the runner reads the host's tree with its own rights (often root); a 0600 file,
or one inside a 0700 directory, that uid 65532 could never read through the mount would otherwise be
handed to the sandbox in full (issue 34, point 3).

The sandbox runs as uid 65532, gid 65532 (hostconfig ``User``), with no supplementary groups (the
image's /etc/group names no member of any group) and no capabilities (no DAC override), so the kernel
(runc) and gVisor decide by the owner, group and other bits against that uid and gid. A bind mount skips
the host directories above the workspace: only the workspace itself and what is under it count (the
copy takes the workspace directory itself as the caller's grant: toolcage.files.upload).
POSIX ACLs: runc's kernel checks an entry's access ACL, gVisor its mode bits (whose group bits are
then the ACL's mask); an entry with an access ACL counts as readable only when both allow, so the rule
never gives more than either runtime's mount. Under a user-namespaced engine (rootless, userns-remap)
the sandbox's host uid is another one, "other" to every file: the rule is then looser only for files
the host itself gives to uid or gid 65532.
"""

from __future__ import annotations

import errno
import os
import stat
import struct

from toolcage.policies import contract

UID = GID = contract.SANDBOX_UID
READ, SEARCH = 4, 1
LIST = READ | SEARCH  # list a directory and reach its entries: what the copy needs to take its contents

_ACL_XATTR = "system.posix_acl_access"
_ACL_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20


def access_acl(where: str | int) -> bytes | None:
    """The entry's POSIX access ACL as the kernel stores it (a path, never followed, or an fd); None: none."""
    try:
        if isinstance(where, int):
            return os.getxattr(where, _ACL_XATTR)
        return os.getxattr(where, _ACL_XATTR, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOENT):
            return None
        raise


def _acl_allows(raw: bytes, st: os.stat_result, want: int) -> bool:
    """The kernel's ACL check (posix_acl_permission) for uid/gid 65532; a malformed ACL allows nothing."""
    if len(raw) < 4 or (len(raw) - 4) % 8 or struct.unpack_from("<I", raw) != (_ACL_VERSION,):
        return False
    entries: list[tuple[int, int, int]] = [struct.unpack_from("<HHI", raw, off) for off in range(4, len(raw), 8)]
    mask = next((perm for tag, perm, _ in entries if tag == _MASK), 7)
    if st.st_uid == UID:
        return any(tag == _USER_OBJ and perm & want == want for tag, perm, _ in entries)
    for tag, perm, ident in entries:
        if tag == _USER and ident == UID:
            return perm & mask & want == want
    groups = [
        perm & mask
        for tag, perm, ident in entries
        if (tag == _GROUP_OBJ and st.st_gid == GID) or (tag == _GROUP and ident == GID)
    ]
    if groups:
        return any(perm & want == want for perm in groups)
    return any(tag == _OTHER and perm & want == want for tag, perm, _ in entries)


def allows(st: os.stat_result, want: int, acl: bytes | None = None) -> bool:
    """Whether uid/gid 65532 may ``want`` (READ, SEARCH, LIST) the entry ``st`` (with its access ACL, if any)."""
    if st.st_uid == UID:
        bits = st.st_mode >> 6
    elif st.st_gid == GID:
        bits = st.st_mode >> 3
    else:
        bits = st.st_mode
    if bits & want != want:
        return False
    return acl is None or _acl_allows(acl, st, want)


def may(path: str, st: os.stat_result, want: int) -> bool:
    """``allows`` for the entry at ``path`` whose lstat is ``st`` (a symlink: always, the mount reads its target)."""
    if stat.S_ISLNK(st.st_mode):
        return True
    return allows(st, want, access_acl(path))


def copied(root: str | os.PathLike[str], rel: str) -> bool:
    """Whether the workspace copy of ``root`` holds ``rel`` (a plain relative path) with its content: every
    directory on the way below ``root`` listable by the sandbox user and the entry itself readable (``root``
    is the caller's grant, toolcage.files.upload). For whoever reads the host's tree on the copy's behalf (the
    diff): what the copy left out, the sandbox never saw."""
    here = os.fspath(root)
    parts = [p for p in rel.split("/") if p]
    try:
        for i, part in enumerate(parts):
            if i:
                st = os.lstat(here)
                if not stat.S_ISDIR(st.st_mode) or not may(here, st, LIST):
                    return False
            here = os.path.join(here, part)
        st = os.lstat(here)
    except OSError:
        return False
    return bool(parts) and may(here, st, LIST if stat.S_ISDIR(st.st_mode) else READ)


__all__ = ["LIST", "READ", "SEARCH", "access_acl", "allows", "copied", "may"]
