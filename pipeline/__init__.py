"""Switchboard: a stream-processing pipeline from IM platforms to hosted agent sessions."""

__version__ = "0.1.0"
