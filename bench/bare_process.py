"""The bare-SDK counterpart of `residents replay` as a whole process: `python -m bench.bare_process SSE TOKENS [--floor]`.

Like replay it starts the local provider server in-process on a recorded stream and reads it over
loopback, and like the `residents` CLI it calls `gc.freeze()` once its modules are imported, so
neither side pays full collections over import-time objects the other is spared. Unlike replay it
does nothing else: `messages.create(stream=True)`, the SDK's typed events, text deltas joined,
printed. With `--floor` it only reads the response's bytes (no SSE decoding, no JSON): what the
in-process server and the HTTP transport cost, which both sides pay.
"""

from __future__ import annotations

import asyncio
import gc
import sys

import anthropic

from residents.localservers.provider import Call, ProviderServer

REQUEST = {"model": "claude-sonnet-4-6", "messages": [{"role": "user", "content": "Write at length."}]}


async def main(path: str, tokens: int, floor: bool) -> str:
    with open(path, "rb") as f:
        body = f.read()
    server = ProviderServer(responder=lambda _req: Call(sse=body))
    url = await server.start()
    client = anthropic.AsyncAnthropic(base_url=url, api_key="bench", max_retries=0)
    try:
        if floor:
            size = 0
            async with client.messages.with_streaming_response.create(**REQUEST, max_tokens=tokens, stream=True) as raw:
                async for chunk in raw.http_response.aiter_bytes():
                    size += len(chunk)
            return f"{size} bytes\n"
        stream = await client.messages.create(**REQUEST, max_tokens=tokens, stream=True)
        parts: list[str] = []
        async for ev in stream:
            if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
                parts.append(ev.delta.text)
        return "".join(parts)
    finally:
        await client.close()
        await server.stop()


if __name__ == "__main__":
    gc.freeze()  # as `residents` does once its modules are imported (residents/cli/__init__.py, residents/cli/replay.py)
    sys.stdout.write(asyncio.run(main(sys.argv[1], int(sys.argv[2]), "--floor" in sys.argv[3:])))
