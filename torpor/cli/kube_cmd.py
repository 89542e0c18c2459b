"""torpor kube archive|import|image: torpor's checkpoints and kubelet's, one into the other;
torpor kube migrate: a running pod moved to another node."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time

import click

from torpor import config
from torpor.cli.durations import duration_option
from torpor.cli.output import Globals, emit_json, human_size
from torpor.cli.registry_flags import access_from, registry_options
from torpor.cli.target_flags import check_target
from torpor.kube.api import KubeApi
from torpor.ops import kube, migrate
from torpor.ops.kube import KubeResult
from torpor.ops.transaction import signals_abort


@click.group("kube")
def kube_group() -> None:
    """Kubernetes: kubelet's checkpoint archives and the checkpoint images pods restore from.

    \b
    torpor kube archive SOURCE -o FILE          a torpor checkpoint as a kubelet archive
    torpor kube import ARCHIVE -o DIR           a kubelet archive as a torpor checkpoint
    torpor kube import ARCHIVE -t REF [--push]  ... as a torpor checkpoint image
    torpor kube image SOURCE -t REF             the image a pod restores from, pushed
    torpor kube migrate NS/POD --to NODE --registry REPO   a running pod to another node
    torpor kube freeze POD_UID                  a pod's containers held frozen (on its node)
    torpor kube node                            how this node restores pods
    torpor kube restored POD_UID                which of its containers were restored here
    torpor kube unpush REF@DIGEST...            delete what a failed migration pushed
    """


@kube_group.command("archive")
@click.argument("source", metavar="DIR|REF")
@click.option("-o", "--output", "out", required=True, metavar="FILE",
              help="Write the kubelet checkpoint archive here.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@registry_options
@click.pass_obj
def archive_command(g: Globals, source: str, out: str, as_json: bool, username: str | None,
                    password_stdin: bool, ca_file: str | None, insecure: bool) -> None:
    """A torpor checkpoint as a kubelet checkpoint archive: `crictl create POD CTR.json POD.json`
    with the archive's path as the image restores it in a pod of runtime class torpor."""
    result = kube.archive(source, out, config.load(),
                          access_from(username, password_stdin, ca_file, insecure),
                          g.progress(quiet=as_json))
    _report(result, as_json, f"wrote {result.archive} ({human_size(result.bytes)})")


@kube_group.command("import")
@click.argument("archive", metavar="ARCHIVE", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", "directory", metavar="DIR",
              help="Write a checkpoint directory (new) here.")
@click.option("--oci", is_flag=True, help="With -o: write an OCI image layout instead.")
@click.option("-t", "--tag", "ref", metavar="REF",
              help="Make a checkpoint image REF (kept locally: torpor ls).")
