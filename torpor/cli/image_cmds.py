"""torpor push, pull, inspect, ls, rm: checkpoint images in the local store and in registries."""

from __future__ import annotations

import click

from torpor import config
from torpor.cli.context import Globals, emit_json, human_size, table
from torpor.cli.registry_flags import flags_from, registry_options
from torpor.ops import images as flows


@click.command("push")
@click.argument("source", metavar="SOURCE")
@click.argument("ref", required=False, metavar="[REF]")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@registry_options
@click.pass_obj
def push_command(g: Globals, source: str, ref: str | None, as_json: bool, username: str | None,
                 password_stdin: bool, ca_file: str | None, insecure: bool) -> None:
    """Push a checkpoint (a local image, a checkpoint directory or an OCI layout) to REF."""
    target = ref or source
    with g.client() as client:
        result = flows.push(client, source, target, config.load(),
                            flags_from(username, password_stdin, ca_file, insecure),
                            g.progress(quiet=as_json))
    if as_json:
        emit_json(result)
        return
    click.echo(f"pushed {result['reference']}: {result['uploaded']} blobs uploaded "
               f"({human_size(result['bytes_uploaded'])}), {result['mounted']} mounted, "
               f"{result['existing']} already there")


@click.command("pull")
@click.argument("ref")
@click.option("-o", "--output", "out", metavar="DIR", help="Into this OCI layout, not the store.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@registry_options
@click.pass_obj
def pull_command(g: Globals, ref: str, out: str | None, as_json: bool, username: str | None,
                 password_stdin: bool, ca_file: str | None, insecure: bool) -> None:
    """Pull the checkpoint image REF (every layer digest-checked)."""
    result = flows.pull(ref, config.load(), flags_from(username, password_stdin, ca_file,
                                                       insecure), out, g.progress(quiet=as_json))
    if as_json:
        emit_json(result)
        return
    click.echo(f"pulled {result['reference']} ({result['container']}): {result['downloaded']} "
               f"blobs, {human_size(result['bytes_downloaded'])} into {result['layout']}")


@click.command("inspect")
@click.argument("source", metavar="DIR|REF")
@click.option("--json", "as_json", is_flag=True, help="Print everything as JSON.")
@registry_options
@click.pass_obj
def inspect_command(g: Globals, source: str, as_json: bool, username: str | None,
                    password_stdin: bool, ca_file: str | None, insecure: bool) -> None:
    """What a checkpoint holds: processes, memory, layers, timings, node, network, mounts, GPUs.
    A registry image is inspected from its metadata alone; no layer is downloaded."""
    info = flows.inspect(source, config.load(),
                         flags_from(username, password_stdin, ca_file, insecure))
    if as_json:
        emit_json(info)
        return
    click.echo(render(info))


def render(info: dict) -> str:  # type: ignore[type-arg]
    sizes, node = info.get("sizes") or {}, info.get("node") or {}
    timings = info.get("timings") or {}
    lines = [
        f"checkpoint   {info['source']} ({info['kind']})" + (f"  {info['digest']}" if
                                                             info.get("digest") else ""),
        f"container    {info['container']}  from image {info['image']}",
        f"created      {info['created']}  by torpor {info['torpor_version']}",
        f"memory       {human_size(sizes.get('memory_pages', 0))} of pages; rootfs changes "
        f"{human_size(sizes.get('rootfs_diff', 0))}; total {human_size(sizes.get('total', 0))}",
        "timings      " + ", ".join(f"{k} {v:.2f}s" for k, v in timings.items()),
        f"node         {node.get('architecture')} kernel {node.get('kernel')}, CRIU "
        f"{node.get('criu_version')}, runc {node.get('runc_version')}, cgroup "
        f"v{node.get('cgroup_version')}, {len(node.get('cpu_flags') or [])} CPU features",
        "criu flags   " + (", ".join(k for k, v in (info.get("criu_flags") or {}).items()
                                     if v is True) or "-"),
    ]
    processes = info.get("processes") or []
    if processes:
        lines.append("processes")
        ns_of = {p["pid"]: p["ns_pid"] for p in processes}  # host pid -> the container's pid
        lines.append(_indent(table(["PID", "PPID", "NAME", "RSS", "COMMAND"], [
            [str(p["ns_pid"]), str(ns_of.get(p["ppid"], 0)), p["name"], human_size(p["rss_bytes"]),
             " ".join(p["cmdline"])[:60]] for p in processes])))
    network = info.get("network") or {}
    lines.append(f"network      {network.get('netns_path')}: "
                 + ", ".join(network.get("addresses") or []))
    listening = [f"{s['proto']} {s['address']}:{s['port']} {s['state']}"
                 for s in network.get("sockets") or []]
    if listening:
        lines.append("sockets      " + "; ".join(listening[:8]))
    mounts = info.get("mounts") or []
    lines.append("mounts       " + ", ".join(f"{m['destination']} ({m['type']})" for m in mounts))
    gpus = info.get("gpus") or {}
    if gpus:
        from torpor.gpu.inventory import describe

        processes = ", ".join(str(p.get("ns_pid")) for p in gpus.get("processes", []))
        lines.append(f"gpus         CUDA processes (container pids): {processes}")
        lines.extend(f"             {line}" for line in describe(gpus.get("inventory") or {}))
    else:
        lines.append("gpus         none")
    layers = info.get("layers") or []
    if layers:
        lines.append("layers")
        lines.append(_indent(table(["MEDIA TYPE", "SIZE", "DIGEST"], [
            [lay["mediaType"], human_size(lay["size"]), lay["digest"][:19]] for lay in layers])))
    return "\n".join(lines)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


@click.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def ls_command(as_json: bool) -> None:
    """List the local checkpoint images."""
    entries = flows.ls(config.load())
    if as_json:
        emit_json(entries)
        return
    click.echo(table(["REF", "DIGEST", "SIZE"], [
        [e["ref"], e["digest"][:19], human_size(e["size"])] for e in entries]))


@click.command("rm")
@click.argument("refs", nargs=-1, required=True, metavar="REF...")
def rm_command(refs: tuple[str, ...]) -> None:
    """Delete local checkpoint images."""
    flows.rm(config.load(), list(refs))
    for ref in refs:
        click.echo(f"removed {ref}")


COMMANDS = {"push": push_command, "pull": pull_command, "inspect": inspect_command,
            "ls": ls_command, "rm": rm_command}
