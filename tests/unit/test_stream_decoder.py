"""torpor-decoder, containerd's stream processor of encrypted layers, run as containerd runs it:
a child process with the layer on stdin, the payload on fd 3 (imgcrypt's Payload as JSON in a
protobuf Any), STREAM_PROCESSOR_MEDIATYPE; and the node's own keys and recipients
([restore] decryption_keys, [image] encrypt_recipients)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
import zstandard
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from google.protobuf import any_pb2

from torpor.config import Config
from torpor.errors import ConfigError
from torpor.formats import mediatypes as mt
from torpor.image import ocicrypt
from torpor.image.encryption_keys import keys_in, node_keys, node_recipients, parse_recipient


def key_pair(directory: Path, name: str) -> tuple[Path, Path]:
    private = ec.generate_private_key(ec.SECP256R1())
    pem, pub = directory / f"{name}.pem", directory / f"{name}.pub"
    pem.write_bytes(private.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    pub.write_bytes(private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pem, pub


def a_tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        data = os.urandom(300_000) + b"the workload's secret"
        info = tarfile.TarInfo("data/memory")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def encrypted_layer(tmp_path: Path, plain: bytes, media_type: str,
                    pub: Path) -> tuple[Path, dict[str, Any]]:
    src = tmp_path / "plain-blob"
    src.write_bytes(plain)
    sealed = ocicrypt.encrypt_blob(str(src), str(tmp_path / "blob"), media_type,
                                   [parse_recipient(f"jwe:{pub}")])
    return tmp_path / "blob", {"mediaType": sealed.media_type, "digest": sealed.digest,
                               "size": sealed.size, "annotations": sealed.annotations}


def payload(descriptor: dict[str, Any]) -> bytes:
    """What containerd writes on fd 3: imgcrypt's Payload (JSON) in a protobuf Any."""
    wrapped = any_pb2.Any(type_url="io.containerd.ocicrypt.v1.Payload",
                          value=json.dumps({"DecryptConfig": {"Parameters": None},
                                            "Descriptor": descriptor}).encode())
    return wrapped.SerializeToString()


def run_decoder(blob: Path, descriptor: dict[str, Any] | None, *args: str,
                media_type: str | None = None) -> subprocess.CompletedProcess[bytes]:
    """The decoder as containerd's binary processor runs it."""
    env = {**os.environ, "STREAM_PROCESSOR_MEDIATYPE": media_type or
           (descriptor or {}).get("mediaType", "")}
    read, write = os.pipe()
    try:
        if descriptor is not None:
            os.write(write, payload(descriptor))
        os.close(write)
        cmd = [sys.executable, "-m", "torpor.image.stream_decoder", *args]
        if descriptor is not None:   # the payload's pipe as fd 3
            cmd = ["bash", "-c", f'exec "$0" "$@" 3<&{read}', *cmd]
        out = blob.with_name("decoded")   # a file: on a pipe, a failure holds it open 1 s
        with open(blob, "rb") as stdin, open(out, "wb") as stdout:
            done = subprocess.run(cmd, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE,
                                  env=env, timeout=60, pass_fds=(read,))
        return subprocess.CompletedProcess(done.args, done.returncode, out.read_bytes(),
                                           done.stderr)
    finally:
        os.close(read)


@pytest.mark.parametrize("media_type,compress,decompress", [
    (mt.OCI_LAYER_ZSTD, zstandard.ZstdCompressor().compress, True),
    (mt.OCI_LAYER_GZIP, lambda data: gzip.compress(data, mtime=0), False),   # the same twice
    (mt.OCI_LAYER_TAR, lambda data: data, True),
])
def test_containerd_gets_the_layer_it_asked_for(tmp_path: Path, media_type: str, compress: Any,
                                                decompress: bool) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    _, pub = key_pair(keys, "node")
    tar = a_tar()
    blob, descriptor = encrypted_layer(tmp_path, compress(tar), media_type, pub)
    done = run_decoder(blob, descriptor, "--decryption-keys-path", str(keys),
                       *(["--decompress"] if decompress else []))
    assert done.returncode == 0, done.stderr
    # --decompress: the plain tar (the .tar processor returns it); else the plain blob
    assert done.stdout == (tar if decompress else compress(tar))


