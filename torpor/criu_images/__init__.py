"""CRIU's images checked before runc sees them: the tasks a checkpoint would restore (their
credentials, seccomp and namespaces), the files, sockets, mounts and ttys they reach, against
the spec they are restored with and this node's policy.

    reader.py   CRIU's image files, read with CRIU's own definitions (pycriu)
    dump.py     what a dump holds, in plain terms
    checks.py   a dump against the spec and the policy: findings in words
    rootfs.py   paths on the root mount against the root filesystem restored onto

`torpor restore` checks before anything is created (no rootfs yet); torpor-runc checks again
before `runc restore`, with the container's rootfs mounted (ctr and nerdctl restores too);
`torpor inspect` shows the findings.
"""

from __future__ import annotations

from torpor.config import Config
from torpor.criu_images import checks, dump, rootfs
from torpor.criu_images.checks import Finding
from torpor.errors import FormatError, RestoreError
from torpor.formats.oci import OciSpec

__all__ = ["Finding", "check", "findings"]


def findings(image_dir: str, spec: OciSpec, cfg: Config,
             root: str | None = None) -> list[Finding]:
    """Every finding of the CRIU images in `image_dir` against `spec`; `root`: the container's
    mounted root filesystem, when there is one. FormatError for images that cannot be read."""
    found_dump = dump.load(image_dir)
    found = checks.findings(found_dump, spec, cfg.restore_host_namespaces)
    if root is not None:
        found.extend(rootfs.findings(found_dump, root))
    return found


def check(image_dir: str, spec: OciSpec, cfg: Config, root: str | None = None) -> None:
    """RestoreError listing every finding, or for images that cannot be read."""
    try:
        found = findings(image_dir, spec, cfg, root)
    except FormatError as e:
        raise RestoreError(f"the checkpoint's CRIU images cannot be checked: {e}") from None
    if found:
        lines = "\n".join(f"  - {f.what} (allow with: {f.remedy})" for f in found)
        raise RestoreError("the checkpoint's CRIU images would restore what its spec and this "
                           f"node's restore policy do not grant:\n{lines}",
                           hint="torpor inspect shows what a checkpoint's images hold")
