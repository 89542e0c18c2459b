"""CRIU's own reason for a failure, from its log."""

from __future__ import annotations

from pathlib import Path

from torpor.shim import criu_log


def test_criu_restore_errors_of_restored_tasks_are_the_reason(tmp_path: Path) -> None:
    log = tmp_path / "restore.log"
    log.write_text(
        "(00.096504) Warn  (criu/cr-restore.c:1050): Set CLONE_PARENT | CLONE_NEWPID\n"
        "(00.455232)      6: Error (soccr/soccr.c:499): Can't bind inet socket back: Cannot "
        "assign requested address\n"
        "(00.455249)      6: Error (criu/files.c:1221): Unable to open fd=4 id=0xa\n"
        "(00.456923)      1: Error (criu/cr-restore.c:1265): 6 exited, status=1\n"
        "(00.459033) Error (criu/cr-restore.c:2331): Restoring FAILED.\n")
    assert criu_log.reasons(str(log)) == [
        "Can't bind inet socket back: Cannot assign requested address",
        "Unable to open fd=4 id=0xa", "6 exited, status=1"]
