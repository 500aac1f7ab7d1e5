"""superfluid: one serving daemon for local LLM inference."""

__version__ = "0.1.0"
