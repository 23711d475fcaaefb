"""What the command-line tools share: an expected failure is one line naming what is wrong,
`<tool>: error: <what>`, with exit status 1; a run stopped by a signal after saving exits with
PREEMPTED, which launchers take as "run the same command again". A traceback is for bugs
only; BERTJAX_TRACEBACK=1 shows it for expected failures too.
"""

from __future__ import annotations

import contextlib
import os
import sys

# TensorFlow (the input pipeline; gs:// paths through etils) announces itself on stderr: its
# C++ info lines, and its oneDNN kernels whatever the log level. Every tool imports this file
# before anything imports TensorFlow (bertjax.data sets the same for library use).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

PREEMPTED = 75  # EX_TEMPFAIL: stopped by SIGTERM/SIGINT after saving; resume by rerunning

# Bad input, bad files, full or read-only disks, divergence: what a user can act on.
EXPECTED = (ValueError, OSError, FloatingPointError, ImportError)


@contextlib.contextmanager
def one_line_errors(tool: str):
    try:
        yield
    except EXPECTED as e:
        if os.environ.get("BERTJAX_TRACEBACK"):
            raise
        message = str(e) if str(e) else type(e).__name__
        if isinstance(e, OSError) and e.filename and str(e.filename) not in message:
            message = f"{message}: {e.filename}"
        sys.exit(f"{tool}: error: {message}")
