"""Signatures stored as OCI 1.1 referrers of an image: manifests whose `subject` is the image
and whose artifact type is `application/vnd.dev.cosign.artifact.sig.v1+json` (what cosign's
`--registry-referrers-mode=oci-1-1` writes; their layers are those of a `.sig` manifest).

They are listed by the registry's referrers API (`GET /v2/<name>/referrers/<digest>`), or,
where a registry has none (docker-registry 2.8 answers 404), by the index clients keep under
the referrers tag `sha256-<hex>` (the OCI distribution spec's fallback, which cosign writes).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from torpor.errors import ImageError, RegistryError
from torpor.formats import mediatypes
from torpor.registry import manifests
from torpor.registry.client import RepositoryClient
from torpor.signing.payload import MAX_SIGNATURES

SIGNATURE_ARTIFACT_TYPE = "application/vnd.dev.cosign.artifact.sig.v1+json"
REFERRERS_LIMIT = 1 << 20
_NO_REFERRERS_API = (400, 404, 405, 501)


def signature_referrers(repo: RepositoryClient, digest: str,
                        unreadable: list[str]) -> list[dict[str, Any]]:
    """The signature manifests that name `digest` as their subject; why others were not read
    goes to `unreadable`."""
    index = _referrers_index(repo, digest)
    out = []
    for entry in (index.get("manifests") or [])[:MAX_SIGNATURES]:
        if not isinstance(entry, dict) or entry.get("artifactType") != SIGNATURE_ARTIFACT_TYPE:
            continue
        child = entry.get("digest")
        try:
            fetched = repo.get_manifest(str(child), REFERRERS_LIMIT,
                                        expected_digest=str(child))
            document = manifests.parse_manifest(fetched.body, f"signature referrer {child}")
        except (RegistryError, ImageError) as e:
            unreadable.append(f"referrer {child}: {e}")
            continue
        if (document.get("subject") or {}).get("digest") == digest:
            out.append(document)
    return out


def _referrers_index(repo: RepositoryClient, digest: str) -> dict[str, Any]:
    url = repo.session.url(f"/v2/{repo.repository}/referrers/{digest}?" +
                           urlencode({"artifactType": SIGNATURE_ARTIFACT_TYPE}))
    try:
        response = repo.session.request("GET", url, ok=(200,), scope=repo.pull_scope,
                                        what=f"GET referrers of {repo.repository}@{digest}",
                                        headers={"Accept": mediatypes.OCI_INDEX})
        body = response.read_limited(REFERRERS_LIMIT)
    except RegistryError as e:
        if e.status not in _NO_REFERRERS_API:
            raise
        try:   # the referrers tag schema, for registries without the API
            body = repo.get_manifest(digest.replace(":", "-", 1), REFERRERS_LIMIT).body
        except RegistryError as e:
            if e.status == 404:
                return {}
            raise
    try:
        return manifests.parse_manifest(body, f"referrers of {digest}")
    except ImageError:
        return {}
