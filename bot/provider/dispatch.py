"""Which protocol one provider call speaks: the residence's client decides, so the generation layer
calls one function for every residence and gets the same `StreamEnd` back."""

from __future__ import annotations

from typing import Any

import anthropic
import openai

from .openai_stream import openai_stream_once
from .stream import BlockSink, StreamEnd, stream_once

Client = anthropic.AsyncAnthropic | openai.AsyncOpenAI


async def stream_call(
    client: Client, request: dict[str, Any], sink: BlockSink, timeout: float | None = None
) -> StreamEnd:
    """One attempt: chat completions for an OpenAI client, Anthropic Messages otherwise."""
    if isinstance(client, openai.AsyncOpenAI):
        return await openai_stream_once(client, request, sink, timeout=timeout)
    return await stream_once(client, request, sink, timeout=timeout)
