"""Where a checkpoint goes (-o DIR, --oci, -t REF, --push): the combinations that mean one
thing, checked in one place before anything is started; a contradiction names both options."""

from __future__ import annotations

import click


def check_target(directory: str | None, oci: bool, ref: str | None, push: bool) -> None:
    """-o DIR (a checkpoint directory), -t REF [--push] (an image), -o DIR --oci [-t REF
    [--push]] (the image as a layout, named and pushed as REF)."""
    if not directory and not ref:
        raise click.UsageError("give -o DIR (a directory) or -t REF (an image)")
    if directory and ref and not oci:
        raise click.UsageError(
            f"-o {directory} (a checkpoint directory) and -t {ref} (an image) contradict each "
            "other: give one, or -o DIR --oci -t REF for the image as an OCI layout in DIR")
    if push and not ref:
        raise click.UsageError("--push needs -t REF")
    if oci and not directory:
        raise click.UsageError("--oci needs -o DIR")
