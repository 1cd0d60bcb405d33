"""Hooks written as plain functions, used from a config through ``type: custom`` or ``mode: custom``."""
