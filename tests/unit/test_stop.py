"""`superfluid stop` signals only a superfluid server: a stale pid file naming some other
program's process (the pid was reused) is removed, and that process is left alone (issue 33)."""

import subprocess
import sys

from superfluid.cli.launch import stop


def test_a_stale_pid_file_never_signals_another_program(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SUPERFLUID_HOME", str(tmp_path))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        pidfile = tmp_path / "run" / "serve-8123.pid"
        pidfile.parent.mkdir(parents=True)
        pidfile.write_text(f"{other.pid}\n")
        assert stop(8123, drain=False, timeout=2) == 1
        assert other.poll() is None  # not signalled
        assert not pidfile.exists()
        assert "another program" in capsys.readouterr().err
    finally:
        other.kill()
        other.wait()
