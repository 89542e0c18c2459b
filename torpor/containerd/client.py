"""containerd over gRPC: namespaces, containers, tasks, content, images, leases, snapshots, diff.

Every call carries the `containerd-namespace` header, and the `containerd-lease` header inside
`with client.lease():` so that content and snapshots made there are not garbage-collected before
something references them. gRPC errors become torpor errors here, and only here.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import grpc
from google.protobuf import empty_pb2
from google.protobuf.message import Message

from torpor.containerd.api import (
    containers_pb2,
    content_pb2,
    diff_pb2,
    images_pb2,
    leases_pb2,
    namespaces_pb2,
    runc_options_pb2,
    snapshots_pb2,
    tasks_pb2,
    types_pb2,
    version_pb2,
)
from torpor.errors import AlreadyExists, ContainerdError, NotFound

DEFAULT_ADDRESS = "/run/containerd/containerd.sock"
WRITE_CHUNK = 1 << 20          # well under containerd's 16 MiB message limit
MAX_MESSAGE = 64 << 20
LOCKED_WAIT_S = 600.0          # how long a content ref another writer holds is waited for

R = TypeVar("R", bound=Message)

_CODE_HINTS = {
    grpc.StatusCode.UNAVAILABLE: "is containerd running? set --address or CONTAINERD_ADDRESS",
    grpc.StatusCode.PERMISSION_DENIED: "containerd's socket needs root",
}


def translate(error: grpc.RpcError, what: str, address: str) -> ContainerdError:
    """One gRPC error -> one torpor error with a message a user can act on."""
    code = error.code() if hasattr(error, "code") else None
    details = (error.details() if hasattr(error, "details") else None) or str(error)
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(f"{what}: {details}")
    if code == grpc.StatusCode.ALREADY_EXISTS:
        return AlreadyExists(f"{what}: {details}")
    if code == grpc.StatusCode.UNAVAILABLE:
        return ContainerdError(f"{what}: cannot reach containerd at {address}: {details}",
                               hint=_CODE_HINTS[code])
    hint = _CODE_HINTS.get(code) if code is not None else None
    if code in (None, grpc.StatusCode.UNKNOWN):
        return ContainerdError(f"{what}: {details}", hint=hint)
    name = code.name.lower().replace("_", " ")
    return ContainerdError(f"{what}: {details} ({name})", hint=hint)


class _Locked(Exception):
    """containerd's content store: another writer holds this ref now."""

    def __init__(self, error: grpc.RpcError) -> None:
        super().__init__(str(error))
        self.error = error


