"""Finding a fleet head on the LAN: mDNS (DNS-SD) service `_superfluid-fleet._tcp`, through
`zeroconf`. A head with `--fleet-listen` advertises its join address; `superfluid node join`
without an address browses for it.

The advertisement carries a fleet id: a hash of the fleet token's PSK under its own label
(it reveals nothing usable about the token), so a node joins only heads of its own fleet,
and two fleets on one LAN never see each other's nodes. A head without a token advertises
the id `open` and is joined only by token-less nodes, on loopback.

The service type is 16 bytes, one more than RFC 6763 recommends; zeroconf registers it
with strict=False and browses it as is."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket

from ..net.loopback import is_loopback_host

log = logging.getLogger("superfluid.fleet")

SERVICE = "_superfluid-fleet._tcp.local."
WILDCARDS = ("", "0.0.0.0", "::")


def fleet_id(psk: bytes | None) -> str:
    if psk is None:
        return "open"
    return hashlib.sha256(b"superfluid fleet id\0" + psk).hexdigest()[:16]


def _interfaces(host: str | None):
    from zeroconf import InterfaceChoice
    return InterfaceChoice.All if host is None or host in WILDCARDS else [host]


def _addresses(host: str) -> list[bytes]:
    if host not in WILDCARDS:
        return [socket.inet_aton(socket.gethostbyname(host))]
    import ifaddr
    ips = [ip.ip for a in ifaddr.get_adapters() for ip in a.ips if isinstance(ip.ip, str)]
    return [socket.inet_aton(ip) for ip in ips if not ip.startswith("127.")] or [socket.inet_aton("127.0.0.1")]


class Advertiser:
    """A head's join address on mDNS, until close()."""

    def __init__(self, azc, info):
        self._azc, self._info = azc, info

    @classmethod
    async def start(cls, host: str, port: int, psk: bytes | None) -> Advertiser | None:
        from zeroconf import IPVersion
        from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf
        azc = None
        try:
            azc = AsyncZeroconf(interfaces=_interfaces(host), ip_version=IPVersion.V4Only)
            name = f"{socket.gethostname()}-{port}.{SERVICE}"
            info = AsyncServiceInfo(SERVICE, name, addresses=_addresses(host), port=port,
                                    properties={"v": "1", "fleet": fleet_id(psk)})
            await azc.async_register_service(info, strict=False, allow_name_change=True)
        except Exception as e:  # no multicast here: joining by address still works
            log.warning("cannot advertise the fleet on mDNS (%s: %s); nodes must name this head", type(e).__name__, e)
            if azc is not None:
                await azc.async_close()
            return None
        log.info("advertising the fleet on mDNS as %s", name)
        return cls(azc, info)

    async def close(self) -> None:
        try:
            await self._azc.async_unregister_service(self._info)
        finally:
            await self._azc.async_close()


async def discover(psk: bytes | None, *, interface: str | None = None, timeout: float = 3.0) -> list[tuple[str, int]]:
    """Heads of this fleet (same token) answering on mDNS within `timeout`, as (host, port)."""
    from zeroconf import IPVersion, ServiceStateChange
    from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf
    want = fleet_id(psk)
    names: asyncio.Queue[str] = asyncio.Queue()

    def changed(zeroconf, service_type: str, name: str, state_change) -> None:
        if state_change in (ServiceStateChange.Added, ServiceStateChange.Updated):
            names.put_nowait(name)

    azc = AsyncZeroconf(interfaces=_interfaces(interface), ip_version=IPVersion.V4Only)
    try:
        browser = AsyncServiceBrowser(azc.zeroconf, SERVICE, handlers=[changed])
    except BaseException:
        await azc.async_close()
        raise
    found: list[tuple[str, int]] = []
    deadline = asyncio.get_running_loop().time() + timeout
    try:
        while not found:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            try:
                name = await asyncio.wait_for(names.get(), left)
            except TimeoutError:
                break
            info = AsyncServiceInfo(SERVICE, name)
            if not await info.async_request(azc.zeroconf, 1000):
                continue
            props = {k.decode(): (v or b"").decode() for k, v in (info.properties or {}).items()}
            if props.get("fleet") != want:
                continue  # another fleet's head
            for ip in info.parsed_addresses(IPVersion.V4Only):
                if psk is None and not is_loopback_host(ip):
                    continue  # a token-less link is for loopback only
                found.append((ip, int(info.port or 0)))
    finally:
        await browser.async_cancel()
        await azc.async_close()
    return found
