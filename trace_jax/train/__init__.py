"""RL training: the compiled TRACE step (allocate, roll out, targets, advantages, loss, update) and its loop."""
