"""Trainyard's GPU-box side: the supervisor, job runners, strategies and recipes."""
