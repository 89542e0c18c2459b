"""What a user asked of one checkpoint: CRIU's options and which files to save. `torpor
checkpoint` leaves it for torpor-runc in the container's record directory (containerd passes
runc's options through, but no others), and checkpoint.json keeps it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from torpor.errors import FormatError
from torpor.formats import names
from torpor.formats.criu import CriuOptions
from torpor.formats.fields import Fields, check_format
from torpor.formats.files import VolumePolicy, parse_volume_policy


@dataclass(frozen=True)
class CheckpointRequest:
    criu: CriuOptions = field(default_factory=CriuOptions)
    volumes: VolumePolicy | None = None     # None: the container's annotation, else the config
    dev_shm: bool | None = None
    rootfs: bool | None = None
    image_path: str | None = None           # where torpor-runc puts CRIU's images
    expires: float = 0.0                    # a request older than this is ignored
    keep_images: bool = False               # the images are the checkpoint (-o DIR), synced
                                            # after: their writing to disk starts as CRIU dumps

    def to_json(self) -> dict[str, Any]:
        volumes = self.volumes if self.volumes is None or isinstance(self.volumes, str) \
            else list(self.volumes)
        return {"format": names.CHECKPOINT_REQUEST_FORMAT, "criu": self.criu.to_json(),
                "volumes": volumes, "dev_shm": self.dev_shm, "rootfs": self.rootfs,
                "image_path": self.image_path, "expires": self.expires,
                "keep_images": self.keep_images}

    @classmethod
    def from_json(cls, f: Fields) -> CheckpointRequest:
        check_format(f, names.CHECKPOINT_REQUEST_FORMAT)
        raw = f.data.get("volumes")
        if raw is not None and not isinstance(raw, (str, list)):
            raise FormatError(f"{f.what}: volumes must be \"all\", \"none\" or a list")
        volumes = parse_volume_policy(raw if not isinstance(raw, list) else f.strings("volumes"))
        dev_shm = f.data.get("dev_shm")
        rootfs = f.data.get("rootfs")
        keep_images = f.data.get("keep_images")   # (absent from older torpor's requests)
        return cls(criu=CriuOptions.from_json(f.child("criu")), volumes=volumes,
                   dev_shm=f.boolean("dev_shm") if dev_shm is not None else None,
                   rootfs=f.boolean("rootfs") if rootfs is not None else None,
                   image_path=f.optional_string("image_path"), expires=f.number("expires", 0.0),
                   keep_images=f.boolean("keep_images") if keep_images is not None else False)

    def dumps(self) -> bytes:
        return json.dumps(self.to_json(), sort_keys=True).encode()

    @classmethod
    def loads(cls, data: bytes, what: str) -> CheckpointRequest:
        try:
            document = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise FormatError(f"{what} is not valid JSON: {e}") from None
        return cls.from_json(Fields(document, what))
