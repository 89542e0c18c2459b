"""torpor's OCI registry client: push an image-layout directory to a registry, pull one back.

Public API (everything else in this package is internal)::

    push_layout(layout_dir, ref, *, options=None, mount_from=(), progress=None) -> PushResult
    EarlyBlobs(ref, options, mount_from)   # upload blobs while an image is still being built
    pull(ref, layout_dir, *, want=None, options=None, progress=None) -> PullResult
    fetch_metadata(ref, options=None, check_top=None) -> PullPlan   # phase 1: metadata only
    PullPlan.download(layout_dir, layers=None, progress=None) -> PullResult
    parse_reference(text) -> Reference
    list_images(repository, options) -> [TaggedImage]       # tags, digests, creation times
    delete_images(repository, digests, keep, listed, options) -> Deleted
    RegistryOptions(username=, password=, docker_config=, ca_file=, insecure=, timeout_s=,
                    retries=, backoff_s=, parallel=, chunk_size=, manifest_limit=, config_limit=)

Errors (torpor.errors): RegistryError (status, registry's code and message, what to do),
AuthError (missing or rejected credentials), DigestMismatch (a blob or manifest is not what its
descriptor says), ImageError (a malformed layout or manifest, a truncated blob), ConfigError (a
malformed reference). Module map: reference, credentials, auth, transport, http_errors, session,
client, blob_upload, blob_download, layout, push, pull, tags. See docs/registry.md.
"""

from torpor.registry.options import RegistryOptions
from torpor.registry.pull import Layer, PulledManifest, PullPlan, PullResult, fetch_metadata, pull
from torpor.registry.push import EarlyBlobs, PushResult, push_layout
from torpor.registry.reference import Reference, parse_reference
from torpor.registry.tags import Deleted, TaggedImage, delete_images, list_images

__all__ = [
    "Deleted",
    "EarlyBlobs",
    "Layer",
    "PullPlan",
    "PullResult",
    "PulledManifest",
    "PushResult",
    "Reference",
    "RegistryOptions",
    "TaggedImage",
    "delete_images",
    "fetch_metadata",
    "list_images",
    "parse_reference",
    "pull",
    "push_layout",
]
