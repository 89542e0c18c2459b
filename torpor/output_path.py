"""Paths a user gives torpor to write a checkpoint into (-o DIR, an OCI layout, a kubelet
archive): what goes there is a workload's memory, so nobody but those who may read it anyway
may be able to reach into it while it is written.

Those are root, the user torpor runs as, and the user who ran torpor through sudo (SUDO_UID,
which only root can set). A directory torpor writes into is new (made 0700), or an existing
one owned by one of them (then made 0700); every directory above it, and every symbolic link
on the way, must be one that only they can change: owned by one of them, and writable by
nobody else unless it is sticky (/tmp). Otherwise its owner could chmod it back, or swap it
for a directory or a file of their own, and read the dump as it is written. A refusal names
the path and its owner, before anything is written.

Stdlib only.
"""

from __future__ import annotations

import os
import stat

from torpor.errors import TorporError


def trusted_uids() -> frozenset[int]:
    uids = {0, os.geteuid()}
    sudo = os.environ.get("SUDO_UID", "")
    if os.geteuid() == 0 and sudo.isdigit():
        uids.add(int(sudo))
    return frozenset(uids)


def check_parents(path: str, what: str, error: type[TorporError]) -> None:
    """Refuse `path` when a directory above it (as given, and with links resolved), or a
    link on the way (`path` itself included), is one another user can change."""
    trusted = trusted_uids()
    absolute = os.path.abspath(path)
    for chain in ([*_ancestors(absolute), absolute], _ancestors(os.path.realpath(absolute))):
        for place in chain:
            try:
                st = os.lstat(place)
            except FileNotFoundError:
                continue
            link = stat.S_ISLNK(st.st_mode)
            if link or (stat.S_ISDIR(st.st_mode) and place != absolute):
                _refuse_unless_trusted(place, st, trusted, what, absolute, error, link)


def check_dir(path: str, what: str, error: type[TorporError], *,
              must_be_empty: bool = True) -> bool:
    """Refuse a directory torpor is about to write `what` into, changing nothing: its parents
    (check_parents); if it exists, anything but a directory (an empty one, with
    `must_be_empty`) owned by a trusted user. Returns whether it exists."""
    absolute = os.path.abspath(path)
    check_parents(absolute, what, error)
    try:
        st = os.stat(absolute)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode) or (must_be_empty and os.listdir(absolute)):
        raise error(f"{absolute} exists and is not an empty directory",
                    hint="pick a new -o DIR or remove it")
    if st.st_uid not in trusted_uids():
        raise error(f"{absolute} belongs to {_user(st.st_uid)}, who could read {what} torpor "
                    "would write there", hint="give a path torpor may create, or a directory "
                    "of your own")
    return True


def prepare_dir(path: str, what: str, error: type[TorporError], *,
                must_be_empty: bool = True, create: bool = True) -> bool:
    """check_dir, then an existing directory made 0700, a new one made (0700) unless not
    `create` (its writer makes it). Returns whether it was made here."""
    absolute = os.path.abspath(path)
    if check_dir(absolute, what, error, must_be_empty=must_be_empty):
        os.chmod(absolute, 0o700)
        return False
    if create:
        os.makedirs(absolute, mode=0o700)
    return create


def _ancestors(path: str) -> list[str]:
    out = []
    parent = os.path.dirname(path)
    while True:
        out.append(parent)
        up = os.path.dirname(parent)
        if up == parent:
            break
        parent = up
    return out[::-1]


def _refuse_unless_trusted(place: str, st: os.stat_result, trusted: frozenset[int], what: str,
                           path: str, error: type[TorporError], writable_ok: bool) -> None:
    if st.st_uid not in trusted:
        raise error(f"{place} belongs to {_user(st.st_uid)}, who could swap {path} for a place "
                    f"of their own and read {what} torpor would write there",
                    hint="give a path under directories only root or you can change")
    others_write = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if not writable_ok and others_write and not st.st_mode & stat.S_ISVTX:
        raise error(f"{place} is writable by others (mode {stat.S_IMODE(st.st_mode):o}), who "
                    f"could swap {path} for a place of their own and read {what} torpor would "
                    "write there", hint="give a path under directories only root or you can "
                    "change")


def _user(uid: int) -> str:
    try:
        import pwd

        return f"user {pwd.getpwuid(uid).pw_name} ({uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"
