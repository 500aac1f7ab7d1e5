"""--gpu-layers auto (runtime/offload.py): weights and every lane's KV fitted into the devices'
free memory, the window shrunk before layers spill to the CPU; what was chosen is said."""

import pytest

from superfluid.runtime.devices import Build, Device
from superfluid.runtime.memory_fit import Fit
from superfluid.runtime.offload import MARGIN, parse_layers, plan

GiB = 1 << 30
CPU = Device("CPU", "a CPU", "cpu", 64 * GiB, 64 * GiB)


def build(*free_gib: float) -> Build:
    gpus = tuple(Device(f"CUDA{i}", "a GPU", "gpu", int(f * GiB), 24 * GiB) for i, f in enumerate(free_gib))
    return Build("0.3.36", ("CUDA", "CPU"), ("AVX2",), gpus + (CPU,))


FIT = Fit(n_ctx=32768, swa_cache="full", token_bytes=128 * 1024, lane_bytes=0)  # 128 KB a token: a ~8B model


def test_everything_on_a_device_with_room():
    # 4 GiB of weights + 4 lanes x 32768 x 128 KB = 16 GiB of KV, on a 24 GiB card
    off = plan(build(23), gpu_layers="auto", names=(), n_layer=32, model_bytes=4 * GiB, fit=FIT, lanes=4,
               requested=None)
    assert (off.layers, off.n_ctx, off.devices) == (33, 32768, ("CUDA0",))
    assert off.device_bytes == 20 * GiB and "33 of 33 layers" in off.line
    assert off.to_json() == {"devices": ["CUDA0"], "layers": 33, "of": 33, "bytes": 20 * GiB, "total_bytes": 24 * GiB}


def test_the_window_shrinks_before_layers_leave_the_device():
    off = plan(build(12), gpu_layers="auto", names=(), n_layer=32, model_bytes=4 * GiB, fit=FIT, lanes=4,
               requested=None)
    assert off.layers == 33
    assert 4096 <= off.n_ctx < 32768 and off.n_ctx % 256 == 0
    assert 4 * GiB + 4 * off.n_ctx * FIT.token_bytes <= 12 * GiB - MARGIN


def test_layers_spill_when_even_the_smallest_window_does_not_fit():
    off = plan(build(6), gpu_layers="auto", names=(), n_layer=32, model_bytes=8 * GiB, fit=FIT, lanes=4,
               requested=None)
    assert off.n_ctx == 4096 and 0 < off.layers < 33 and "the rest on the CPU" in off.line
    # an asked-for window is kept: fewer layers instead
    asked = plan(build(6), gpu_layers="auto", names=(), n_layer=32, model_bytes=8 * GiB, fit=FIT, lanes=4,
                 requested=32768)
    assert asked.n_ctx == 32768 and asked.layers < off.layers


def test_explicit_counts_devices_and_none():
    kw = dict(n_layer=32, model_bytes=4 * GiB, fit=FIT, lanes=4, requested=None)
    assert plan(build(1), gpu_layers="all", names=(), **kw).layers == 33
    assert plan(build(23), gpu_layers="10", names=(), **kw).layers == 10
    assert plan(build(23), gpu_layers="0", names=(), **kw).layers == 0
    assert plan(build(23, 23), gpu_layers="auto", names=("cuda1",), **kw).devices == ("CUDA1",)
    assert plan(build(23), gpu_layers="auto", names=("none",), **kw).layers == 0
    cpu_only = Build("0.3.36", ("CPU",), (), (CPU,))
    off = plan(cpu_only, gpu_layers="auto", names=(), **kw)
    assert (off.layers, off.line, off.to_json()) == (0, "", {"devices": ["CPU"], "layers": 0})
    with pytest.raises(ValueError, match="no such device"):
        plan(build(23), gpu_layers="auto", names=("Vulkan0",), **kw)
    with pytest.raises(ValueError, match="not a GPU"):
        plan(build(23), gpu_layers="auto", names=("CPU",), **kw)


def test_gpu_layers_values():
    assert [parse_layers(v) for v in ("auto", "ALL", "-1", "0", "24")] == ["auto", "all", "all", "0", "24"]
    for bad in ("-2", "many", ""):
        with pytest.raises(ValueError):
            parse_layers(bad)
