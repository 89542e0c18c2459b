"""The certificates and kubeconfigs of the test cluster (tests/support/kube.py), made at run time
with openssl: one CA, the API server's serving certificate, client certificates (the admin in
`system:masters`, each kubelet as `system:node:NAME` in `system:nodes`, which the Node authorizer
and RBAC's bootstrap roles let in), a serving certificate for the registry, and the service
account signing key. Nothing outlives the test's temporary directory (2 days' validity)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


class Pki:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.ca = Pair(directory / "ca.pem", directory / "ca-key.pem")
        openssl("req", "-x509", *EC_KEY, "-keyout", str(self.ca.key), "-out", str(self.ca.cert),
                "-days", "2", "-subj", "/CN=torpor-test-cluster-ca",
                "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        self.service_account = Pair(directory / "sa.pub", directory / "sa-key.pem")
        openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                "-out", str(self.service_account.key))
        openssl("pkey", "-in", str(self.service_account.key), "-pubout",
                "-out", str(self.service_account.cert))

    def signing_key(self, name: str) -> Path:
        """An EC P-256 key (NAME.pem) and its public half beside it (NAME.pub): cosign's kind,
        as a node's [image] signing_key and [restore] trusted_keys take them."""
        key = self.dir / f"{name}.pem"
        openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                "-out", str(key))
        openssl("pkey", "-in", str(key), "-pubout", "-out", str(key.with_suffix(".pub")))
        return key

    def issue(self, name: str, common_name: str, organization: str | None = None,
              ips: tuple[str, ...] = (), dns: tuple[str, ...] = ()) -> Pair:
        """A certificate signed by the CA, for serving (with `ips`/`dns`) and as a client."""
        pair = Pair(self.dir / f"{name}.pem", self.dir / f"{name}-key.pem")
        csr = self.dir / f"{name}.csr"
        subject = f"/CN={common_name}" + (f"/O={organization}" if organization else "")
        openssl("req", "-new", *EC_KEY, "-keyout", str(pair.key), "-out", str(csr),
                "-subj", subject)
        extensions = self.dir / f"{name}.ext"
        sans = [f"IP:{ip}" for ip in ips] + [f"DNS:{name}" for name in dns]
        extensions.write_text("basicConstraints=CA:FALSE\n"
                              "keyUsage=critical,digitalSignature\n"
                              "extendedKeyUsage=serverAuth,clientAuth\n"
                              + (f"subjectAltName={','.join(sans)}\n" if sans else ""))
        openssl("x509", "-req", "-in", str(csr), "-CA", str(self.ca.cert),
                "-CAkey", str(self.ca.key), "-CAcreateserial", "-days", "2",
                "-extfile", str(extensions), "-out", str(pair.cert))
        return pair

    def kubeconfig(self, name: str, server: str, client: Pair) -> Path:
        """A kubeconfig (JSON is YAML) for `server` with the client certificate `client`."""
        path = self.dir / f"{name}.kubeconfig"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": name,
            "clusters": [{"name": "torpor-test",
                          "cluster": {"server": server,
                                      "certificate-authority": str(self.ca.cert)}}],
            "users": [{"name": name, "user": {"client-certificate": str(client.cert),
                                              "client-key": str(client.key)}}],
            "contexts": [{"name": name, "context": {"cluster": "torpor-test", "user": name}}],
        }))
        return path
