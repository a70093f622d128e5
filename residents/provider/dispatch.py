"""Which protocol one provider call speaks: the residence's client decides, so the generation layer
calls one function for every residence and gets the same `StreamEnd` back.

The openai SDK is imported only when a residence speaks chat completions: importing it costs a
process about 30 MB, which a room of Claude residents should not carry (issue 15's idle target).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

import anthropic

from .stream import BlockSink, StreamEnd, stream_once

if TYPE_CHECKING:
    import openai

    Client: TypeAlias = anthropic.AsyncAnthropic | openai.AsyncOpenAI


async def stream_call(
    client: Client, request: dict[str, Any], sink: BlockSink, timeout: float | None = None
) -> StreamEnd:
    """One attempt: chat completions for an OpenAI client, Anthropic Messages otherwise."""
    if isinstance(client, anthropic.AsyncAnthropic):
        return await stream_once(client, request, sink, timeout=timeout)
    from .openai_stream import openai_stream_once  # only a chat-completions client gets here

    return await openai_stream_once(client, request, sink, timeout=timeout)
