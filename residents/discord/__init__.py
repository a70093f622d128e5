"""Glue between the residents and discord.py."""
