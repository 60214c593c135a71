"""Operator commands (`brorl verifiers swap|status`), taken only from an admin credential: with CURVE a key
under `keys_dir/admins/` (its ZAP User-Id is "admin:<name>"); without CURVE a connection from loopback.
Also the reward range each verifier declared, which admission validation checks rewards against."""

from __future__ import annotations

import logging
from typing import Callable

from config.schema import BrorlConfig
from transport import wire
from transport.zmq_transport import Peer

log = logging.getLogger("brorl.learner")


class AdminDesk:
    def __init__(self, cfg: BrorlConfig, control, status: Callable[[], str]):
        self.cfg = cfg
        self.control = control  # the learner's ControlPublisher: swaps are published through it
        self.status = status
        self.reward_ranges: dict[str, tuple[float, float]] = {}  # verifier name -> rewards it may give

    def problem(self, peer: Peer) -> str:
        """Why this connection may not send admin commands ("" if it may)."""
        if self.cfg.transport.curve:
            return "" if peer.user.startswith("admin:") else f"the connection's key ({peer.user!r}) is not an admin key"
        return "" if peer.loopback else f"without CURVE admin commands are taken over loopback only, not from {peer.address!r}"

    async def handle(self, msg: wire.Admin, peer: Peer) -> wire.AdminReply:
        """Operator commands, from an admin credential only. A verifier swap must match
        `verifiers.allowed_modules`, and is imported and self-tested in a separate, time-limited process
        (`verifiers.check`) before it is published; each actor checks again, acknowledges in its heartbeat,
        and keeps the previous verifier if its own check fails."""
        from verifiers.check import allowed, check
        from verifiers.registry import VerifierLoadError

        why = self.problem(peer)
        if why:
            log.warning("admin command %r refused: %s", msg.command, why)
            return wire.AdminReply(False, f"refused: {why}")
        if msg.command == "swap":
            name, path = str(msg.args.get("name", "")), str(msg.args.get("path", ""))
            patterns = self.cfg.verifiers.allowed_modules
            if not name or not allowed(path, patterns):
                return wire.AdminReply(False, f"refused: {path!r} is not in verifiers.allowed_modules {patterns} "
                                              f"(or no verifier name given); previous verifier stays in force")
            try:
                info = await check(path, self.cfg.verifiers.check_timeout_s)
            except VerifierLoadError as e:
                return wire.AdminReply(False, f"rejected, previous verifier stays in force: {e}")
            lo, hi = self.reward_range(name)  # groups of the old and the new verifier are both in flight
            self.reward_ranges[name] = (min(lo, info.reward_range[0]), max(hi, info.reward_range[1]))
            await self.control.publish("swap", name=name, path=path)
            return wire.AdminReply(True, f"verifier {name!r} -> {path} (version {info.version}) published")
        if msg.command == "status":
            return wire.AdminReply(True, self.status())
        return wire.AdminReply(False, f"unknown command {msg.command!r}")

    def reward_range(self, verifier: str) -> tuple[float, float]:
        """The rewards verifier `verifier` may give (a built-in's own declaration; a swapped one's)."""
        if verifier not in self.reward_ranges:
            from verifiers.registry import Registry

            try:
                self.reward_ranges[verifier] = Registry().info(verifier).reward_range
            except (KeyError, Exception):
                return (0.0, 1.0)
        return self.reward_ranges[verifier]
