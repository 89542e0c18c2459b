"""torpor inspect DIR|ARCHIVE|REF: what a checkpoint holds."""

from __future__ import annotations

import click

from torpor import config
from torpor.cli.encryption_flags import decryption_key_option, keys_from
from torpor.cli.output import emit_json, human_size, table
from torpor.cli.registry_flags import access_from, registry_options
from torpor.lazy import progress as lazy_progress
from torpor.ops.inspect import InspectReport, inspect
from torpor.signing import SignatureCheck


@click.command("inspect")
@click.argument("source", metavar="DIR|ARCHIVE|REF")
@click.option("--json", "as_json", is_flag=True, help="Print everything as JSON.")
@decryption_key_option
@registry_options
def inspect_command(source: str, as_json: bool, decryption_keys: tuple[str, ...],
                    username: str | None, password_stdin: bool, ca_file: str | None,
                    insecure: bool) -> None:
    """What a checkpoint holds: processes, memory, layers, timings, node, network, mounts, GPUs,
    and what a restore on this node would grant its spec. A registry image is inspected from
    its metadata alone; no layer is downloaded (an encrypted one's metadata layer with
    --decryption-key). A kubelet checkpoint archive (ARCHIVE) is read without extracting it."""
    report = inspect(source, config.load(), access_from(username, password_stdin, ca_file,
                                                        insecure), keys_from(decryption_keys))
    if as_json:
        emit_json(report.to_json())
        return
    click.echo(render(report))


