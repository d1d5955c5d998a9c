"""A workspace tree's key for the engine's cache of copies (``workspace_cache``: toolcage.engine.copycache).

One walk of the tree as its copy considers it (``workspace_gitignore`` applied; no ACL read, no file opened):
every entry's name, mode, owner, size, mtime, ctime and inode, with the copy's format. A file's content, mode,
owner or ACL changed sets its ctime, which nothing can set back; a file replaced is another inode. So a tree
changed in any way the copy would show has another key: the cache never serves it stale.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct

from toolcage.files.upload import _entries

FORMAT = b"toolcage-copy-1"  # the copy's layout: a new one never matches an older cache
_PACK = struct.Struct("<IIIqqqQ").pack  # mode, uid, gid, size, mtime_ns, ctime_ns, inode


def key(local: str | os.PathLike[str], gitignore: bool) -> str:
    """The tree's key: every entry a copy of it considers (``workspace_gitignore`` applied), with its lstat."""

    top = os.path.abspath(os.fspath(local))
    h = hashlib.blake2b(FORMAT + (b"\1" if gitignore else b"\0"), digest_size=20)
    root = os.lstat(top)
    h.update(_PACK(root.st_mode, root.st_uid, root.st_gid, 0, root.st_mtime_ns, root.st_ctime_ns, root.st_ino))
    for path, name, known in _entries(top, gitignore):
        st = known or os.lstat(path)
        h.update(os.fsencode(name) + b"\0")
        size = st.st_size if not stat.S_ISDIR(st.st_mode) else 0
        h.update(_PACK(st.st_mode, st.st_uid, st.st_gid, size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
    return h.hexdigest()
