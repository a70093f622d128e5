"""The provider: one SDK stream per attempt, classified into plain data."""

from .stream import BlockSink, Failure, ListSink, StreamEnd, make_client, stream_once

__all__ = ["BlockSink", "Failure", "ListSink", "StreamEnd", "make_client", "stream_once"]
