"""Errors of the state package."""


class StateError(Exception):
    """Redis could not be reached or answered unexpectedly."""
