"""gRPC settings a server process makes before anything imports gRPC, which reads them once, when imported.

gRPC 1.85 accepts connections through its EventEngine listener by default. On this project's servers the
classic listener costs less per message on every connection it accepted (a bare unary call, an AppendEntries
on a follower's stream, a producer session's batch): 5-16% less node CPU per sequential call, and 5-12% lower
p50 latency, measured side by side (docs/decisions/0028-grpc-classic-listener.md). So the processes that run
servers (``python -m dledger``: a node, a name server, the console; the chaos ``faultnode`` launcher) ask gRPC
for the classic listener, unless ``GRPC_EXPERIMENTS`` is already set, which then wins as it is. The client side
keeps gRPC's default: the EventEngine client was faster at reading large answers (a consumer's pulls).
"""

from __future__ import annotations

import os
import sys
from typing import Final

EXPERIMENTS: Final = "-event_engine_listener"


def prefer_classic_listener() -> bool:
    """Ask gRPC for its classic listener in this process (``GRPC_EXPERIMENTS``), unless the environment already
    says something. False when gRPC was imported already: the setting would be ignored, so nothing is set."""
    if "grpc" in sys.modules:
        return False
    os.environ.setdefault("GRPC_EXPERIMENTS", EXPERIMENTS)
    return True
