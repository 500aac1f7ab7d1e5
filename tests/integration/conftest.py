import concurrent.futures
import os

import openai
import pytest

from .daemon import Daemon

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="session")
def daemon():
    d = Daemon()
    yield d
    d.stop()


@pytest.fixture(scope="session")
def client(daemon):
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def each(fn, seeds) -> list:
    """fn(seed) for every seed, the requests at once: the daemon batches them (each seed's
    tokens are its own, keyed by seed and position, whatever else is in the batch)."""
    seeds = list(seeds)
    with concurrent.futures.ThreadPoolExecutor(len(seeds)) as pool:
        return list(pool.map(fn, seeds))


def need_suffix_tree() -> None:
    """Skip without Arctic Inference's suffix tree (--speculative suffix); CI, whose .ci/run
    builds it, fails instead."""
    from superfluid.errors import ModelLoadError
    from superfluid.runtime.suffix import suffix_tree_class
    try:
        suffix_tree_class()
    except ModelLoadError as e:
        if os.environ.get("CI"):
            pytest.fail(str(e))
        pytest.skip(str(e))
