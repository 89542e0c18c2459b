"""cosign's own private key files, as `cosign generate-key-pair` writes them (`-----BEGIN
ENCRYPTED SIGSTORE PRIVATE KEY-----`, or `COSIGN` in older versions).

The PEM body is a JSON document (go-securesystemslib's "encrypted" format)::

    {"kdf": {"name": "scrypt", "params": {"N": 65536, "r": 8, "p": 1}, "salt": "<base64>"},
     "cipher": {"name": "nacl/secretbox", "nonce": "<base64>"},
     "ciphertext": "<base64>"}

The plaintext is the PKCS#8 DER private key, sealed with NaCl's secretbox (XSalsa20-Poly1305,
PyNaCl) under the 32-byte key scrypt derives from the password (COSIGN_PASSWORD).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json

from torpor.errors import ConfigError

MARKERS = (b"ENCRYPTED SIGSTORE PRIVATE KEY", b"ENCRYPTED COSIGN PRIVATE KEY")
_MAX_N, _MAX_R, _MAX_P = 1 << 20, 32, 16     # at most 1 GiB of scrypt memory


def is_cosign_key(data: bytes) -> bool:
    return any(marker in data for marker in MARKERS)


def decrypt(data: bytes, password: str, path: str) -> bytes:
    """The PKCS#8 DER key inside a cosign key file; ConfigError in words otherwise."""
    from nacl.exceptions import CryptoError
    from nacl.secret import SecretBox

    lines = data.decode(errors="replace").splitlines()
    body = "".join(line.strip() for line in lines if line.strip() and not line.startswith("-----"))
    try:
        document = json.loads(base64.b64decode(body, validate=True))
        kdf, cipher = document["kdf"], document["cipher"]
        params = kdf["params"]
        n, r, p = int(params["N"]), int(params["r"]), int(params["p"])
        salt, nonce = base64.b64decode(kdf["salt"]), base64.b64decode(cipher["nonce"])
        ciphertext = base64.b64decode(document["ciphertext"])
        names = (kdf["name"], cipher["name"])
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise ConfigError(f"the cosign key {path} is malformed") from None
    if names != ("scrypt", "nacl/secretbox"):
        raise ConfigError(f"the cosign key {path} is sealed with {names[0]}/{names[1]}, not "
                          "scrypt/nacl-secretbox")
    if not (1 < n <= _MAX_N and n & (n - 1) == 0 and 0 < r <= _MAX_R and 0 < p <= _MAX_P):
        raise ConfigError(f"the cosign key {path} asks for scrypt N={n} r={r} p={p}, beyond "
                          f"N={_MAX_N} r={_MAX_R} p={_MAX_P}")
    key = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=32,
                         maxmem=256 * n * r + (1 << 20))
    try:
        return bytes(SecretBox(key).decrypt(ciphertext, nonce))
    except (CryptoError, ValueError):
        raise ConfigError(f"COSIGN_PASSWORD does not open the cosign key {path}",
                          hint="give the password it was made with") from None
