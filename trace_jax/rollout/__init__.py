"""Rollout engine: slot arrays, token sampling, and the jitted multi-turn episode loop."""
