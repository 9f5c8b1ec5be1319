"""The audit as a script for ``spark-submit`` (``spark-submit spark/audit_job.py DIR... [--ack-log FILE]``).

spark-submit runs this file with its own directory first on ``sys.path``; the project root (this file's parent's
parent) is put in front so ``spark.audit`` and the storage codec import as packages. The executors receive the
same code from ``spark.session.code_zip``. The master is spark-submit's ``--master`` unless ``--master`` is also
given after the script.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    root = str(Path(__file__).resolve().parent.parent)
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [root] + [p for p in sys.path if p not in (here, root)]
    from spark.audit import main

    sys.exit(main(sys.argv[1:]))
