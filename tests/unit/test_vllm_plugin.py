"""The vLLM plugin our engine processes load: NIXL's progress-thread delay
is bounded, shared-memory queue readers sleep instead of spinning, and engine
processes exit when their parent is killed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import nixl._api as api
import pytest
import vllm.distributed.device_communicators.shm_broadcast as shm

from orchestrator.engines import vllm_plugin


def test_nixl_agent_config_gets_the_minimum_progress_delay(monkeypatch):
    monkeypatch.setattr(api.nixlBind, "nixlAgentConfig", api.nixlBind.nixlAgentConfig)
    monkeypatch.setattr(vllm_plugin, "_installed", set())
    monkeypatch.setenv(vllm_plugin.NIXL_PROGRESS_DELAY_ENV, "1000")
    monkeypatch.delenv(vllm_plugin.EXIT_WITH_PARENT_ENV, raising=False)
    vllm_plugin.register()
    config = api.nixlBind.nixlAgentConfig()
    config.pthrDelay = 0  # what nixl_agent.__init__ writes
    assert config.pthrDelay == 1000
    config.pthrDelay = 5000
    assert config.pthrDelay == 5000


def test_without_the_variables_the_plugin_changes_nothing(monkeypatch):
    original = api.nixlBind.nixlAgentConfig
    spin_condition = shm.SpinCondition
    monkeypatch.setattr(vllm_plugin, "_installed", set())
    for name in (vllm_plugin.NIXL_PROGRESS_DELAY_ENV, vllm_plugin.EXIT_WITH_PARENT_ENV, vllm_plugin.SHM_POLL_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(vllm_plugin.SHM_POLL_MAX_ENV, raising=False)
    vllm_plugin.register()
    assert api.nixlBind.nixlAgentConfig is original
    assert shm.SpinCondition is spin_condition


def _polling_plugin(monkeypatch, start: float, poll_us: str, max_poll_us: str | None):
    """The plugin's queue poll registered on a fake clock starting at `start`: ([now], the sleeps it took)."""
    import types

    now = [start]
    slept: list[float] = []
    monkeypatch.setattr(vllm_plugin, "time", types.SimpleNamespace(monotonic=lambda: now[0], sleep=slept.append))
    monkeypatch.setattr(shm, "SpinCondition", shm.SpinCondition)
    monkeypatch.setattr(vllm_plugin, "_installed", set())
    monkeypatch.setenv(vllm_plugin.SHM_POLL_ENV, poll_us)
    if max_poll_us is None:
        monkeypatch.delenv(vllm_plugin.SHM_POLL_MAX_ENV, raising=False)
    else:
        monkeypatch.setenv(vllm_plugin.SHM_POLL_MAX_ENV, max_poll_us)
    vllm_plugin.register()
    return now, slept


@contextlib.contextmanager
def _queue_ends(address: str):
    """A writer's and a reader's SpinCondition (vLLM's, or the plugin's once registered) on `address`."""
    import zmq

    context = zmq.Context()
    writer = shm.SpinCondition(is_reader=False, context=context, notify_address=address)
    reader = shm.SpinCondition(is_reader=True, context=context, notify_address=address)
    try:
        yield writer, reader
    finally:
        for socket in (
            writer.local_notify_socket,
            reader.local_notify_socket,
            reader.read_cancel_socket,
            reader.write_cancel_socket,
        ):
            socket.close(linger=0)
        context.term()


def test_shm_queue_readers_sleep_between_looks_then_wait_for_the_writer(monkeypatch):
    """Within vLLM's spin window the reader sleeps the poll interval (on the plugin's clock, faked here; no
    longest poll set: a fixed poll); past it, vLLM's own wait on the writer's notification runs, woken by a
    notify before its timeout."""
    now, slept = _polling_plugin(monkeypatch, 0.0, poll_us="20000", max_poll_us=None)
    with _queue_ends("inproc://queue") as (writer, reader):
        reader.last_read = 0.0  # a message was just read: the spin window
        reader.wait()
        assert slept == [0.02]  # slept 20 ms where vLLM yields and returns
        now[0] = reader.busy_loop_s + 1.0  # idle: vLLM's own wait on the writer's notification
        started = time.monotonic()
        reader.wait(timeout_ms=100)
        assert time.monotonic() - started >= 0.09 and slept == [0.02]
        writer.notify()
        started = time.monotonic()
        reader.wait(timeout_ms=10_000)
        assert time.monotonic() - started < 9  # the notification woke it, not the timeout


def test_shm_queue_readers_back_off_within_a_wait_and_start_short_after_each_read(monkeypatch):
    """Each sleep is WAIT_SHARE of the wait so far, between the shortest and the longest poll; a read starts
    a new wait, however long the reader then worked before looking again."""
    now, slept = _polling_plugin(monkeypatch, 100.0, poll_us="50", max_poll_us="1000")
    with _queue_ends("inproc://backoff") as (_, reader):
        reader.last_read = 100.0
        for waited in (0.0, 0.0016, 0.008, 0.5):  # looks at these times into the wait
            now[0] = 100.0 + waited
            reader.wait()
        assert slept == pytest.approx([50e-6, 100e-6, 500e-6, 1000e-6])
        reader.last_read = now[0] = 100.7  # a message read; the reader then works 20 ms before it looks again
        now[0] += 0.02
        reader.wait()
        assert slept[-1] == pytest.approx(50e-6)


def test_engine_process_exits_when_its_parent_is_killed(tmp_path):
    pid_file = tmp_path / "child.pid"
    # parent -> child; the child loads the plugin and then just sleeps, like an
    # engine core whose replica is about to be killed.
    child = textwrap.dedent(f"""
        import os, time
        os.environ["{vllm_plugin.EXIT_WITH_PARENT_ENV}"] = "1"
        from orchestrator.engines import vllm_plugin
        vllm_plugin.PARENT_POLL_S = 0.1
        vllm_plugin.register()
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        time.sleep(60)
    """)
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(60)",
        ]
    )
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "child never started"
            time.sleep(0.05)
        child_pid = int(pid_file.read_text())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(child_pid):
            assert time.monotonic() < deadline, "child outlived its parent"
            time.sleep(0.1)
    finally:
        parent.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie counts as gone.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"
