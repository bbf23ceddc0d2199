"""Inspectors of converted shards: ``stats`` (balance), ``verify`` (integrity), ``diff`` (two versions)."""
