"""`torpor-decoder`: containerd's stream processor for encrypted layers, in place of imgcrypt's
`ctd-decoder`, so that a node restores (and runs) the images torpor encrypts with nothing but
torpor installed.

containerd runs a stream processor for each layer whose media type a `[stream_processors.ID]`
table of its config accepts, as it unpacks an image: the layer's blob on stdin, what the layer
becomes on stdout, the input media type in STREAM_PROCESSOR_MEDIATYPE, and on fd 3 the payload
that the pull gave for ID: a protobuf `Any` holding imgcrypt's Payload as JSON (the layer's
descriptor, with its encryption annotations). containerd gives that payload only to the IDs
`io.containerd.ocicrypt.decoder.v1.tar` and `...v1.tar.gzip`, and only where the pull asked for
it: the CRI plugin's "node" key model (its default) with its local pull (containerd 2.x's
`use_local_image_pull = true`: its transfer service gives none), or `ctr`/nerdctl with
imgcrypt's options.

    [stream_processors."io.containerd.ocicrypt.decoder.v1.tar"]
      accepts = ["application/vnd.oci.image.layer.v1.tar+encrypted",
                 "application/vnd.oci.image.layer.v1.tar+zstd+encrypted"]
      returns = "application/vnd.oci.image.layer.v1.tar"
      path = "/usr/local/bin/torpor-decoder"
      args = ["--decryption-keys-path", "/etc/containerd/ocicrypt/keys", "--decompress"]
    [stream_processors."io.containerd.ocicrypt.decoder.v1.tar.gzip"]
      accepts = ["application/vnd.oci.image.layer.v1.tar+gzip+encrypted"]
      returns = "application/vnd.oci.image.layer.v1.tar+gzip"
      path = "/usr/local/bin/torpor-decoder"
      args = ["--decryption-keys-path", "/etc/containerd/ocicrypt/keys"]

(`torpor runtime-config containerd --decryption-keys DIR` writes these.) `tar+zstd+encrypted`
rides on the `.tar` ID, because no ID for zstd gets a payload: `--decompress` makes the output the
plain tar that ID returns.

Unlike ocicrypt, nothing decrypted leaves this program before it is checked: the plaintext goes
to an anonymous file (O_TMPFILE, mode 0600, in `--scratch`, /var/tmp by default: on disk, not
in memory), which the kernel removes however the program ends, even by containerd's SIGKILL;
torpor.image.ocicrypt.decrypt_stream checks the ciphertext's size and digest, its HMAC and the
sealed plain digest; only then does the plaintext go to stdout. A layer no key opens, or any
damage, exits 1 with the reason on stderr, which containerd puts in its pull error.
Integrity is not provenance: anyone holding a recipient's public key can make a layer that
passes; who made the image is the signature's business (docs/signing.md), and containerd checks
the uncompressed layer against the image config's diff_ids as always.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

from torpor.errors import DecryptionError, TorporError
from torpor.formats import mediatypes as mt

PAYLOAD_FD = 3
PAYLOAD_TYPE = "io.containerd.ocicrypt.v1.Payload"
MEDIA_TYPE_ENV = "STREAM_PROCESSOR_MEDIATYPE"
HOLD_OUTPUT_S = 1.0
SCRATCH = "/var/tmp"


def read_payload(raw: bytes) -> dict[str, Any]:
    """The layer's descriptor, from the payload containerd writes on fd 3."""
    from google.protobuf import any_pb2
    from google.protobuf.message import DecodeError

    try:
        wrapped = any_pb2.Any.FromString(raw)
    except DecodeError:
        raise DecryptionError("the payload on fd 3 is not a protobuf Any") from None
    if wrapped.type_url.rsplit("/", 1)[-1] != PAYLOAD_TYPE:
        raise DecryptionError(f"the payload on fd 3 is a {wrapped.type_url!r}, not imgcrypt's "
                           f"{PAYLOAD_TYPE}")
    try:
        payload = json.loads(wrapped.value)
    except ValueError:
        raise DecryptionError("the payload on fd 3 is not JSON") from None
    descriptor = payload.get("Descriptor") if isinstance(payload, dict) else None
    if not isinstance(descriptor, dict) or not descriptor.get("digest"):
        raise DecryptionError("the payload on fd 3 holds no layer descriptor")
    return descriptor


def decode(stdin: BinaryIO, stdout: BinaryIO, descriptor: dict[str, Any],
           key_paths: Sequence[str], *, media_type: str, decompress: bool,
           scratch: str = SCRATCH) -> int:
    """The layer on `stdin`, decrypted (and with `decompress`, uncompressed) onto `stdout`;
    the bytes written."""
    from torpor.image import ocicrypt
    from torpor.image.encryption_keys import keys_in

    declared = str(descriptor.get("mediaType") or "")
    if media_type and declared and media_type != declared:
        raise DecryptionError(f"containerd says the layer is {media_type}, its descriptor "
                           f"{declared}")
    media_type = media_type or declared
    if not ocicrypt.is_encrypted(media_type):
        raise DecryptionError(f"layer {descriptor.get('digest')} is not encrypted ({media_type})")
    keys = keys_in(key_paths)
    if not keys:
        recipients = ", ".join(ocicrypt.layer_recipients(descriptor.get("annotations") or {}))
        raise DecryptionError(f"layer {descriptor.get('digest')} is encrypted (recipients: "
                              f"{recipients or 'none readable'}) and this node holds no private "
                              f"key: {', '.join(key_paths)} has none")
    size = descriptor.get("size")
    free = _free_bytes(scratch)
    if isinstance(size, int) and size > free:
        raise DecryptionError(f"layer {descriptor.get('digest')} is {size} bytes and {scratch} "
                              f"has {free} free to check it in",
                              hint="give --scratch a directory on a larger file system")
    with _anonymous_file(scratch) as plain_file:
        with open(stdin.fileno(), "rb", buffering=0, closefd=False) as source:
            plain = ocicrypt.decrypt_stream(source, plain_file,
                                            {**descriptor, "mediaType": media_type}, keys,
                                            keys_from=", ".join(key_paths))
        plain_file.flush()
        plain_file.seek(0)
        if decompress:
            return _uncompressed(plain_file, stdout, plain.media_type)
        shutil.copyfileobj(plain_file, stdout, 1 << 20)
        return plain.size


