import os
import sys

# The module from the build tree (PYTHONPATH=build/python is what ctest sets; this is the fallback
# for running pytest by hand from the repository root).
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "build", "python"))
