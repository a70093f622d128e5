"""The providers: one module each implementing `Provider` (`base.py`), and the registry below mapping a
residence's `provider:` name to it. Configuration, start-up, the attempt runner, `run` and `replay`
know providers only through this registry; adding one is a module and a line here
(docs/extending.md).

A provider's module is imported only when some residence uses it: importing the openai SDK costs a
process about 30 MB, which a room of Claude residents should not carry.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .base import BlockSink, Endpoint, Failure, KeyRejected, ListSink, Provider, StreamEnd


@dataclass(frozen=True)
class Registration:
    """What the rest of the project knows of a provider without importing it.

    `key_env`/`base_url_env`: the environment variables a provider configured by the environment
    reads; None for one configured in the residence file (`base_url` and `api_key_env` there, both
    required). `prefill`: a cut output is continued by an assistant-turn prefill (else by a user turn).
    `base_path`: what follows a server's root in this provider's base URL (OpenAI's clients put `/v1`
    there), so the local provider server, which speaks every protocol, can be named for each.
    `server`: what `base_url_env` may name, in the words of a message that asks for it.
    `breakpoints`: the provider caches a prompt's prefix only where the request marks it
    (`cache_control`, `residents.provider.caching`); others cache a repeated prefix by themselves.
    """

    module: str
    key_env: str | None = None
    base_url_env: str | None = None
    prefill: bool = False
    base_path: str = ""
    server: str = "a compatible server"
    breakpoints: bool = False

    @property
    def configured_in_residence(self) -> bool:
        return self.key_env is None


REGISTRY: dict[str, Registration] = {
    "anthropic": Registration(
        "residents.provider.anthropic_messages",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        prefill=True,
        server="an Anthropic-compatible server",
        breakpoints=True,
    ),
    "openai-compatible": Registration("residents.provider.openai_compatible", base_path="/v1"),
}


class MissingKey(Exception):
    """A provider configured by the environment has neither its key nor a server of its own set."""


def endpoint(name: str, base_url: str | None, api_key_env: str | None, env: Mapping[str, str]) -> Endpoint:
    """Where provider `name` is called for a residence, read from the environment `env`.

    A provider configured by the environment needs its key, or a base URL of its own (a local or
    compatible server may take any key); one configured in the residence reads the key its
    `api_key_env` names.
    """
    reg = REGISTRY[name]
    if reg.key_env is None:
        assert api_key_env is not None  # required by the residence's configuration
        return Endpoint(base_url, env.get(api_key_env, "").strip(), api_key_env)
    server = (env.get(reg.base_url_env, "") if reg.base_url_env else "") or None
    key = env.get(reg.key_env, "")
    if not key and server is None:
        raise MissingKey(f"{reg.key_env} is not set (or set {reg.base_url_env} to {reg.server})")
    return Endpoint(server, key, reg.key_env)


def connect(name: str, where: Endpoint) -> Provider:
    """Provider `name` at `where`: its module, imported now, builds it."""
    module = importlib.import_module(REGISTRY[name].module)
    provider: Provider = module.connect(where)
    return provider


def connect_all(wanted: Iterable[tuple[str, str, Endpoint]]) -> dict[str, Provider]:
    """A provider for each `(residence, provider name, endpoint)`; residences with the same provider,
    server and key share one (and its connection pool)."""
    shared: dict[tuple[str, Endpoint], Provider] = {}
    out = {}
    for residence, name, where in wanted:
        if (name, where) not in shared:
            shared[name, where] = connect(name, where)
        out[residence] = shared[name, where]
    return out


async def close_all(providers: Iterable[Provider]) -> None:
    """Close each distinct provider once."""
    for p in {id(p): p for p in providers}.values():
        await p.close()


__all__ = [
    "REGISTRY",
    "BlockSink",
    "Endpoint",
    "Failure",
    "KeyRejected",
    "ListSink",
    "MissingKey",
    "Provider",
    "Registration",
    "StreamEnd",
    "close_all",
    "connect",
    "connect_all",
    "endpoint",
]
