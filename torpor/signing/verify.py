"""Whether a registry checkpoint is signed by a key this node trusts, and what the node's
policy makes of it: `[restore] signatures` and `[restore] trusted_keys`.

Checked by `torpor restore`, `torpor pull` and `torpor kube archive|image` of a registry
image, right after the image's index is fetched, before any other manifest, config or layer
(registry.fetch_metadata's `check_top`), on the digest that is then pulled:

  - "off": signatures are not looked at;
  - "if-present" (the default): an image without signatures is restored; an image with
    signatures is restored only if one of them is over this digest and verifies with a
    trusted key;
  - "required": as "if-present", and an image without signatures is refused, unless this node
    made it itself (own.py: its digest is one this node built).

Only what comes from a registry is checked: a checkpoint directory, an OCI layout or an image
in the local store is already on this node, put there by it or by its operator (images pulled
into the store were checked when they were pulled).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torpor.config import Config
from torpor.errors import ConfigError, FormatError, RestoreError
from torpor.formats.oci import Descriptor
from torpor.registry.client import RepositoryClient
from torpor.registry.reference import parse_reference
from torpor.signing import own
from torpor.signing.keys import TrustedKey, load_trusted_key
from torpor.signing.payload import SignatureLayer, signed_digest
from torpor.signing.remote import decode_signature, read_signatures


class Policy(enum.Enum):
    REQUIRED = "required"
    IF_PRESENT = "if-present"
    OFF = "off"

    @classmethod
    def of(cls, cfg: Config) -> Policy:
        try:
            return cls(cfg.restore_signatures)
        except ValueError:
            raise ConfigError(f'[restore] signatures is "{cfg.restore_signatures}"',
                              hint='say "required", "if-present" or "off"') from None


def trusted_keys(cfg: Config) -> list[TrustedKey]:
    return [load_trusted_key(path) for path in cfg.restore_trusted_keys]


@dataclass(frozen=True)
class SignatureStatus:
    """One signature of an image: whom it verifies with, or why it does not."""

    layer: str                      # the payload's digest
    signed_digest: str | None       # the image digest its payload names
    verified_by: str | None         # the trusted key it verifies with
    problem: str | None             # why not

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def describe(self) -> str:
        if self.verified_by:
            return f"verified by {self.verified_by}"
        return f"not verified: {self.problem}"


@dataclass(frozen=True)
class SignatureCheck:
    digest: str
    where: str                       # repository:tag of the signatures
    policy: Policy
    signatures: tuple[SignatureStatus, ...] = ()
    made_here: bool = False
    unreadable: tuple[str, ...] = field(default=())

    @property
    def verified_by(self) -> str | None:
        return next((s.verified_by for s in self.signatures if s.verified_by), None)

    def describe(self) -> str:
        if self.policy is Policy.OFF:
            return "signatures not checked ([restore] signatures = \"off\")"
        if self.verified_by:
            return f"{self.digest} signed, verified by {self.verified_by}"
        if self.made_here:
            return f"{self.digest} was made by this node"
        return f"{self.digest} is not signed"

    def to_json(self) -> dict[str, Any]:
        return {"digest": self.digest, "where": self.where, "policy": self.policy.value,
                "verified_by": self.verified_by, "made_here": self.made_here,
                "signatures": [s.to_json() for s in self.signatures],
                "unreadable": list(self.unreadable)}


def status_of(layer: SignatureLayer, digest: str, keys: list[TrustedKey]) -> SignatureStatus:
    try:
        named = signed_digest(layer.payload)
    except FormatError as e:
        return SignatureStatus(layer.digest, None, None, str(e))
    if named != digest:
        return SignatureStatus(layer.digest, named, None, f"it signs another image, {named}")
    der = decode_signature(layer)
    if der is None:
        return SignatureStatus(layer.digest, named, None, "its signature is not base64")
    for key in keys:
        if key.verifies(layer.payload, der):
            return SignatureStatus(layer.digest, named, key.describe(), None)
    if not keys:
        return SignatureStatus(layer.digest, named, None, "no [restore] trusted_keys are set")
    return SignatureStatus(layer.digest, named, None,
                           "it verifies with none of the trusted keys ("
                           + ", ".join(k.describe() for k in keys) + ")")


def examine(repo: RepositoryClient, digest: str, cfg: Config) -> SignatureCheck:
    """Every signature of `digest` in `repo` against the trusted keys (nothing refused here)."""
    policy = Policy.of(cfg)
    keys = trusted_keys(cfg)
    found = read_signatures(repo, digest)
    statuses = tuple(status_of(layer, digest, keys) for layer in found.layers)
    return SignatureCheck(digest, found.where, policy, statuses,
                          own.made_here(cfg.image_store, digest), tuple(found.unreadable))


def check(repo: RepositoryClient, reference: str, digest: str, cfg: Config,
          required_by: str = "") -> SignatureCheck:
    """The node's policy on the image `digest`: a SignatureCheck, or RestoreError in words.
    `required_by`: the setting that requires a signature whatever `[restore] signatures` says
    (`[restore] on_create = "signed"`)."""
    policy = Policy.REQUIRED if required_by else Policy.of(cfg)
    if policy is Policy.OFF:
        return SignatureCheck(digest, "", policy)
    result = examine(repo, digest, cfg)
    if result.verified_by or result.made_here:   # what this node built is its own
        return result
    signed = result.signatures or result.unreadable
    if not signed and policy is Policy.IF_PRESENT:
        return result
    if not signed:
        setting = required_by or '[restore] signatures is "required"'
        otherwise = ('start it cold (annotation io.torpor.restore.cold-start=true)'
                     if required_by else 'set [restore] signatures = "if-present" on this node')
        raise RestoreError(
            f"{reference} ({digest}) is not signed, and this node's {setting}",
            hint=f"sign it where it was made (torpor checkpoint --sign KEY, torpor push --sign "
                 f"KEY, or cosign sign --key KEY {_repository(reference)}@{digest}), or "
                 f"{otherwise}")
    reasons = [f"signature {s.layer}: {s.problem}" for s in result.signatures] + \
        [f"unreadable signature {u}" for u in result.unreadable]
    raise RestoreError(
        f"{reference} ({digest}) carries {len(reasons)} signature(s) in {result.where} and none "
        f"verifies: " + "; ".join(reasons),
        hint="restore only what a trusted signer signed: add the signer's public key to "
             "[restore] trusted_keys if you trust it; a signature that does not verify with "
             "its own key means the image or its signature was changed after signing")


def _repository(reference: str) -> str:
    ref = parse_reference(reference)
    return f"{ref.registry}/{ref.repository}"


def checker(cfg: Config, reference: str, results: list[SignatureCheck],
            required_by: str = "") -> Callable[[RepositoryClient, Descriptor], None]:
    """A `check_top` for registry.fetch_metadata: the policy on the index, appended to
    `results`. The keys are read now, so a bad key file is reported before any request."""
    if required_by or Policy.of(cfg) is not Policy.OFF:
        trusted_keys(cfg)

    def check_top(repo: RepositoryClient, top: Descriptor) -> None:
        results.append(check(repo, reference, top.digest, cfg, required_by))

    return check_top
