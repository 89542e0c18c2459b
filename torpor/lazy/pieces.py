"""The pieces of an answer to CRIU: bytes in memory, or a range of a pack this restore has
checked, sent by `sendfile` without passing through torpor.

A chunk stored raw in a pack whose digest this restore checked whole is such a range (its
block headers read and checked first, checked.py). Onto CRIU's Unix socket `sendfile` copies
nothing: the socket holds the pack's page-cache pages and CRIU's read copies from them, where
reading the bytes into torpor, joining its blocks and writing them out cost three copies and
a Python object per chunk. So the pack's file must not change until CRIU has read the
answer: it is the download's own file, renamed into place and never written again
(registry/blob_download.py). A filesystem that cannot splice its pages gets the bytes read
and sent instead.

An `OpenFile` owns its descriptor and closes it when the last piece or chunk naming it is
gone (a failure's traceback can hold one until the garbage collector runs), so a descriptor
number is never used once closed, and perhaps reused by another file.
"""

from __future__ import annotations

import errno
import os
import select
import socket
from dataclasses import dataclass

from torpor.errors import ImageError

_NO_SPLICE = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)


class OpenFile:
    """A file open for reading, closed when this object goes."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self) -> None:
        os.close(self.fd)


@dataclass(frozen=True, slots=True)
class FileRange:
    file: OpenFile
    offset: int
    length: int


Piece = bytes | memoryview | FileRange


def contents(piece: Piece) -> bytes:
    """The bytes of `piece` (a file range read)."""
    if not isinstance(piece, FileRange):
        return bytes(piece)
    data = os.pread(piece.file.fd, piece.length, piece.offset)
    if len(data) != piece.length:
        raise _short(piece, piece.length - len(data))
    return data


def send(sock: socket.socket, pieces: list[Piece]) -> int:
    """Every piece to `sock`, in order; the bytes sent."""
    total = 0
    for piece in pieces:
        if not isinstance(piece, FileRange):
            sock.sendall(piece)
            total += len(piece)
            continue
        offset, left = piece.offset, piece.length
        while left:
            try:
                sent = os.sendfile(sock.fileno(), piece.file.fd, offset, left)
            except BlockingIOError:   # a socket with a timeout
                writable = select.poll()
                writable.register(sock, select.POLLOUT)
                writable.poll()
                continue
            except OSError as e:
                if e.errno not in _NO_SPLICE:
                    raise
                sock.sendall(contents(FileRange(piece.file, offset, left)))
                sent = left
            if sent == 0:
                raise _short(piece, left)
            offset, left = offset + sent, left - sent
        total += piece.length
    return total


def _short(piece: FileRange, missing: int) -> ImageError:
    return ImageError(f"a pack ends {missing} bytes before the end of the page range at "
                      f"{piece.offset} its index holds")
