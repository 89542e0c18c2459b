"""`torpor push SOURCE [REF]`: a local checkpoint (an image in the store, an OCI layout, or a
checkpoint directory, packed first) to a registry.

Steps: 1. find the source; 2. a checkpoint directory only: compress it into an OCI layout in
scratch space (its base image comes from containerd); 3. with recipients (--encrypt-recipient
and the node's [image] encrypt_recipients): encrypt a copy of the layout in scratch space
(image.encrypt_layout; the source is left as it is), unless the node's are the only ones and the
image is encrypted already (its checkpoint encrypted it for them); 4. push the
layout's blobs (cross-repo mounts where the registry has them, resumable uploads, every blob
digest-checked), then its manifests; 5. with --sign KEY (or [image] signing_key): sign the
pushed index, as cosign does (torpor.signing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torpor import signing, tally
from torpor.config import Config
from torpor.containerd.client import Client
from torpor.errors import ImageError
from torpor.image import build as image_build
from torpor.image import encrypt_layout, unpack
from torpor.image.encryption_keys import Recipient, node_recipients
from torpor.image.store import Store
from torpor.ops.access import NO_CREDENTIALS, RegistryAccess
from torpor.ops.sources import SourceKind, kind_of, registry_options, tag_of
from torpor.registry import push_layout
from torpor.reporting import SILENT, Progress
from torpor.signing import own


@dataclass(frozen=True)
class PushResult:
    reference: str
    digest: str
    uploaded: int
    mounted: int
    existing: int
    bytes_uploaded: int
    signature: str | None = None      # where its signature is (REPO:sha256-<hex>.sig)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def push(client: Client | None, source: str, ref: str, cfg: Config,
         access: RegistryAccess = NO_CREDENTIALS, progress: Progress = SILENT,
         recipients: Sequence[Recipient] = (), sign: str | None = None) -> PushResult:
    store = Store(cfg.image_store)
    asked = bool(recipients)
    recipients = node_recipients(cfg, recipients) if cfg.image_encrypt_recipients else recipients
    key_path = sign or cfg.image_signing_key
    signing_key = signing.load_signing_key(key_path) if key_path else None
    kind = kind_of(source, store)
    if kind is SourceKind.REGISTRY:
        raise ImageError(f"{source} is not a local checkpoint", hint="see `torpor ls`")
    if kind is SourceKind.KUBE_ARCHIVE:
        raise ImageError(f"{source} is a kubelet checkpoint archive",
                         hint=f"push it as a torpor image (torpor kube import {source} -t {ref} "
                         f"--push) or as the image Kubernetes restores (torpor kube image "
                         f"{source} -t {ref})")
    with store.scratch() as scratch:
        if kind is SourceKind.DIRECTORY:
            if client is None:
                raise ImageError("packing a checkpoint directory needs containerd (its base image)")
            progress.step("compressing layers (zstd, in parallel)")
            layout = str(image_build.build(client, source, str(scratch / "layout"),
                                           ref_name=tag_of(ref), level=cfg.image_zstd_level).layout)
        else:
            layout = source if kind is SourceKind.LAYOUT else str(store.layout(source))
            if recipients and not asked and unpack.open_layout(layout).sealed:
                recipients = ()
            if recipients:
                layout = encrypt_layout.copy_layout(layout, str(scratch / "layout"))
        if recipients:
            progress.step(f"encrypting the layers for {len(recipients)} recipient(s)")
            encrypt_layout.encrypt_layout(layout, recipients)
        progress.step(f"pushing {ref}")
        options = registry_options(cfg, ref, access)
        pushed = push_layout(layout, ref, options=options, progress=progress.transfer("uploaded"))
    if kind is SourceKind.DIRECTORY:   # packed here: this node's own (torpor.signing.own)
        own.record(cfg.image_store, pushed.digest)
    signature = None
    if signing_key is not None:
        progress.step(f"signing {pushed.digest} with {signing_key.path}")
        signature = signing.sign_image(ref, pushed.digest, signing_key, options).signature
    tally.add("pushed", pushed.bytes_uploaded)
    return PushResult(str(pushed.reference), pushed.digest, pushed.uploaded, pushed.mounted,
                      pushed.existing, pushed.bytes_uploaded, signature)
