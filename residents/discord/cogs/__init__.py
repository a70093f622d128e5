"""One cog per feature: the resident's conversation, and the moderators' slash commands."""
