"""Certificates for TLS tests, made with ``openssl`` (and ``keytool`` for ActiveMQ's stores)
when a test needs them, in a directory of its own::

    certs = Certificates.make(directory)
    certs.ca            # the test CA (PEM) that signed the server and client certificates
    certs.server_cert   # for 127.0.0.1 (an IP SAN) only: 'localhost' is a wrong host name
    certs.client_cert   # a client certificate for mutual TLS (with client_key)
    certs.other_ca      # a CA that signed nothing here: "wrong CA"
    certs.expired_cert  # for 127.0.0.1, signed by the CA, expired in 2020
    certs.java_stores() # (keystore, truststore) PKCS12 files for ActiveMQ, password STORE_PASSWORD

Keys are RSA 2048 without a passphrase; certificates are valid for two days.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

STORE_PASSWORD = "mdb-test-store"

_CA_CONFIG = """\
[ca]
default_ca = test_ca
[test_ca]
database = index.txt
new_certs_dir = .
serial = serial
default_md = sha256
policy = anything
[anything]
commonName = supplied
[server]
subjectAltName = IP:127.0.0.1
"""


def tools_available() -> bool:
    """True when ``openssl`` and ``keytool`` (from the JDK) are on the PATH."""
    return shutil.which("openssl") is not None and shutil.which("keytool") is not None


def _run(directory: Path, *command: str) -> None:
    done = subprocess.run(command, cwd=directory, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")


@dataclass(frozen=True)
class Certificates:
    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def other_ca(self) -> Path:
        return self.directory / "other-ca.pem"

    @property
    def server_cert(self) -> Path:
        return self.directory / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.directory / "server.key"

    @property
    def client_cert(self) -> Path:
        return self.directory / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.directory / "client.key"

    @property
    def expired_cert(self) -> Path:
        return self.directory / "expired.pem"

    @classmethod
    def make(cls, directory: Path) -> Certificates:
        """Write every certificate and key into ``directory`` (created if missing)."""
        directory.mkdir(parents=True, exist_ok=True)
        certs = cls(directory)
        for name in ("ca", "other-ca"):
            _run(directory, "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                 "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
                 "-subj", f"/CN=mdb test {name}")
        (directory / "server.ext").write_text("subjectAltName = IP:127.0.0.1\n")
        (directory / "client.ext").write_text("extendedKeyUsage = clientAuth\n")
        for name in ("server", "client"):
            _run(directory, "openssl", "req", "-newkey", "rsa:2048", "-nodes",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=mdb-{name}")
            _run(directory, "openssl", "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem",
                 "-CAkey", "ca.key", "-CAcreateserial", "-days", "2", "-out", f"{name}.pem",
                 "-extfile", f"{name}.ext")
        # `openssl x509` cannot back-date a certificate; `openssl ca` can.
        (directory / "ca.cnf").write_text(_CA_CONFIG)
        (directory / "index.txt").write_text("")
        (directory / "serial").write_text("1000\n")
        _run(directory, "openssl", "ca", "-batch", "-config", "ca.cnf", "-cert", "ca.pem",
             "-keyfile", "ca.key", "-in", "server.csr", "-out", "expired.pem", "-notext",
             "-startdate", "20200101000000Z", "-enddate", "20200102000000Z",
             "-extensions", "server")
        return certs

    def java_stores(self) -> tuple[Path, Path]:
        """ActiveMQ's key store (the server certificate and key) and trust store (the CA, to
        check client certificates), PKCS12, password ``STORE_PASSWORD``; made once."""
        keystore = self.directory / "broker.p12"
        truststore = self.directory / "trust.p12"
        if not keystore.exists():
            _run(self.directory, "openssl", "pkcs12", "-export", "-in", "server.pem",
                 "-inkey", "server.key", "-certfile", "ca.pem", "-name", "broker",
                 "-out", keystore.name, "-passout", f"pass:{STORE_PASSWORD}")
            _run(self.directory, "keytool", "-importcert", "-noprompt", "-alias", "ca",
                 "-file", "ca.pem", "-keystore", truststore.name, "-storetype", "PKCS12",
                 "-storepass", STORE_PASSWORD)
        return keystore, truststore
