"""The context compiler: what a resident sees of its room when it is asked to speak."""

from .compile import RoomMessage, compile_request

__all__ = ["RoomMessage", "compile_request"]