def render(report: InspectReport) -> str:
    m = report.metadata
    sizes, node, state = m.sizes, m.node, m.state
    lines = [
        f"checkpoint   {report.source} ({report.kind.value})"
        + (f"  {report.digest}" if report.digest else ""),
        f"container    {m.container.id}  from image "
        f"{m.image.name if m.image else (m.container.image or '-')}",
        f"created      {m.created}  by torpor {m.torpor_version}",
        f"memory       {human_size(sizes.memory_pages)} of pages; rootfs changes "
        f"{human_size(sizes.rootfs_diff)}; total {human_size(sizes.total)}",
        "timings      " + ", ".join(f"{k} {v:.2f}s" for k, v in m.timings.items()),
        (f"node         {node.architecture} kernel {node.kernel}, CRIU {node.criu_version}, runc "
         f"{node.runc_version}, cgroup v{node.cgroup_version}, {len(node.cpu_flags)} CPU features"
         if node.architecture else "node         not recorded (CRIU checks it on restore)"),
        "criu flags   " + (", ".join(state.criu.enabled()) or "-"),
    ]
    if report.kube is not None:
        k = report.kube
        lines[1:1] = [
            f"kubernetes   container {k.container} of pod {k.namespace or '-'}/{k.pod or '-'}, "
            f"runtime {k.runtime}; base image {k.base_image_ref}",
            "restore      " + ("in a pod of runtime class torpor, or with torpor restore"
                               if k.torpor_state else "by any pod (plain runc, no torpor state)"),
            f"archive      checkpoint {human_size(k.checkpoint_bytes)}, rootfs-diff.tar "
            f"{human_size(k.rootfs_diff_bytes)}"]
    if state.processes:
        lines.append("processes")
        ns_of = {p.pid: p.ns_pid for p in state.processes}  # host pid -> the container's pid
        lines.append(_indent(table(["PID", "PPID", "NAME", "RSS", "COMMAND"], [
            [str(p.ns_pid), str(ns_of.get(p.ppid, 0)), p.name, human_size(p.rss_bytes),
             " ".join(p.cmdline)[:60]] for p in state.processes])))
    if report.sealed:   # the spec, processes and network are in the encrypted metadata layer
        lines += [f"{what:<12} encrypted (give --decryption-key KEY.pem to see them)"
                  for what in ("processes", "network", "mounts")]
    else:
        network = state.network
        lines.append("network      " + (", ".join(
            f"{a.address}/{a.prefixlen} ({a.ifname})" for a in network.config.addresses) or "-")
            + ("  (its own namespace: a restore makes a new one)" if network.created_by_runtime
               else f"  (it joined {network.netns_path}: a restore needs --netns)"
               if network.netns_path else ""))
        listening = [f"{s.proto} {s.address}:{s.port} {s.state}" for s in network.sockets]
        if listening:
            lines.append("sockets      " + "; ".join(listening[:8]))
        mounts = m.container.spec.get("mounts") or []
        lines.append("mounts       " + (", ".join(
            f"{mount.get('destination')} ({mount.get('type')})" for mount in mounts) or "-"))
    if state.gpu is not None:
        from torpor.gpu.inventory import describe

        pids = ", ".join(str(p.ns_pid) for p in state.gpu.processes)
        lines.append(f"gpus         CUDA processes (container pids): {pids}")
        if state.gpu.inventory is not None:
            lines.extend(f"             {line}" for line in describe(state.gpu.inventory))
    else:
        lines.append("gpus         none")
    if report.encrypted:
        lines.append(f"encrypted    for {', '.join(report.recipients) or 'unknown recipients'}"
                     + ("; spec, processes and network need --decryption-key" if report.sealed
                        else ""))
    if not report.sealed:
        lines.append("a restore here would grant")
        lines.extend(f"  {'ok     ' if v.allowed_by else 'REFUSED'}  {v.what}"
                     + (f"  [{v.allowed_by}]" if v.allowed_by else f"  (allow with: {v.remedy})")
                     for v in report.grants)
    if report.signatures is not None:
        lines.extend(_signature_lines(report.signatures))
    if report.criu_error:
        lines.append(f"CRIU images  not checked: {report.criu_error}")
    elif report.criu_findings is not None:
        lines.append("CRIU images  " + ("nothing beyond the spec" if not report.criu_findings
                                        else "a restore here would refuse"))
        lines.extend(f"  REFUSED  {f.what}  (allow with: {f.remedy})"
                     for f in report.criu_findings)
    elif report.kube is None:
        lines.append("CRIU images  in the image's state layers, not read here: torpor restore "
                     "checks them")
    generation = report.generation
    if generation is not None:
        built = (f"on {generation.previous[:19]}, adding {human_size(generation.new_bytes)}"
                 if generation.previous and generation.new_bytes is not None else
                 "a first generation")
        lines.append(f"generation   stores {human_size(generation.stored_bytes)}; {built}")
        if generation.estimate_full_bytes is not None and generation.estimate_new_bytes is not None:
            actual_new = generation.new_bytes if generation.new_bytes is not None else 0
            lines.append(
                f"estimate     {human_size(generation.estimate_full_bytes)} in full, "
                f"{human_size(generation.estimate_new_bytes)} new (torpor estimate, "
                f"{generation.estimate_created}); actual {human_size(generation.stored_bytes)}, "
                f"{human_size(actual_new)} new")
    lines.extend(
        f"restoring    lazily here as {p.container} (namespace {p.namespace}): "
        f"{human_size(p.placed_bytes)} of {human_size(p.lazy_bytes)} of memory in "
        f"({p.fraction:.0%}), {lazy_progress.since(p):.0f}s" for p in report.restoring)
    if report.layers:
        lines.append("layers")
        lines.append(_indent(table(["MEDIA TYPE", "SIZE", "DIGEST"], [
            [d.media_type, human_size(d.size), d.digest[:19]] for d in report.layers])))
    return "\n".join(lines)


def _signature_lines(check: SignatureCheck) -> list[str]:
    own = "; made by this node" if check.made_here else ""
    if not check.signatures and not check.unreadable:
        return [f"signatures   none in {check.where}{own} ([restore] signatures = "
                f"\"{check.policy.value}\")"]
    lines = [f"signatures   {len(check.signatures) + len(check.unreadable)} in {check.where}{own} "
             f"([restore] signatures = \"{check.policy.value}\")"]
    lines.extend(f"  {'ok     ' if s.verified_by else 'BAD    '}  {s.layer[:19]}  {s.describe()}"
                 for s in check.signatures)
    lines.extend(f"  BAD      {u}" for u in check.unreadable)
    return lines


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


COMMANDS = {"inspect": inspect_command}
