"""The keyed executor: one FIFO per conversation, a global bound on calls in flight, and acks
released in offset order per partition, so a committed offset never passes unfinished work."""

from pipeline.executor.keyed import KeyedExecutor, Ticket, defer, work_revoked, wrap_deferred

__all__ = ["KeyedExecutor", "Ticket", "defer", "work_revoked", "wrap_deferred"]
