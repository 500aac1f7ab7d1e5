"""The command line: `superfluid serve | node | fleet | launch | top | ...` (main.py), its
flag groups (flags.py, and llama_flags.py for llama-server's spellings), the fleet verbs
(fleet.py) and `launch`, which points a coding agent at the daemon (launch.py)."""


def main() -> int:
    """The `superfluid` command (an install made before the entry point named cli.main:main
    still finds it here)."""
    from .main import main as run
    return run()
