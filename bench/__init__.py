"""gpuk benchmark suites (pytest-benchmark) and the report that turns their JSON into a
markdown table and a plot. Run everything with ``python -m bench``."""
