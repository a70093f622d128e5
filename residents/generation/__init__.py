"""Generations and their attempts: the provider calls for one reply, retries and continuation."""
