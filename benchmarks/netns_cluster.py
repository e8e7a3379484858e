"""A multi-host Ray cluster on one Linux machine: each "host" is a network
namespace with its own address on a private bridge, running one Ray node.

Traffic between hosts crosses veth links (loopback-only: nothing leaves the
machine), so an address a replica advertises is another host's address, as on
a real cluster. Needs root (CAP_NET_ADMIN) and iproute2; `available()` says
why not when it cannot run.

Ownership: the cluster owns its namespaces, the bridge and every process
inside the namespaces. `down()` kills exactly those processes (found by
namespace, never by name: `ray stop` would also stop any other Ray instance
on the machine) and removes the links.

    with NetnsCluster([HostSpec("head", {"decode_host": 4}),
                       HostSpec("worker", {"prefill_host": 4})]) as cluster:
        cluster.serve_run("serve-config.yaml")
        httpx.get(f"http://{cluster.head.address}:8000/health")
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BRIDGE = "orchbr0"
AUTH_MODE = os.environ.get("RAY_AUTH_MODE", "disabled")
SUBNET = "10.77.0"  # hosts get .1, .2, ...; the machine itself .254 on the bridge
MACHINE_ADDRESS = f"{SUBNET}.254"
RAY_PORT = 6379
TEMP_DIR = "/tmp/ray-netns"  # apart from /tmp/ray, where another local Ray may live


@dataclass(frozen=True)
class HostSpec:
    name: str
    resources: dict[str, float] = field(default_factory=dict)  # Ray custom resources of its node
    num_cpus: int = 2


@dataclass(frozen=True)
class Host:
    spec: HostSpec
    address: str

    @property
    def netns(self) -> str:
        return f"orch-{self.spec.name}"

    @property
    def veth(self) -> str:
        return f"veth-{self.spec.name}"[:15]


def available() -> str | None:
    """None when namespaces can be made here, else the reason they cannot."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CAP_NET_ADMIN)"
    probe = "orch-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


class NetnsCluster:
    def __init__(self, hosts: list[HostSpec], python: str = sys.executable) -> None:
        self.hosts = [Host(spec, f"{SUBNET}.{i + 1}") for i, spec in enumerate(hosts)]
        self._bin = Path(python).parent

    @property
    def head(self) -> Host:
        return self.hosts[0]

    @property
    def ray_address(self) -> str:
        return f"{self.head.address}:{RAY_PORT}"

    def host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.spec.name == name)

    # -- life cycle -----------------------------------------------------------

    def __enter__(self) -> NetnsCluster:
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> None:
        self.down()  # leftovers of a run that was killed
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{MACHINE_ADDRESS}/24", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        for host in self.hosts:
            _ip("netns", "add", host.netns)
            _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
            _ip("link", "set", host.veth, "master", BRIDGE, "up")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.netns, "link", "set", "eth0", "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
        for host in self.hosts:
            self._start_ray(host)

    def _start_ray(self, host: Host) -> None:
        role = (
            ["--head", f"--port={RAY_PORT}", "--include-dashboard=false"]
            if host is self.head
            else [f"--address={self.ray_address}"]
        )
        self.run(
            host,
            [
                str(self._bin / "ray"),
                "start",
                *role,
                f"--node-ip-address={host.address}",
                f"--num-cpus={host.spec.num_cpus}",
                f"--resources={json.dumps(host.spec.resources)}",
                f"--temp-dir={TEMP_DIR}",
                "--disable-usage-stats",
            ],
            timeout=120,
        )

    def down(self) -> None:
        for host in self.hosts:
            self._kill_processes(host)
            _ip("netns", "del", host.netns, check=False)
            _ip("link", "del", host.veth, check=False)
        _ip("link", "del", BRIDGE, check=False)

    def _kill_processes(self, host: Host) -> None:
        for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
            pids = self.pids(host)
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait_s
            while pids and self.pids(host) and time.monotonic() < deadline:
                time.sleep(0.2)

    def lose(self, host: Host) -> None:
        """`host` vanishes, as a machine that loses power: its link goes down first (nothing it sends, not
        even its sockets' closing, reaches anyone), then every process in it is SIGKILLed. The namespace
        stays, empty and cut off, until `down`."""
        _ip("link", "set", host.veth, "down")
        for pid in self.pids(host):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    # -- inside the hosts -----------------------------------------------------

    def pids(self, host: Host) -> list[int]:
        listed = _ip("netns", "pids", host.netns, check=False)
        return [int(p) for p in listed.stdout.split()] if listed.returncode == 0 else []

    def run(
        self,
        host: Host,
        argv: list[str],
        timeout: float = 600,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess:
        """Run a command inside `host`'s namespace; raise with its output if it fails."""
        done = subprocess.run(
            ["ip", "netns", "exec", host.netns, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            # One authentication mode on every host: Ray turns token authentication on for a head that finds
            # a token (~/.ray/auth_token, which any local ray.init() leaves) but not always for the nodes
            # joining it, which then cannot reach its GCS. The hosts here share one private bridge.
            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": AUTH_MODE, **(env or {})},
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv[:3])} in {host.netns} failed ({done.returncode}):\n"
                f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        return done

    def serve_run(self, serve_config: str | Path, timeout: float = 600) -> None:
        """Deploy a Serve config file (`serve run --non-blocking`) from the head host."""
        self.run(
            self.head,
            [str(self._bin / "serve"), "run", "--non-blocking", f"--address={self.ray_address}", str(serve_config)],
            timeout=timeout,
        )

    def link_bytes(self, host: Host) -> int:
        """Bytes sent plus received on `host`'s link so far (its veth, seen from the machine)."""
        stats = Path("/sys/class/net") / host.veth / "statistics"
        return sum(int((stats / f).read_text()) for f in ("rx_bytes", "tx_bytes"))
