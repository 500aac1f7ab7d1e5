"""One model's engine, and its public face: what the API, the service, the monitor and the
daemon may use of it. api/ and monitor/ import only from here (an import contract checks it).

- `EngineAPI` (contract.py) is what every engine meets: the local one here (local.Engine:
  scheduler + worker process) and the fleet head's (fleet/head.FleetEngine). Neither
  inherits from the other; what they share (codec, request check, streams) is base.py.
- `stats()` gives an `EngineStats` record; readings.py turns it into /health's and the web
  monitor's JSON.
- delivery.py hands a step's tokens to clients after the session log commits them.
- embedding.py checks and queues embedding requests.
- sampling_defaults.py is the table a request's left-out sampling parameters fall back to."""

from .contract import NO_HOOKS, QUEUE_CLASSES, EngineAPI, EngineStats, Hooks, Lane, NodeStats
from .delivery import SessionLog, Stream
from .embedding import EmbedInput
from .embedding import check as check_embed
from .local import Engine
from .readings import health_row, monitor_record
from .sampling_defaults import for_api

__all__ = ["NO_HOOKS", "QUEUE_CLASSES", "EmbedInput", "Engine", "EngineAPI", "EngineStats", "Hooks", "Lane",
           "NodeStats", "SessionLog", "Stream", "check_embed", "for_api", "health_row", "monitor_record"]
