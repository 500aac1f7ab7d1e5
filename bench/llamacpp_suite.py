"""llama.cpp's own server test suite (`tools/server/tests` in the llama.cpp tree the
llama-cpp-python 0.3.36 sdist vendors) against superfluid and llama-server side by side.

    python bench/llamacpp_suite.py [--systems superfluid,llama-server] [FILE ...]

The tests start their server through LLAMA_SERVER_BIN_PATH with llama-server's flags; a shim
maps those onto each system: superfluid `serve` (its llama-server flags: -c, -np, -n,
--api-key, --cors-origins, --threads) and llama-server from the xllamacpp wheel (bench only:
pip install xllamacpp) with the same settings, both on the embedded SmolLM2 (every model a
test asks for is replaced by it, so asserts on a model's text fail on both; --embedding and
--pooling are left out on both, so the embedding tests are of the generative model). The
sdist's tests and their requirements go to /tmp/lcs (from PyPI at run time, never committed).

Prints the two counts and the tests that pass on one side only; writes every test's outcome
on both sides to /tmp/lcs/results.json. About 15 minutes per system on two cores.

Measured: see the closing note of issue 36."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import common  # noqa: F401  (puts the repository on sys.path)

from superfluid.runtime.registry import embedded_model

W = Path("/tmp/lcs")
SDIST = "llama-cpp-python==0.3.36"
FILES = ["unit/test_chat_completion.py", "unit/test_compat_anthropic.py", "unit/test_tool_call.py",
         "unit/test_compat_oai_responses.py", "unit/test_security.py", "unit/test_completion.py",
         "unit/test_tokenize.py", "unit/test_infill.py", "unit/test_embedding.py"]


def fetch_tests() -> Path:
    tests = W / "tests"
    if not tests.is_dir():
        W.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        "-d", str(W / "dl"), SDIST], check=True)
        (sdist,) = (W / "dl").glob("llama_cpp_python-*.tar.gz")
        prefix = sdist.name[:-len(".tar.gz")] + "/vendor/llama.cpp/tools/server/tests/"
        with tarfile.open(sdist) as t:
            members = [m for m in t.getmembers() if m.name.startswith(prefix)]
            for m in members:
                m.name = m.name[len(prefix):]
            t.extractall(tests, members=[m for m in members if m.name], filter="data")
    venv = W / "venv"
    if not (venv / "bin" / "pytest").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "-r", str(tests / "requirements.txt")], check=True)
    return tests


# -- the shims: llama-server's command line in, each system's out ------------------------------

VALUED = {"--hf-repo", "--hf-file", "--model-url", "--model", "-m", "--alias", "--batch-size", "-b",
          "--ubatch-size", "-ub", "--n-gpu-layers", "-ngl", "--tags", "-ctk", "-ctv", "--slot-save-path",
          "--grp-attn-n", "--grp-attn-w", "--lora", "--spec-type", "--spec-draft-n-max", "--spec-draft-n-min",
          "--models-dir", "--models-max", "--models-preset", "--model-draft", "--chat-template",
          "--chat-template-file", "--reasoning-format", "--reasoning-budget", "--seed", "--temp", "-fa",
          "--flash-attn", "--draft-max", "--draft-min", "--draft", "--reasoning", "--media-path", "--pooling"}


def parse(argv: list[str]) -> tuple[dict, list[str]]:
    """(the flags both shims read, the rest) of a llama-server command line."""
    o: dict = {"port": "8080", "host": "127.0.0.1"}
    rest: list[str] = []
    i = 0
    names = {"--port": "port", "--host": "host", "--ctx-size": "ctx", "-c": "ctx", "--parallel": "np", "-np": "np",
             "--api-key": "api_key", "--threads": "threads", "-t": "threads", "--cors-origins": "cors",
             "--n-predict": "n_predict", "-n": "n_predict"}
    while i < len(argv):
        a = argv[i]
        if a in names:
            o[names[a]] = argv[i + 1]
            i += 2
        elif a in VALUED:
            i += 2
        else:
            rest.append(a)
            i += 1
    return o, rest


def superfluid_shim(argv: list[str]) -> None:
    o, rest = parse(argv)
    out = ["serve", "--host", o["host"], "--port", o["port"], "--no-tui"]
    for flag, key in (("--api-key", "api_key"), ("--threads", "threads"), ("--cors-origins", "cors"),
                      ("-c", "ctx"), ("-np", "np"), ("-n", "n_predict")):
        if key in o:
            out += [flag, o[key]]
    os.execv(sys.executable, [sys.executable, "-m", "superfluid.cli", *out])


def llama_server_shim(argv: list[str]) -> None:
    import xllamacpp as x
    o, rest = parse(argv)
    p = x.CommonParams()
    p.model.path = embedded_model().path
    p.hostnames = [o["host"]]
    p.port = int(o["port"])
    p.use_jinja = True
    p.endpoint_metrics = True
    p.endpoint_slots = "--no-slots" not in rest
    p.n_parallel = int(o.get("np", 1))
    if "ctx" in o:
        p.n_ctx = int(o["ctx"])
    if "threads" in o:
        p.cpuparams.n_threads = p.cpuparams_batch.n_threads = int(o["threads"])
    if "api_key" in o:
        p.api_keys = [o["api_key"]]
    if "n_predict" in o:
        p.n_predict = int(o["n_predict"])
    if "cors" in o:
        p.cors_origins = o["cors"]
    server = x.Server(p)  # noqa: F841  (it serves while referenced)
    while True:
        time.sleep(3600)


def shim(system: str) -> Path:
    path = W / f"shim-{system}.sh"
    path.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} --shim {system} \"$@\"\n")
    path.chmod(0o755)
    return path


# -- a run ---------------------------------------------------------------------------------------

def run(system: str, tests: Path, files: list[str]) -> dict[str, str]:
    """{test id: passed | failed | skipped | error} of one system."""
    xml = W / f"junit-{system}.xml"
    env = {**os.environ, "LLAMA_SERVER_BIN_PATH": str(shim(system))}
    t0 = time.monotonic()
    subprocess.run([str(W / "venv" / "bin" / "pytest"), "-q", "-p", "no:cacheprovider", "--tb=line",
                    f"--junitxml={xml}", *files], cwd=tests, env=env, stdout=open(W / f"last-{system}.txt", "w"),
                   stderr=subprocess.STDOUT)
    print(f"{system}: {time.monotonic() - t0:.0f} s", flush=True)
    out = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {c.tag for c in case}
        out[name] = "failed" if "failure" in kinds else "error" if "error" in kinds else \
            "skipped" if "skipped" in kinds else "passed"
    return out


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--shim":
        (superfluid_shim if sys.argv[2] == "superfluid" else llama_server_shim)(sys.argv[3:])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--systems", default="superfluid,llama-server")
    ap.add_argument("files", nargs="*", default=FILES)
    a = ap.parse_args()
    tests = fetch_tests()
    results = {s: run(s, tests, a.files) for s in a.systems.split(",")}
    (W / "results.json").write_text(json.dumps(results, indent=1))
    for s, r in results.items():
        print(f"{s}: {sum(v == 'passed' for v in r.values())} passed of {len(r)}")
    if len(results) == 2:
        (s1, r1), (s2, r2) = results.items()
        for a_, ra, rb in ((s1, r1, r2), (s2, r2, r1)):
            only = sorted(t for t, v in ra.items() if v == "passed" and rb.get(t) != "passed")
            print(f"\npassed on {a_} only ({len(only)}):")
            for t in only:
                print("  " + t)


if __name__ == "__main__":
    main()
