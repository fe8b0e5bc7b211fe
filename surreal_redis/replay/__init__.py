"""Replay memories: FIFO (on-policy), uniform and prioritized (off-policy), rate limiting."""
