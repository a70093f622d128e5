"""A provider is one module and one registry line: configuration, start-up and the pipeline know
providers only through `residents.provider.REGISTRY`.

The provider added here is a real module written to a temporary folder (the way a maintainer would
add one), registered for the test; nothing of the project is patched besides that one line.
"""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from residents.config import ConfigError, build_residence
from residents.discord import startup
from residents.discord.run import StartupError, provider_endpoints
from residents.provider import REGISTRY, Endpoint, Registration, connect_all, endpoint
from residents.replay.run import replay
from residents.replay.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent

ECHO_MODULE = '''
"""A provider that streams one fixed reply: enough to show what a provider module must hold."""
from residents.provider.base import BlockSink, Endpoint, StreamEnd

TEXT = "Said by the echo provider."


class EchoProvider:
    def __init__(self, where: Endpoint) -> None:
        self.where, self.closed, self.requests = where, False, []

    async def stream(self, request, sink: BlockSink, timeout=None) -> StreamEnd:
        self.requests.append(request)
        sink.start(0, "text", "", None)
        sink.add(TEXT)
        await sink.flush()
        return StreamEnd(stop_reason="end_turn", output_tokens=5)

    async def check_key(self) -> None:
        return None

    async def close(self) -> None:
        self.closed = True


def connect(where: Endpoint) -> EchoProvider:
    return EchoProvider(where)
'''


@pytest.fixture
def echo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Registration:
    """The module `echo_provider` in a folder on the path, and its one registry line."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "echo_provider.py").write_text(textwrap.dedent(ECHO_MODULE))
    monkeypatch.syspath_prepend(str(folder))
    reg = Registration("echo_provider", key_env="ECHO_KEY", base_url_env="ECHO_URL")
    monkeypatch.setitem(REGISTRY, "echo", reg)
    return reg


RESIDENCE = {"name": "wren", "model": "claude-3-opus-20240229", "max_tokens": 100}


def test_configuration_takes_a_registered_name_and_names_every_provider_otherwise(echo: Registration) -> None:
    assert build_residence({**RESIDENCE, "provider": "echo"}, "residences/wren.yaml", None, ROOT).provider == "echo"
    with pytest.raises(ConfigError) as e:
        build_residence({**RESIDENCE, "provider": "ech"}, "residences/wren.yaml", None, ROOT)
    assert e.value.key == "provider"
    assert "'ech' is not a provider (one of: anthropic, echo, openai-compatible)" in str(e.value)
    with pytest.raises(ConfigError) as e:  # configured by the environment: no base_url in the residence
        build_residence({**RESIDENCE, "provider": "echo", "base_url": "http://x"}, "residences/wren.yaml", None, ROOT)
    assert e.value.key == "base_url" and "reads ECHO_KEY and ECHO_URL" in str(e.value)


def test_start_up_reads_a_registered_providers_variables_and_names_a_missing_one(echo: Registration) -> None:
    res = build_residence({**RESIDENCE, "provider": "echo"}, "residences/wren.yaml", None, ROOT)
    line = startup.missing_variables([res], {}, local_api=True)
    assert line == "not set in the environment: ECHO_KEY (the provider key; or set ECHO_URL to a compatible server)"
    with pytest.raises(StartupError, match="ECHO_KEY is not set"):
        provider_endpoints([res], {})
    found = provider_endpoints([res], {"ECHO_KEY": "k"})
    assert found == {"wren": ("echo", Endpoint(None, "k", "ECHO_KEY"))}
    twin = build_residence({**RESIDENCE, "name": "twin", "provider": "echo"}, "residences/twin.yaml", None, ROOT)
    wanted = [(r.name, r.provider, endpoint(r.provider, None, None, {"ECHO_KEY": "k"})) for r in (res, twin)]
    providers = connect_all(wanted)
    assert providers["wren"] is providers["twin"]  # one server and key: one client


def test_replay_runs_a_turn_through_a_registered_provider(echo: Registration, tmp_path: Path) -> None:
    path = tmp_path / "echo.yaml"
    path.write_text(
        textwrap.dedent(
            """
            residence: {name: wren, model: claude-3-opus-20240229, max_tokens: 100, provider: echo}
            turns:
              - say: {author: alice, content: "Say something."}
                calls: []
            """
        )
    )
    result = asyncio.run(replay(load_scenario(path), None))
    (turn,) = result["turns"]
    assert turn["generation"]["status"] == "completed"
    assert turn["generation"]["text"] == "Said by the echo provider."
    assert [p["content"] for p in turn["posts"]] == ["Said by the echo provider."]
    assert turn["provider_calls"] == 0  # the local provider server was never asked: the registry's module was
