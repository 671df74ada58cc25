"""Data: source readers, cleaning ops and the Ray Data cleaning pipeline."""
