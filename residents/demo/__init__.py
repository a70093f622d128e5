"""`residents demo`: the offline room a newcomer runs first, on the same code that runs in Discord.

The verb itself lives with the other verbs, in `residents.cli.demo`.
"""
