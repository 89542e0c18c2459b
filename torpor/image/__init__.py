"""Checkpoints as OCI images: the format (docs/format.md), building it from a checkpoint
directory, unpacking it again, and torpor's local store of checkpoint images."""
