"""The runner's exit statuses, importable before anything heavy (``runner.__main__`` exits with them early)."""
EXIT_RUN_ERROR = 1
#: Exit status for a configuration error (argparse's convention for usage errors).
EXIT_CONFIG_ERROR = 2
EXIT_INTERRUPTED = 130
