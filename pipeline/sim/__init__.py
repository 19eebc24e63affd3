"""Reference simulator of the agent-session API (both profiles), see :mod:`pipeline.sim.server`.

Public API: ``SimServer(settings=None, **overrides)`` with ``await start(host, port) -> int``,
``await stop()``, ``base_url(profile)``, ``root_url``; ``SimSettings``, ``Faults``; ``cli.main(argv)``.
"""

from pipeline.sim.server import SimServer
from pipeline.sim.settings import Faults, SimSettings

__all__ = ["Faults", "SimServer", "SimSettings"]
