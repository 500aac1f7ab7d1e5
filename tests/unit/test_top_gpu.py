"""`superfluid top` shows what the models hold of each GPU (superfluid_device_memory_bytes)."""

from __future__ import annotations

from superfluid.monitor.top import Sample, parse, row, table

PAGE = """# HELP superfluid_device_memory_bytes a GPU's memory
# TYPE superfluid_device_memory_bytes gauge
superfluid_device_memory_bytes{model="a",device="CUDA0",kind="model"} 3221225472
superfluid_device_memory_bytes{model="a",device="CUDA0",kind="total"} 25769803776
superfluid_device_memory_bytes{model="b",device="CUDA0",kind="model"} 1073741824
superfluid_device_memory_bytes{model="b",device="CUDA0",kind="total"} 25769803776
superfluid_device_memory_bytes{model="c",device="Vulkan0+Vulkan1",kind="model"} 536870912
superfluid_device_memory_bytes{model="c",device="Vulkan0+Vulkan1",kind="total"} 17179869184
# HELP superfluid_lanes_active lanes
# TYPE superfluid_lanes_active gauge
superfluid_lanes_active{model="a"} 2
superfluid_lanes_active{model="b"} 1
"""


def test_each_gpu_shows_what_the_models_hold_of_its_memory():
    values, _, devices = parse(PAGE)
    assert values["superfluid_lanes_active"] == 3
    assert devices == {"CUDA0": [4 * 2**30, 24 * 2**30], "Vulkan0+Vulkan1": [2**29, 16 * 2**30]}
    r = row("127.0.0.1:8080", Sample("up", 0.0, values, {}, devices), None)
    assert r[-1] == "CUDA0 4.0/24.0 GiB, Vulkan0+Vulkan1 0.5/16.0 GiB"
    assert len(r) == len(table([r]).columns)


def test_a_server_on_the_cpu_shows_no_gpu():
    values, _, devices = parse(PAGE.split("# HELP superfluid_lanes_active")[0].replace("superfluid_device", "x_device")
                               + "# TYPE superfluid_lanes_active gauge\nsuperfluid_lanes_active 1\n")
    assert devices == {}
    assert row("h:1", Sample("up", 0.0, values, {}, devices), None)[-1] == "-"
    assert row("h:1", Sample("down", 0.0, {}), None)[-1] == "-"
