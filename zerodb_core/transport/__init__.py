"""Transports: how the client reaches storage (in-process now, over the network later)."""

from zerodb_core.transport.base import Lease, Transport, TransportCounters
from zerodb_core.transport.local import LocalTransport, open_local_transport

__all__ = ["Lease", "LocalTransport", "Transport", "TransportCounters", "open_local_transport"]
