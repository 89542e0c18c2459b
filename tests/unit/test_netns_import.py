"""torpor-runc and torpor-hook load only the part of pyroute2 that IPRoute needs, and the rest of
the package still works for anyone in the same process who asks for it."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
from torpor.capture import netns
ipr = netns._ipr("/proc/self/ns/net")
assert any(link.get("ifname") == "lo" for link in ipr.get_links())
assert "pyroute2.ndb.main" not in sys.modules and "pyroute2.ipdb" not in sys.modules
from pyroute2 import NDB, IPRoute, config
import pyroute2
assert IPRoute is sys.modules["pyroute2.iproute.linux"].IPRoute and pyroute2.__version__
print("ok")
"""


def test_pyroute2_loads_lean_and_whole_when_asked() -> None:
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == "ok", done.stderr
