"""Vocabulary parallelism: the output and input layers split over all pipeline ranks."""
