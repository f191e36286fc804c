"""python -m bench.soak --seed 7 --faults 50 --json --record --figure chaos.png (see bench/soak/run.py)."""

import sys

from bench.soak.run import main

sys.exit(main())
