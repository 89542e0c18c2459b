"""The journal of one checkpoint (`<store>/journals/<id>/`, torpor.capture.journal): what
`torpor checkpoint` set out to do and how far it got (journal.json), the decision that ends a
checkpoint which stops its container (decision.json), and what torpor-runc did to the container
(runtime.json). `torpor recover` reads them after a crash."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from torpor.errors import FormatError
from torpor.formats import names
from torpor.formats.fields import Fields, check_format

# The steps a checkpoint goes through, in order (journal.json's "step").
STEPS = ("started", "requested", "dumping", "dumped", "writing", "compressing", "pushing",
         "installing", "syncing", "committed", "finished")


@dataclass(frozen=True)
class JournalTarget:
    """Where the checkpoint goes, and what it made there (so a recovery removes only that)."""

    directory: str | None = None        # -o DIR (a checkpoint directory, or a layout with oci)
    created_directory: bool = False     # DIR did not exist before: remove it, not just empty it
    oci: bool = False
    ref: str | None = None              # -t REF: an image in the local store
    push: bool = False
    store: str | None = None            # the local store's root
    scratch: str | None = None          # scratch space in the store for this checkpoint

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, f: Fields) -> JournalTarget:
        return cls(directory=f.optional_string("directory"),
                   created_directory=f.boolean("created_directory", False),
                   oci=f.boolean("oci", False), ref=f.optional_string("ref"),
                   push=f.boolean("push", False), store=f.optional_string("store"),
                   scratch=f.optional_string("scratch"))

    def describe(self) -> str:
        if self.ref:
            return f"{'pushed ' if self.push else ''}image {self.ref}"
        kind = "OCI layout" if self.oci else "checkpoint directory"
        return f"{kind} {self.directory}"


@dataclass(frozen=True)
class CheckpointJournal:
    id: str
    container_id: str
    namespace: str
    address: str                        # containerd's socket
    pid: int                            # the `torpor` that runs it
    created: float
    leave_running: bool
    target: JournalTarget = field(default_factory=JournalTarget)
    step: str = "started"
    lease: str | None = None            # containerd lease holding what the checkpoint made
    boot_id: str = ""                   # the boot it ran in (its processes die with it)

    def at(self, step: str, **changes: Any) -> CheckpointJournal:
        if step not in STEPS:
            raise ValueError(f"unknown checkpoint step {step!r}")
        return replace(self, step=step, **changes)

    def to_json(self) -> dict[str, Any]:
        return {"format": names.JOURNAL_FORMAT, "id": self.id, "container_id": self.container_id,
                "namespace": self.namespace, "address": self.address, "pid": self.pid,
                "created": self.created, "leave_running": self.leave_running,
                "target": self.target.to_json(), "step": self.step, "lease": self.lease,
                "boot_id": self.boot_id}

    @classmethod
    def from_json(cls, f: Fields) -> CheckpointJournal:
        check_format(f, names.JOURNAL_FORMAT)
        step = f.string("step")
        if step not in STEPS:
            raise FormatError(f"{f.what}: step {step!r} is none of {', '.join(STEPS)}")
        return cls(id=f.string("id"), container_id=f.string("container_id"),
                   namespace=f.string("namespace"), address=f.string("address"),
                   pid=f.integer("pid"), created=f.number("created"),
                   leave_running=f.boolean("leave_running"),
                   target=JournalTarget.from_json(f.child("target")), step=step,
                   lease=f.optional_string("lease"), boot_id=f.string("boot_id", ""))

    def dumps(self) -> bytes:
        return _dumps(self.to_json())

    @classmethod
    def loads(cls, data: bytes, what: str) -> CheckpointJournal:
        return cls.from_json(_fields(data, what))


@dataclass(frozen=True)
class Decision:
    """How a checkpoint that stops its container ends: commit (CRIU stops it) or abort (CRIU
    lets it run on)."""

    commit: bool
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"format": names.DECISION_FORMAT, "commit": self.commit, "reason": self.reason}

    @classmethod
    def from_json(cls, f: Fields) -> Decision:
        check_format(f, names.DECISION_FORMAT)
        return cls(commit=f.boolean("commit"), reason=f.string("reason", ""))

    def dumps(self) -> bytes:
        return _dumps(self.to_json())

    @classmethod
    def loads(cls, data: bytes, what: str) -> Decision:
        return cls.from_json(_fields(data, what))


@dataclass(frozen=True)
class RuntimeRecord:
    """What torpor-runc did to the container, so that nothing stays frozen after a crash."""

    pid: int                            # torpor-runc's pid
    init_pid: int
    cgroup: str
    cgroup_version: int
    froze: bool                         # torpor-runc froze the cgroup (else containerd paused it)

    def to_json(self) -> dict[str, Any]:
        return {"format": names.RUNTIME_RECORD_FORMAT, **self.__dict__}

    @classmethod
    def from_json(cls, f: Fields) -> RuntimeRecord:
        check_format(f, names.RUNTIME_RECORD_FORMAT)
        return cls(pid=f.integer("pid"), init_pid=f.integer("init_pid"), cgroup=f.string("cgroup"),
                   cgroup_version=f.integer("cgroup_version"), froze=f.boolean("froze"))

    def dumps(self) -> bytes:
        return _dumps(self.to_json())

    @classmethod
    def loads(cls, data: bytes, what: str) -> RuntimeRecord:
        return cls.from_json(_fields(data, what))


def _dumps(document: dict[str, Any]) -> bytes:
    return json.dumps(document, indent=1, sort_keys=True).encode()


def _fields(data: bytes, what: str) -> Fields:
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise FormatError(f"{what} is not valid JSON: {e}") from None
    return Fields(document, what)
