"""The `torpor` entry point: hand the command to torpord when it answers, else run it here.

Stdlib only until the fallback (torpor.handoff, the wire): click and the commands are imported
only when the command runs in this process.
"""

from __future__ import annotations

import sys

from torpor import handoff


def main() -> int:
    path = handoff.service_socket()
    sock = handoff.connect(path) if path else None
    status = handoff.run_in_service(sock) if sock is not None else None
    if status is not None:
        return status
    from torpor.cli.main import main as in_process

    return in_process()


if __name__ == "__main__":
    sys.exit(main())
