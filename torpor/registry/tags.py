"""The images of one repository, by tag, and deleting some of them (for retention).

`list_images(repo)`: every tag, its manifest or index digest, the index's creation time
(annotation org.opencontainers.image.created) and the manifests it names. `delete_images(repo,
digests, keep)`: DELETE each index by digest (every tag on it goes with it), then the manifests
it named that no kept image names. Blobs are left to the registry's own garbage collection,
which keeps every blob a remaining manifest refers to. A registry that does not allow deletes
is a RegistryError saying how to allow them.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass

from torpor.errors import ImageError
from torpor.formats import mediatypes
from torpor.registry.client import RepositoryClient
from torpor.registry.options import RegistryOptions
from torpor.registry.reference import Reference, parse_reference
from torpor.registry.session import RegistrySession


@dataclass(frozen=True)
class TaggedImage:
    tag: str
    digest: str                  # of the tag's manifest or index
    created: str                 # its org.opencontainers.image.created, "" when absent
    children: tuple[str, ...]    # the manifests an index names
    annotations: dict[str, str]  # of the index or manifest


@dataclass(frozen=True)
class Deleted:
    images: tuple[str, ...]      # index (or manifest) digests deleted
    children: tuple[str, ...]    # child manifests deleted with them


def _repository_ref(repository: Reference | str) -> Reference:
    return parse_reference(repository) if isinstance(repository, str) else repository


def list_images(repository: Reference | str,
                options: RegistryOptions | None = None) -> list[TaggedImage]:
    options = options or RegistryOptions()
    ref = _repository_ref(repository)
    session = RegistrySession.for_reference(ref, options)
    try:
        repo = RepositoryClient(session, session.repository(ref.repository))
        out = []
        for tag in sorted(repo.list_tags()):
            fetched = repo.get_manifest(tag, options.manifest_limit)
            try:
                document = json.loads(fetched.body)
            except ValueError:
                raise ImageError(f"{ref.repository}:{tag} is not JSON") from None
            annotations = document.get("annotations") or {}
            children = tuple(str(m.get("digest")) for m in document.get("manifests") or []
                             if isinstance(m, dict)) \
                if fetched.media_type in mediatypes.INDEX_TYPES else ()
            out.append(TaggedImage(tag, fetched.digest,
                                   str(annotations.get("org.opencontainers.image.created", "")),
                                   children, {str(k): str(v) for k, v in annotations.items()}))
        return out
    finally:
        session.close()


def delete_images(repository: Reference | str, digests: Collection[str],
                  keep: Collection[TaggedImage], listed: Collection[TaggedImage],
                  options: RegistryOptions | None = None) -> Deleted:
    """Delete the images `digests` (from `listed`), sparing the child manifests `keep` names."""
    options = options or RegistryOptions()
    ref = _repository_ref(repository)
    spared = {child for image in keep for child in image.children} | {i.digest for i in keep}
    children = {child for image in listed if image.digest in digests for child in image.children}
    session = RegistrySession.for_reference(ref, options)
    deleted: list[str] = []
    deleted_children: list[str] = []
    try:
        repo = RepositoryClient(session, session.repository(ref.repository))
        for digest in sorted(set(digests) - spared):
            if repo.delete_manifest(digest):
                deleted.append(digest)
        for child in sorted(children - spared):
            if repo.delete_manifest(child):
                deleted_children.append(child)
    finally:
        session.close()
    return Deleted(tuple(deleted), tuple(deleted_children))
