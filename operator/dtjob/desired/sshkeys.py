"""Per-job SSH identity for the MPI world: the launcher reaches every worker's sshd with it."""

from __future__ import annotations

from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


@dataclass(frozen=True)
class SshKeyPair:
    private_openssh: str
    public_openssh: str


def generate_keypair(comment: str) -> SshKeyPair:
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return SshKeyPair(private_openssh=private, public_openssh=f"{public.decode()} {comment}\n")
