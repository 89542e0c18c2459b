"""What the command line says about reaching a registry (credentials, CA, plain HTTP). A module of
its own, with nothing heavy in it: every CLI command that takes registry options imports it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RegistryAccess:
    """What the command line says about reaching a registry."""

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    insecure: bool = False


NO_CREDENTIALS = RegistryAccess()  # docker's config.json and credential helpers, as configured
