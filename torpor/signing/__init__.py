"""Signed checkpoints: cosign-compatible signatures over a checkpoint image's index digest.

Public API (docs/signing.md)::

    load_signing_key(path) -> SigningKey          # PEM EC P-256 private key
    load_trusted_key(path) -> TrustedKey          # PEM public key (cosign.pub)
    sign_image(ref, digest, key, options) -> SignResult     # into REPO:sha256-<hex>.sig
    sign_with_node_key(ref, digest, cfg.image_signing_key, options)   # if the node has one
    checker(cfg, ref, results) -> check_top       # the node's policy, for fetch_metadata
    examine(repo, digest, cfg) -> SignatureCheck  # every signature, for torpor inspect
    own.record(store, digest)                     # an image this node made itself

Module map: payload (the simple-signing documents, no I/O), keys (PEM files, ECDSA P-256;
cosign_key: cosign's encrypted cosign.key), referrers (OCI 1.1 referrers),
remote (the `.sig` tag in a registry), verify (`[restore] signatures` and `trusted_keys`),
own (the digests this node built). Refusals are RestoreError; unreadable keys ConfigError.
"""

from torpor.signing.keys import SigningKey, TrustedKey, load_signing_key, load_trusted_key
from torpor.signing.remote import SignResult, sign_image, sign_with_node_key
from torpor.signing.verify import Policy, SignatureCheck, SignatureStatus, checker, examine

__all__ = [
    "Policy",
    "SignResult",
    "SignatureCheck",
    "SignatureStatus",
    "SigningKey",
    "TrustedKey",
    "checker",
    "examine",
    "load_signing_key",
    "load_trusted_key",
    "sign_image",
    "sign_with_node_key",
]
