"""Tools for the project's own checks, not for a user's run: the bundle fuzzer's worker and detectors
(``fuzzwatch``), imported by ``scripts/fuzz_bundles.py`` and its tests like any other module. Nothing else
in the package imports them."""
