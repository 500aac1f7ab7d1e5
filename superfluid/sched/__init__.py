"""Pure scheduling: no I/O, no clock reads, no model. Tested with plain data."""
