"""Harnesses outside the package core: in-process training loops for the learning tests and the
hub benchmark (``surreal-redis bench hub``). Nothing in the core imports this package."""
