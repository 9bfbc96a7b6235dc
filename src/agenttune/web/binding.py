"""Whether a server bound to a host is reachable only from this machine (the gateway, the log viewer)."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """True for loopback addresses (127.0.0.0/8, ::1) and `localhost`; False for 0.0.0.0, :: and the rest."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
