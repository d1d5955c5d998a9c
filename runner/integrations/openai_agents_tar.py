"""The workspace as the OpenAI Agents SDK's portable tar (``persist_workspace``), for
``toolcage.integrations.openai_agents``.

Threat: every entry comes from the sandbox. The tar is read from toolcage's download stream (each name
checked, files streamed, never all in memory) within what the sandbox may hold: its workspace copy's or its
scratch's size (``limits``), not a fixed multi-GiB cap. An absolute symlink into the workspace
(``ln -s /workspace/a.txt b``) is rewritten as a relative one by the SDK's own rule
(``agents.sandbox.util.tar_utils.rebase_symlink_target``: plain components only, every directory on the way
and the file it names present in the archive), so that the SDK's strict hydrate, and toolcage's, take it
back on resume; any other absolute target stays as it is, for hydrate to refuse as the SDK's clients do.
"""

from __future__ import annotations

import hashlib
import tarfile
import tempfile
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, cast

from agents.sandbox.util.tar_utils import rebase_symlink_target

from toolcage.policies import contract

if TYPE_CHECKING:
    from toolcage.policies import Policy
    from toolcage.results import CallResult


def persist_bounds(policy: Policy, root: str) -> int:
    """The most file content a persist of ``root`` may carry: what the sandbox can hold there."""
    under_workspace = root == contract.WORKSPACE or root.startswith(contract.WORKSPACE + "/")
    return int(policy.limits.workspace_copy if under_workspace else policy.limits.scratch)


def _key(name: str) -> bytes:
    """A fixed-size key for a member's name: 100,000 names of 4 KiB cost 2 MB, not 400."""
    return hashlib.blake2b(name.encode("utf-8", "surrogateescape"), digest_size=16).digest()


def _rebased(link: tarfile.TarInfo, root: str, kinds: dict[bytes, str]) -> str | None:
    """``link``'s target made relative, if it is a plain path to a file the archive makes (the SDK's rule)."""
    rebased = rebase_symlink_target(link.linkname, link_name=link.name, root=root)
    if rebased == link.linkname:
        return None
    rest = ("/" + link.linkname.lstrip("/"))[len("/" + root.strip("/")) :]
    parts = [p for p in rest.split("/") if p]
    link_parents = link.name.split("/")[:-1]
    for depth in range(1, len(link_parents) + 1):
        if kinds.get(_key("/".join(link_parents[:depth]))) != "d":
            return None
    for depth in range(1, len(parts)):
        if kinds.get(_key("/".join(parts[:depth]))) != "d":
            return None
    return rebased if kinds.get(_key("/".join(parts))) == "f" else None


def workspace_tar(
    call: Callable[[dict[str, Any]], CallResult],
    root: str,
    skip: set[str],
    *,
    max_bytes: int,
    max_files: int,
) -> IO[bytes]:
    """``root``'s tree as the SDK's tar (``.`` first, workspace-relative names, symlinks last), spooled to a
    temporary file the caller closes."""
    from toolcage.files import download as transfer
    from toolcage.files.download import DownloadResult

    out = tempfile.TemporaryFile()  # noqa: SIM115 - handed to the SDK, which closes it
    try:
        with (
            tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tf,
            tempfile.TemporaryFile() as spool,
        ):
            top = tarfile.TarInfo(".")
            top.type, top.mode = tarfile.DIRTYPE, 0o755
            tf.addfile(top)
            kinds: dict[bytes, str] = {}
            with tarfile.open(fileobj=spool, mode="w", format=tarfile.PAX_FORMAT) as links:
                try:
                    for name, m, src in transfer.members(
                        call, {"path": root}, max_bytes=max_bytes, max_files=max_files, result=DownloadResult("")
                    ):
                        if any(name == s or name.startswith(s + "/") for s in skip):
                            continue
                        m.name = name
                        # the checked name, not the sandbox's spelling of it in a PAX header
                        cast(dict[str, str], m.pax_headers).pop("path", None)
                        if m.issym():
                            links.addfile(m)  # written last, once every name of the archive is known
                            continue
                        kinds[_key(name)] = "d" if m.isdir() else "f"
                        tf.addfile(m, src if m.isreg() else None)
                except transfer.DownloadUsage:
                    pass  # no workspace root yet: an empty archive
            spool.seek(0)
            with tarfile.open(fileobj=spool, mode="r|") as links:
                for link in links:
                    cast(Any, links).members.clear()  # stream mode keeps every header otherwise
                    rebased = _rebased(link, root, kinds)
                    if rebased is not None:
                        link.linkname = rebased
                        cast(dict[str, str], link.pax_headers).pop("linkpath", None)
                    tf.addfile(link)
        out.seek(0)
    except BaseException:
        out.close()
        raise
    return out


__all__ = ["persist_bounds", "workspace_tar"]
