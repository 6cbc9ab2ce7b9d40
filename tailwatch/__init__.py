"""tailwatch: the command line, configuration and the service that wires the stages together."""

__version__ = "0.1.0"
