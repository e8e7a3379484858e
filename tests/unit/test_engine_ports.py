import random
import socket
import subprocess
import sys

import pytest

from orchestrator.engines.ports import (
    FIRST_LISTEN_PORT,
    LINUX_DEFAULT_EPHEMERAL,
    ephemeral_ports,
    listen_candidates,
    listen_port,
    reserve_listen_port,
)


def test_listen_ports_avoid_the_ephemeral_range_and_rays_worker_ports():
    assert listen_candidates(range(32768, 61000)) == [range(20000, 32768), range(61000, 65536)]
    assert listen_candidates(range(1024, 65536)) == []
    assert listen_candidates(range(40000, 65536)) == [range(20000, 40000)]


def test_drawn_ports_are_free_outside_the_ephemeral_range_and_follow_the_seed():
    ephemeral = ephemeral_ports()
    drawn = [listen_port("127.0.0.1", random.Random(seed)) for seed in range(20)]
    assert all(p >= FIRST_LISTEN_PORT and p not in ephemeral for p in drawn)
    assert drawn == [listen_port("127.0.0.1", random.Random(seed)) for seed in range(20)]
    assert len(set(drawn)) > 15


def test_a_port_in_use_is_not_drawn():
    only = range(FIRST_LISTEN_PORT, FIRST_LISTEN_PORT + 1)
    ephemeral = range(only.stop, 65536)  # leaves `only` as the single candidate
    with socket.socket() as held:
        try:
            held.bind(("127.0.0.1", only.start))
        except OSError:
            pytest.skip(f"port {only.start} in use on this machine")
        held.listen()
        with pytest.raises(OSError, match="no free port"):
            listen_port("127.0.0.1", random.Random(0), ephemeral)
    assert listen_port("127.0.0.1", random.Random(0), ephemeral) == only.start


def test_no_candidates_is_an_error():
    with pytest.raises(OSError, match="outside the ephemeral range"):
        listen_port("127.0.0.1", random.Random(0), range(1024, 65536))


def test_the_ephemeral_range_is_read_from_the_kernel_or_defaulted(tmp_path):
    custom = tmp_path / "range"
    custom.write_text("40000\t50000\n")
    assert ephemeral_ports(custom) == range(40000, 50001)
    assert ephemeral_ports(tmp_path / "missing") == LINUX_DEFAULT_EPHEMERAL


def test_a_reserved_port_is_drawn_by_no_other_reservation_until_released():
    first = reserve_listen_port("127.0.0.1", random.Random(0))
    second = reserve_listen_port("127.0.0.1", random.Random(0))  # the same draws
    try:
        assert second.port != first.port
        assert first.port == listen_port("127.0.0.1", random.Random(0))  # free: the engine has not bound it yet
    finally:
        first.release()
        second.release()
    again = reserve_listen_port("127.0.0.1", random.Random(0))
    again.release()
    assert again.port == first.port


def test_a_reservation_holds_across_processes_until_its_process_ends():
    """Replicas on one node are processes: another process's reservation is
    respected, and the kernel drops it with that process."""
    hold = (
        "import random, sys\n"
        "from orchestrator.engines.ports import reserve_listen_port\n"
        "held = reserve_listen_port('127.0.0.1', random.Random(0))\n"
        "print(held.port, flush=True)\n"
        "sys.stdin.read()\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as holder:
        held = int(holder.stdout.readline())
        mine = reserve_listen_port("127.0.0.1", random.Random(0))
        mine.release()
        holder.stdin.close()  # the holder exits
    assert mine.port != held
    after = reserve_listen_port("127.0.0.1", random.Random(0))
    after.release()
    assert after.port == held
