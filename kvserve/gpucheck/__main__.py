"""``python -m kvserve.gpucheck --device cuda --out FILE``: every check, one JSON file."""

import sys

from kvserve.gpucheck.run import main

sys.exit(main(sys.argv[1:]))
