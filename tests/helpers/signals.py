"""Children that a test stops with Ctrl-C (SIGINT)."""

from __future__ import annotations

import signal


def ctrl_c_restored() -> None:
    """`preexec_fn` for such a child: a test tier run in the background (`make test-slow &`, nohup) ignores SIGINT,
    its children inherit that, and Python then installs no KeyboardInterrupt, so the child never stops (the
    `lumen serve` docs test's 60 s timeouts: its threads' stacks showed the server still in select)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
