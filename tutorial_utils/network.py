"""Whether a host answers, in seconds: the one probe before every download or Hub lookup.

Offline, name resolution can hang for minutes and the Hub client retries for about half a
minute; the tutorial fails fast with a line that says what to do instead.
"""

from __future__ import annotations

import socket
import threading

__all__ = ["reachable"]


def reachable(host: str, port: int = 443, timeout_s: float = 3.0) -> bool:
    """Whether a TCP connection to ``host`` opens within ``timeout_s`` seconds, DNS included.

    Why a thread: name resolution has no timeout of its own.
    """
    outcome: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                outcome.append(True)
        except OSError:
            outcome.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return bool(outcome) and outcome[0]
