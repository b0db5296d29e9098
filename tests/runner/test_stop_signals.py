"""The runner's SIGTERM/SIGINT handling, in a child process (a real signal, and a
deadlock fails by timeout instead of hanging the suite). No database."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.processes import PROJECT_ROOT

CHILD = textwrap.dedent(
    """
    import os, signal, threading
    import django
    django.setup()  # the runner package imports the models
    from nexus_workflows.deferred.runner.stop_signals import StopSignals

    wake, stop, stop_now = threading.Event(), threading.Event(), threading.Event()

    def request_stop(*, now=False):
        stop.set()
        if now:
            stop_now.set()
        wake.set()

    def sigterm_while_holding_the_wake_lock():
        # The main thread holds the lock of the event a stop sets, as it does inside
        # wake.clear() or at the end of wake.wait() when the signal lands. The handler
        # runs at the next bytecode, still inside this block.
        with wake._cond:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):
                pass

    signals = StopSignals(request_stop, stop.is_set, 2.0)
    signals.install()
    sigterm_while_holding_the_wake_lock()
    assert wake.wait(5), "the first SIGTERM did not wake the loop"
    assert not stop_now.is_set()
    wake.clear()
    sigterm_while_holding_the_wake_lock()
    assert stop_now.wait(5), "the second SIGTERM did not stop at once"
    signals.restore()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    print("stopped")
    """
)


def test_a_signal_landing_while_the_main_thread_holds_the_wake_lock_still_stops_the_runner() -> None:
    # Before the fix the handler set the event itself and waited for its lock forever.
    result = subprocess.run(
        [sys.executable, "-c", CHILD],
        cwd=PROJECT_ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "stopped"
