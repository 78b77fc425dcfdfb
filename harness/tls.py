"""A throwaway certificate authority for TLS tests on loopback.

Clients of Event Hubs speak TLS unless their connection string says
``UseDevelopmentEmulator=true``; the local emulator speaks plain AMQP. Tests that need
the TLS path put a TLS-terminating relay (:class:`~eventprocessor.emulators.fault_proxy.TcpFaultProxy`
with ``ssl=``) in front of the emulator, with a server certificate this module issues
from a CA made for the test session. Nothing here is trusted beyond the files it writes.

Example::

    pki = TestPki.create(tmp_path, hostnames=["emulator.test"])
    async with TcpFaultProxy("127.0.0.1", emulator.port, ssl=pki.server_context()) as relay:
        client_context = pki.client_context()   # trusts the test CA only
"""
from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TestPki"]


@dataclass(frozen=True)
class TestPki:
    """A CA certificate and one server certificate (with its key) signed by it, as PEM files."""

    __test__ = False  # not a pytest test class

    ca_path: Path
    cert_path: Path
    key_path: Path

    @classmethod
    def create(cls, directory: Path, *, hostnames: list[str]) -> TestPki:
        """Issue a CA and a server certificate for ``hostnames`` (DNS names or IP
        addresses), valid for a day, into ``directory``."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        now = datetime.datetime.now(datetime.timezone.utc)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "eventprocessor test CA")])
        ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
              .serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
              .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
              .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                           content_commitment=False, key_encipherment=False, data_encipherment=False,
                                           key_agreement=False, encipher_only=False, decipher_only=False),
                             critical=True)
              .sign(ca_key, hashes.SHA256()))
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        for host in hostnames:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        server = (x509.CertificateBuilder()
                  .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostnames[0])]))
                  .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                  .not_valid_before(now - datetime.timedelta(minutes=5))
                  .not_valid_after(now + datetime.timedelta(days=1))
                  .add_extension(x509.SubjectAlternativeName(names), critical=False)
                  .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                  .sign(ca_key, hashes.SHA256()))
        directory.mkdir(parents=True, exist_ok=True)
        pki = cls(directory / "ca.pem", directory / "server.pem", directory / "server-key.pem")
        pki.ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        pki.cert_path.write_bytes(server.public_bytes(serialization.Encoding.PEM))
        pki.key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
        return pki

    def server_context(self) -> ssl.SSLContext:
        """What a TLS-terminating relay presents: the server certificate."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert_path, self.key_path)
        return context

    def client_context(self) -> ssl.SSLContext:
        """A client context that trusts this CA only (host names checked)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.load_verify_locations(self.ca_path)
        return context

    def bundle_with(self, other_bundle: str | Path, path: Path) -> Path:
        """``other_bundle``'s CAs plus this one, written to ``path`` (a trust store a
        client reads from one file, such as ``certifi``'s)."""
        path.write_bytes(Path(other_bundle).read_bytes().rstrip(b"\n") + b"\n" + self.ca_path.read_bytes())
        return path
