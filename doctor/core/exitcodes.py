"""The exit codes of every ``k26-doctor`` command (CONTRACT.md): the one place they are defined."""

EXIT_OK = 0  # every selected check passed (warnings allowed unless --strict)
EXIT_FAILED = 1  # a check failed or errored, or an action failed
EXIT_USAGE = 2  # invalid invocation or configuration
EXIT_NO_REPORT = 3  # the doctor itself crashed: no report
# `kube-node`: node-problem-detector's plugin protocol has a third answer, Unknown (any status but 0 and 1): the
# node's checks could not be judged. It is EXIT_USAGE's number, as NPD reads an invalid invocation too.
EXIT_NPD_UNKNOWN = 2
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as a shell reports it): a short report of what finished
EXIT_TERMINATED = 143  # SIGTERM (128 + 15): the same short report as Ctrl-C (doctor.core.interrupt)
EXIT_SIGPIPE = 141  # the reader closed the pipe (128 + SIGPIPE, as a shell reports `yes | head -1`): quiet
