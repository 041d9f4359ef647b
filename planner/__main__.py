import gc
import sys

# everything the imports build (modules, classes, pydantic schemas) lives as long as the
# process: collecting it again and again during start-up, and walking it in every later
# collection, is wasted work; freeze it instead
gc.disable()
from .cli import main  # noqa: E402

gc.freeze()
gc.enable()

sys.exit(main())
