"""CURVE keys and socket security (pyzmq's `zmq.auth`).

Layout of a keys folder written by `brorl keys generate` (the folder 0700, secret keys 0600):
    learner.key / learner.key_secret      the learner's key pair (servers: ROUTER, PULL, PUB)
    actors/<name>.key                      public keys of the actors the learner accepts
    admins/<name>.key                      public keys allowed to send admin commands (verifier swaps)
    <name>.key / <name>.key_secret         each actor's or operator's key pair (copy it to that host only)

With CURVE on, every learner socket is a CURVE server and a ZAP authenticator admits only clients whose
public key is in `actors/` or `admins/`; a peer without an admitted key fails the handshake inside libzmq,
so its frames never reach application code. Traffic is encrypted. Each admitted connection carries a
ZAP User-Id, "actor:<name>" or "admin:<name>", which the learner checks against what the peer claims to
be (its actor id) and against the admin role (admin commands).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

LEARNER = "learner"
ROLES = {"actor": "actors", "admin": "admins"}  # ZAP User-Id role -> folder of its public keys


def generate(keys_dir: str | Path, actors: list[str], admins: list[str] = ()) -> Path:
    """Create a learner key pair, one key pair per actor and per admin name (existing keys are kept); the
    folders are 0700 and secret keys 0600."""
    d = Path(keys_dir)
    old = os.umask(0o077)
    try:
        for folder in ("", *ROLES.values()):
            (d / folder).mkdir(parents=True, exist_ok=True)
            os.chmod(d / folder, 0o700)
        for name, folder in [(LEARNER, ""), *((a, "actors") for a in actors), *((a, "admins") for a in admins)]:
            if not (d / f"{name}.key_secret").exists():
                zmq.auth.create_certificates(str(d), name)
            os.chmod(d / f"{name}.key_secret", 0o600)
            if folder:
                shutil.copy(d / f"{name}.key", d / folder / f"{name}.key")
    finally:
        os.umask(old)
    return d


def load_pair(keys_dir: str | Path, name: str) -> tuple[bytes, bytes]:
    path = Path(keys_dir) / f"{name}.key_secret"
    if not path.exists():
        raise FileNotFoundError(f"no CURVE secret key {path} (create keys with `brorl keys generate`)")
    public, secret = zmq.auth.load_certificate(str(path))
    return public, secret


def learner_public(keys_dir: str | Path) -> bytes:
    path = Path(keys_dir) / f"{LEARNER}.key"
    if not path.exists():
        raise FileNotFoundError(f"no learner public key {path}")
    return zmq.auth.load_certificate(str(path))[0]


def make_server(sock: zmq.Socket, keys_dir: str | Path) -> None:
    public, secret = load_pair(keys_dir, LEARNER)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True


def make_client(sock: zmq.Socket, keys_dir: str | Path, name: str) -> None:
    public, secret = load_pair(keys_dir, name)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_serverkey = learner_public(keys_dir)


class KeyAuthenticator(ThreadAuthenticator):
    """ZAP handler admitting the public keys of `actors/` and `admins/`; the User-Id of a connection is
    "actor:<name>" or "admin:<name>" (a key in both folders is an actor: admin needs its own key)."""

    def __init__(self, ctx: zmq.Context, keys_dir: str | Path):
        super().__init__(ctx)
        self.users: dict[bytes, str] = {}  # z85 public key -> user id
        for role, folder in reversed(ROLES.items()):
            for f in sorted((Path(keys_dir) / folder).glob("*.key")):
                self.users[zmq.auth.load_certificate(str(f))[0]] = f"{role}:{f.stem}"

    def curve_user_id(self, client_public_key: bytes) -> str:
        return self.users.get(zmq.utils.z85.encode(client_public_key), "")

    def ban(self, user_id: str) -> None:
        """Refuse every new connection of `user_id`'s key from now on (this process's life)."""
        for key, user in list(self.users.items()):
            if user == user_id:
                for allowed in self.certs.values():
                    allowed.pop(key, None)


def start_authenticator(ctx: zmq.Context, keys_dir: str | Path) -> KeyAuthenticator:
    """Start a ZAP handler on `ctx` that admits only the public keys in keys_dir/actors/ and admins/."""
    allowed = Path(keys_dir) / "actors"
    if not allowed.is_dir():
        raise FileNotFoundError(f"no allowed-actor folder {allowed}")
    auth = KeyAuthenticator(ctx, keys_dir)
    auth.start()
    auth.allow_any = False
    auth.certs["*"] = {key: True for key in auth.users}
    return auth
