"""Local stand-ins for the outside world, on loopback: an Anthropic-compatible provider and a Discord-compatible room.

They import nothing of the pipeline, so each can be read, tested and replaced alone.
"""
