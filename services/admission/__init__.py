"""Admission: the gRPC front door. Authenticates, validates, deduplicates, records."""
