"""python -m specjax.export --draft DIR --engine vllm|sglang|hf --out OUTDIR [--target MODEL]"""

import sys

from specjax.export import engines

sys.exit(engines.main())
