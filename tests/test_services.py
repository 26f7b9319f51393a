"""The servers tests start for themselves (deploy/local/services.py): the session's own, never the
machine's (nothing on 5432 or 6379 is ever asked), shared by concurrent processes of one session the
way xdist workers share them, and gone when the session ends."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import postgres
import pytest
import redis_server
import services
from live_airflow import free_port, wait_for

HARNESS = Path(__file__).resolve().parents[1] / "deploy" / "local"  # the servers' modules


def test_postgres_is_the_sessions_own_server():
    """The URIs tests hand out carry the private port, and whatever answers there keeps its data in
    this session's folder, with durability off (a test database is thrown away)."""
    assert postgres.port() != 5432
    assert f"@127.0.0.1:{postgres.port()}/" in postgres.pg_uri("x")
    conn = postgres.admin()
    cur = conn.cursor()
    cur.execute("SELECT inet_server_port(), current_setting('data_directory'), current_setting('fsync')")
    served_on, data, fsync = cur.fetchone()
    conn.close()
    assert served_on == postgres.port()
    assert Path(data).is_relative_to(services.session_dir()), data
    assert fsync == "off"
    with postgres.fresh_db("taxiway_services") as name:
        conn = postgres.admin()
        cur = conn.cursor()
        cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
        assert cur.fetchone() == (1,)
        conn.close()


def test_redis_is_the_sessions_own_server():
    """The broker URL carries the private port; that Redis lives in this session's folder and keeps
    nothing on disk."""
    import redis

    assert redis_server.port() != 6379
    assert redis_server.redis_url(3) == f"redis://127.0.0.1:{redis_server.port()}/3"
    client = redis.Redis.from_url(redis_server.redis_url())
    assert Path(client.config_get("dir")["dir"]).is_relative_to(services.session_dir())
    assert client.config_get("save")["save"] == ""
    assert client.config_get("appendonly")["appendonly"] == "no"
    assert client.config_get("timeout")["timeout"] == "0"


@pytest.mark.parametrize("server", [postgres, redis_server], ids=["postgres", "redis"])
def test_a_port_taken_before_the_server_binds_it_is_given_up_for_another(server, monkeypatch):
    """A free port is free only until something binds it: the server that finds it taken is started
    again on another, rather than failing its session."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1], free_port()])
        monkeypatch.setattr(services, "free_port", lambda: next(ports))
        address = server._start(Path(tempfile.mkdtemp(dir=services.session_dir())))
        try:
            assert address["port"] != taken.getsockname()[1]
            assert _answers(address["port"])
        finally:
            subprocess.run(address["stop"], check=True, capture_output=True)


def _answers(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_session_starts_each_server_once_for_all_its_processes_and_stops_them_at_its_end():
    """A process outside pytest is a session of its own (as bench/ scripts are); the processes it
    starts inherit the session, as xdist workers do, and two of them asking at once get one server
    of each kind; once the session's process is gone, both servers are stopped and their folder removed."""
    ask = "import json, postgres, redis_server; print(json.dumps([postgres.port(), redis_server.port()]))"
    session = textwrap.dedent(f"""
        import json, subprocess, sys, services
        services.session_dir()
        workers = [subprocess.Popen([sys.executable, "-c", {ask!r}], stdout=subprocess.PIPE, text=True)
                   for _ in range(2)]
        print(json.dumps({{"ports": [json.loads(w.communicate()[0]) for w in workers],
                          "folder": str(services.session_dir())}}))
    """)
    env = {key: value for key, value in os.environ.items() if key != services.ENV}
    done = subprocess.run([sys.executable, "-c", session], capture_output=True, text=True, cwd=HARNESS,
                          env={**env, "PYTHONPATH": str(HARNESS)}, timeout=300)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    (pg_port, redis_port), other = seen["ports"]
    assert other == [pg_port, redis_port]
    wait_for("the session's watchdog to end it", lambda: not Path(seen["folder"]).exists(), 30, every_s=0.1)
    assert not _answers(pg_port) and not _answers(redis_port)


def test_a_stop_command_that_fails_leaves_no_other_server_running(tmp_path: Path):
    """The session's end stops every server whatever became of another's stop (a stop command whose
    interpreter is gone raised, and the session's PostgreSQL, Redis and live Airflow ran on)."""
    root = tmp_path / "session"
    root.mkdir()
    stopped = tmp_path / "stopped"
    (root / "a-gone.json").write_text(json.dumps({"stop": [str(tmp_path / "no-such-python"), "-c", "pass"]}))
    (root / "b-server.json").write_text(json.dumps({"stop": ["touch", str(stopped)]}))
    services.end(str(root))
    assert stopped.exists() and not root.exists()


def test_a_free_port_is_never_one_an_outgoing_connection_may_take():
    """Below the kernel's ephemeral range: between the pick and the server's bind, no outgoing connection's
    source port can land on it (a port from ``bind(0)`` could, and a test's MLflow server once failed so)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in {free_port() for _ in range(50)}:
        assert 10000 <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
