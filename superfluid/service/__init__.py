"""The service layer: the session log's daemon side (Sessions) and the service that orders
a request's work, session first, then engine."""

from .service import Service
from .sessions import Sessions
from .watchers import BEHIND

__all__ = ["BEHIND", "Service", "Sessions"]
