"""The command line: clear exits for bad model files, clean stop without orphans."""

import signal
import subprocess
import sys

import pytest

from .daemon import Daemon, free_port, pid_alive


def serve(*args):
    return subprocess.run([sys.executable, "-m", "superfluid.cli", "serve", *args, "--port", str(free_port())],
                          capture_output=True, text=True, timeout=60)


def test_missing_model_file_exits_2():
    r = serve("/nonexistent/model.gguf")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "not found" in lines[0]


def test_non_gguf_file_exits_2(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_bytes(b"this is not a gguf file")
    r = serve(str(p))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a GGUF file" in lines[0]


def test_truncated_gguf_exits_2(tmp_path):
    p = tmp_path / "broken.gguf"
    p.write_bytes(b"GGUF" + b"\0" * 64)
    r = serve(str(p))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("superfluid:")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_daemon_and_worker(sig):
    d = Daemon(max_batch=2, max_context=512)
    worker = d.worker_pid()
    assert pid_alive(worker)
    code = d.stop(sig)
    assert code == 0
    assert not pid_alive(worker)


def test_serve_a_gguf_path_with_http_flag(tmp_path):
    from superfluid.runtime.registry import embedded_model
    import httpx
    path = tmp_path / "my-model.Q4_1.gguf"  # a GGUF's id is its file name; the embedded file keeps its own
    path.symlink_to(embedded_model().path)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "superfluid.cli", "serve", str(path), "--http", f"127.0.0.1:{port}",
                             "--max-batch", "2", "--max-context", "512", "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        banner = proc.stdout.readline()
        assert "llama.cpp" in banner and "backends" in banner  # the first line: the build (docs/gpu.md)
        banner = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}" in banner and "my-model.Q4_1" in banner
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30).json()
        assert models["data"][0]["id"] == "my-model.Q4_1"
        assert models["data"][0]["meta"]["n_ctx"] == 512
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert proc.returncode == 0


def test_context_beyond_memory_exits_2_with_one_line():
    r = serve("--max-context", "100000000")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert "llama.cpp" in lines[0] and "backends" in lines[0]  # the first line: the build it would run on
    assert len(lines) == 2 and "lower --max-context" in lines[1], lines