@click.option("--push", is_flag=True, help="Push the image to REF's registry.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@registry_options
@click.pass_obj
def import_command(g: Globals, archive: str, directory: str | None, oci: bool, ref: str | None,
                   push: bool, as_json: bool, username: str | None, password_stdin: bool,
                   ca_file: str | None, insecure: bool) -> None:
    """A kubelet checkpoint archive as a torpor checkpoint. Its base image must be in
    containerd (-n k8s.io on the node the pod ran on)."""
    check_target(directory, oci, ref, push)
    with g.client() as client:
        result = kube.import_archive(
            client, archive, config.load(), directory=directory, oci=oci, ref=ref, push=push,
            access=access_from(username, password_stdin, ca_file, insecure),
            progress=g.progress(quiet=as_json))
    where = (result.directory or (f"pushed {result.reference}" if push else
                                  f"image {ref}" if ref else f"OCI layout {result.layout}"))
    _report(result, as_json, f"imported {result.container}: {where}")


@kube_group.command("image")
@click.argument("source", metavar="ARCHIVE|DIR|REF")
@click.option("-t", "--tag", "ref", metavar="REF", help="Push the image as REF.")
@click.option("-o", "--output", "directory", metavar="DIR",
              help="Write the image as an OCI image layout here.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@registry_options
@click.pass_obj
def image_command(g: Globals, source: str, ref: str | None, directory: str | None,
                  as_json: bool, username: str | None, password_stdin: bool,
                  ca_file: str | None, insecure: bool) -> None:
    """The checkpoint image a pod restores from (annotation org.criu.checkpoint.container.name):
    `crictl pull REF`, then REF as the container's image. SOURCE is a kubelet archive or any
    torpor checkpoint."""
    if not ref and not directory:
        raise click.UsageError("give -t REF (pushed) or -o DIR (an OCI layout), or both")
    result = kube.image(source, config.load(), ref=ref, directory=directory,
                        access=access_from(username, password_stdin, ca_file, insecure),
                        progress=g.progress(quiet=as_json))
    where = " and ".join(x for x in (f"pushed {result.reference}" if result.reference else "",
                                     f"OCI layout {result.layout}" if result.layout else "") if x)
    _report(result, as_json, f"checkpoint image of {result.container}: {where} "
                             f"({human_size(result.bytes)} layer, {result.digest})")


@kube_group.command("migrate")
@click.argument("target", metavar="[NAMESPACE/]POD")
@click.option("--to", "node", required=True, metavar="NODE", help="The node the pod moves to.")
@click.option("--registry", "repository", envvar="TORPOR_KUBE_REGISTRY", required=True,
              metavar="REPO", help="Push the checkpoint images under this repository "
              "(REPO/NAMESPACE/POD/CONTAINER:TIME); both nodes pull from it "
              "[env TORPOR_KUBE_REGISTRY].")
@click.option("--keep-source", is_flag=True, help="Leave the original pod running.")
@click.option("--name", "new_name", metavar="NAME",
              help="The moved pod's name (default: the original's, with a suffix).")
@click.option("--timeout", "timeout", default="5m", show_default=True, metavar="DURATION",
              callback=duration_option,
              help="Longest wait for each checkpoint, each image and the moved pod to be ready.")
@click.option("--kubeconfig", metavar="FILE", envvar="KUBECONFIG",
              help="kubectl's kubeconfig [env KUBECONFIG].")
@click.option("--context", metavar="NAME", help="The kubeconfig context.")
@click.option("--kubectl", "kubectl", default="kubectl", show_default=True, metavar="PATH",
              help="The kubectl that reaches the cluster.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def migrate_command(g: Globals, target: str, node: str, repository: str, keep_source: bool,
                    new_name: str | None, timeout: float, kubeconfig: str | None,
                    context: str | None, kubectl: str, as_json: bool) -> None:
    """Move a running pod to NODE: each container checkpointed through kubelet, its checkpoint
    image built, signed and pushed on the pod's node by torpor's node agent, a pod on NODE from
    the original's spec restored from those images, the original deleted once that one is
    ready. On any failure the original keeps running and what was made is removed."""
    namespace, _, name = target.rpartition("/")
    api = KubeApi(kubectl=kubectl, kubeconfig=kubeconfig, context=context)
    with signals_abort():    # SIGTERM and SIGHUP undo what was made, as Ctrl-C does
        result = migrate.migrate(api, namespace or "default", name, node,
                                 repository=repository, keep_source=keep_source,
                                 new_name=new_name, timeout_s=int(timeout),
                                 progress=g.progress(quiet=as_json))
    if as_json:
        emit_json(result.to_json())
        return
    kept = "; the original keeps running" if keep_source else ""
    click.echo(f"moved {result.source} from {result.source_node} to {result.target_node} as "
               f"{result.pod} in {result.seconds:.2f}s (checkpoints "
               f"{result.checkpoint_seconds:.2f}s){kept}")


@kube_group.command("node")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def node_command(g: Globals, as_json: bool) -> None:
    """How this node restores a pod from a checkpoint image: through containerd's CRI (2.1 to
    2.3), through torpor's restore on create ([restore] on_create), or not at all."""
    from torpor.ops import kube_node

    with g.client() as client:
        found = kube_node.pod_restore(client, config.load())
    if as_json:
        emit_json(found.to_json())
        return
    how = {"cri": "through containerd's CRI (torpor kube image)",
           "on-create": f"through torpor's restore on create ({found.on_create}; torpor kube "
                        "import --push)",
           "none": "not at all: set [restore] on_create = \"signed\" (docs/kubernetes.md)"}
    click.echo(f"containerd {found.containerd}: pods restore {how[found.restore]}; this node "
               f"{'signs' if found.signs else 'does not sign'} what it pushes")


@kube_group.command("restored")
@click.argument("pod_uid", metavar="POD_UID")
@click.pass_obj
def restored_command(g: Globals, pod_uid: str) -> None:
    """Which of a pod's containers on this node torpor-runc restored at create, and which
    started cold (JSON: {"restored": [...], "cold": [...]})."""
    from torpor.containerd.client import Client
    from torpor.ops import kube_node
    from torpor.ops.pod_freeze import CRI_NAMESPACE

    with Client(g.address, CRI_NAMESPACE) as client:
        done, cold = kube_node.restored(client, config.load(), pod_uid)
    emit_json({"restored": done, "cold": cold})


@kube_group.command("unpush")
@click.argument("refs", nargs=-1, required=True, metavar="REF@DIGEST...")
@registry_options
@click.pass_obj
def unpush_command(g: Globals, refs: tuple[str, ...], username: str | None,
                   password_stdin: bool, ca_file: str | None, insecure: bool) -> None:
    """Delete checkpoint images from their registry, by digest (every tag on them goes too):
    what `torpor kube migrate` pushed for a move that failed."""
    from torpor.ops import kube_node

    for ref in kube_node.unpush(config.load(), list(refs),
                                access_from(username, password_stdin, ca_file, insecure)):
        click.echo(f"deleted {ref}")


@kube_group.command("freeze")
@click.argument("pod_uid", metavar="POD_UID")
@click.option("--for", "hold_s", default="2m", show_default=True, metavar="DURATION",
              callback=duration_option, help="Resume the pod after this long, whatever else.")
@click.pass_obj
def freeze_command(g: Globals, pod_uid: str, hold_s: float) -> None:
    """Hold a pod's containers frozen on this node, so that checkpoints of each are of one
    instant: prints `frozen NAME...`, then resumes them when stdin closes (`thawed`), or on
    SIGTERM, SIGINT or SIGHUP, or after --for (`thawed early`, exit 1: the holder did not let
    go). `torpor kube migrate` runs it through the node agent."""
    from torpor.containerd.client import Client
    from torpor.ops import pod_freeze

    signalled: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):   # before anything is paused
        signal.signal(sig, lambda signum, frame: signalled.append(signum))
    # the node's OOM killer takes anything before this
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("-1000")
    with Client(g.address, pod_freeze.CRI_NAMESPACE) as client, \
            pod_freeze.frozen(client, pod_uid, hold_s) as paused:
        click.echo("frozen " + " ".join(c.name for c in paused))
        sys.stdout.flush()
        let_go = _hold(hold_s, signalled)
    if not let_go:
        click.echo("thawed early: " + (f"signal {signalled[0]}" if signalled
                                       else f"--for {hold_s:.0f}s passed"))
        sys.exit(1)
    click.echo("thawed")


def _hold(seconds: float, signalled: list[int]) -> bool:
    """Until stdin closes (True), a signal comes or `seconds` pass (False)."""
    deadline = time.monotonic() + seconds
    while not signalled and (left := deadline - time.monotonic()) > 0:
        with contextlib.suppress(InterruptedError):
            readable, _, _ = select.select([sys.stdin], [], [], min(left, 0.2))
            if readable and not os.read(sys.stdin.fileno(), 4096):
                return True
    return False


def _report(result: KubeResult, as_json: bool, line: str) -> None:
    if as_json:
        emit_json(result.to_json())
    else:
        click.echo(f"{line} in {result.seconds:.2f}s")


COMMANDS = {"kube": kube_group}
