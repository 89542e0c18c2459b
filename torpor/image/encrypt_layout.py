"""Encrypting a built checkpoint image in its OCI layout, and decrypting one (docs/encryption.md).

`encrypt_layout` rewrites the image in place: the whole metadata becomes a layer of its own
(`...metadata.v1+json`), and it, the state layers (CRIU images, volumes, torpor's state) and the
runnable image's own layer (the read-write layer) are encrypted for the recipients, in ocicrypt's
format (torpor.image.ocicrypt), in parallel (the cryptography library releases the GIL); the
config keeps only its clear part (torpor.image.clear_metadata). New manifests and index follow,
index.json names the new index in place of the old, and the plain blobs are removed. The base
image's layers and the runnable config stay as they are.

`decrypt_layout` undoes the encryption of the layers (what `skopeo copy --decryption-key` does):
every encrypted layer is decrypted and checked before anything in the layout changes; the
metadata layer stays, in the clear, beside the clear config.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from torpor.errors import ImageError
from torpor.formats import mediatypes as mt
from torpor.formats.digests import sha256_digest
from torpor.formats.oci import Descriptor, OciDocument, stored_bytes
from torpor.image import clear_metadata, documents, ocicrypt, unpack
from torpor.image.build import BuiltImage
from torpor.image.encryption_keys import DecryptionKey, Recipient
from torpor.registry.layout import Layout, write_atomically

BlobChange = Callable[[Descriptor, str], Descriptor]   # (layer, staging dir) -> new layer


@dataclass(frozen=True)
class RewrittenImage:
    index: Descriptor
    runnable: Descriptor
    state: Descriptor
    layer_bytes: int      # its own blobs: the two configs, the state layers, the read-write layer


def encrypt_layout(layout_dir: str, recipients: Sequence[Recipient], ref_name: str | None = None,
                   workers: int = 0) -> RewrittenImage:
    """Encrypt the checkpoint image in `layout_dir` for `recipients` (at least one)."""
    layout = Layout(Path(layout_dir))
    image = unpack.open_layout(layout_dir, ref_name)
    if image.sealed:
        raise ImageError(f"the checkpoint image in {layout_dir} is already encrypted")
    config = Descriptor.from_json(image.state_manifest["config"], "state config")
    full = layout.read_small(config, unpack.CONFIG_LIMIT, "checkpoint metadata")

    def encrypt(layer: Descriptor, staging: str) -> Descriptor:
        source = str(layout.blob_path(layer.digest)) if layer.media_type != mt.METADATA_LAYER \
            else os.path.join(staging, "metadata.json")
        out = os.path.join(staging, secrets.token_hex(12))  # a private directory
        encrypted = ocicrypt.encrypt_blob(source, out, layer.media_type, recipients,
                                          durable=False)
        _move_in(layout, out, encrypted.digest)
        raw = {k: v for k, v in layer.to_json().items() if k != "annotations"}
        raw["annotations"] = {**layer.annotations, **encrypted.annotations}
        raw.update(mediaType=encrypted.media_type, digest=encrypted.digest, size=encrypted.size)
        return Descriptor(encrypted.media_type, encrypted.digest, encrypted.size, raw)

    def prepare(staging: str) -> Descriptor:
        with open(os.path.join(staging, "metadata.json"), "wb") as f:
            f.write(full)
        return Descriptor(mt.METADATA_LAYER, sha256_digest(full), len(full))

    redacted = clear_metadata.redact(image.metadata).dumps()
    return _rewrite(layout, image, ref_name, workers, encrypt, prepare, redacted)


def decrypt_layout(layout_dir: str, keys: Sequence[DecryptionKey], ref_name: str | None = None,
                   workers: int = 0) -> RewrittenImage:
    """Decrypt every encrypted layer of the checkpoint image in `layout_dir`."""
    layout = Layout(Path(layout_dir))
    image = unpack.open_layout(layout_dir, ref_name)
    unpack.check_keys(image, keys)
    with tempfile.TemporaryDirectory(prefix=".torpor-check-", dir=layout_dir) as work:
        unpack.full_metadata(image, layout_dir, keys, work)

    def decrypt(layer: Descriptor, staging: str) -> Descriptor:
        if not ocicrypt.is_encrypted(layer.media_type):
            return layer
        path, plain, _ = unpack.open_blob(layout, layer, keys, staging)
        _move_in(layout, path, plain.digest)
        return plain

    return _rewrite(layout, image, ref_name, workers, decrypt, None, None)


def encrypt_built(built: BuiltImage, recipients: Sequence[Recipient],
                  ref_name: str | None = None) -> BuiltImage:
    """A freshly built image, encrypted in its layout (for `torpor checkpoint`)."""
    rewritten = encrypt_layout(str(built.layout), recipients, ref_name)
    return replace(built, index=rewritten.index, runnable=rewritten.runnable,
                   state=rewritten.state, compressed_bytes=rewritten.layer_bytes)


def copy_layout(source: str, target: str) -> str:
    """A copy of the layout `source` at `target` (new): blobs hard-linked where the file system
    allows, copied otherwise; for encrypting without touching the source."""
    root = Path(source)
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        out = Path(target) / rel
        if path.is_symlink():
            raise ImageError(f"{path} is a symlink: an OCI layout holds only files")
        if path.is_dir():
            out.mkdir(mode=0o700, parents=True, exist_ok=True)
            continue
        out.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            os.link(path, out)
        except OSError:
            shutil.copyfile(path, out)
            os.chmod(out, 0o600)
    return target


def _move_in(layout: Layout, path: str, digest: str) -> None:
    layout.blob_dir(digest)
    os.chmod(path, 0o600)
    os.replace(path, layout.blob_path(digest))


def _rewrite(layout: Layout, image: unpack.CheckpointImage, ref_name: str | None, workers: int,
             change: BlobChange, prepare: Callable[[str], Descriptor] | None,
             new_config: bytes | None) -> RewrittenImage:
    """New blobs for the state layers and the runnable image's own layers (`change`), a new
    config when given, then new manifests and index; the blobs no longer named are removed."""
    staging = tempfile.mkdtemp(prefix=".torpor-rewrite-", dir=layout.root)
    try:
        state_layers = image.state_layers
        if prepare is not None:
            state_layers = [prepare(staging), *state_layers]
        own = image.own_layers
        jobs = [*state_layers, *own]
        with ThreadPoolExecutor(max_workers=workers or min(8, os.cpu_count() or 1)) as pool:
            changed = list(pool.map(lambda layer: change(layer, staging), jobs))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    new_state_layers, new_own = changed[:len(state_layers)], changed[len(state_layers):]

    state_doc = json.loads(json.dumps(image.state_manifest))
    state_doc["layers"] = [d.to_json() for d in new_state_layers]
    if new_config is not None:
        state_doc["config"] = {**state_doc["config"], "digest": sha256_digest(new_config),
                               "size": len(new_config)}
        layout.write_small(sha256_digest(new_config), new_config, durable=False)
    runnable_doc = json.loads(json.dumps(image.runnable_manifest))
    base = len(runnable_doc.get("layers", [])) - len(own)
    runnable_doc["layers"] = [*runnable_doc.get("layers", [])[:base],
                              *(d.to_json() for d in new_own)]
    state = _write_doc(layout, state_doc, image.state)
    runnable = _write_doc(layout, runnable_doc, image.runnable)
    index_doc = json.loads(json.dumps(_read_doc(layout, image.index)))
    index_doc["manifests"] = [
        state.to_json() if entry.get("digest") == image.state.digest else
        runnable.to_json() if entry.get("digest") == image.runnable.digest else entry
        for entry in index_doc.get("manifests", [])]
    index = _write_doc(layout, index_doc, image.index)
    _retag(layout, image.index.digest, index)
    kept = {index.digest, state.digest, runnable.digest, state_doc["config"]["digest"],
            *(d.digest for d in (*new_state_layers, *new_own))}
    for old in (image.index, image.state, image.runnable, *image.state_layers, *own,
                Descriptor.from_json(image.state_manifest["config"], "config")):
        if old.digest not in kept:
            layout.blob_path(old.digest).unlink(missing_ok=True)
    configs = [Descriptor.from_json(doc["config"], "config") for doc in (state_doc, runnable_doc)]
    return RewrittenImage(index, runnable, state,
                          stored_bytes((*configs, *new_state_layers, *new_own)))


def _read_doc(layout: Layout, descriptor: Descriptor) -> OciDocument:
    data = layout.read_small(descriptor, unpack.MANIFEST_LIMIT, "manifest")
    document: OciDocument = json.loads(data)
    return document


def _write_doc(layout: Layout, document: OciDocument, old: Descriptor) -> Descriptor:
    data = documents.canonical(document)
    digest = sha256_digest(data)
    layout.write_small(digest, data, durable=False)
    raw: dict[str, Any] = {**old.raw, "digest": digest, "size": len(data)}
    return Descriptor(old.media_type, digest, len(data), raw)


def _retag(layout: Layout, old_digest: str, new: Descriptor) -> None:
    """index.json names `new` wherever it named the old index (same annotations)."""
    index = layout.read_index()
    index["manifests"] = [
        {**entry, "digest": new.digest, "size": new.size}
        if isinstance(entry, dict) and entry.get("digest") == old_digest else entry
        for entry in index.get("manifests", [])]
    write_atomically(layout.root / "index.json", json.dumps(index, indent=2).encode())
