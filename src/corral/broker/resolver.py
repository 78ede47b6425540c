"""Name resolution for the broker (the only place it touches DNS).

Overrides from the configuration win (tests map `pypi.test` to 127.0.0.1);
otherwise the system resolver is asked through `getaddrinfo`, unless
`system_dns` is off, in which case unknown names do not resolve. The broker
connects only to addresses returned here *and* checked by the policy, so a
second lookup can never change the destination (DNS rebinding).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Mapping

from corral.errors import BrokerError

__all__ = ["Resolver"]


class Resolver:
    """Resolves canonical host names to address strings."""

    def __init__(
        self, overrides: Mapping[str, tuple[str, ...]], system_dns: bool, timeout_s: float
    ) -> None:
        self._overrides = dict(overrides)
        self._system = system_dns
        self._timeout = timeout_s

    async def resolve(self, host: str, port: int) -> tuple[str, ...]:
        """Addresses for `host`, de-duplicated in resolver order.

        Raises BrokerError when the name does not resolve or the lookup times out.
        """
        listed = self._overrides.get(host)
        if listed is not None:
            return listed
        if not self._system:
            raise BrokerError(f"{host} is not in the broker's resolver overrides")
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._timeout):
                infos = await loop.getaddrinfo(
                    host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
                )
        except (OSError, TimeoutError) as exc:
            raise BrokerError(f"cannot resolve {host}: {exc or 'timeout'}") from exc
        seen: dict[str, None] = {}
        for family, _, _, _, sockaddr in infos:
            if family in (socket.AF_INET, socket.AF_INET6):
                seen.setdefault(str(sockaddr[0]), None)
        return tuple(seen)
