"""Child side of ``doctor.service.diagnose.match_bounded``: ``python -m doctor.service.diagnose_worker`` < request.

Loads the built-in and the site's signatures, matches them against the log file the request names, and
prints the matches as one JSON line; before each signature its id goes to stderr, so a parent that kills
this process at its deadline can name the signature that was being matched.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    from doctor.core.fileio import read_text
    from doctor.service.diagnose import MAX_LOG_BYTES, diagnose_lines, load_signatures

    req = json.loads(sys.stdin.read())
    signatures = load_signatures([Path(p) for p in req["signatures"]])
    lines = read_text(req["log"], MAX_LOG_BYTES, "a log", errors="replace").splitlines()

    def progress(sig_id: str) -> None:
        sys.stderr.write(sig_id + "\n")
        sys.stderr.flush()

    found = diagnose_lines(lines, signatures, on_signature=progress)
    sys.stdout.write(json.dumps([{"id": f.signature.id, "line_no": f.line_no, "line": f.line, "count": f.count,
                                  "context": f.context, "values": f.values, "withheld": f.withheld}
                                 for f in found]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
