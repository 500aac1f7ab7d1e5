"""Sessions: an append-only log of token spans (events), its fold (state) and its SQLite
store. KV in the worker is only a cache of what the log says."""
