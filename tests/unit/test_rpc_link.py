"""runtime/rpc_link.py's pure parts and its guard: how the layers are shared (--rpc-split or
free memory), a share that does not fit, and the stand-in port taking only this process's
own connections (a node's RPC server has no authentication: another local user must not
reach it through the head's worker)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from superfluid.errors import ModelLoadError
from superfluid.runtime.rpc_link import check_fits, own_connection, shares


def test_shares_follow_the_split_or_the_free_memory():
    assert shares([(100, 0), (300, 0)], []) == [0.25, 0.75]
    assert shares([(100, 0), (300, 0), (0, 0)], [1, 1, 2]) == [0.25, 0.25, 0.5]
    with pytest.raises(ModelLoadError, match="--rpc-split needs 2"):
        shares([(1, 0), (1, 0)], [1, 1, 1])


def test_a_share_over_a_devices_free_memory_is_refused_by_name():
    check_fits(1000, [(600, 0), (600, 0)], [0.5, 0.5], ["this host", "n1"])
    with pytest.raises(ModelLoadError, match="n1 has"):
        check_fits(1000, [(900, 0), (100 << 20, 0), (100, 0)], [0.2, 0.2, 0.6], ["this host", "n0", "n1"])


def test_the_stand_in_port_takes_only_this_processs_connections():
    async def go() -> list[bool]:
        seen: list[bool] = []

        def on(r, w):
            seen.append(own_connection(w))
            w.close()
        srv = await asyncio.start_server(on, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        _, w = await asyncio.open_connection("127.0.0.1", port)  # ours (llama.cpp's client is in-process)
        other = await asyncio.create_subprocess_exec(
            sys.executable, "-c", f"import socket, time; s = socket.create_connection(('127.0.0.1', {port})); "
                                  "time.sleep(1)")
        for _ in range(100):
            if len(seen) == 2:
                break
            await asyncio.sleep(0.05)
        await other.wait()
        w.close()
        srv.close()
        return seen
    assert asyncio.run(go()) == [True, False]


def test_rpc_nodes_are_dialed_by_address_and_taken_by_name_or_auto_when_they_join():
    import argparse

    from superfluid.cli.flags import _rpc_nodes
    assert _rpc_nodes("h1:8454, gpu-2,auto,[::1]:9") == ((("h1", 8454), ("::1", 9)), ("gpu-2", "auto"))
    assert _rpc_nodes("j1,j1") == ((), ("j1",))
    for bad in ("", " , ", "a b", "h:port", "x" * 65):
        with pytest.raises(argparse.ArgumentTypeError):
            _rpc_nodes(bad)


def test_nodes_named_to_join_need_a_place_to_join(capsys):
    from superfluid.cli.main import main
    assert main(["serve", "--rpc-nodes", "j1", "--port", "1"]) == 2
    assert "--fleet-listen" in capsys.readouterr().err
    assert main(["serve", "--rpc-nodes", "auto", "--fleet", "127.0.0.1:9", "--port", "1"]) == 2
    assert "pick one" in capsys.readouterr().err
