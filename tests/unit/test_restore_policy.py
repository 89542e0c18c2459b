"""The restore policy: what a checkpoint's spec asks for, and what allows it (the node's
`[restore]`, the user's flags), refused in words; the grant record torpor-runc checks again."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from torpor.capture import restore_policy as policy
from torpor.config import Config
from torpor.errors import RestoreError
from torpor.formats.spec_requests import GRANT_FILE, RestoreGrant, SpecRequests
from torpor.shim.modifiers import HOOK_MARKER

PLAIN: dict[str, Any] = {   # what ctr run gives a container, in short
    "root": {"path": "rootfs"},
    "process": {"capabilities": {"bounding": ["CAP_CHOWN", "CAP_KILL"]}},
    "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
               {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"}],
    "hooks": {"createRuntime": [{"path": "/old/node/torpor-hook", "args": [HOOK_MARKER, "x"]}]},
    "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")],
              "resources": {"devices": [{"allow": False, "access": "rwm"},
                                        {"allow": True, "type": "c", "major": 1, "minor": 3,
                                         "access": "rwm"},
                                        {"allow": True, "type": "c", "major": 136,
                                         "access": "rwm"}]},
              "cgroupsPath": "/default/web1"},
}


def spec(**changes: Any) -> dict[str, Any]:
    import json

    out: dict[str, Any] = json.loads(json.dumps(PLAIN))
    for key, value in changes.items():
        target = out
        *parents, last = key.split("__")
        for parent in parents:
            target = target.setdefault(parent, {})
        target[last] = value
    return out


NO_POLICY, NO_GRANTS = policy.RestorePolicy(), policy.UserGrants()


def refused(document: dict[str, Any], node: policy.RestorePolicy = NO_POLICY,
            grants: policy.UserGrants = NO_GRANTS) -> list[str]:
    return [v.what for v in policy.refusals(SpecRequests.of(document), node, grants)]


def test_a_plain_container_needs_nothing_and_torpors_own_hooks_are_not_requests() -> None:
    assert HOOK_MARKER == "torpor-hook"
    assert refused(PLAIN) == []


HOSTILE = {
    "hook": (spec(hooks={"prestart": [{"path": "/bin/sh", "args": ["sh", "-c", "id"]}]}),
             "prestart hook /bin/sh sh -c id"),
    "root-on-host": (spec(root={"path": "/etc"}), "root filesystem at '/etc'"),
    "root-dotdot": (spec(root={"path": "../../.."}), "root filesystem at '../../..'"),
    "bind-mount": (spec(mounts=[{"destination": "/host", "type": "bind", "source": "/",
                                 "options": ["rbind", "rw"]}]),
                   "bind mount of host path '/' at /host"),
    "disk-mount": (spec(mounts=[{"destination": "/d", "type": "ext4", "source": "/dev/sda1"}]),
                   "ext4 mount of host path '/dev/sda1' at /d"),
    "devtmpfs": (spec(mounts=[{"destination": "/dev", "type": "devtmpfs", "source": "dev"}]),
                 "devtmpfs mount"),
    "device-node": (spec(linux__devices=[{"path": "/dev/sda", "type": "b", "major": 8,
                                          "minor": 0}]), "device /dev/sda (b 8:0)"),
    "all-devices": (spec(linux__resources={"devices": [{"allow": True, "access": "rwm"}]}),
                    "access to devices a *:* (rwm)"),
    "capability": (spec(process={"capabilities": {"effective": ["CAP_SYS_ADMIN"]}}),
                   "capability CAP_SYS_ADMIN"),
    "host-pid": (spec(linux__namespaces=[{"type": t} for t in ("ipc", "uts", "mount",
                                                               "network")]),
                 "the host's pid namespace"),
    "join-netns": (spec(linux__namespaces=[{"type": "network", "path": "/proc/1/ns/net"},
                                           *({"type": t} for t in ("pid", "ipc", "uts",
                                                                    "mount"))]),
                   "joining the network namespace /proc/1/ns/net"),
    "cgroup-dotdot": (spec(linux__cgroupsPath="/../../system.slice"),
                      "cgroup path '/../../system.slice'"),
    # what a hook calls itself proves nothing outside the stages torpor-runc replaces
    "hook-named-torpor-hook": (spec(hooks={"prestart": [
        {"path": "/bin/sh", "args": [HOOK_MARKER, "-c", "id"]}]}),
        "prestart hook /bin/sh torpor-hook -c id"),
    "criu-config": (spec(annotations={"org.criu.config": "/tmp/evil.conf"}),
                    "annotation org.criu.config='/tmp/evil.conf', which runc hands to CRIU"),
    "systemd-property": (spec(annotations={"org.systemd.property.Delegate": "true"}),
                         "annotation org.systemd.property.Delegate"),
    "crun": (spec(annotations={"run.oci.hooks.stdout": "/etc/passwd"}),
             "annotation run.oci.hooks.stdout"),
    "shim-group": (spec(annotations={"io.kubernetes.cri.sandbox-id": "abc"}),
                   "annotation io.kubernetes.cri.sandbox-id"),
    "restore-option": (spec(annotations={"io.torpor.restore.add-addresses": "true"}),
                       "annotation io.torpor.restore.add-addresses"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_what_a_hostile_spec_asks_is_refused_in_words(case: str) -> None:
    document, words = HOSTILE[case]
    found = refused(document)
    assert any(words in what for what in found), found
    with pytest.raises(RestoreError, match="does not allow"):
        policy.check(SpecRequests.of(document), policy.RestorePolicy())


def test_the_node_and_the_user_can_allow_each_request() -> None:
    node = policy.RestorePolicy(hooks=("/bin/sh",), mount_sources=("/srv/data",),
                                devices=("b 8:*",), capabilities=("CAP_SYS_ADMIN",),
                                host_namespaces=("pid",))
    assert refused(HOSTILE["hook"][0], node) == []
    assert refused(HOSTILE["device-node"][0], node) == []
    assert refused(HOSTILE["capability"][0], node) == []
    assert refused(HOSTILE["host-pid"][0], node) == []
    data = spec(mounts=[{"destination": "/data", "type": "bind", "source": "/srv/data/a",
                         "options": ["rbind"]}])
    assert refused(data, node) == []
    sneaky = spec(mounts=[{"destination": "/data", "type": "bind",
                           "source": "/srv/data/../../etc", "options": ["rbind"]}])
    assert refused(sneaky, node) != []
    assert refused(HOSTILE["hook"][0], grants=policy.UserGrants(spec_hooks=True)) == []
    assert refused(HOSTILE["bind-mount"][0],
                   grants=policy.UserGrants(mounts=frozenset({"/host"}))) == []
    assert refused(HOSTILE["join-netns"][0],
                   grants=policy.UserGrants(netns="/proc/1/ns/net")) == []
    assert refused(HOSTILE["root-on-host"][0], node,
                   policy.UserGrants(spec_hooks=True)) != []   # nothing allows that


def test_the_policy_comes_from_the_config() -> None:
    cfg = Config({"restore": {"hooks": ["/usr/bin/nvidia-ctk"], "devices": ["c 195:*"]}})
    node = policy.RestorePolicy.of(cfg)
    gpu = spec(linux__devices=[{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}],
               hooks={"createContainer": [{"path": "/usr/bin/nvidia-ctk", "args": ["x"]}]})
    assert refused(gpu, node) == []


def test_torpor_runc_accepts_exactly_what_torpor_restore_granted(tmp_path: Path) -> None:
    hooked = SpecRequests.of(HOSTILE["hook"][0])
    policy.write_grant(str(tmp_path), hooked)
    assert (tmp_path / GRANT_FILE).stat().st_mode & 0o777 == 0o600
    granted = policy.take_grant(str(tmp_path))
    assert granted == hooked and not (tmp_path / GRANT_FILE).exists()   # taken: once only
    policy.check_in_runtime(hooked, policy.RestorePolicy(), granted)
    more = SpecRequests.of(spec(hooks={"prestart": [{"path": "/bin/evil", "args": []}]}))
    with pytest.raises(RestoreError, match="/bin/evil"):
        policy.check_in_runtime(more, policy.RestorePolicy(), granted)
    with pytest.raises(RestoreError, match="/bin/sh"):   # ctr restore: no record
        policy.check_in_runtime(hooked, policy.RestorePolicy(), policy.take_grant(str(tmp_path)))
    (tmp_path / GRANT_FILE).write_bytes(RestoreGrant(hooked, time.time() - 1).dumps())
    assert policy.take_grant(str(tmp_path)) is None   # expired


def test_odd_specs_are_read_without_crashing() -> None:
    for document in ({}, {"hooks": "x", "mounts": 5, "linux": [], "process": {"capabilities": 3}},
                     {"hooks": {"prestart": [5]}, "mounts": [5, {"options": "bind"}],
                      "linux": {"devices": [{"major": "8"}], "namespaces": [3]}}):
        SpecRequests.of(document)


def test_a_spec_this_node_sealed_needs_no_policy_and_a_changed_one_does(tmp_path: Path) -> None:
    cfg = Config({"image": {"store": str(tmp_path / "store")}})
    key = policy.node_key(cfg)
    assert len(key) == 32 and policy.node_key(cfg) == key  # made once, then read
    assert (tmp_path / "store" / policy.NODE_KEY).stat().st_mode & 0o777 == 0o600
    spec = {"hooks": {"createRuntime": [{"path": "/usr/bin/nerdctl",
                                         "args": ["nerdctl", "internal", "oci-hook"]}]},
            "mounts": [{"destination": "/data", "source": "/srv/data", "type": "bind"}]}
    requests = SpecRequests.of(spec)
    sealed = policy.seal(key, requests)
    assert policy.sealed_here(key, requests, sealed)
    policy.check_in_runtime(requests, policy.RestorePolicy(), None, sealed_here=True)
    with pytest.raises(RestoreError, match="createRuntime hook /usr/bin/nerdctl"):
        policy.check_in_runtime(requests, policy.RestorePolicy(), None)
    tampered = SpecRequests.of({**spec, "mounts": [
        {"destination": "/data", "source": "/etc", "type": "bind"}]})
    assert not policy.sealed_here(key, tampered, sealed)
    other_node = Config({"image": {"store": str(tmp_path / "other")}})
    assert not policy.sealed_here(policy.node_key(other_node), requests, sealed)
    assert not policy.sealed_here(key, requests, "")


def test_only_containerds_cri_directory_marks_a_kubernetes_restore(tmp_path: Path) -> None:
    cri = tmp_path / "state" / "io.containerd.grpc.v1.cri" / "containers" / "c1" / "ctrd-restore"
    (cri / "checkpoint").mkdir(parents=True)
    assert policy.built_by_cri(str(cri / "checkpoint"), "c1")
    assert not policy.built_by_cri(str(cri / "checkpoint"), "c2")  # another container's
    assert not policy.built_by_cri(str(tmp_path / "ctrd-checkpoint123"), "c1")  # ctr, nerdctl
    link = tmp_path / "looks-like-cri"
    link.symlink_to(tmp_path)  # a path that only names the directory does not count
    assert not policy.built_by_cri(str(link / "io.containerd.grpc.v1.cri-x" / "c1"), "c1")


def test_annotations_the_node_acts_on_need_their_own_key_or_family() -> None:
    criu = spec(annotations={"org.criu.config": "/etc/criu/x.conf"})
    assert refused(criu, policy.RestorePolicy(annotations=("org.criu.config",))) == []
    assert refused(criu, policy.RestorePolicy(annotations=("org.criu.*",))) == []
    for broad in ("org.*", "*", "org.c*"):   # written for inert keys: they name no acted-on one
        assert refused(criu, policy.RestorePolicy(annotations=(broad,))) != [], broad
    group = spec(annotations={"io.kubernetes.cri.sandbox-id": "abc"})
    assert refused(group, policy.RestorePolicy(annotations=("io.kubernetes.cri.*",))) != []
    added = spec(annotations={"io.torpor.restore.add-addresses": "true"})
    users = policy.UserGrants(annotations=frozenset({"io.torpor.restore.add-addresses"}))
    assert refused(added, grants=users) == []


def test_inert_annotations_travel_only_where_the_policy_names_them() -> None:
    document = spec(annotations={"org.opencontainers.image.title": "t", "nerdctl/name": "web",
                                 "com.example.note": "x", "org.criu.config": "/x.conf"})
    node = policy.RestorePolicy.of(Config({}))
    assert policy.admit_annotations(document, node) == ["com.example.note"]
    # the acted-on one stays, for the policy to refuse in words
    assert sorted(document["annotations"]) == ["nerdctl/name", "org.criu.config",
                                               "org.opencontainers.image.title"]
    kept = spec(annotations={"com.example.note": "x"})
    assert policy.admit_annotations(kept, policy.RestorePolicy(annotations=("com.example.*",))) \
        == [] and kept["annotations"] == {"com.example.note": "x"}


def test_seals_of_specs_without_acted_on_annotations_are_unchanged() -> None:
    """A seal made before annotations were requests still matches (no key in the JSON)."""
    assert "annotations" not in SpecRequests.of(PLAIN).to_json()
    criu = SpecRequests.of(spec(annotations={"org.criu.config": "/a"}))
    assert criu != SpecRequests.of(spec(annotations={"org.criu.config": "/b"}))
    from torpor.formats.fields import Fields

    assert SpecRequests.from_json(Fields(criu.to_json(), "x")) == criu


def test_restore_time_options_are_the_users_never_the_checkpoints() -> None:
    """A checkpoint's own io.torpor.restore.add-addresses would add addresses of its choosing to
    the namespace the user gave with --netns: torpor restore drops it; the user's flag sets it."""
    from torpor.ops.restore import RestoreOptions, rewrite_spec

    document = spec(annotations={"io.torpor.restore.add-addresses": "true"})
    given = RestoreOptions(netns="/var/run/netns/blue")
    rewritten = rewrite_spec(document, "web1", "web1", given)
    assert "io.torpor.restore.add-addresses" not in rewritten["annotations"]
    asked = rewrite_spec(document, "web1", "web1",
                         RestoreOptions(netns="/var/run/netns/blue", add_addresses=True))
    assert asked["annotations"]["io.torpor.restore.add-addresses"] == "true"
