"""A local Discord-compatible room server that the real discord.py client can log in to.

Discord's side: REST under /api/v10 (rest.py) and the gateway at /gateway and /gateway/
(gateway.py). People's side, not Discord's, under /_room/ (roomapi.py): state, messages,
commands, faults, events. Any bot token is accepted; see `bot_name_for_token` for its name.

Inside: model.py (guilds, roles, overwrites, messages), layout.py (`--layout` files), payloads.py
(Discord JSON), validation.py (Discord's rules), state.py (the room and its event bus),
interactions.py (slash commands). Nothing here imports the residents' pipeline.
"""

from .layout import Layout, LayoutError, default_layout, load_layout
from .server import RoomServer, serve
from .state import bot_name_for_token

__all__ = ["Layout", "LayoutError", "RoomServer", "bot_name_for_token", "default_layout", "load_layout", "serve"]
