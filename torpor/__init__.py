"""torpor: checkpoint, ship and restore whole containers under containerd."""

__version__ = "0.1.0"