def _free_bytes(directory: str) -> int:
    try:
        found = os.statvfs(directory)
    except OSError as e:
        raise DecryptionError(f"cannot use {directory} to check layers in: {e.strerror}",
                              hint="give --scratch a directory on disk") from None
    return found.f_bavail * found.f_frsize


@contextlib.contextmanager
def _anonymous_file(directory: str) -> Iterator[BinaryIO]:
    """A file with no name in `directory` (mode 0600): gone when its last descriptor closes."""
    try:
        fd = os.open(directory, os.O_TMPFILE | os.O_RDWR, 0o600)
    except OSError:   # a file system without O_TMPFILE: a named file, unlinked at once
        fd, name = tempfile.mkstemp(prefix=".torpor-decoder-", dir=directory)
        os.unlink(name)
    with open(fd, "w+b") as f:
        yield f


def _uncompressed(src: BinaryIO, out: BinaryIO, media_type: str) -> int:
    written = 0
    if media_type == mt.OCI_LAYER_ZSTD:
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(src, read_across_frames=True)
        while chunk := reader.read(1 << 20):
            out.write(chunk)
            written += len(chunk)
        return written
    if media_type == mt.OCI_LAYER_GZIP:
        inflate = zlib.decompressobj(zlib.MAX_WBITS | 16)
        while chunk := src.read(1 << 20):
            data = inflate.decompress(chunk)
            out.write(data)
            written += len(data)
        data = inflate.flush()
        out.write(data)
        return written + len(data)
    while chunk := src.read(1 << 20):
        out.write(chunk)
        written += len(chunk)
    return written


def _arguments(argv: Sequence[str]) -> tuple[list[str], bool, str]:
    paths: list[str] = []
    decompress, scratch = False, SCRATCH
    items = iter(argv)
    for arg in items:
        if arg == "--decompress":
            decompress = True
        elif arg in ("--decryption-keys-path", "--scratch"):
            value = next(items, None)
            if not value:
                raise DecryptionError(f"{arg} needs a value")
            if arg == "--scratch":
                scratch = value
            else:
                paths.append(value)
        else:
            raise DecryptionError(f"unknown argument {arg!r}")
    if not paths:
        raise DecryptionError("no --decryption-keys-path: where are this node's keys?")
    return paths, decompress, scratch


def main(argv: Sequence[str] | None = None) -> int:
    try:
        paths, decompress, scratch = _arguments(sys.argv[1:] if argv is None else argv)
        try:
            with os.fdopen(PAYLOAD_FD, "rb") as payload:
                descriptor = read_payload(payload.read())
        except OSError:
            raise DecryptionError(
                "containerd gave no payload on fd 3, so the layer's keys are unknown: name this "
                "processor io.containerd.ocicrypt.decoder.v1.tar or .tar.gzip, and pull through "
                "the CRI plugin (image_decryption key_model \"node\", local pull) or with "
                "imgcrypt's options") from None
        decode(sys.stdin.buffer, sys.stdout.buffer, descriptor, paths,
               media_type=os.environ.get(MEDIA_TYPE_ENV, ""), decompress=decompress,
               scratch=scratch)
        sys.stdout.buffer.flush()
    except TorporError as e:
        return _failed(str(e))
    except BrokenPipeError:
        return _failed("containerd stopped reading the layer")
    except Exception as e:   # a damaged stream inside a sound layer (zstd, gzip), a full disk
        return _failed(f"{type(e).__name__}: {e}")
    return 0


def _failed(why: str) -> int:
    """Exit 1 with `why` on stderr, which containerd makes its error, where it reads it: it asks
    for a processor's exit status as soon as the layer's output ends, and takes a status it has
    not reaped yet for success (core/diff/apply.go, Err() after the copy). So the output ends
    only after this process has exited: a child holds stdout open for a moment. The layer then
    fails with these words rather than as an empty layer of the wrong digest."""
    sys.stderr.write(f"torpor-decoder: {why}\n")
    sys.stderr.flush()
    if stat.S_ISFIFO(os.fstat(1).st_mode) and os.fork() == 0:
        # stdout alone: containerd waits on stdin's and stderr's copies too before it reaps
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        os.close(0)
        os.close(2)
        time.sleep(HOLD_OUTPUT_S)
        os._exit(0)
    return 1


if __name__ == "__main__":
    sys.exit(main())
