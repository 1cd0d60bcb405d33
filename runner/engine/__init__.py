"""Plan and run: a config compiled once into a checked plan, then the loop that runs it."""
