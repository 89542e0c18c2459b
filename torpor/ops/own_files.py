"""The sandbox files a restore makes, and their lifetime.

A restored container whose checkpoint mounted its engine's or its pod's files (/etc/hosts,
/etc/hostname, /etc/resolv.conf, /dev/shm, a volume this node lacks) gets its own, in
`<runtime state>/pod-files/<namespace>-<name>-<random>/` (capture/pod.py makes them). They live
exactly as long as the container that mounts them:

- a restore claims the directory it made (`Claims.claim`: an owner record, `owner.json`, naming
  the namespace and the container, and an exclusive lock on it held until the restore ends);
  a restore that fails removes what it claimed;
- `sweep` removes every directory whose container is gone, or no longer mounts it (deleted by
  `ctr c rm`, `nerdctl rm`, the kubelet, and a new container made under the same name), and
  leaves those a restore in flight still holds. `torpor restore` and `torpor recover` sweep.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torpor.config import Config
from torpor.errors import ContainerdError, NotFound

if TYPE_CHECKING:
    from torpor.containerd.client import Client

DIR = "pod-files"
OWNER = "owner.json"


def root(cfg: Config) -> str:
    return os.path.join(cfg.runtime_state_dir, DIR)


@dataclass
class Claims:
    """The directories one restore made: locked while it runs, removed if it fails."""

    held: dict[str, int] = field(default_factory=dict)   # directory -> its locked owner fd

    def claim(self, directory: str, namespace: str, container: str) -> None:
        """Make `directory`, record who it is for and lock it, before anything is written into
        it: the record appears locked (written beside, locked, then renamed into place), so no
        sweep sees it unlocked, and a restore that fails while filling it removes it."""
        os.makedirs(directory, mode=0o700, exist_ok=True)
        record = os.path.join(directory, OWNER)
        partial = record + ".partial"
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, json.dumps({"namespace": namespace, "container": container}).encode())
            os.rename(partial, record)
        except BaseException:
            os.close(fd)
            raise
        self.held[directory] = fd

    def drop_if_unused(self, directory: str) -> bool:
        """Remove a claimed `directory` nothing was put in but its owner record; whether it
        went."""
        if os.listdir(directory) != [OWNER]:
            return False
        shutil.rmtree(directory, ignore_errors=True)
        os.close(self.held.pop(directory))
        return True

    def release(self, failed: bool) -> None:
        for directory, fd in self.held.items():
            if failed:
                shutil.rmtree(directory, ignore_errors=True)
            os.close(fd)
        self.held.clear()


@contextlib.contextmanager
def claims() -> Iterator[Claims]:
    """The claims of one restore: on an error, every directory it made goes."""
    made = Claims()
    try:
        yield made
    except BaseException:
        made.release(failed=True)
        raise
    made.release(failed=False)


def sweep(client: Client, cfg: Config) -> list[str]:
    """Remove the sandbox-file directories whose container is gone or mounts them no more, in
    every namespace of `client`'s containerd; return them. A directory a restore still holds,
    or one without an owner record, is left."""
    from torpor.containerd.client import Client as ClientType

    try:
        entries = sorted(os.scandir(root(cfg)), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    removed: list[str] = []
    others: dict[str, Client] = {}
    try:
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            with _unclaimed(entry.path) as owner:
                if owner is None:
                    continue
                namespace, container = owner
                if namespace == client.namespace:
                    asked = client
                else:
                    if namespace not in others:
                        others[namespace] = ClientType(client.address, namespace)
                    asked = others[namespace]
                if _mounted_by(asked, container, entry.path):
                    continue
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
    finally:
        for other in others.values():
            other.close()
    return removed


@contextlib.contextmanager
def _unclaimed(directory: str) -> Iterator[tuple[str, str] | None]:
    """(namespace, container) of `directory`, locked for the caller; None when a restore holds
    it or it has no readable owner record."""
    try:
        fd = os.open(os.path.join(directory, OWNER), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        yield None
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        try:
            record = json.loads(os.read(fd, 4096))
            owner = (str(record["namespace"]), str(record["container"]))
        except (ValueError, KeyError, TypeError):
            yield None
            return
        yield owner
    finally:
        os.close(fd)


def _mounted_by(client: Client, container: str, directory: str) -> bool:
    """Whether `container` exists and its spec mounts something in `directory` (containerd
    unreachable or the namespace unknown: assumed so, nothing is removed)."""
    try:
        found = client.get_container(container)
    except NotFound:
        return False
    except ContainerdError:
        return True
    try:
        spec = json.loads(found.spec.value or b"{}")
    except ValueError:
        return True
    prefix = directory.rstrip("/") + "/"
    return any(isinstance(m, dict) and str(m.get("source", "")).startswith(prefix)
               for m in spec.get("mounts") or [])
