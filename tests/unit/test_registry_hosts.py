"""containerd's hosts.toml read as ctr and nerdctl read it (registry/hosts.py): which hosts, in
what order, for what, and the request URLs a mirror gets."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torpor.errors import ConfigError
from torpor.registry import RegistryOptions
from torpor.registry.hosts import endpoints, for_capability
from torpor.registry.reference import parse_reference
from torpor.registry.session import RegistrySession


def write(root: Path, directory: str, text: str) -> Path:
    (root / directory).mkdir(parents=True)
    (root / directory / "hosts.toml").write_text(text)
    return root


def test_no_file_means_the_registry_itself(tmp_path: Path) -> None:
    assert [(e.scheme, e.host) for e in endpoints("reg:5000", "reg:5000", tmp_path)] == \
        [("", "reg:5000")]
    assert [e.host for e in endpoints("reg:5000", "reg:5000", None)] == ["reg:5000"]


def test_mirrors_first_in_order_then_the_server(tmp_path: Path) -> None:
    root = write(tmp_path, "reg.example:5000", '''
server = "https://origin.example"
ca = "/etc/ssl/origin.pem"
[host."http://10.0.0.5:5000"]
  capabilities = ["pull", "resolve"]
[host."https://cache.example/registry/v2"]
  capabilities = ["pull"]
  override_path = true
  skip_verify = true
  client = [["/c.pem", "/c.key"]]
  [host."https://cache.example/registry/v2".header]
    x-team = "ml"
''')
    found = endpoints("reg.example:5000", "reg.example:5000", root)
    assert [(e.scheme, e.host, e.path) for e in found] == [
        ("http", "10.0.0.5:5000", "/v2"), ("https", "cache.example", "/registry/v2"),
        ("https", "origin.example", "/v2")]
    assert [e.host for e in for_capability(found, "resolve")] == ["10.0.0.5:5000",
                                                                  "origin.example"]
    assert [e.host for e in for_capability(found, "push")] == ["origin.example"]
    mirror, cache, server = found
    assert mirror.is_mirror and not server.is_mirror
    assert server.ca_files == (Path("/etc/ssl/origin.pem"),)
    assert cache.skip_verify and cache.client_certs == ((Path("/c.pem"), Path("/c.key")),)
    assert cache.headers == {"x-team": "ml"}


def test_default_applies_to_every_registry_without_its_own(tmp_path: Path) -> None:
    root = write(tmp_path, "_default", '[host."http://127.0.0.1:5001"]\n')
    assert [e.host for e in endpoints("any.example", "any.example", root)] == [
        "127.0.0.1:5001", "any.example"]


def test_a_mirror_is_asked_with_ns_and_its_own_path(tmp_path: Path) -> None:
    root = write(tmp_path, "reg.example", '''
[host."http://127.0.0.1:5001/cache"]
  capabilities = ["pull", "resolve"]
''')
    ref = parse_reference("reg.example/team/web:1")
    mirror, server = RegistrySession.candidates(ref, RegistryOptions(hosts_dir=root), "resolve")
    assert mirror.url("/v2/team/web/manifests/1") == \
        "http://127.0.0.1:5001/cache/v2/team/web/manifests/1?ns=reg.example"
    assert mirror.url("/v2/team/web/tags/list?n=5").endswith("?n=5&ns=reg.example")
    assert server.host == "reg.example"


@pytest.mark.parametrize("text, words", [
    ('[host."http://m:5000"]\n  capabilities = ["pull", "fly"]\n', "capabilities of"),
    ('server = "ftp://m"\n', "is not an http:// or https:// URL"),
    ('[host."http://m:5000"\n', "cannot read"),
    ('[host."http://m:5000"]\n  ca = 5\n', "ca of http://m:5000"),
])
def test_mistakes_name_the_file_and_the_key(tmp_path: Path, text: str, words: str) -> None:
    root = write(tmp_path, "reg.example", text)
    with pytest.raises(ConfigError, match=re.escape(words)) as refused:
        endpoints("reg.example", "reg.example", root)
    assert str(root / "reg.example" / "hosts.toml") in str(refused.value)


def test_a_registry_no_host_may_push_to_is_refused_in_words(tmp_path: Path) -> None:
    root = write(tmp_path, "reg.example", 'server = "https://reg.example"\n'
                 'capabilities = ["pull", "resolve"]\n')
    with pytest.raises(ConfigError, match=r"no host of reg\.example may push"):
        RegistrySession.for_reference(parse_reference("reg.example/a:1"),
                                      RegistryOptions(hosts_dir=root))


def conf(tmp_path: Path, text: str, drop_in: str = "") -> Path:
    path = tmp_path / "registries.conf"
    path.write_text(text)
    if drop_in:
        (tmp_path / "registries.conf.d").mkdir()
        (tmp_path / "registries.conf.d" / "50-team.conf").write_text(drop_in)
    return path


def test_podman_s_registries_conf_where_no_hosts_toml_applies(tmp_path: Path) -> None:
    """The longest prefix wins; mirrors first (pull-from-mirror), the location last; a location
    with a path moves the repository, as containers/image does."""
    path = conf(tmp_path, '''
unqualified-search-registries = ["docker.io"]
[[registry]]
prefix = "reg.example"
location = "reg.example"
[[registry]]
prefix = "reg.example/team"
location = "internal.example:5000/mirrored/team"
insecure = true
[[registry.mirror]]
location = "cache.example:5000/team-cache"
pull-from-mirror = "digest-only"
''')
    found = endpoints("reg.example", "reg.example", None, path, "team/web")
    assert [(e.host, e.repository("team/web"), sorted(e.capabilities)) for e in found] == [
        ("cache.example:5000", "team-cache/web", ["pull"]),
        ("internal.example:5000", "mirrored/team/web", ["pull", "push", "resolve"])]
    assert found[1].insecure and found[0].is_mirror and not found[1].is_mirror
    other = endpoints("reg.example", "reg.example", None, path, "other/web")
    assert [(e.host, e.repository("other/web")) for e in other] == [("reg.example", "other/web")]
    hosts = write(tmp_path / "certs.d", "reg.example", '[host."http://m:5000"]\n')
    assert endpoints("reg.example", "reg.example", hosts, path, "team/web")[0].host == "m:5000"


def test_a_drop_in_replaces_the_table_of_its_prefix_and_blocked_is_refused(
        tmp_path: Path) -> None:
    path = conf(tmp_path, '[[registry]]\nlocation = "reg.example"\n',
                drop_in='[[registry]]\nlocation = "reg.example"\nblocked = true\n')
    with pytest.raises(ConfigError, match=r"reg\.example is blocked") as refused:
        endpoints("reg.example", "reg.example", None, path, "a/b")
    assert "50-team.conf" in str(refused.value)
