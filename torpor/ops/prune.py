"""`torpor prune [REPOSITORY] --keep N --older-than D [--registry]`: old checkpoint generations
out of the local store, and out of a registry.

A generation is one image index: the tags on the same index (a generation's own tag and a
moving `latest`) are one generation. Generations are grouped by repository and ordered by
their creation time (the index's org.opencontainers.image.created). Kept, per repository: the
newest N (--keep), and every generation newer than D (--older-than); with --older-than alone
the newest is kept too. `tags` and `container` narrow what is looked at to the tags they match
and that container's checkpoints (a periodic series' generations, ops/schedule.py), so other
images of the repository are never touched.

Steps: 1. the local store's images, grouped and sorted; 2. remove the generations not kept
(their store entries: a pack blob lives on while a kept generation's layout links it);
3. --registry: the same over the registry's tags, deleting index manifests by digest and the
child manifests no kept generation names (the registry's garbage collection reclaims blobs no
manifest refers to); a registry that does not allow deletes is reported, not fatal to the
local part.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from torpor.config import Config
from torpor.errors import ConfigError, RegistryError
from torpor.formats import annotations as ann
from torpor.formats import names, timestamps
from torpor.image.generations import repository_of, stored_images
from torpor.image.store import Store
from torpor.ops.access import NO_CREDENTIALS, RegistryAccess
from torpor.ops.sources import registry_options
from torpor.registry import TaggedImage, delete_images, list_images, parse_reference
from torpor.reporting import SILENT, Progress

T = TypeVar("T")


@dataclass(frozen=True)
class Retention:
    keep: int | None = None            # the newest N generations
    older_than_s: float | None = None  # and every generation newer than this

    def __post_init__(self) -> None:
        if self.keep is None and self.older_than_s is None:
            raise ConfigError("say what to keep: --keep N and/or --older-than DURATION")
        if self.keep is not None and self.keep < 0:
            raise ConfigError(f"--keep {self.keep}: give 0 or more")


@dataclass
class PruneResult:
    removed: list[str] = field(default_factory=list)           # local references
    kept: list[str] = field(default_factory=list)
    registry_removed: list[str] = field(default_factory=list)  # repository@digest
    registry_kept: list[str] = field(default_factory=list)     # repository:tag
    registry_error: str | None = None
    # generations (image indexes: the tags of one index are one generation), as counted by
    # --keep; the lists above hold every reference
    kept_generations: int = 0
    registry_kept_generations: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def created_epoch(created: str) -> float:
    return timestamps.epoch(created) or 0.0


def chosen_to_keep(generations: Sequence[T], created: Callable[[T], str], retention: Retention,
                   now: float) -> list[T]:
    """The generations `retention` keeps, of one repository."""
    ordered = sorted(generations, key=lambda g: timestamps.order(created(g)), reverse=True)
    keep = retention.keep if retention.keep is not None else 1
    kept = ordered[:keep]
    if retention.older_than_s is not None:
        kept += [g for g in ordered[keep:]
                 if now - created_epoch(created(g)) < retention.older_than_s]
    return kept


def prune(cfg: Config, retention: Retention, repository: str | None = None, *,
          tags: re.Pattern[str] | None = None, container: str | None = None,
          registry: bool = False,
          access: RegistryAccess = NO_CREDENTIALS, dry_run: bool = False,
          progress: Progress = SILENT) -> PruneResult:
    now = time.time()
    wanted = repository_of(repository) if repository else None
    if repository and wanted is None:
        raise ConfigError(f"{repository} is not a repository reference")
    # 1. the local store, by repository and index digest
    store = Store(cfg.image_store)
    groups: dict[str, dict[str, list[str]]] = {}   # repository -> index digest -> refs
    created: dict[str, str] = {}
    for image in stored_images(store):
        where = repository_of(image.ref) or image.ref
        if wanted and where != wanted:
            continue
        if tags is not None and not tags.fullmatch(parse_reference(image.ref).tag or ""):
            continue
        if container is not None and image.container != container:
            continue
        groups.setdefault(where, {}).setdefault(image.index_digest, []).append(image.ref)
        created[image.index_digest] = max(created.get(image.index_digest, ""), image.created,
                                          key=timestamps.order)
    result = PruneResult()
    # 2. remove what is not kept
    for by_digest in groups.values():
        kept = set(chosen_to_keep(list(by_digest), lambda d: created[d], retention, now))
        result.kept_generations += len(kept)
        for digest, refs in sorted(by_digest.items()):
            target = result.kept if digest in kept else result.removed
            target.extend(sorted(refs))
            if digest not in kept and not dry_run:
                for ref in refs:
                    progress.step(f"removing {ref} from the local store")
                    store.remove(ref)
    # 3. the registry
    if registry:
        if not repository:
            raise ConfigError("--registry needs the repository to prune (torpor prune REPO)")
        try:
            _prune_registry(cfg, repository, retention, tags, container, access, dry_run, now,
                            result, progress)
        except RegistryError as e:
            return PruneResult(result.removed, result.kept, result.registry_removed,
                               result.registry_kept, str(e), result.kept_generations,
                               result.registry_kept_generations)
    return result


def _prune_registry(cfg: Config, repository: str, retention: Retention,
                    tags: re.Pattern[str] | None, container: str | None,
                    access: RegistryAccess, dry_run: bool,
                    now: float, result: PruneResult, progress: Progress) -> None:
    options = registry_options(cfg, repository, access)
    ref = parse_reference(repository)
    progress.step(f"listing the tags of {ref.registry}/{ref.repository}")
    every = list_images(ref, options)
    listed = [i for i in every  # torpor's checkpoints only, never others
              if i.annotations.get(ann.FORMAT) == names.CHECKPOINT_FORMAT
              and (tags is None or tags.fullmatch(i.tag))
              and (container is None or i.annotations.get(ann.CONTAINER) == container)]
    by_digest: dict[str, list[TaggedImage]] = {}
    for image in listed:
        by_digest.setdefault(image.digest, []).append(image)
    kept_digests = set(chosen_to_keep(list(by_digest), lambda d: by_digest[d][0].created,
                                      retention, now))
    # deleting a manifest deletes every tag on it: one a tag outside the selection names stays
    selected = {i.tag for i in listed}
    named_elsewhere = {i.digest for i in every if i.digest in by_digest and i.tag not in selected}
    kept_digests |= named_elsewhere
    name = f"{ref.registry}/{ref.repository}"
    result.registry_kept.extend(sorted(f"{name}:{i.tag}" for i in listed
                                       if i.digest in kept_digests))
    result.registry_kept_generations += len(kept_digests)
    doomed = [d for d in by_digest if d not in kept_digests]
    if not doomed:
        return
    if dry_run:
        result.registry_removed.extend(f"{name}@{d}" for d in sorted(doomed))
        return
    progress.step(f"deleting {len(doomed)} generation(s) from {name}")
    kept = [i for i in listed if i.digest in kept_digests]
    deleted = delete_images(ref, doomed, kept, listed, options)
    result.registry_removed.extend(f"{name}@{d}" for d in deleted.images)
