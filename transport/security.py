"""CURVE keys and socket security (pyzmq's `zmq.auth`).

Layout of a keys folder written by `brorl keys generate`:
    learner.key / learner.key_secret      the learner's key pair (servers: ROUTER, PULL, PUB)
    actors/<name>.key                      public keys of the actors the learner accepts
    <name>.key / <name>.key_secret         each actor's key pair (copy it to that actor's host only)

With CURVE on, every learner socket is a CURVE server and a ZAP authenticator admits only clients whose
public key is in `actors/`; a peer without an admitted key fails the handshake inside libzmq, so its
frames never reach application code. Traffic is encrypted.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import zmq
import zmq.auth

LEARNER = "learner"


def generate(keys_dir: str | Path, actors: list[str]) -> Path:
    """Create a learner key pair and one key pair per actor name (existing keys are kept)."""
    d = Path(keys_dir)
    (d / "actors").mkdir(parents=True, exist_ok=True)
    for name in [LEARNER, *actors]:
        if not (d / f"{name}.key_secret").exists():
            zmq.auth.create_certificates(str(d), name)
        if name != LEARNER:
            shutil.copy(d / f"{name}.key", d / "actors" / f"{name}.key")
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


def start_authenticator(ctx: zmq.Context, keys_dir: str | Path):
    """Start a ZAP handler on `ctx` that admits only the public keys in keys_dir/actors/."""
    from zmq.auth.thread import ThreadAuthenticator

    allowed = Path(keys_dir) / "actors"
    if not allowed.is_dir():
        raise FileNotFoundError(f"no allowed-actor folder {allowed}")
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain="*", location=str(allowed))
    return auth
