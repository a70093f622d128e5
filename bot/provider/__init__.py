"""The provider: one SDK stream per attempt, classified into plain data."""
from .stream import Failure, ListSink, StreamEnd, make_client, stream_once

__all__ = ["Failure", "ListSink", "StreamEnd", "make_client", "stream_once"]
