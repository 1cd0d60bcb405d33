"""The writer: parquet files, the manifest and the run directory they are committed to."""
