"""The one error family every tailwatch stage raises for problems a user can fix."""

from __future__ import annotations


class TailwatchError(Exception):
    """Base class of errors whose message is meant for the user, as one line."""


class StoreError(TailwatchError):
    """The ClickHouse store could not be opened or answered with an error."""


class StoreInUseError(StoreError):
    """An embedded store directory is held by another process."""


class SchemaError(StoreError):
    """The schema could not be created or migrated."""
