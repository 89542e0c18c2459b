"""The `torpor` entry point: hand the command to torpord when it answers, else run it here.

Stdlib only until the fallback (torpor.handoff, the wire): click and the commands are imported
only when the command runs in this process.
"""

from __future__ import annotations

import os
import sys

from torpor import handoff


def main() -> int:
    # run by the compiled front end (lib/torpor.py): argv[0] is `torpor`, as a script's would be
    front_end = os.environ.pop("TORPOR_CLI_PATH", None)
    if front_end:
        sys.argv[0] = front_end
    path = handoff.service_socket()
    sock = handoff.connect(path) if path else None
    status = handoff.run_in_service(sock) if sock is not None else None
    if status is not None:
        return status
    from torpor.cli.main import main as in_process

    return in_process()


if __name__ == "__main__":
    sys.exit(main())
