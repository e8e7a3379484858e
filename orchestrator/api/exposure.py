"""The secure default for an application's HTTP address: keys unless it is loopback or the risk is accepted."""

from __future__ import annotations

import ipaddress

from orchestrator.config import AuthConfig

SERVE_DEFAULT_HOST = "127.0.0.1"  # Serve's http_options.host when a config names none


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def exposure_problem(host: str, auth: AuthConfig, tenant_keys: bool = False) -> str | None:
    """Why an application may not serve on `host` with `auth` (and tenants' keys, `tenant_keys`), or None."""
    if is_loopback(host) or auth.api_key_env is not None or tenant_keys or auth.allow_unauthenticated:
        return None
    return (
        f"the HTTP address {host} is not loopback and no API key is configured: set frontend.auth.api_key_env "
        "to the name of an environment variable holding the key (e.g. ORCHESTRATOR_API_KEY) and export it where "
        "Ray runs, bind http_options.host to 127.0.0.1, or accept the risk with "
        "frontend.auth.allow_unauthenticated: true"
    )
