"""The bare-SDK counterpart of `residents replay` as a whole process: `python -m bench.bare_process SSE TOKENS`.

Like replay it starts the local provider server in-process on a recorded stream and reads it over
loopback; unlike replay it does nothing else: the SDK's raw events, text deltas joined, printed.
"""

from __future__ import annotations

import asyncio
import sys

import anthropic

from bot.localservers.provider import Call, ProviderServer


async def main(path: str, tokens: int) -> str:
    with open(path, "rb") as f:
        body = f.read()
    server = ProviderServer(responder=lambda _req: Call(sse=body))
    url = await server.start()
    client = anthropic.AsyncAnthropic(base_url=url, api_key="bench", max_retries=0)
    try:
        stream = await client.messages.create(
            model="claude-sonnet-4-6",
            max_tokens=tokens,
            stream=True,
            messages=[{"role": "user", "content": "Write at length."}],
        )
        parts: list[str] = []
        async for ev in stream:
            if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
                parts.append(ev.delta.text)
        return "".join(parts)
    finally:
        await client.close()
        await server.stop()


if __name__ == "__main__":
    sys.stdout.write(asyncio.run(main(sys.argv[1], int(sys.argv[2]))))
