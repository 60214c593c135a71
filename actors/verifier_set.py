"""The actor's verifiers: self-tested when the actor starts, swapped only when allowed and self-tested.

No verifier code runs in the actor's own process: import and self-test happen in a separate, time-limited
process (`verifiers.check`), scoring in the scoring pool's worker processes. A swap must match
`verifiers.allowed_modules`; a rejected swap leaves the verifier in force and says why.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from config.schema import BrorlConfig
from verifiers.check import allowed, check
from taskdata import DataError, uses_files, verifier_names
from verifiers.registry import Registry, VerifierLoadError
from verifiers.sandbox import UNSAFE_ENV

log = logging.getLogger("brorl.actor")
EXIT_REFUSED = 78  # EX_CONFIG: `brorl actor` cannot work as configured; restarting it would not help


class ActorRefused(RuntimeError):
    """The actor cannot work as configured (a verifier failed its start-up self-test)."""


class ActorVerifiers:
    def __init__(self, cfg: BrorlConfig):
        self.cfg = cfg
        self.registry = Registry()

    async def self_test(self) -> None:
        """Every verifier the configured tasks use must pass its self-test — through the code path scoring
        takes (for `code`: the real sandbox) — or the actor refuses to start, with the reason. The tasks of
        data files that this host cannot read (an actor on another machine) are not known here: their
        verifiers are self-tested when a prompt first names them (`ensure`)."""
        v = self.cfg.verifiers
        os.environ[UNSAFE_ENV] = "1" if v.sandbox_unsafe else "0"  # what the verifier processes inherit
        d = self.cfg.data
        elsewhere = [s.path for s in (*d.train, *d.eval) if not Path(s.path).exists()] if uses_files(self.cfg) else []
        if elsewhere:
            log.info("data files not on this host (%s): verifiers are self-tested at first use", ", ".join(elsewhere))
            names: set[str] = set()
        else:
            try:
                names = verifier_names(self.cfg)
            except DataError as e:
                raise ActorRefused(f"the job's data cannot be used: {e}") from e
        for name in sorted(names):
            await self.ensure(name, "start-up ")

    async def ensure(self, name: str, when: str = "") -> None:
        """Self-test the verifier for `name` unless it passed already; ActorRefused (the actor stops) if it
        is unknown or fails."""
        if name in self.registry.in_force():
            return
        path = self.registry.path(name)
        if path is None:
            raise ActorRefused(f"the tasks use verifier {name!r}, which is not registered")
        try:
            self.registry.adopt(name, await check(path, self.cfg.verifiers.check_timeout_s))
        except VerifierLoadError as e:
            raise ActorRefused(f"verifier {name!r} failed its {when}self-test: {e}") from None

    async def swap(self, name: str, path: str) -> str:
        """Make `path` the verifier for `name`; "" on success, else why not (the old one stays)."""
        patterns = self.cfg.verifiers.allowed_modules
        if not allowed(path, patterns):
            return f"swap {name} -> {path} refused: not in verifiers.allowed_modules {patterns}"
        try:
            self.registry.adopt(name, await check(path, self.cfg.verifiers.check_timeout_s))
        except VerifierLoadError as e:
            return f"swap {name} -> {path} rejected: {e}"
        return ""
