"""Everything the service keeps in Redis: job records and their transitions, leases and
the reaper's indexes, completion waits, cancellation, heartbeats, metrics (and the Lua
scripts in ``lua/``). ``keys`` owns every key.
"""
