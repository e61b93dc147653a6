"""Benchmarks (``make bench``): each module prints its own table; ``python -m bench`` runs them all."""
