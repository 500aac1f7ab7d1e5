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
