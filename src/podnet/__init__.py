"""podnet: a software-defined network for container clusters."""

__version__ = "0.1.0"