def test_a_layer_for_other_keys_damaged_or_without_payload_gives_nothing(tmp_path: Path) -> None:
    keys, other = tmp_path / "keys", tmp_path / "other"
    keys.mkdir()
    other.mkdir()
    _, pub = key_pair(keys, "node")
    key_pair(other, "stranger")
    blob, descriptor = encrypted_layer(tmp_path, zstandard.ZstdCompressor().compress(a_tar()),
                                       mt.OCI_LAYER_ZSTD, pub)
    # a node without the key: the reason, in words, for containerd's pull error
    done = run_decoder(blob, descriptor, "--decryption-keys-path", str(other), "--decompress")
    assert done.returncode == 1 and done.stdout == b""
    assert b"torpor-decoder: layer sha256:" in done.stderr
    assert b"encrypted for other keys" in done.stderr, done.stderr
    # one byte changed: refused before a byte of it reaches containerd
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 1
    blob.write_bytes(bytes(data))
    done = run_decoder(blob, {**descriptor, "digest": "sha256:" + hashlib.sha256(
        data).hexdigest()}, "--decryption-keys-path", str(keys), "--decompress")
    assert done.returncode == 1 and done.stdout == b""
    assert b"HMAC" in done.stderr, done.stderr
    # no key at all on the node
    done = run_decoder(blob, descriptor, "--decryption-keys-path", str(tmp_path / "none"))
    assert done.returncode == 1 and b"cannot read decryption keys" in done.stderr, done.stderr
    (tmp_path / "empty").mkdir()
    done = run_decoder(blob, descriptor, "--decryption-keys-path", str(tmp_path / "empty"))
    assert done.returncode == 1 and b"this node holds no private key" in done.stderr, done.stderr
    # no payload: containerd was not told to hand over the layer's descriptor
    done = run_decoder(blob, None, "--decryption-keys-path", str(keys),
                       media_type=descriptor["mediaType"])
    assert done.returncode == 1 and b"no payload on fd 3" in done.stderr, done.stderr


def test_a_key_directory_holds_private_keys_and_passes_over_public_ones(tmp_path: Path) -> None:
    pem, _ = key_pair(tmp_path, "node")           # node.pub beside node.pem: passed over
    (tmp_path / ".hidden").write_text("not a key")
    assert [k.source for k in keys_in([str(tmp_path)])] == [str(pem)]
    (tmp_path / "junk").write_text("not a key")
    with pytest.raises(ConfigError, match="junk is not a private key"):
        keys_in([str(tmp_path)])
    with pytest.raises(ConfigError, match="cannot read decryption keys"):
        keys_in([str(tmp_path / "missing")])


def test_the_nodes_keys_and_recipients_join_the_ones_given(tmp_path: Path) -> None:
    pem, pub = key_pair(tmp_path, "node")
    cfg = Config({"image": {"encrypt_recipients": [f"jwe:{pub}"]},
                  "restore": {"decryption_keys": [str(pem)]}})
    given = parse_recipient(f"jwe:{pub}")
    assert [r.source for r in node_recipients(cfg)] == [str(pub)]
    assert len(node_recipients(cfg, [given])) == 1       # the same file once
    assert [k.source for k in node_keys(cfg)] == [str(pem)]
    assert node_recipients(Config()) == () and node_keys(Config()) == ()
    with pytest.raises(ConfigError, match="is not jwe:"):
        Config({"image": {"encrypt_recipients": [str(pub)]}})
    with pytest.raises(ConfigError, match="not an absolute path"):
        Config({"restore": {"decryption_keys": ["keys"]}})


def test_a_key_directory_passes_over_der_public_keys_and_reads_bundles(tmp_path: Path) -> None:
    pem, pub = key_pair(tmp_path, "node")
    key = serialization.load_pem_public_key(pub.read_bytes())
    (tmp_path / "node.der").write_bytes(key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo))
    bundle = tmp_path / "bundle.pem"       # a private key with its public half, one file
    bundle.write_bytes(pem.read_bytes() + pub.read_bytes())
    assert [k.source for k in keys_in([str(tmp_path)])] == [str(bundle), str(pem)]


def test_a_decoder_killed_mid_layer_leaves_no_plaintext(tmp_path: Path) -> None:
    """containerd SIGKILLs a processor whose pull it gives up: what was decrypted so far was
    in a file with no name, which the kernel drops."""
    keys, scratch = tmp_path / "keys", tmp_path / "scratch"
    keys.mkdir()
    scratch.mkdir()
    _, pub = key_pair(keys, "node")
    blob, descriptor = encrypted_layer(tmp_path, os.urandom(4 << 20), mt.OCI_LAYER_ZSTD, pub)
    read, write = os.pipe()
    os.write(write, payload(descriptor))
    os.close(write)
    data = blob.read_bytes()
    with open(tmp_path / "out", "wb") as out:
        decoder = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{read}', sys.executable, "-m",
             "torpor.image.stream_decoder", "--decryption-keys-path", str(keys),
             "--scratch", str(scratch)],
            stdin=subprocess.PIPE, stdout=out, pass_fds=(read,))
    os.close(read)
    assert decoder.stdin is not None
    decoder.stdin.write(data[: len(data) // 2])
    decoder.stdin.flush()
    deadline = time.monotonic() + 10
    while decoder.poll() is None and time.monotonic() < deadline:
        fds = Path(f"/proc/{decoder.pid}/fd")
        if any("(deleted)" in os.readlink(f) or str(scratch) in os.readlink(f)
               for f in fds.iterdir() if f.is_symlink()):
            break                        # its spool is open: half the layer is in it
        time.sleep(0.05)
    decoder.kill()
    decoder.wait()
    decoder.stdin.close()
    assert list(scratch.iterdir()) == []
    assert (tmp_path / "out").read_bytes() == b""
