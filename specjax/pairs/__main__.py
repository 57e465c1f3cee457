"""python -m specjax.pairs gemma3-text SRC_DIR DST_DIR"""

import sys

from specjax.pairs import gemma3_text

gemma3_text.main(sys.argv)
