"""Imported by every Python process the test suite starts (tests/conftest.py puts this folder on PYTHONPATH)."""
import strict_deprecations
strict_deprecations.install()
