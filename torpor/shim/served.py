"""torpor-runc's restore in torpord's child: `runc restore` runs in the caller, below the shim.

runc restores a container detached: CRIU's restored init is reparented to the nearest subreaper
above the process that ran runc, which must be containerd's shim (it waits for the init and
reports its exit). So when torpor-runc's compiled front end (frontend.c) hands a `restore
--detach` to torpord, it hands over a channel with fds 0-2 (a SOCK_SEQPACKET socket), and the
child here, having done all of torpor's work, asks the front end to run runc, in its own
process, below the shim. Packets, NUL-separated fields:

    here -> front end: b"run" ARGC ARGV... ENVC KEY=VALUE...
    front end -> here: b"pid" N (none where it could not start it), then b"ran" CODE (the exit
                       status; -SIGNAL for a signal), runc left unreaped, so that N still
                       names it while this side kills its tree past the deadline
    here -> front end: b"done" (then the front end reaps it)

Without a channel (no torpord, or a restore run in torpor-runc's own process) nothing here is
used: torpor.shim.runc runs runc as a child of torpor-runc.
"""

from __future__ import annotations

import os
import select
import socket

from torpor.errors import RestoreError

KILLED_WAIT_S = 30.0    # for the front end to see a killed runc end
MAX_PACKET = 1 << 20

_channel: socket.socket | None = None


class FrontEndGone(RestoreError):
    """The channel ended before runc's status came: the front end (and so runc, which dies with
    it) is gone, or it refused to start runc because its caller is going away."""


def attach(fd: int | None) -> None:
    """The channel torpord's child got with the request (torpor.service.child, which also has
    the child end through the channel rather than by SIGTERM: a front end that goes away or is
    told to stop is seen there, and what runc left is removed before the child exits)."""
    global _channel
    if fd is None:
        _channel = None
        return
    os.set_inheritable(fd, False)   # never runc's, when this child execs it (help, errors)
    _channel = socket.socket(fileno=fd)


def active() -> bool:
    return _channel is not None


def run(argv: list[str], limit_s: float | None) -> int | None:
    """Run `argv` (the runtime's path first) in the front end, with this process's
    environment: its exit status (negative: killed by that signal), or None past `limit_s`,
    when runc and everything it started were killed (as torpor.shim.runc.run_within).
    FrontEndGone when the front end went away first."""
    channel = _channel
    assert channel is not None
    env = [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in os.environ.items()]
    fields = [b"run", str(len(argv)).encode(), *map(os.fsencode, argv), str(len(env)).encode(),
              *env]
    try:
        channel.sendall(b"\0".join(fields) + b"\0")
        first = _receive(channel, None)
        assert first is not None   # (no timeout)
        kind, value = first
        pid = value if kind == b"pid" else None
        timed_out = False
        if pid is not None:
            ran = _receive(channel, limit_s)
            if ran is None:
                timed_out = True
                from torpor.capture import deadlines

                if _parent_of(pid) == _front_end_pid(channel):   # still runc (unreaped)
                    deadlines.kill_tree(pid)
                ran = _receive(channel, KILLED_WAIT_S)
                if ran is None:   # not seen to end: what is left is removed all the same
                    return None
            if ran[0] != b"ran":
                raise OSError(f"the front end answered {ran[0]!r} for runc's status")
            value = ran[1]
        elif kind != b"ran":
            raise OSError(f"the front end answered {kind!r} to run runc")
        channel.sendall(b"done")
    except OSError as e:
        raise FrontEndGone(f"torpor-runc's front end went away while runc restore ran: {e}",
                           hint="the shim ended torpor-runc (containerd's call was cancelled "
                           "or timed out); what runc restored was removed") from None
    return None if timed_out else value


def _receive(channel: socket.socket, timeout_s: float | None) -> tuple[bytes, int] | None:
    """The next packet (kind, number); None when `timeout_s` passed first."""
    if timeout_s is not None:
        waiting = select.poll()
        waiting.register(channel, select.POLLIN)
        if not waiting.poll(max(timeout_s, 0.0) * 1000):
            return None
    packet = channel.recv(MAX_PACKET)
    if not packet:
        raise OSError("the channel closed")
    kind, _, number = packet.partition(b"\0")
    try:
        return kind, int(number)
    except ValueError:
        raise OSError(f"a packet that is not the front end's: {packet[:40]!r}") from None


def _front_end_pid(channel: socket.socket) -> int:
    """The process that made the channel (its peer, a socketpair's maker): the front end."""
    from torpor.handoff import peer_credentials

    return peer_credentials(channel)[0]


def _parent_of(pid: int) -> int | None:
    """`pid`'s parent, None when there is no such process: a pid whose parent is not the front
    end is no longer runc (the front end died, runc was reaped elsewhere, the pid reused)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