class Client:
    """One connection to containerd, bound to a namespace."""

    def __init__(self, address: str = DEFAULT_ADDRESS, namespace: str = "default") -> None:
        self.address = address
        self.namespace = namespace
        self._lease: str | None = None
        target = address if "://" in address else f"unix://{address}"
        self.channel = grpc.insecure_channel(target, options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE),
        ])

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Plumbing ---------------------------------------------------------------------------------

    def metadata(self) -> list[tuple[str, str]]:
        md = [("containerd-namespace", self.namespace)]
        if self._lease:
            md.append(("containerd-lease", self._lease))
        return md

    def call(self, method: str, request: Message, response: type[R], what: str,
             timeout: float | None = 60.0) -> R:
        stub = self.channel.unary_unary(method, request_serializer=type(request).SerializeToString,
                                        response_deserializer=response.FromString)
        try:
            result: R = stub(request, metadata=self.metadata(), timeout=timeout)
        except grpc.RpcError as e:
            raise translate(e, what, self.address) from None
        return result

    def _empty(self, method: str, request: Message, what: str, timeout: float | None = 60.0) -> None:
        self.call(method, request, empty_pb2.Empty, what, timeout)

    def create_lease(self, expire_s: int = 3600) -> str:
        """A new lease that containerd drops by itself after `expire_s` (should we die)."""
        lease_id = f"torpor-{int(time.time())}-{secrets.token_hex(4)}"
        expire = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + expire_s))
        self.call("/containerd.services.leases.v1.Leases/Create",
                  leases_pb2.CreateRequest(id=lease_id, labels={"containerd.io/gc.expire": expire}),
                  leases_pb2.CreateResponse, "create lease")
        return lease_id

    def delete_lease(self, lease_id: str, sync: bool = False) -> None:
        """Drop a lease (gone already: fine); with `sync`, containerd collects what it held
        before answering."""
        try:
            self._empty("/containerd.services.leases.v1.Leases/Delete",
                        leases_pb2.DeleteRequest(id=lease_id, sync=sync), "delete lease")
        except NotFound:
            pass

    def leases(self) -> list[str]:
        return [lease.id for lease in self.call(
            "/containerd.services.leases.v1.Leases/List", leases_pb2.ListRequest(),
            leases_pb2.ListResponse, "list leases").leases]

    @contextlib.contextmanager
    def using_lease(self, lease_id: str) -> Iterator[str]:
        """Calls in the block carry `lease_id` (from any thread)."""
        previous, self._lease = self._lease, lease_id
        try:
            yield lease_id
        finally:
            self._lease = previous

    @contextlib.contextmanager
    def lease(self, expire_s: int = 3600, sync: bool = False) -> Iterator[str]:
        """A lease for the duration of the block (and at most `expire_s` if we die)."""
        lease_id = self.create_lease(expire_s)
        try:
            with self.using_lease(lease_id):
                yield lease_id
        finally:
            with contextlib.suppress(ContainerdError):
                self.delete_lease(lease_id, sync)

    # Version and namespaces --------------------------------------------------------------------

    def version(self) -> version_pb2.VersionResponse:
        return self.call("/containerd.services.version.v1.Version/Version", empty_pb2.Empty(),
                         version_pb2.VersionResponse, "containerd version", timeout=10)

    def ensure_namespace(self) -> None:
        try:
            self.call("/containerd.services.namespaces.v1.Namespaces/Create",
                      namespaces_pb2.CreateNamespaceRequest(
                          namespace=namespaces_pb2.Namespace(name=self.namespace)),
                      namespaces_pb2.CreateNamespaceResponse, f"create namespace {self.namespace}")
        except AlreadyExists:
            pass

    # Containers -------------------------------------------------------------------------------

    def get_container(self, container_id: str) -> containers_pb2.Container:
        try:
            return self.call("/containerd.services.containers.v1.Containers/Get",
                             containers_pb2.GetContainerRequest(id=container_id),
                             containers_pb2.GetContainerResponse,
                             f"container {container_id}").container
        except NotFound as error:
            error.hint = (f"looked in namespace {self.namespace} of containerd at "
                          f"{self.address}: another one? give -n NAMESPACE (ctr -n, nerdctl "
                          "--namespace; Kubernetes: k8s.io) or --address SOCKET")
            raise

    def list_containers(self, *filters: str) -> list[containers_pb2.Container]:
        """Containers matching any of containerd's filters (`labels."k"==v`); all without one."""
        return list(self.call("/containerd.services.containers.v1.Containers/List",
                              containers_pb2.ListContainersRequest(filters=list(filters)),
                              containers_pb2.ListContainersResponse, "list containers").containers)

    def create_container(self, container: containers_pb2.Container) -> containers_pb2.Container:
        return self.call("/containerd.services.containers.v1.Containers/Create",
                         containers_pb2.CreateContainerRequest(container=container),
                         containers_pb2.CreateContainerResponse,
                         f"create container {container.id}").container

    def delete_container(self, container_id: str) -> None:
        self._empty("/containerd.services.containers.v1.Containers/Delete",
                    containers_pb2.DeleteContainerRequest(id=container_id),
                    f"delete container {container_id}")

    # Tasks ------------------------------------------------------------------------------------

    def get_task(self, container_id: str) -> tasks_pb2.GetResponse:
        return self.call("/containerd.services.tasks.v1.Tasks/Get",
                         tasks_pb2.GetRequest(container_id=container_id), tasks_pb2.GetResponse,
                         f"task {container_id}")

    def create_task(self, request: tasks_pb2.CreateTaskRequest,
                    timeout: float | None = None) -> tasks_pb2.CreateTaskResponse:
        return self.call("/containerd.services.tasks.v1.Tasks/Create", request,
                         tasks_pb2.CreateTaskResponse, f"create task {request.container_id}",
                         timeout=timeout)

    def start_task(self, container_id: str, timeout: float | None = None) -> int:
        return self.call("/containerd.services.tasks.v1.Tasks/Start",
                         tasks_pb2.StartRequest(container_id=container_id),
                         tasks_pb2.StartResponse, f"start task {container_id}",
                         timeout=timeout).pid

    def delete_task(self, container_id: str) -> None:
        self.call("/containerd.services.tasks.v1.Tasks/Delete",
                  tasks_pb2.DeleteTaskRequest(container_id=container_id),
                  tasks_pb2.DeleteResponse, f"delete task {container_id}")

    def kill_task(self, container_id: str, signal: int, all_processes: bool = False) -> None:
        self._empty("/containerd.services.tasks.v1.Tasks/Kill",
                    tasks_pb2.KillRequest(container_id=container_id, signal=signal,
                                          all=all_processes), f"kill task {container_id}")

    def pause_task(self, container_id: str) -> None:
        self._empty("/containerd.services.tasks.v1.Tasks/Pause",
                    tasks_pb2.PauseTaskRequest(container_id=container_id),
                    f"pause task {container_id}")

    def resume_task(self, container_id: str) -> None:
        self._empty("/containerd.services.tasks.v1.Tasks/Resume",
                    tasks_pb2.ResumeTaskRequest(container_id=container_id),
                    f"resume task {container_id}")

    def checkpoint_task(self, container_id: str, options: runc_options_pb2.CheckpointOptions,
                        timeout: float | None = None) -> list[types_pb2.Descriptor]:
        from torpor.containerd.runtime import CHECKPOINT_OPTIONS_TYPE_URL, pack_any

        request = tasks_pb2.CheckpointTaskRequest(
            container_id=container_id,
            options=pack_any(CHECKPOINT_OPTIONS_TYPE_URL, options.SerializeToString()))
        return list(self.call("/containerd.services.tasks.v1.Tasks/Checkpoint", request,
                              tasks_pb2.CheckpointTaskResponse,
                              f"checkpoint task {container_id}", timeout=timeout).descriptors)

    def wait_task(self, container_id: str, timeout: float | None = None) -> tasks_pb2.WaitResponse:
        return self.call("/containerd.services.tasks.v1.Tasks/Wait",
                         tasks_pb2.WaitRequest(container_id=container_id), tasks_pb2.WaitResponse,
                         f"wait for task {container_id}", timeout=timeout)

    # Images -----------------------------------------------------------------------------------

    def get_image(self, name: str) -> images_pb2.Image:
        return self.call("/containerd.services.images.v1.Images/Get",
                         images_pb2.GetImageRequest(name=name), images_pb2.GetImageResponse,
                         f"image {name}").image

    def create_image(self, image: images_pb2.Image) -> images_pb2.Image:
        return self.call("/containerd.services.images.v1.Images/Create",
                         images_pb2.CreateImageRequest(image=image),
                         images_pb2.CreateImageResponse, f"create image {image.name}").image

    def delete_image(self, name: str) -> None:
        self._empty("/containerd.services.images.v1.Images/Delete",
                    images_pb2.DeleteImageRequest(name=name), f"delete image {name}")

    def update_image(self, image: images_pb2.Image) -> images_pb2.Image:
        return self.call("/containerd.services.images.v1.Images/Update",
                         images_pb2.UpdateImageRequest(image=image),
                         images_pb2.UpdateImageResponse, f"update image {image.name}").image

    # Content ----------------------------------------------------------------------------------

    def content_info(self, digest: str) -> content_pb2.Info:
        return self.call("/containerd.services.content.v1.Content/Info",
                         content_pb2.InfoRequest(digest=digest), content_pb2.InfoResponse,
                         f"content {digest}").info

    def has_content(self, digest: str) -> bool:
        try:
            self.content_info(digest)
            return True
        except NotFound:
            return False

    def read_content(self, digest: str, offset: int = 0, size: int = 0) -> Iterator[bytes]:
        stub = self.channel.unary_stream(
            "/containerd.services.content.v1.Content/Read",
            request_serializer=content_pb2.ReadContentRequest.SerializeToString,
            response_deserializer=content_pb2.ReadContentResponse.FromString)
        try:
            for chunk in stub(content_pb2.ReadContentRequest(digest=digest, offset=offset, size=size),
                              metadata=self.metadata()):
                yield chunk.data
        except grpc.RpcError as e:
            raise translate(e, f"read content {digest}", self.address) from None

    def write_content(self, ref: str, chunks: Callable[[], Iterable[bytes]], total: int,
                      expected: str, labels: dict[str, str] | None = None) -> str:
        """Stream a blob into the content store; returns its digest (already there: no-op).
        While another client writes the same ref (a restore of the same image started at the
        same moment), containerd answers "locked": wait for it, as containerd's own clients do,
        and take its blob when it is there or write again (`chunks()` anew) if it gave up."""
        waited, pause = 0.0, 0.02
        while True:
            if self.has_content(expected):
                if labels:
                    self.label_content(expected, labels)
                return expected
            try:
                return self._write_content(ref, chunks(), total, expected, labels)
            except _Locked as locked:
                if waited >= LOCKED_WAIT_S:
                    raise translate(locked.error, f"write content {expected}: another "
                                    f"writer held it for {LOCKED_WAIT_S:.0f} s",
                                    self.address) from None
                time.sleep(pause)
                waited, pause = waited + pause, min(pause * 2, 1.0)

    def _write_content(self, ref: str, chunks: Iterable[bytes], total: int, expected: str,
                       labels: dict[str, str] | None) -> str:

        def requests() -> Iterator[content_pb2.WriteContentRequest]:
            offset = 0
            yield content_pb2.WriteContentRequest(action=content_pb2.STAT, ref=ref)
            for chunk in chunks:
                for start in range(0, len(chunk), WRITE_CHUNK):
                    piece = chunk[start:start + WRITE_CHUNK]
                    yield content_pb2.WriteContentRequest(
                        action=content_pb2.WRITE, ref=ref, total=total, expected=expected,
                        offset=offset, data=piece)
                    offset += len(piece)
            yield content_pb2.WriteContentRequest(
                action=content_pb2.COMMIT, ref=ref, total=total, expected=expected, offset=offset,
                labels=labels or {})

        stub = self.channel.stream_stream(
            "/containerd.services.content.v1.Content/Write",
            request_serializer=content_pb2.WriteContentRequest.SerializeToString,
            response_deserializer=content_pb2.WriteContentResponse.FromString)
        digest = ""
        try:
            for response in stub(requests(), metadata=self.metadata(), timeout=None):
                if response.action == content_pb2.COMMIT:
                    digest = response.digest
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.ALREADY_EXISTS:
                return expected
            if e.code() == grpc.StatusCode.UNAVAILABLE and " locked" in (e.details() or ""):
                raise _Locked(e) from None
            raise translate(e, f"write content {expected}", self.address) from None
        return digest or expected

    def write_file(self, ref: str, path: str, size: int, digest: str,
                   labels: dict[str, str] | None = None) -> str:
        """Stream the file at `path` into the content store (read only if not there already)."""
        def chunks() -> Iterator[bytes]:
            with open(path, "rb") as f:
                while chunk := f.read(WRITE_CHUNK):
                    yield chunk

        return self.write_content(ref, chunks, size, digest, labels)

    def label_content(self, digest: str, labels: dict[str, str]) -> None:
        from google.protobuf import field_mask_pb2

        info = content_pb2.Info(digest=digest, labels=labels)
        mask = field_mask_pb2.FieldMask(paths=[f"labels.{k}" for k in labels])
        self.call("/containerd.services.content.v1.Content/Update",
                  content_pb2.UpdateRequest(info=info, update_mask=mask), content_pb2.UpdateResponse,
                  f"label content {digest}")

    # Snapshots and diff -----------------------------------------------------------------------

    def prepare_snapshot(self, snapshotter: str, key: str, parent: str,
                         labels: dict[str, str] | None = None) -> list[types_pb2.Mount]:
        return list(self.call("/containerd.services.snapshots.v1.Snapshots/Prepare",
                              snapshots_pb2.PrepareSnapshotRequest(
                                  snapshotter=snapshotter, key=key, parent=parent,
                                  labels=labels or {}),
                              snapshots_pb2.PrepareSnapshotResponse,
                              f"prepare snapshot {key}").mounts)

    def view_snapshot(self, snapshotter: str, key: str, parent: str) -> list[types_pb2.Mount]:
        return list(self.call("/containerd.services.snapshots.v1.Snapshots/View",
                              snapshots_pb2.ViewSnapshotRequest(snapshotter=snapshotter, key=key,
                                                                parent=parent),
                              snapshots_pb2.ViewSnapshotResponse, f"view snapshot {parent}").mounts)

    def snapshot_mounts(self, snapshotter: str, key: str) -> list[types_pb2.Mount]:
        return list(self.call("/containerd.services.snapshots.v1.Snapshots/Mounts",
                              snapshots_pb2.MountsRequest(snapshotter=snapshotter, key=key),
                              snapshots_pb2.MountsResponse, f"mounts of snapshot {key}").mounts)

    def stat_snapshot(self, snapshotter: str, key: str) -> snapshots_pb2.Info:
        return self.call("/containerd.services.snapshots.v1.Snapshots/Stat",
                         snapshots_pb2.StatSnapshotRequest(snapshotter=snapshotter, key=key),
                         snapshots_pb2.StatSnapshotResponse, f"snapshot {key}").info

    def has_snapshot(self, snapshotter: str, key: str) -> bool:
        try:
            self.stat_snapshot(snapshotter, key)
            return True
        except NotFound:
            return False

    def commit_snapshot(self, snapshotter: str, name: str, key: str,
                        labels: dict[str, str] | None = None) -> None:
        self._empty("/containerd.services.snapshots.v1.Snapshots/Commit",
                    snapshots_pb2.CommitSnapshotRequest(snapshotter=snapshotter, name=name, key=key,
                                                        labels=labels or {}),
                    f"commit snapshot {key}")

    def remove_snapshot(self, snapshotter: str, key: str) -> None:
        self._empty("/containerd.services.snapshots.v1.Snapshots/Remove",
                    snapshots_pb2.RemoveSnapshotRequest(snapshotter=snapshotter, key=key),
                    f"remove snapshot {key}")

    def diff(self, left: list[types_pb2.Mount], right: list[types_pb2.Mount], media_type: str,
             ref: str) -> types_pb2.Descriptor:
        """containerd's diff service: the changes from `left` to `right` as a layer blob."""
        return self.call("/containerd.services.diff.v1.Diff/Diff",
                         diff_pb2.DiffRequest(left=left, right=right, media_type=media_type,
                                              ref=ref),
                         diff_pb2.DiffResponse, f"diff {ref}", timeout=None).diff

    def apply_diff(self, diff: types_pb2.Descriptor,
                   mounts: list[types_pb2.Mount]) -> types_pb2.Descriptor:
        return self.call("/containerd.services.diff.v1.Diff/Apply",
                         diff_pb2.ApplyRequest(diff=diff, mounts=mounts), diff_pb2.ApplyResponse,
                         f"apply layer {diff.digest}", timeout=None).applied
