"""A second serving stack, of three KV groups (full attention, window 8, window 32), with the backend that
reads it: a third-party KV manager plugged in by import path, touching no harness file."""
