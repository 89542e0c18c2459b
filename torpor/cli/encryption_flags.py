"""The encryption options: `--encrypt-recipient jwe:PUBKEY.pem` (checkpoint, push) and
`--decryption-key KEY.pem` (restore, pull, inspect), in skopeo's forms (docs/encryption.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:  # the keys (and `cryptography`) load only when an option is given
    from torpor.image.encryption_keys import DecryptionKey, Recipient

F = Callable[..., Any]


def recipient_option(fn: F) -> F:
    return click.option(
        "--encrypt-recipient", "recipients", multiple=True, metavar="jwe:PUBKEY.pem",
        help="Encrypt the memory, volume and read-write layers for this RSA or EC public key "
        "(repeatable; ocicrypt's format, as skopeo --encryption-key).")(fn)


def decryption_key_option(fn: F) -> F:
    return click.option(
        "--decryption-key", "decryption_keys", multiple=True, metavar="KEY.pem[:pass=SECRET]",
        help="A private key to decrypt encrypted layers with (repeatable; as skopeo "
        "--decryption-key).")(fn)


def recipients_from(values: tuple[str, ...]) -> tuple[Recipient, ...]:
    if not values:
        return ()
    from torpor.image.encryption_keys import parse_recipient

    return tuple(parse_recipient(value) for value in values)


def keys_from(values: tuple[str, ...]) -> tuple[DecryptionKey, ...]:
    if not values:
        return ()
    from torpor.image.encryption_keys import parse_decryption_key

    return tuple(parse_decryption_key(value) for value in values)
